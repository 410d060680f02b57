"""The final project's judge (lab13): the entry timed and checked from outside its process; Part B.

Part A, as the grader runs it:
1. **Two kernels.** The student's kernel (the notebook ran in it) loads the course's model and calls the
   student's `build` on it. A clean kernel (`Judge(clean=True)`: a sandbox of its own, another user, its own
   cgroup) loads the same model and builds the course's baseline (`capstone.baseline_build`: Module 05's
   KV-cached greedy loop, the same code the student's visible test times); it runs nothing of the student's,
   so nothing the entry does to its own process (patching torch, the library, the clock) reaches the baseline.
2. **Prompts drawn here, one at a time** (`capstone.prompt_stream`, from the class secret and the student's
   key: a regrade draws the same ones), each only when it is sent, after `build` returned; each is new to
   both kernels. The reference tokens are the clean kernel's (the grader's process, out of the entry's reach).
3. **Rounds timed from outside.** `CHECKS` untimed prompts warm both kernels up; then `ROUNDS` rounds, each
   one new prompt to the entry and to the baseline (one request each, the order alternating). The clock is
   each kernel's CPU time read from outside it (its cgroup's counter; `session.CpuClock`) over the whole
   round: whatever the entry's processes do while the baseline runs is charged to the entry. The wall time
   of each call is kept too (flags). The statistic, for points and rank alike: the geometric mean of the
   per-round ratios (baseline CPU / entry CPU) with its 90% interval (`capstone.speedup_interval`); the
   points are `capstone.speed_points` of the interval's lower end, none for an entry that is not correct.
4. **Correct** means: every token the entry returned equals the baseline's (the clean kernel's); for a lossy entry
   (its generate_fn has ``lossy_model``) the tokens are lossy_model's greedy ones (the grader asks the
   entry's kernel for lossy_model's logits on the prompt and the entry's tokens and takes the argmax here)
   and its bits per byte on held-out text within the model's context, computed here from the logits
   lossy_model gives, exceed the model's by at most `BPB_BOUND`.
5. **Flags for review** (the leaderboard's status): an entry call under a millisecond, the entry's CPU while
   the baseline ran, per-round ratios spread beyond the noise, a baseline round far from the others, a wall
   speed-up far below the CPU one, a lossy entry whose tokens the model itself rarely agrees with.

The scale (`capstone.RATIO_FLOOR` 1.1, `RATIO_FULL` 1.3), as this judge measured entries on the course's 2-core
CPU (the bundled tiny, 64 + 16 tokens, one thread; speed-up over the cached loop and its 90% interval): the
baseline against itself 0.89-1.08x over 20 judgings beside a CPU-bound and a memory-bound loop, its intervals'
lower ends 0.85-1.03; `generate(cache="contiguous")` 0.96x; `generate` with tiny-draft 0.97x and with prompt
lookup 1.07x; `generate(compile=True)` 1.10x (1.04-1.15); int8 weight-only (lossy) 0.74x; a module-free forward
with fused products and a preallocated cache, its products still reading the model's [out, in] weights,
1.18-1.23x (lower ends 1.12-1.20); the same with each weight copied in the layout its one-row product streams
fastest, the reference entry (solutions/lab13), 1.50-1.57x (lower ends 1.43-1.50, busy machine included). A
step of this model streams 19 MB of fp32 weights through one-row products, about 70% of the reference's time:
speculative decoding with tiny-draft on its forward measured no better (verifying 2-5 positions costs 1.3-1.7x
one here). An independent solve from the student edition reached 1.68x (1.61-1.75) the same way. Kept here,
not in `capstone` (which ships to students): it maps the search.

Part B. The attention pairs of the recompute and the cached loop (with or without a sliding window), counted
here forward by forward from each forward's mask, against the prediction.
"""
import math
import statistics
import time

import torch
import torch.nn.functional as F

