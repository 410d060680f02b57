"""Distil the bundled default draft `tiny-draft` from the target `tiny` and install it (Module 04).

    python -m course_lib.training.distill_draft --scratch      # distil `tiny` into a `tiny-draft`-shaped student
                                                               # on the bundled draft's budget, and a scratch twin
    python -m course_lib.training.distill_draft --steps 150    # the reduced budget measured for the notebook
                                                               # (~20 min, 1 thread)
    python -m course_lib.training.distill_draft --quick        # a half-minute smoke run
    python -m course_lib.training.distill_draft --continue-from-bundled --steps 250 ... --out build/distill
    python -m course_lib.training.distill_draft --install-from build/distill   # how `make train` makes tiny-draft

White-box, T = 1, alpha = 1 by default: the acceptance rate of a draft is measured at T = 1, and the forward
KL at T = 1 is the divergence whose minimiser is the teacher's own distribution. Writes <out>/tiny-draft
(loadable by course_lib.models.load and transformers), <out>/tiny-draft-scratch when a scratch twin is
trained, and <out>/distill_report.json with held-out bits per byte and acceptance rates. `--install-from`
copies a finished run's draft into the bundled models and writes its model-card section (``CARD_SECTION``,
which `course_lib.training.train` keeps when it rewrites the rest of the card). The training loop and the
metrics are `course_lib.distill`'s.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from pathlib import Path

import torch

from course_lib.distill import acceptance_rates, distill, new_student, token_stream
from course_lib.models import BUNDLED, bundled_path, load
from course_lib.models.corpus import load_split
from course_lib.perf.quality import bits_per_byte
from course_lib.training.train import CARD_SECTION

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("distilled"), help="folder for the student + report")
    ap.add_argument("--steps", type=int, default=None, help="default: the bundled draft's steps")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scratch", action="store_true", help="also train a scratch student on the same budget")
    ap.add_argument("--scratch-dir", type=Path, default=None,
                    help="a scratch student trained elsewhere on the same budget (e.g. in parallel); not retrained")
    ap.add_argument("--heldout-files", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny run for smoke tests")
    ap.add_argument("--continue-from-bundled", dest="cont", action="store_true",
                    help="start both students from the bundled scratch draft instead of a fresh init: "
                         "`--steps` more steps of distillation vs `--steps` more steps of cross entropy "
                         "(the same extra budget); this is how the default `tiny-draft` was made")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0, help="data order (and init) seed")
    ap.add_argument("--install-from", type=Path, default=None,
                    help="install <dir>/tiny-draft (a finished run) as the bundled default draft, with its "
                         "report and a model-card section; trains nothing")
    args = ap.parse_args(argv)
    if args.install_from is not None:
        return install_draft(args.install_from)
    torch.set_num_threads(args.threads)

    teacher, tok = load("tiny", device="cpu")
    scratch_name = "tiny-draft-scratch" if "tiny-draft-scratch" in BUNDLED else "tiny-draft"
    if args.cont and args.steps is None:
        ap.error("--continue-from-bundled needs --steps (the extra budget)")
    bundled_scratch, _ = load(scratch_name, device="cpu")
    report_path = bundled_path("tiny").parent / "training_report.json"
    base = json.loads(report_path.read_text())
    base = base.get("draft_scratch", base["draft"])
    last = base["stages"][-1] if "stages" in base else base   # a staged run: default to its last windows
    steps = args.steps or base["steps"]
    batch = args.batch or last["batch"]
    seq_len = args.seq_len or last["seq_len"]
    train_texts, heldout = load_split("train"), load_split("heldout", max_files=args.heldout_files)
    if args.quick:
        steps, batch, seq_len = 20, 4, 64
        train_texts, heldout = train_texts[:20], heldout[:2]
    stream = token_stream(tok, train_texts)
    same_budget = ("stages" not in base and (steps, batch, seq_len) == (base["steps"], last["batch"], last["seq_len"])
                   and not args.quick)
    print(f"budget: {steps} steps x {batch} x {seq_len} = {steps * batch * seq_len:,} tokens "
          f"({'the bundled draft' + chr(39) + 's budget' if same_budget else 'reduced'})")
    args.out.mkdir(parents=True, exist_ok=True)
    students = {}
    runs = [("distilled", "white_box")]
    if (args.scratch or not same_budget) and args.scratch_dir is None:
        runs.append(("scratch", "scratch"))
    report = {"device": f"CPU ({platform.processor() or platform.machine()}), {args.threads} threads",
              "torch": torch.__version__, "python": platform.python_version(), "threads": args.threads,
              "steps": steps, "batch": batch, "seq_len": seq_len, "tokens": steps * batch * seq_len,
              "temperature": args.temperature, "alpha": args.alpha, "teacher": "tiny",
              "heldout_files": len(heldout), "heldout_bytes": sum(len(t.encode()) for t in heldout),
              "lr": args.lr, "warmup": args.warmup, "seed": args.seed,
              "init": f"bundled {scratch_name} ({base['steps']} scratch steps)" if args.cont else "fresh"}
    if args.cont:
        runs = [("distilled", "white_box"), ("scratch", "scratch")]   # both continue: same extra budget
    for name, mode in runs:
        if args.cont:
            student, _ = load(scratch_name, device="cpu")
            student.train()
        else:
            student = new_student(bundled_scratch, seed=args.seed)
        student, hist = distill(teacher, student, steps=steps, batch_size=batch, seq_len=seq_len, mode=mode,
                                temperature=args.temperature, alpha=args.alpha, stream=stream, seed=args.seed,
                                lr=args.lr, warmup=args.warmup)
        folder = args.out / ("tiny-draft" if name == "distilled" else
                             "tiny-draft-ce-continued" if args.cont else "tiny-draft-scratch")
        student.save_pretrained(folder)
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(bundled_path("tiny") / f, folder / f)
        students[name] = student
        report[name] = {"mode": mode, "train_seconds": hist["total_seconds"], "final_loss": hist["loss"][-1]}
        print(f"{name}: {hist['total_seconds'] / 60:.1f} min, final loss {hist['loss'][-1]:.3f}")
    if args.scratch_dir is not None:
        for _ in range(360):   # trained in parallel: wait for it (up to an hour)
            if (args.scratch_dir / "model.safetensors").is_file():
                break
            time.sleep(10)
        time.sleep(5)
        students["scratch"], _ = load(str(args.scratch_dir), device="cpu")
        report["scratch"] = {"mode": "scratch", "model": str(args.scratch_dir)}
    bundled_key = "scratch" if "scratch" not in students else "bundled_scratch"
    students[bundled_key] = bundled_scratch
    report[bundled_key] = {"mode": "scratch", "model": f"bundled {scratch_name} (course_lib.training.train)",
                           "steps": base["steps"], "batch": last["batch"], "seq_len": last["seq_len"],
                           "stages": base.get("stages")}
    for name, student in students.items():
        rates = acceptance_rates(teacher, student, heldout, tok, temperatures=(1.0, 0.0), progress=False)
        report[name].update(bits_per_byte=bits_per_byte(student, tok, heldout, progress=False),
                            acceptance_t1=rates[1.0], acceptance_greedy=rates[0.0],
                            parameters=student.num_parameters())
        print(f"{name}: {report[name]['bits_per_byte']:.3f} bits/byte, acceptance T=1 {rates[1.0]:.3f}, "
              f"greedy agreement {rates[0.0]:.3f}")
    report["teacher_bits_per_byte"] = bits_per_byte(teacher, tok, heldout, progress=False)
    (args.out / "distill_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def card_section(report: dict) -> str:
    """The model card's section on the distilled draft, from a run's distill_report.json (as a dict)."""
    new, old = report["distilled"], report.get("bundled_scratch") or report["scratch"]
    ctl = report.get("scratch", {})
    rows = [("`tiny-draft` (default): scratch + distillation", new),
            ("`tiny-draft-scratch`: scratch only (the table above)", old)]
    if report.get("init", "fresh") != "fresh" and "bits_per_byte" in ctl:
        rows.append(("control: scratch + the same extra steps of cross entropy", ctl))
    lines = [CARD_SECTION, "",
             f"Made by `python -m course_lib.training.distill_draft --continue-from-bundled --steps {report['steps']} "
             f"--lr {report['lr']} --warmup {report['warmup']} --seed {report['seed']} --threads {report['threads']}`"
             f" then `--install-from <out>`: the scratch draft, trained {report['steps']} more steps "
             f"({report['steps']} x {report['batch']} x {report['seq_len']} tokens) on forward KL to the target's "
             f"distribution (T = {report['temperature']}, alpha = {report['alpha']}). The acceptance rate is the mean "
             "over held-out positions of sum_x min(p_target(x), q_draft(x)), the probability that speculative "
             "sampling accepts a drafted token; greedy agreement is the same at temperature 0.", "",
             "| draft | held-out bits per byte | acceptance (T = 1) | greedy agreement |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['bits_per_byte']:.3f} | {r['acceptance_t1']:.3f} | {r['acceptance_greedy']:.3f} |"
              for name, r in rows]
    lines += ["", f"- Device: {report['device']}; torch {report['torch']}. Full report: `distill_report.json`.", ""]
    return "\n".join(lines)


def install_draft(run_dir: Path, root: Path | None = None) -> dict:
    """Make <run_dir>/tiny-draft the bundled default draft, if it beats the scratch draft on acceptance.

    Copies the weights and tokenizer into <root>/tiny-draft (root: the bundled models' folder by default),
    the run's report to <root>/distill_report.json, and (re)writes the distilled-draft section at the end of
    <root>/MODEL_CARD.md from the report, keeping the rest of the card (`course_lib.training.train` writes it).
    """
    run_dir = Path(run_dir)
    report = json.loads((run_dir / "distill_report.json").read_text())
    new, old = report["distilled"], report.get("bundled_scratch") or report["scratch"]
    if new["acceptance_t1"] <= old["acceptance_t1"]:
        raise ValueError(f"the distilled draft does not win: acceptance {new['acceptance_t1']:.3f} vs the scratch "
                         f"draft's {old['acceptance_t1']:.3f}; nothing installed")
    root = bundled_path("tiny").parent if root is None else Path(root)
    dest = root / "tiny-draft"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(run_dir / "tiny-draft", dest)
    (root / "distill_report.json").write_text(json.dumps(report, indent=2) + "\n")
    card_path = root / "MODEL_CARD.md"
    card = card_path.read_text().split(CARD_SECTION)[0].rstrip("\n")
    card_path.write_text(card + "\n\n" + card_section(report))
    print(f"installed {dest} (acceptance {new['acceptance_t1']:.3f} vs {old['acceptance_t1']:.3f})")
    return report


if __name__ == "__main__":
    main()
