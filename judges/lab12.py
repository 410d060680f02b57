"""Lab 12's judge: a decode step without a graph break, the attribution table, the roofline's step time.

Part A's models are drawn here: the kernel builds the course's `LlamaForCausalLM` and a `StaticCache` with library
ops and loads the weights drawn here; the grader holds the same model and computes the provided step's tokens and
the logits of the step after (what a cache advanced exactly once gives) in its own process. The graph breaks are
what `course_lib.compile_tools.explain_breaks` (dynamo) reports on the student's step in the kernel, and the
known wrong answer's count (the `.tolist()` moved, not removed) is explained here on the grader's copy. Parts B
and C are judged against `course_lib.capstone.attribution_table` and `course_lib.perf.roofline.decode_step`.
"""
import math

import torch

from course_grading.judging import Judge, call, notebook, ref
from course_lib.capstone import attribution_table as ref_table
from course_lib.checks import check_close, check_equal
from course_lib.compile_tools import explain_breaks
from course_lib.kvcache import StaticCache
from course_lib.models import LlamaForCausalLM, as_config
from course_lib.perf.hardware import DeviceSpec, get_gpu, gpu_names
from course_lib.perf.roofline import decode_step as ref_decode_step

judge = Judge(references={
    "attribution_tests": ["course_lib.capstone.attribution_table"],
    "predict_step_tests": ["course_lib.perf.roofline.decode_step", "course_lib.perf.roofline.min_decode_latency"],
})

CACHE_LEN = 48


def shape_of(x):
    return tuple(getattr(x, "shape", ()))


# ---------------------------------------------------------------------------------------------------
# Part A

def config(vocab):
    """The lab's tiny model's shape (one layer, grouped-query attention), with `vocab` tokens."""
    return dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, max_position_embeddings=64)


def drawn_model(t, vocab):
    """The grader's copy of a model with weights drawn here (the library's init is left out: it would draw from
    torch's global generator)."""
    g = t.torch_generator()
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(as_config(config(vocab))).eval().requires_grad_(False)
    for _, p in model.named_parameters():
        p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if p.dim() == 1 else
                torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return model


def model_ops(model, vocab):
    """Ops that build the same model in the kernel as $m (no autograd: a decode step, as under inference_mode)."""
    return [call("lib:course_lib.models.as_config", config(vocab), store="cfg", send=False),
            call("lib:course_lib.models.LlamaForCausalLM", ref("cfg"), store="m", send=False),
            call("$m.load_state_dict", model.state_dict(), send=False), call("$m.eval", send=False),
            call("$m.requires_grad_", False, send=False)]


def prefill_ops(prompts, cache):
    """A StaticCache $<cache> holding `prompts`, in the kernel."""
    return [call("lib:course_lib.kvcache.StaticCache.for_model", ref("m"), prompts.shape[0], CACHE_LEN, store=cache,
                 send=False),
            call("$m", prompts, cache=ref(cache), send=False)]


@torch.no_grad()
def reference_steps(model, prompts):
    """Here: the logits of the provided step (after the prompts), its tokens, and the logits of the step after it
    (from those tokens, on the cache the provided step advanced once)."""
    cache = StaticCache.for_model(model, prompts.shape[0], CACHE_LEN)
    model(prompts, cache=cache)
    logits = model(prompts[:, -1:], cache=cache)[:, -1, :]
    tokens = logits.argmax(dim=-1, keepdim=True)
    return logits, tokens, model(tokens, cache=cache)[:, -1, :]


def moved_break(model, tok, cache):
    """The known wrong answer (host_sync): the argmax stays a tensor, then .tolist() leaves the graph."""
    logits = model(tok, cache=cache)[:, -1, :]
    return torch.tensor(logits.argmax(dim=-1).tolist(), device=tok.device).unsqueeze(-1)