from course_grading.judging import Judge, Get, call, ref
from course_lib.capstone import (BPB_BOUND, PROJECT_POINTS, RATIO_FLOOR, RATIO_FULL, model_logits,
                                 prompt_stream, speed_points, speedup_interval, state_digest)
from course_lib.checks import check_equal
from course_lib.kvcache import ContiguousCache
from course_lib.models import load
from course_lib.models.corpus import load_split

judge = Judge(references={"speed_tests": [], "predict_positions_tests": []}, clean=True)

MODEL, PROMPT_LEN, NEW_TOKENS, THREADS = "tiny", 64, 16, 1   # the lab's CPU sizes; one thread each side
CHECKS = 2                           # untimed prompts first: they warm both kernels up
MIN_ROUNDS, MAX_ROUNDS = 6, 30       # timed rounds: at least MIN, then until the interval is narrow enough
HALF_WIDTH = 0.05                    # ... its half-width in log(speed-up) (about +-5%), or MAX rounds
WINDOW, WINDOWS = 256, 6             # lossy entries: held-out windows scored for bits per byte
TIE = 1e-3                           # a lossy entry's token may trail lossy_model's top logit by this much
FLAG_UNDER = 1e-3                    # an entry call that used under 1 ms of CPU
FLAG_BACKGROUND = 0.05               # the entry's CPU while the baseline ran, as a share of the baseline's
# the noise bands below were measured on 2 cores: the blank release against its own baseline reached a max/min
# per-round ratio of 2.6x and one baseline round 2.05x its median while the whole test suite ran (baseline: the
# recompute loop), 2.74x and 1.44x in 20 judgings beside a CPU-bound and a memory-bound loop (the cached loop)
FLAG_SPREAD = 5.0                    # max/min per-round ratio beyond this: more than the noise
FLAG_BASELINE = 3.0                  # a baseline round this far (x or /) from the median baseline round
FLAG_WALL = 0.5                      # the wall speed-up under this share of the CPU one
FLAG_AGREEMENT = 0.5                 # a lossy entry's tokens: the model's own top-1 on fewer than this share

RUN = "lib:course_lib.capstone.run_entry"

_GRADER: dict = {}


def grader_model():
    """The grader's own copy of the model and its tokenizer (loaded once per process)."""
    if "model" not in _GRADER:
        model, tok = load(MODEL, device="cpu", verbose=False)
        _GRADER.update(model=model.eval(), tokenizer=tok, digest=state_digest(model))
    return _GRADER["model"], _GRADER["tokenizer"], _GRADER["digest"]


def stale_outputs(model, prompts, n):
    """The known wrong answer: one KV cache for every call, never emptied (None where it fails)."""
    cache, outs = ContiguousCache(), []
    with torch.inference_mode():
        for p in prompts:
            try:
                x, out = p.view(1, -1), []
                for _ in range(n):
                    tok = model(x, cache=cache)[0, -1].argmax()
                    out.append(int(tok))
                    x = tok.view(1, 1)
                outs.append(out)
            except Exception:  # noqa: BLE001 - its cache outgrows the model's context
                outs.append(None)
    return outs


def thresholds():
    """(points, the lower end of the speed-up's interval that earns them) for each half point of the scale."""
    out = []
    for k in range(1, int(PROJECT_POINTS * 2) + 1):
        pts = k / 2
        lo, hi = RATIO_FLOOR, 10 * RATIO_FULL
        for _ in range(60):                    # the smallest ratio speed_points gives pts for (it is monotone)
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if speed_points(mid) >= pts else (mid, hi)
        out.append((pts, hi))
    return out


def heldout_windows(tokenizer) -> list[tuple[list[int], int]]:
    """(token ids, UTF-8 bytes of the text they cover) of `WINDOWS` held-out texts: EOS then the text's first
    `WINDOW` tokens, within the model's context (512)."""
    eos, out = tokenizer.eos_token_id, []
    for text in load_split("heldout", max_files=WINDOWS + 4):
        ids = tokenizer(text[:5 * WINDOW], add_special_tokens=False)["input_ids"][:WINDOW]  # under 512: no warning
        if len(ids) == WINDOW:
            out.append(([eos] + ids, len(tokenizer.decode(ids).encode("utf-8"))))
        if len(out) == WINDOWS:
            break
    return out


