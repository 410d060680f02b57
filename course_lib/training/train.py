"""Train the bundled model pair (target and draft) and their tokenizer from scratch.

    python -m course_lib.training.train                 # full run, writes course_lib/models/bundled/
    python -m course_lib.training.train --quick --out /tmp/m   # a minute-long smoke run

Deterministic for a given Python stdlib, torch version and thread count: fixed seeds, a fixed data
order, a fixed number of steps. The tokenizer is a byte-level BPE (2048 tokens) trained with
`tokenizers` on the training split only. Each model is trained in stages (``TARGET_STAGES``,
``DRAFT_STAGES``): short 256-token windows first, where a step is cheap, then windows of the full
512-token context the models declare, so every position they will be asked about was trained on.
Each stage has its own AdamW, warm-up and cosine schedule on random windows of the tokenized
training split. The models are then scored on the held-out split (bits per byte), greedy
continuations of held-out prompts are recorded, and the model card is written from the measured numbers.

    python -m course_lib.training.train --resume-target course_lib/models/bundled/tiny --resume-stages 1
        # start from saved weights that already ran the first stage: run only the later ones
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from course_lib.generation import generate
from course_lib.models.config import BUNDLED_ROOT, LlamaConfig, flops_per_token
from course_lib.models.corpus import EOS, encode_stream, load_split
from course_lib.models.llama import LlamaForCausalLM, causal_lm_loss
from course_lib.perf.quality import bits_per_byte, repeated_ngram_share
from course_lib.schedule import cosine_lr

BUNDLED_DIR = BUNDLED_ROOT
# The model card's last section, on the distilled default draft: written by `course_lib.training.distill_draft`
# when it installs a draft, kept by `write_card` when this script rewrites the rest of the card.
CARD_SECTION = "## The default draft `tiny-draft`: distilled from `tiny`"

TARGET = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
# The draft has one layer: at batch 1 a decode step's cost is mostly per-layer work (kernel launches,
# small matmuls), so one wider layer costs less per call than two narrower ones.
DRAFT = LlamaConfig(vocab_size=2048, hidden_size=128, intermediate_size=352, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


@dataclass
class TrainSettings:
    steps: int
    batch: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 0


# One TrainSettings per stage; every stage sees batch * seq_len = 4096 tokens per step.
TARGET_STAGES = (TrainSettings(steps=1500, batch=16, seq_len=256, lr=3e-3, warmup=100),
                 TrainSettings(steps=600, batch=8, seq_len=512, lr=1e-3, warmup=50, seed=1))
DRAFT_STAGES = (TrainSettings(steps=1500, batch=16, seq_len=256, lr=3e-3, warmup=100),
                TrainSettings(steps=1000, batch=8, seq_len=512, lr=1e-3, warmup=50, seed=1))


def train_tokenizer(texts: list[str], vocab_size: int, out: Path):
    """Byte-level BPE, saved so that ``AutoTokenizer.from_pretrained(out)`` works offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOS, "eos_token": EOS,
        "unk_token": EOS, "pad_token": EOS, "model_max_length": 512, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "pad_token": EOS}, indent=2) + "\n")
    return tok