@torch.no_grad()
def planted_breaks(model, prompts) -> int:
    cache = StaticCache.for_model(model, prompts.shape[0], CACHE_LEN)
    model(prompts, cache=cache)
    return explain_breaks(moved_break, model, prompts[:, -1:], cache)["graph_break_count"]


def check_tokens(t, got, logits, what):
    """`got` is the provided step's tokens: [B, 1] int64, each the argmax of its row (a near-tie within float32
    rounding of another process's sums may go either way)."""
    want = logits.argmax(dim=-1, keepdim=True)
    t.expect(isinstance(got, torch.Tensor), f"{what}: decode_step must return a tensor, got {got!r}"[:300])
    t.expect(shape_of(got) == shape_of(want), f"{what}: expected shape {shape_of(want)}, got {shape_of(got)}")
    check_equal(got.dtype, torch.int64, f"{what}: the dtype of decode_step's result")
    picked = logits.gather(1, got.clamp(0, logits.shape[1] - 1))
    best = logits.max(dim=-1, keepdim=True).values
    if not (bool(((got >= 0) & (got < logits.shape[1])).all()) and bool((picked >= best - 1e-5).all())):
        check_equal(got, want, f"{what}: the next tokens")


@judge.part("step_tests", groups={"values": 2, "graph": 1, "errors": 1})
def step(t):
    visible = [torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[7, 8, 9, 10, 11]])]
    models = [(128, visible)]          # (vocab, prompts): the visible prompts, then drawn models and batches
    for vocab in (t.rng.choice([64, 128, 200]) for _ in range(3)):
        g = t.torch_generator()
        prompts = [torch.randint(0, vocab, (t.rng.randint(1, 4), t.rng.randint(1, 9)), generator=g)
                   for _ in range(2)]
        models.append((vocab, prompts))
    for k, (vocab, prompts) in enumerate(models):
        model = drawn_model(t, vocab)
        graph = visible[0] if k == 0 else prompts[0]
        if k == 0:                      # the known wrong answer's breaks: the same on every model of this shape
            planted = planted_breaks(model, graph)
        steps = [reference_steps(model, p) for p in prompts]
        ops = model_ops(model, vocab)
        index = []
        for j, (p, (_, tokens, _)) in enumerate(zip(prompts, steps)):
            index.append(len(ops) + 2)
            ops += prefill_ops(p, f"c{j}") + [call("decode_step", ref("m"), p[:, -1:], ref(f"c{j}")),
                                              call("$m", tokens, cache=ref(f"c{j}"))]
        ops += prefill_ops(graph, "g") + [call("lib:course_lib.compile_tools.explain_breaks", notebook("decode_step"),
                                               ref("m"), graph[:, -1:], ref("g"))]
        got = t.run(ops)
        label = "the visible prompts" if k == 0 else "a drawn model"
        for p, (logits, _, after), i in zip(prompts, steps, index):
            what = f"decode_step, {label} (vocab {vocab}), batch {p.shape[0]}, prompt length {p.shape[1]}"
            with t.case(what, group="values"):
                check_tokens(t, got[i].get(), logits, what)
                check_close(got[i + 1].get()[:, -1, :], after, f"{what}: the logits of the step after yours (did "
                            "decode_step call the model once, through the cache?)", rtol=1e-4, atol=1e-4)
        what = f"graph breaks in decode_step, {label} (vocab {vocab}), batch {graph.shape[0]}"
        with t.case(what, group="graph"):
            report = got[-1].get()
            t.expect(isinstance(report, dict), f"{what}: explain gave {report!r}"[:300])
            check_equal(report.get("graph_break_count"), 0, f"{what} ({'; '.join(report.get('break_reasons', []))})",
                        mistakes={t.mistake("host_sync"): planted})
    # a bad tok raises before the model runs: the cache is where the prompts left it (on a model drawn afresh)
    vocab, prompts = models[1]
    model, p = drawn_model(t, vocab), prompts[0]
    logits, _, _ = reference_steps(model, p)
    bad = [("tok of 1 dimension [B]", p[:, -1]), ("tok [B, 2]", p[:, -2:] if p.shape[1] > 1 else p.repeat(1, 2)),
           ("tok of 3 dimensions [B, 1, 1]", p[:, -1:, None])]
    ops, index = model_ops(model, vocab), []
    for j, (_, tok) in enumerate(bad):
        index.append(len(ops) + 2)
        ops += prefill_ops(p, f"c{j}") + [call("decode_step", ref("m"), tok, ref(f"c{j}")),
                                          call("$m", p[:, -1:], cache=ref(f"c{j}"))]
    got = t.run(ops)
    for (what, _), i in zip(bad, index):
        what = f"decode_step with {what}"
        with t.case(what, group="errors"):
            t.raises(got[i], "ValueError", what=what)
            check_close(got[i + 1].get()[:, -1, :], logits, f"{what}: the logits of the next step (the cache must be "
                        "unchanged: raise before the model runs)", rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------
# Part B

def linear_shares(tps):
    total = tps[-1] / tps[0]
    return [0.0] + [0.0 if total == 1 else (b / a - 1) / (total - 1) for a, b in zip(tps, tps[1:])]


@judge.part("attribution_tests", groups={"values": 3, "errors": 1})
def attribution(t):
    grid = [([("no cache", 10.0), ("KV cache", 40.0), ("compile", 50.0), ("speculative", 40.0), ("batching", 400.0)],
             2.0),
            ([("a", 5.0), ("b", 10.0), ("c", 5.0)], 1.0),                       # a total speed-up of exactly 1
            ([("only", 42.0)], 3.0), ([("fast", 100.0), ("slow", 50.0)], 1.5), ([("a", 80.0), ("b", 175.0)], 0.0),
            ([("a", 10), ("b", 40), ("c", 35)], 2.5),                           # integer tokens/s
            ([("a", 1e-3), ("b", 1e6)], 0.1),
            ([(f"step{i}", x) for i, x in enumerate([80.0, 175.0, 320.0, 200.0, 560.0, 559.0, 1200.0, 90.0])], 0.1)]
    drawn = []
    for _ in range(200):
        n = t.rng.randint(1, 8)
        drawn.append(([(f"step{i}", t.rng.uniform(0.5, 5000)) for i in range(n)], t.rng.uniform(0, 10)))
    cases = grid + drawn
    for (timings, price), o in zip(cases, t.run([call("attribution", timings, price) for timings, price in cases])):
        names, tps = [n for n, _ in timings], [x for _, x in timings]
        want = ref_table(names, [1 / x for x in tps], price_per_hour=price)
        what = f"attribution({timings}, {price!r})"
        with t.case(what, group="values"):
            rows = o.get()
            t.expect(isinstance(rows, list) and len(rows) == len(timings) and all(isinstance(r, dict) for r in rows),
                     f"{what}: expected a list of {len(timings)} dicts, got {rows!r}"[:400])
            check_equal([r.get("step") for r in rows], names, f"{what}: the step names, in order")
            check_close([r.get("tokens_per_s") for r in rows], tps, f"{what}: 'tokens_per_s'")
            for key in ("speedup", "share", "usd_per_1M"):
                check_close([r.get(key) for r in rows], [r[key] for r in want], f"{what}: {key!r}", rtol=1e-7,
                            atol=1e-12, mistakes={t.mistake("linear_shares"): linear_shares(tps)} if key == "share"
                            else None)
    bad = [([], 1.0), ([("a", 1.0), ("b", 0.0)], 1.0), ([("a", 1.0), ("b", -3.0)], 1.0),
           ([("a", 1.0), ("b", float("nan"))], 1.0), ([("a", float("inf")), ("b", 1.0)], 1.0),
           ([("a", 1.0), ("b", "fast")], 1.0), ([("a", 1.0)], -1.0)]
    for (timings, price), o in zip(bad, t.run([call("attribution", timings, price) for timings, price in bad])):
        what = f"attribution({timings}, {price!r})"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what)