def nll_nats(logits: torch.Tensor, ids: list[int]) -> float:
    """The summed next-token loss of `ids` under `logits` ([len(ids), vocab]: each position's next token)."""
    return F.cross_entropy(torch.as_tensor(logits, dtype=torch.float32)[:-1], torch.tensor(ids[1:]),
                           reduction="sum").item()


def snapshot(t):
    return time.perf_counter(), t.cpu("entry"), t.cpu("clean")


def spent(later, earlier):
    """Seconds between two clock readings (None where the clock could not be read)."""
    return None if later is None or earlier is None else later - earlier


def request_cpu(t) -> float | None:
    """The CPU seconds one request costs the clean kernel by itself (the median of three that do nothing): in
    every timed call, on both sides; the flag for an entry call that did no work is counted above it."""
    costs = []
    for _ in range(3):
        c0 = t.cpu("clean")
        t.run([call("lib:torch.get_num_threads", send=False)], where="clean")
        costs.append(spent(t.cpu("clean"), c0))
    return None if None in costs else statistics.median(costs)


@judge.part("speed_tests", groups={"speed": 1, "correct": 0})
def speed(t):
    """Correctness gates the speed points: each half point is a case that passes when the entry is correct and
    the lower end of its speed-up's interval reaches that half point's threshold."""
    model, tokenizer, digest = grader_model()
    record = {"correct": False, "problem": "", "lossy": False, "rounds": 0, "ratio": None, "low": None,
              "high": None, "wall_ratio": None, "points": 0.0, "max_points": PROJECT_POINTS, "flags": [],
              "clock": t.clock_kind("entry")}
    t.record = record
    problems, flags = [], record["flags"]
    load_model = [call("lib:torch.set_num_threads", THREADS, send=False),
                  call("lib:course_lib.models.load", MODEL, device="cpu", verbose=False, store="loaded", send=False),
                  call("$loaded.__getitem__", 0, store="model", send=False)]
    for o in t.run(load_model + [call("lib:course_lib.capstone.baseline_build", ref("model"), store="base",
                                      send=False)], where="clean"):
        o.get()                                  # the grader's own kernel: a failure here is the judge's
    setup = t.run(load_model + [call("build", ref("model"), store="fn", send=False), Get("$fn.lossy_model")])
    with t.case("build(model) returns a generate_fn", group="correct"):
        for o in setup[:4]:
            o.get()
    if not t.cases[-1].passed:
        problems.append(t.cases[-1].message)
    lossy = setup[4].ok                          # generate_fn.lossy_model exists
    record["lossy"] = lossy
    stream = prompt_stream(tokenizer, PROMPT_LEN, seed=t.seed % 2**32, split="heldout")
    prompts, outputs, references, rounds = [], [], [], []
    if not problems:
        if lossy:
            setup = t.run([call("$fn.lossy_model.eval", store="lossy", send=False)])
            with t.case("generate_fn.lossy_model is a model (it has .eval())", group="correct"):
                setup[0].get()
            if not t.cases[-1].passed:
                problems.append(t.cases[-1].message)
    if not problems:
        overhead = request_cpu(t)
        record["request_ms"] = None if overhead is None else round(1e3 * overhead, 3)
        for k in range(CHECKS):                  # the checks: they also warm both kernels up
            p = next(stream)
            prompts.append(p)
            outputs.append(t.run([call(RUN, ref("fn"), p, NEW_TOKENS)])[0])
            references.append(t.run([call(RUN, ref("base"), p, NEW_TOKENS)], where="clean")[0])
        for r in range(MAX_ROUNDS):              # the timed rounds: a new prompt, drawn now, for both
            if r >= MIN_ROUNDS and narrow(rounds):
                break
            p = next(stream)
            prompts.append(p)
            marks = [snapshot(t)]
            order = ("clean", "entry") if r % 2 == 0 else ("entry", "clean")
            for where in order:
                o = t.run([call(RUN, ref("fn" if where == "entry" else "base"), p, NEW_TOKENS)], where=where)[0]
                marks.append(snapshot(t))
                (outputs if where == "entry" else references).append(o)
            e, b = (1, 2) if order[0] == "entry" else (2, 1)   # the marks after the entry's, the baseline's call
            rounds.append({"entry_cpu": spent(marks[2][1], marks[0][1]), "base_cpu": spent(marks[2][2], marks[0][2]),
                           "entry_wall": marks[e][0] - marks[e - 1][0], "base_wall": marks[b][0] - marks[b - 1][0],
                           "entry_own": spent(marks[e][1], marks[e - 1][1]),
                           "background": spent(marks[b][1], marks[b - 1][1])})
    expected = [o.get() for o in references]     # the baseline's tokens, from the clean kernel: the grader's own
    got = []
    for o in outputs:
        try:
            got.append(o.get())
        except Exception as e:  # noqa: BLE001 - judged in the cases below
            got.append(e)
    if lossy and outputs:
        expected = lossy_reference(t, tokenizer, model, prompts, got, expected, record, flags)
    stale: list = []
    for label, ks in ((f"your tokens on the {CHECKS} check prompts", range(min(CHECKS, len(got)))),
                      ("your tokens on every timed prompt", range(CHECKS, len(got)))):
        if not ks:
            continue
        with t.case(label, group="correct"):     # one case per kind: the rounds' count follows the noise
            wrong = 0
            for k in ks:
                if isinstance(expected[k], Exception):
                    raise expected[k]
                if isinstance(got[k], Exception):
                    # a cache kept across calls outgrows the context after enough prompts: the same failure
                    # at the same prompt as the known wrong answer, after the same tokens, is that mistake
                    if not stale and not lossy:
                        stale = stale_outputs(model, prompts, NEW_TOKENS)
                    if stale and stale[k] is None and all(got[i] == stale[i] for i in range(k)):
                        t.expect(False, f"your generate_fn raised on prompt {k + 1} ({type(got[k]).__name__}: "
                                        f"{got[k]}), as one KV cache kept across calls does: "
                                        + t.mistake("state_between_calls"))
                    raise got[k]
                wrong += got[k] != expected[k]
            for k in ks:
                if got[k] != expected[k]:
                    if not stale and not lossy:
                        stale = stale_outputs(model, prompts, NEW_TOKENS)
                    check_equal(got[k], expected[k], f"your tokens on prompt {k + 1} (of {len(got)}; {wrong} "
                                                     "differ)", mistakes={t.mistake("state_between_calls"): stale[k]}
                                if stale else None)
    if outputs:
        after = t.run([call("lib:course_lib.capstone.state_digest", ref("model"))])
        with t.case("the model is unchanged (weights and buffers)", group="correct"):
            t.expect(after[0].get() == digest, "build or generate_fn changed the model's weights or buffers (copy "
                                               "the model to change it)")
    problems += [c.message for c in t.cases if c.group == "correct" and not c.passed and c.message not in problems]
    correct = not problems
    points, speed_up = 0.0, None
    if rounds and all(None not in (x["entry_cpu"], x["base_cpu"], x["entry_own"], x["background"])
                      for x in rounds):
        ratios = [x["base_cpu"] / max(x["entry_cpu"], FLAG_UNDER) for x in rounds]
        speed_up = speedup_interval(ratios)
        walls = speedup_interval([x["base_wall"] / max(x["entry_wall"], 1e-6) for x in rounds])
        points = speed_points(speed_up.low) if correct else 0.0
        record.update(rounds=speed_up.n, ratio=round(speed_up.estimate, 4), low=round(speed_up.low, 4),
                      high=round(speed_up.high, 4), wall_ratio=round(walls.estimate, 4),
                      min=round(min(ratios), 4), max=round(max(ratios), 4),
                      baseline_ms=round(1e3 * statistics.median(x["base_cpu"] for x in rounds), 3),
                      entry_ms=round(1e3 * statistics.median(x["entry_cpu"] for x in rounds), 3))
        record["per_round_ms"] = [{k: round(1e3 * v, 2) for k, v in x.items()} for x in rounds]   # for a review
        flags += anomalies(rounds, ratios, speed_up, walls, overhead or 0.0)
    elif rounds:
        flags.append("no CPU clock: the kernels' CPU time could not be read (no cgroup, no /proc)")
    record.update(correct=correct, problem="; ".join(problems)[:300], points=points)
    for pts, need in thresholds():
        label = f"speed point {pts:g}: the lower end of your speed-up's 90% interval reaches {need:.2f}x"
        with t.case(label, group="speed"):
            t.expect(correct, f"{label}: not earned: the entry is not correct")
            t.expect(speed_up is not None, f"{label}: not earned: no timed round")
            t.expect(points >= pts, f"{label}: not earned: {speed_up}")