def train_model(cfg: LlamaConfig, stream: torch.Tensor, stages, model: LlamaForCausalLM | None = None):
    """Train `model` (a fresh one from ``stages[0].seed`` if None) through `stages` in order.

    Returns (model in eval mode, [training seconds of each stage]). Each stage starts a fresh AdamW with its own
    warm-up and cosine decay to a tenth of its peak learning rate.
    """
    if isinstance(stages, TrainSettings):
        stages = (stages,)
    if not stages and model is None:
        raise ValueError("stages is empty and no model was given: nothing to train")
    if model is None:
        torch.manual_seed(stages[0].seed)
        model = LlamaForCausalLM(cfg).to(stream.device)   # initialised from the seed on the CPU, then moved
    for s in stages:
        if s.seq_len > cfg.max_position_embeddings:
            raise ValueError(f"a stage's seq_len {s.seq_len} exceeds the model's context "
                             f"{cfg.max_position_embeddings}")
    model.train()
    seconds = []
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    for k, s in enumerate(stages):
        t0 = time.perf_counter()
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=s.lr, betas=(0.9, 0.95))
        gen = torch.Generator(device=stream.device).manual_seed(s.seed)   # the windows: drawn where the stream is
        n = stream.numel() - s.seq_len - 1
        bar = range(s.steps)
        if tqdm is not None:
            bar = tqdm(bar, desc=f"train d={cfg.hidden_size} L={cfg.num_hidden_layers} "
                                 f"stage ({s.batch}x{s.seq_len}, {s.steps} steps)", mininterval=5)
        ema = None
        for step in bar:
            lr = cosine_lr(step, s.steps, s.lr, s.warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            starts = torch.randint(0, n, (s.batch,), generator=gen, device=stream.device)
            x = torch.stack([stream[i:i + s.seq_len + 1] for i in starts.tolist()])
            loss = causal_lm_loss(model(x[:, :-1]), x[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
            if hasattr(bar, "set_postfix") and step % 50 == 0:
                bar.set_postfix(loss=f"{ema:.3f}")
        seconds.append(time.perf_counter() - t0)
    return model.eval(), seconds


def unigram_bits_per_byte(train_stream: torch.Tensor, heldout_docs: list[list[int]], vocab: int,
                          heldout_bytes: int) -> float:
    """Add-one smoothed token unigram model fitted on the training stream."""
    counts = torch.bincount(train_stream, minlength=vocab).double() + 1
    logp = torch.log2(counts / counts.sum())
    total = sum(-logp[torch.tensor(d, device=logp.device)].sum().item() for d in heldout_docs if d)
    return total / heldout_bytes


def _stages_text(m: dict) -> str:
    return " then ".join(f"{st['steps']} x {st['batch']} x {st['seq_len']}" for st in m["stages"])


def write_card(out: Path, report: dict):
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")   # first: the numbers
    t, d = report["target"], report["draft"]
    lines = [
        "# The bundled models: `tiny` (target), `tiny-draft-scratch` and `tiny-draft` (drafts)",
        "",
        "Two Llama-architecture decoders trained from scratch by `python -m course_lib.training.train` on the",
        "Python standard library's own source (read at training time, never committed), sharing one byte-level",
        "BPE tokenizer of 2048 tokens trained on the same training split. Every number below was measured by",
        "that script in the runs that produced these weights (`training_report.json`).",
        "",
        "| | target (`tiny`) | draft (`tiny-draft-scratch`) | unigram baseline |",
        "|---|---|---|---|",
        f"| held-out bits per byte | **{t['bits_per_byte']:.3f}** | {d['bits_per_byte']:.3f} | "
        f"{report['unigram_bits_per_byte']:.3f} |",
        f"| parameters | {t['parameters']:,} | {d['parameters']:,} | {report['vocab_size']:,} counts |",
        f"| layers x hidden (heads / kv heads) | {t['layers']} x {t['hidden']} ({t['heads']}/{t['kv_heads']}) | "
        f"{d['layers']} x {d['hidden']} ({d['heads']}/{d['kv_heads']}) | |",
        f"| forward FLOPs per token (no attention) | {t['flops_per_token']:,} | {d['flops_per_token']:,} "
        f"({d['flops_per_token'] / t['flops_per_token']:.2f}x) | |",
        f"| training stages: steps x batch x window | {_stages_text(t)} | {_stages_text(d)} | |",
        f"| tokens seen in training | {t['tokens_seen']:,} | {d['tokens_seen']:,} | |",
        f"| training time | {t['train_seconds'] / 60:.1f} min | {d['train_seconds'] / 60:.1f} min | |",
        "",
        f"- Device: {report['device']}; torch {report['torch']}; Python {report['python']}.",
        f"- Corpus: {report['train_files']} training files ({report['train_bytes']:,} bytes, "
        f"{report['train_tokens']:,} tokens);"
        f" held-out split {report['heldout_files']} files ({report['heldout_bytes']:,} bytes), chosen by",
        "  `sha1(path relative to the stdlib)[0] < 13` (see `course_lib/models/corpus.py`); test suites, idlelib,",
        "  lib2to3 and site-packages are left out.",
        "- Bits per byte: summed next-token loss over each held-out file (an EOS token first, windows of 512",
        "  tokens) in bits, divided by the file's UTF-8 bytes. The unigram baseline is an add-one smoothed token",
        "  frequency table from the training split.",
        "- Context: 512 tokens (about 1,700 bytes of Python). Training runs in stages, each with its own AdamW,",
        "  warm-up and cosine decay: 256-token windows first (cheaper steps), then windows of the full 512-token",
        "  context, so every position the models are asked about was trained on (notebook 05 checks that the",
        "  full cache predicts better than any sliding window on 511-token texts).",
    ]
    if t.get("resumed_from"):
        lines += ["- The target's first stage is the earlier bundled target (this script, the same first-stage",
                  "  settings); the run that made these weights started from it (`--resume-target`) and ran the",
                  "  later stages. A fresh `make train` runs all stages (on a CUDA GPU when one is present)."]
    lines += [
        "- The draft has one layer: at batch 1 a decode step's cost is mostly per-layer work, so one layer of",
        "  width 128 costs less per call than two narrower ones (notebook 08 measures the cost ratio c).",
        "- Weights are stored in float32.",
        "- Load: `course_lib.models.load('tiny')`, or `transformers.AutoModelForCausalLM.from_pretrained(path)` and",
        "  `AutoTokenizer.from_pretrained(path)` on the folders `tiny/`, `tiny-draft/` and `tiny-draft-scratch/`.",
        "- The default draft `tiny-draft` has the draft's shape and starts from `tiny-draft-scratch`, then is",
        "  distilled from the target by `python -m course_lib.training.distill_draft` (its own section below, when",
        "  installed).",
        "",
        "## Greedy continuations of held-out prompts",
        "",
        "Greedy decoding (temperature 0) of 64 tokens after 96-token prompts from the middle of held-out files.",
        "\"Repeated 4-grams\" is the share of the continuation's 4-token windows that occurred earlier in it",
        "(a model stuck in a loop scores near 1; varied text near 0).",
        "",
    ]
    reps = [(label, m["repetition"]) for label, m in (("`tiny`", t), ("`tiny-draft-scratch`", d))
            if m.get("repetition")]
    if reps:
        n = reps[0][1]["prompts"]
        lines += [f"| repeated 4-grams, mean over {n} prompts | greedy | sampled (T = 0.8, top-k 40, seed 0) |",
                  "|---|---|---|"]
        lines += [f"| {label} | {r['greedy']:.2f} | {r['sampled_t0.8_top40']:.2f} |" for label, r in reps]
        lines.append("")
    for name, m in (("target `tiny`", t), ("draft `tiny-draft-scratch`", d)):
        samples = m.get("greedy_samples") or []
        if not samples:
            continue
        share = sum(x["repeated_4gram_share"] for x in samples) / len(samples)
        lines += [f"### {name}: repeated 4-grams {share:.2f} on average", ""]
        for x in samples:
            lines += ["```python", "# ...prompt ends: " + x["prompt_tail"].replace("\n", "\\n")[-60:],
                      x["continuation"].rstrip(), "```", ""]
    rep = t.get("repetition")
    measured = (f"repeated 4-grams {rep['greedy']:.2f} greedy against {rep['sampled_t0.8_top40']:.2f} sampled"
                if rep else "repeated 4-grams")
    lines += [
        "- Limits: a toy. It writes plausible-looking Python, not correct programs. Greedy decoding loops: it",
        f"  soon repeats a line or a phrase ({measured}, the table",
        "  above), the degeneration of maximization-based decoding that Holtzman et al. (\"The Curious Case of",
        "  Neural Text Degeneration\", ICLR 2020) describe; a bigger model does not fit the CPU training budget, so",
        "  the course teaches it instead: notebook 00, section 11, measures greedy against temperature, top-p and a",
        "  repetition penalty (`generate(..., repetition_penalty=1.3)`) on this model. Sample (or add a penalty)",
        "  when you read its text; the tests check bracket balance over completed lines of sampled text. It knows",
        "  nothing but the standard library's style. It exists so that every technique of the course shows a real",
        "  effect offline.",
        "",
    ]
    card = out / "MODEL_CARD.md"
    kept = card.read_text().split(CARD_SECTION, 1) if card.exists() else []
    tail = ("\n" + CARD_SECTION + kept[1]) if len(kept) == 2 else ""
    card.write_text("\n".join(lines) + tail)


def middle_prompt(tok, text: str, prompt_tokens: int) -> list[int]:
    """`prompt_tokens` token ids ending at the middle of `text`: code with context before it."""
    ids = tok(text, verbose=False)["input_ids"]
    start = max(0, len(ids) // 2 - prompt_tokens)
    return ids[start:start + prompt_tokens]


def greedy_samples(model, tok, texts: list[str], n: int = 4, prompt_tokens: int = 96,
                   new_tokens: int = 64) -> list[dict]:
    """Greedy continuations of `n` held-out prompts (each from the middle of a file): the model card's
    plausibility evidence, each with its repeated 4-gram share (``repeated_ngram_share``)."""
    out = []
    for text in texts[:n]:
        prompt = middle_prompt(tok, text, prompt_tokens)
        new = generate(model, prompt, max_new_tokens=new_tokens).tokens.tolist()
        out.append({"prompt_tail": tok.decode(prompt[-24:]), "continuation": tok.decode(new),
                    "repeated_4gram_share": round(repeated_ngram_share(new), 3)})
    return out


def repetition(model, tok, texts: list[str], n: int = 12, prompt_tokens: int = 96, new_tokens: int = 64,
               seed: int = 0) -> dict:
    """Mean repeated 4-gram share of 64-token continuations of `n` held-out prompts, greedy and sampled
    (temperature 0.8, top-k 40, one seeded generator): the number behind "sampling repeats less"."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    greedy, sampled = [], []
    for text in texts[:n]:
        prompt = middle_prompt(tok, text, prompt_tokens)
        greedy.append(repeated_ngram_share(generate(model, prompt, max_new_tokens=new_tokens).tokens.tolist()))
        sampled.append(repeated_ngram_share(generate(model, prompt, max_new_tokens=new_tokens, temperature=0.8,
                                                     top_k=40, generator=gen).tokens.tolist()))
    return {"prompts": len(greedy), "greedy": sum(greedy) / len(greedy),
            "sampled_t0.8_top40": sum(sampled) / len(sampled)}


def add_samples(out: Path, report: dict, tok, heldout_texts: list[str]) -> None:
    """Greedy samples and repetition numbers for each model saved in `out`, into `report`."""
    for name, folder in (("target", "tiny"), ("draft", "tiny-draft-scratch")):
        if name in report and (out / folder / "model.safetensors").is_file():
            saved = LlamaForCausalLM.from_pretrained(out / folder).eval()
            report[name]["greedy_samples"] = greedy_samples(saved, tok, heldout_texts)
            report[name]["repetition"] = repetition(saved, tok, heldout_texts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=BUNDLED_DIR)
    ap.add_argument("--only", choices=("target", "draft"), default=None,
                    help="train one model; the other's entry in the report in --out is kept")
    ap.add_argument("--resume-target", type=Path, default=None,
                    help="a saved target (with its tokenizer) that already ran --resume-stages stages")
    ap.add_argument("--resume-draft", type=Path, default=None, help="the same for the draft")
    ap.add_argument("--resume-stages", type=int, default=1, help="how many stages the resumed weights ran")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="a folder with the tokenizer to reuse instead of training one (default: the resumed model's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny run for smoke tests")
    ap.add_argument("--card-only", action="store_true",
                    help="train nothing: recompute the samples of the models in --out and rewrite the card")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.card_only:
        from transformers import PreTrainedTokenizerFast
        report = json.loads((args.out / "training_report.json").read_text())
        tok = PreTrainedTokenizerFast.from_pretrained(str(args.out / "tiny"))
        add_samples(args.out, report, tok, load_split("heldout")[:2] if args.quick else load_split("heldout"))
        write_card(args.out, report)
        return

    train_texts = load_split("train")
    heldout_texts = load_split("heldout")
    target_cfg, draft_cfg = TARGET, DRAFT
    stages = {"target": TARGET_STAGES, "draft": DRAFT_STAGES}
    if args.quick:
        train_texts, heldout_texts = train_texts[:12], heldout_texts[:2]
        stages = {k: tuple(replace(s, steps=4, warmup=2) for s in v) for k, v in stages.items()}
    resume = {"target": args.resume_target, "draft": args.resume_draft}
    if not 0 <= args.resume_stages <= len(TARGET_STAGES):
        raise SystemExit(f"--resume-stages must be between 0 and {len(TARGET_STAGES)}, got {args.resume_stages}")
    tok_dir = args.out / "tokenizer"
    tok_source = args.tokenizer or next((p for p in resume.values() if p is not None), None)
    if tok_source is not None:   # resumed weights keep the tokenizer they were trained with
        from tokenizers import Tokenizer
        tok_dir.mkdir(parents=True, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (tok_dir / f).write_bytes((tok_source / f).read_bytes())
        tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    else:
        tok = train_tokenizer(train_texts, target_cfg.vocab_size, tok_dir)
    eos = tok.token_to_id(EOS)
    target_cfg = replace(target_cfg, bos_token_id=eos, eos_token_id=eos)
    draft_cfg = replace(draft_cfg, bos_token_id=eos, eos_token_id=eos)
    stream = encode_stream(tok, train_texts)
    per_token = sum(len(t.encode()) for t in train_texts) / stream.numel()
    print(f"training tokens: {stream.numel():,} ({per_token:.2f} bytes/token)")

    from transformers import PreTrainedTokenizerFast
    hf_tok = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    old = args.out / "training_report.json"
    report = json.loads(old.read_text()) if args.only and old.exists() else {}
    report.update({"device": platform.processor() or platform.machine(), "torch": torch.__version__,
                   "python": platform.python_version(), "threads": args.threads,
                   "vocab_size": target_cfg.vocab_size, "train_files": len(train_texts),
                   "train_bytes": sum(len(t.encode()) for t in train_texts), "train_tokens": stream.numel(),
                   "heldout_files": len(heldout_texts),
                   "heldout_bytes": sum(len(t.encode()) for t in heldout_texts)})
    try:
        import subprocess
        cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                             capture_output=True, text=True).stdout.strip()
        report["device"] = f"CPU ({cpu}), {args.threads} threads" if cpu else report["device"]
    except OSError:
        pass
    if torch.cuda.is_available():
        stream = stream.to("cuda")
        report["device"] = torch.cuda.get_device_name()
    for name, cfg in (("target", target_cfg), ("draft", draft_cfg)):
        if args.only and name != args.only:
            continue
        folder = args.out / ("tiny" if name == "target" else "tiny-draft-scratch")
        model, done = None, 0
        if resume[name] is not None:
            model = LlamaForCausalLM.from_pretrained(resume[name]).to(stream.device)
            if model.config.num_hidden_layers != cfg.num_hidden_layers or model.config.hidden_size != cfg.hidden_size:
                raise SystemExit(f"--resume-{name} {resume[name]} has shape {model.config.num_hidden_layers} x "
                                 f"{model.config.hidden_size}, the script's {name} is {cfg.num_hidden_layers} x "
                                 f"{cfg.hidden_size}")
            done = args.resume_stages
            model.config.max_position_embeddings = cfg.max_position_embeddings
        before = report.get(name, {}) if model is not None else {}
        model, secs = train_model(cfg, stream, stages[name][done:], model=model)
        model.save_pretrained(folder)
        for f in tok_dir.iterdir():  # each model folder is self-contained for AutoTokenizer
            (folder / f.name).write_bytes(f.read_bytes())
        model = model.to("cpu")
        bpb = bits_per_byte(model, hf_tok, heldout_texts, progress=False)
        # resumed stages keep the seconds their run reported (a report without stages ran one stage)
        earlier = [st.get("train_seconds") for st in before.get("stages", [])] or [before.get("train_seconds")]
        ran = [dict(steps=s.steps, batch=s.batch, seq_len=s.seq_len, lr=s.lr, warmup=s.warmup, seed=s.seed,
                    train_seconds=(earlier[k] if k < len(earlier) else None) if k < done else secs[k - done])
               for k, s in enumerate(stages[name])]
        print(f"{name}: {bpb:.3f} bits/byte, {sum(secs) / 60:.1f} min this run")
        report[name] = {"bits_per_byte": bpb, "parameters": model.num_parameters(),
                        "steps": sum(r["steps"] for r in ran), "stages": ran,
                        "tokens_seen": sum(r["steps"] * r["batch"] * r["seq_len"] for r in ran),
                        "train_seconds": sum(r["train_seconds"] or 0 for r in ran),
                        "resumed_from": str(resume[name]) if resume[name] is not None else None,
                        "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                        "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                        "flops_per_token": flops_per_token(cfg)}
    add_samples(args.out, report, hf_tok, heldout_texts)   # both models, from the saved weights
    heldout_ids = [hf_tok(t)["input_ids"] for t in heldout_texts]
    report["unigram_bits_per_byte"] = unigram_bits_per_byte(stream.cpu(), heldout_ids, target_cfg.vocab_size,
                                                            report["heldout_bytes"])
    write_card(args.out, report)
    import shutil
    shutil.rmtree(tok_dir)
    print(json.dumps({k: report[k] for k in ("unigram_bits_per_byte",)}, indent=1))


if __name__ == "__main__":
    main()