# ---------------------------------------------------------------------------------------------------
# Part C

def ref_step(params, bpp, batch, kv, bandwidth, peak):
    device = DeviceSpec("the grader's device", bandwidth_gbs=bandwidth / 1e9, peak_tflops={"fp16": peak / 1e12})
    return ref_decode_step(params, device, bpp, batch=batch, kv_bytes=kv)


@judge.part("predict_step_tests", groups={"values": 3, "errors": 1})
def predict_step(t):
    a100 = (2.039e12, 312e12)
    grid = [(6.74e9, 2, 1, 0, *a100), (6.74e9, 2, 512, 0, *a100), (6.74e9, 2, 8, 8 * 2**30, *a100),   # the visible
            (1e9, 2, 1, 0, 1e12, 1e12),                             # memory and compute times exactly equal
            (7e9, 0.5, 1, 0, 3.35e12, 989e12), (1e8, 4, 1024, 5e10, 1e11, 1e13), (70e9, 1, 64, 1e11, 8e12, 2e15),
            (1, 1, 1, 0, 1, 1)]
    drawn = []
    for _ in range(60):
        device = get_gpu(t.rng.choice(gpu_names()))
        dtype = t.rng.choice(["fp16", "bf16", "int8", "fp32"])
        params, batch = t.rng.uniform(1e8, 1e11), t.rng.choice([1, 2, 8, 64, 256, 1024])
        kv = t.rng.choice([0.0, t.rng.uniform(0, 1e11)])
        step = ref_decode_step(params, device, dtype, batch=batch, kv_bytes=kv)
        drawn.append((params, step.weight_bytes / params, batch, kv, step.bandwidth, step.peak))
    cases = grid + drawn
    for args, o in zip(cases, t.run([call("predict_decode_step_s", *args) for args in cases])):
        want = ref_step(*args)
        what = f"predict_decode_step_s({', '.join(f'{a:.4g}' for a in args)})"
        with t.case(what, group="values"):
            check_close(o.get(), want.time, what, rtol=1e-9,
                        mistakes={t.mistake("sum_not_max"): want.memory_s + want.compute_s})
    bad = [(0, 2, 1, 0, 1e12, 1e14), (-1e9, 2, 1, 0, 1e12, 1e14), (1e9, 0, 1, 0, 1e12, 1e14),
           (1e9, 2, 0, 0, 1e12, 1e14), (1e9, 2, 1.5, 0, 1e12, 1e14), (1e9, 2, 2.0, 0, 1e12, 1e14),
           (1e9, 2, 1, -1, 1e12, 1e14), (1e9, 2, 1, 0, 0, 1e14), (1e9, 2, 1, 0, 1e12, 0), (1e9, 2, 1, 0, 1e12, -1e14)]
    for args, o in zip(bad, t.run([call("predict_decode_step_s", *args) for args in bad])):
        what = f"predict_decode_step_s{args}"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what)


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("the graph break moved, not removed: the argmax stays a tensor but .tolist() still leaves the graph",
         {"step_answer": solution_with("lab12", "step_answer", {
             "    return logits.argmax(dim=-1, keepdim=True)            # [B, 1] int64, stays on the device":
             "    return torch.tensor(logits.argmax(dim=-1).tolist(), device=tok.device).unsqueeze(-1)"})},
         ["host_sync"]),
        ("shares computed linearly, (speedup - 1) / (S - 1), instead of on a log scale; the roofline's memory and "
         "compute times added instead of their max",
         {"attribution_answer": solution_with("lab12", "attribution_answer", {
             "math.log(speedup) / math.log(total)": "(speedup - 1) / (total - 1)"}),
          "predict_step_answer": solution_with("lab12", "predict_step_answer", {
              "    return max(memory_s, compute_s)": "    return memory_s + compute_s"})},
         ["linear_shares", "sum_not_max"]),
    ]