def narrow(rounds) -> bool:
    """Is the speed-up's interval after these rounds narrow enough (`HALF_WIDTH`) to stop?"""
    try:
        s = speedup_interval([x["base_cpu"] / max(x["entry_cpu"], FLAG_UNDER) for x in rounds])
    except (TypeError, ValueError):
        return True                              # no CPU clock: the round count does not matter
    return math.log(s.high / s.estimate) <= HALF_WIDTH


def anomalies(rounds, ratios, speed_up, walls, overhead) -> list[str]:
    """Why a measurement needs a person's look (empty: none)."""
    out = []
    least = min(x["entry_own"] for x in rounds) - overhead
    if least < FLAG_UNDER:
        out.append(f"an entry call used {1e3 * max(least, 0):.2f} ms of CPU beyond the request's own "
                   f"({1e3 * overhead:.1f} ms): under {1e3 * FLAG_UNDER:g} ms, an answer not computed in the call?")
    bg = sum(x["background"] for x in rounds) / max(sum(x["base_cpu"] for x in rounds), 1e-9)
    if bg > FLAG_BACKGROUND:
        out.append(f"the entry's kernel used CPU while the baseline ran ({100 * bg:.0f}% of the baseline's): "
                   "work in the background (charged to the entry)")
    if max(ratios) / min(ratios) > FLAG_SPREAD:
        out.append(f"per-round speed-ups from {min(ratios):.2f}x to {max(ratios):.2f}x: more spread than the "
                   "machine's noise")
    med = statistics.median(x["base_cpu"] for x in rounds)
    far = [k + 1 for k, x in enumerate(rounds) if not med / FLAG_BASELINE <= x["base_cpu"] <= med * FLAG_BASELINE]
    if far:
        out.append(f"the baseline's CPU time in round(s) {', '.join(map(str, far[:5]))} is over {FLAG_BASELINE:g}x "
                   "from its median: something else ran on the machine, or in its kernel?")
    if walls.estimate < FLAG_WALL * speed_up.estimate:
        out.append(f"the wall-clock speed-up ({walls.estimate:.2f}x) is far below the CPU one "
                   f"({speed_up.estimate:.2f}x): the entry waits for something the CPU clock does not see")
    return out


def lossy_reference(t, tokenizer, model, prompts, got, expected, record, flags):
    """A lossy entry's reference tokens and its quality check (see the module's docstring): lossy_model's
    logits, asked of the entry's kernel, on held-out windows (bits per byte, computed here beside the
    model's own) and on each prompt followed by the entry's tokens (lossy_model's greedy tokens, taken
    here: the entry's token where it is within `TIE` of the top logit)."""
    windows = heldout_windows(tokenizer)
    mine = sum(nll_nats(model_logits(model, ids), ids) for ids, _ in windows)
    nbytes = sum(b for _, b in windows)
    bpb_model = mine / math.log(2) / nbytes
    theirs = 0.0
    with t.case(f"lossy_model's held-out bits per byte within {BPB_BOUND} of the model's", group="correct"):
        for ids, _ in windows:                   # one request per window: a reply holds one window's logits
            logits = t.run([call("lib:course_lib.capstone.model_logits", ref("lossy"), ids)])[0].get()
            t.expect(tuple(logits.shape) == (len(ids), model.config.vocab_size),
                     f"lossy_model's logits have shape {tuple(logits.shape)}, expected ({len(ids)}, "
                     f"{model.config.vocab_size})")
            theirs += nll_nats(logits, ids)
        bpb = theirs / math.log(2) / nbytes
        record["bpb"], record["bpb_model"] = round(bpb, 4), round(bpb_model, 4)
        t.expect(bpb <= bpb_model + BPB_BOUND, f"lossy_model's held-out bits per byte {bpb:.4f} exceed the "
                                               f"model's {bpb_model:.4f} by more than {BPB_BOUND}")
    reference, agree, total = [], 0, 0
    for p, g, want in zip(prompts, got, expected):
        if not (isinstance(g, list) and len(g) == NEW_TOKENS):
            reference.append(want)
            continue
        seq = p.tolist() + g[:-1]
        logits = t.run([call("lib:course_lib.capstone.model_logits", ref("lossy"), seq)])[0]
        try:
            lg = torch.as_tensor(logits.get(), dtype=torch.float32)[len(p) - 1:]
            if tuple(lg.shape) != (len(g), model.config.vocab_size):
                raise ValueError(f"logits of shape {tuple(lg.shape)} for {len(g)} positions")
        except Exception as e:  # noqa: BLE001 - the token cases say it: the tokens cannot be checked
            reference.append(AssertionError(f"lossy_model's logits on this prompt and your tokens could not be "
                                          f"had: {type(e).__name__}: {str(e)[:200]}"))
            continue
        top = lg.argmax(-1).tolist()
        reference.append([tok if lg[i, tok] >= lg[i].max() - TIE else top[i] for i, tok in enumerate(g)])
        agree += sum(int(a == b) for a, b in zip(g, model_logits(model, seq)[len(p) - 1:].argmax(-1).tolist()))
        total += len(g)
    if total and agree / total < FLAG_AGREEMENT:
        flags.append(f"the model's own top-1 token agrees with the lossy entry's on {100 * agree / total:.0f}% of "
                     "its tokens: is lossy_model what generate_fn decodes?")
    record["agreement"] = round(agree / total, 4) if total else None
    return reference


@judge.part("predict_positions_tests", groups={"values": 3, "errors": 1})
def predict_positions(t):
    # edge grid: one token (one forward for both loops), a one-token prompt, a window of 1 (each query itself),
    # a window that never binds, one that binds inside the prompt, one that binds only during decoding
    grid = [(4, 3, None), (64, 1, None), (1, 1, None), (1, 40, None), (80, 40, None), (7, 2, 1), (10, 5, 1),
            (10, 5, 100), (10, 5, 14), (64, 16, 32), (20, 30, 25), (1, 1, 1), (256, 64, 128)]
    for _ in range(10):
        T, n = t.rng.randint(1, 120), t.rng.randint(1, 60)
        grid.append((T, n, t.rng.choice([None, t.rng.randint(1, T + n), t.rng.randint(1, 16)])))
    for T, n, w in grid:
        want = (counted_pairs(T, n, w, cached=False), counted_pairs(T, n, w, cached=True))
        what = f"predict_attention_pairs({T}, {n}, window={w})"
        with t.case(what, group="values"):
            got = t.call("predict_attention_pairs", T, n, w)
            t.expect(isinstance(got, (tuple, list)) and len(got) == 2, f"{what}: expected two ints, got {got!r}")
            check_equal(tuple(got), want, what, mistakes={
                t.mistake("last_token_fed"): (want[0], counted_pairs(T, n + 1, w, cached=True)),
                t.mistake("no_causal_mask"): (counted_pairs(T, n, w, cached=False, causal=False),
                                              counted_pairs(T, n, w, cached=True, causal=False)),
                t.mistake("window_ignored"): (counted_pairs(T, n, None, cached=False),
                                              counted_pairs(T, n, None, cached=True))})
    for bad in ((0, 3), (4, 0), (4.0, 3), (4, True), (-1, 2), (4, 3, 0), (4, 3, 2.5), (4, 3, True)):
        with t.case(f"predict_attention_pairs{bad}", group="errors"):
            t.raises(t.outcome("predict_attention_pairs", *bad), "ValueError", what=f"predict_attention_pairs{bad}")


def counted_pairs(T, n, window, cached, causal=True):
    """The (query, key) pairs the loop scores, counted forward by forward from the mask of each forward: the
    recompute loop runs positions 0..T+i-1 at step i; the cached loop runs the prompt, then one position at a
    time up to T + n - 2 (the last token is never fed). `causal=False` is the planted mistake: every query
    against every key of the forward and the cache."""
    chunks = ([(0, T + i) for i in range(n)] if not cached else
              [(0, T)] + [(T + i, T + i + 1) for i in range(n - 1)])
    total = 0
    for start, end in chunks:
        q = torch.arange(start, end)[:, None]
        k = torch.arange(0, end)[None, :]
        mask = (k <= q) if causal else torch.ones(end - start, end, dtype=torch.bool)
        if window is not None:
            mask &= (q - k < window) if causal else (end - 1 - k < window)
        total += int(mask.sum())
    return total


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("the KV cache made once in build and kept from one call to the next (the next prompt attends to the "
         "previous one's keys and values): fast, but its tokens differ, so no speed points; Part B right",
         {"build_answer": '''\
def build(model):
    device = next(model.parameters()).device
    cache = ContiguousCache()

    def generate_fn(prompt_ids, max_new_tokens):
        x, out = prompt_ids.to(device).view(1, -1), []
        for _ in range(max_new_tokens):
            tok = model(x, cache=cache)[0, -1].argmax()
            out.append(tok)
            x = tok.view(1, 1)
        return torch.stack(out).cpu()
    return generate_fn
'''},
         ["state_between_calls"]),
        ("the cached pairs count the last new token as fed (one query too many)",
         {"predict_positions_answer": solution_with("lab13", "predict_positions_answer", {
             "    cached = pairs(prompt_len + new_tokens - 1)": "    cached = pairs(prompt_len + new_tokens)"})},
         ["last_token_fed"]),
        ("the window left out of the pairs",
         {"predict_positions_answer": solution_with("lab13", "predict_positions_answer", {
             "        if window is None or window >= n:": "        if True:"})},
         ["window_ignored"]),
        ("every query scored against every key of its forward (no causal mask)",
         {"predict_positions_answer": '''\
def predict_attention_pairs(prompt_len, new_tokens, window=None):
    for name, v in (("prompt_len", prompt_len), ("new_tokens", new_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or an integer >= 1, got {window!r}")
    w = lambda n: n if window is None else min(n, window)
    recompute = sum((prompt_len + i) * w(prompt_len + i) for i in range(new_tokens))
    cached = prompt_len * w(prompt_len) + sum(w(j + 1) for j in range(prompt_len, prompt_len + new_tokens - 1))
    return recompute, cached
'''},
         ["no_causal_mask"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_report": {"points": 2, "rubric": [
        (0.5, "Method line states what the entry does, concretely (not the template)"),
        (1, "reports their own speed-up over the cached loop with its interval and what each change gave on its "
            "own, and explains it from where the cached loop's time goes (the prefill it keeps; in a step, the "
            "weights read for one position against every operator's fixed cost) and which part the changes cut"),
        (0.5, "reports what did not work, with a measured or reasoned cause"),
    ]},
}
