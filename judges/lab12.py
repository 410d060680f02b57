"""Lab 12's judge: a decode step that compiles once, a profiler trace read, the attribution table, a decode step's
time from the roofline and the launches, and the rubric of the written part.

Part A: the kernel builds the course's `LlamaForCausalLM` from a shape and weights drawn here and exports the
student's step at a batch and a cache size drawn here (`course_lib.compile_tools.export_step`: dynamo's tracer,
one graph). Nothing the kernel computes about that graph is believed: the grader receives it as plain data, reads
it (`graph_report`: no op that reads a tensor's value on the host) and runs it op by op in its own process
(`run_exported`: aten ops only, the grader's own weights) at every position of prompts it draws, with garbage in the
unwritten slots, against the model's logits and the reference step's caches. Part B: traces the grader records in
its own process and trees of events it draws, read by the student's function and by the course's reader. Parts C
and D are judged against `course_lib.capstone.attribution_table` and `course_lib.perf.roofline.decode_step`.
"""
import dataclasses
import math

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from course_grading.judging import Judge, call, notebook, ref
from course_lib.capstone import attribution_table as ref_table
from course_lib.checks import check_close, check_equal
from course_lib.compile_tools import graph_report, run_exported, static_caches, trace_events
from course_lib.compile_tools import read_trace as ref_read_trace
from course_lib.compile_tools import static_decode_step as ref_static_step
from course_lib.kvcache import StaticCache
from course_lib.models import LlamaForCausalLM, as_config
from course_lib.perf.hardware import DeviceSpec, get_gpu, gpu_names
from course_lib.perf.roofline import decode_step as ref_decode_step

judge = Judge(references={
    "static_step_tests": ["course_lib.compile_tools.static_decode_step"],
    "trace_tests": ["course_lib.compile_tools.read_trace"],
    "attribution_tests": ["course_lib.capstone.attribution_table"],
    "predict_step_tests": ["course_lib.perf.roofline.decode_step", "course_lib.perf.roofline.min_decode_latency"],
})

# The written part, graded by the instructor: the rubric stays here, never in the student's notebook.
WRITTEN = {
    "written_trace": {"points": 2, "rubric": [
        (1, "From the student's own trace, with its numbers: the operator with the most self time and its share, "
            "and the top-level operators (kernels on a GPU) per token; and what that says: on a model this small "
            "most of the step is the fixed cost of many small operators (or launches), not the matmuls' arithmetic "
            "or bytes (an answer that only names the top op, or quotes no number, gets 0.5)."),
        (1, "The factor between the measured step and the Part D prediction, quoted, with a reason the student's "
            "numbers support: the roofline counts bytes and FLOPs, which are tiny here, and the per-operator "
            "(launch) cost dominates; operators cost more than the tiny add op_overhead times (matmuls, "
            "attention); and a remedy from Module 12 (fusion with torch.compile: fewer operators; CUDA graphs: one "
            "launch per step, which the static step of Part A allows). A generic 'overhead' with no link to the "
            "numbers gets 0.5."),
    ]},
}


def shape_of(x):
    return tuple(getattr(x, "shape", ()))


# ---------------------------------------------------------------------------------------------------
# Part A

VISIBLE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def drawn_config(rng):
    """A small model's shape: 1 to 3 layers, grouped-query attention or not, head_dim 4 to 16."""
    kv = rng.choice([1, 2])
    heads = kv * rng.choice([1, 2, 3])
    head_dim = rng.choice([4, 8, 16])
    hidden = rng.choice([16, 24, 32])
    return dict(vocab_size=rng.choice([64, 100, 160]), hidden_size=hidden, intermediate_size=rng.choice([32, 48, 64]),
                num_hidden_layers=rng.randint(1, 3), num_attention_heads=heads, num_key_value_heads=kv,
                head_dim=head_dim, max_position_embeddings=64)


def drawn_model(t, shape):
    """The grader's model with weights drawn here (the library's init is left out: it would draw from torch's
    global generator)."""
    g = t.torch_generator()
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(as_config(shape)).eval().requires_grad_(False)
    for _, p in model.named_parameters():
        p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if p.dim() == 1 else
                torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return model


def model_ops(model, shape):
    """Ops that build the same model in the kernel as $m."""
    return [call("lib:course_lib.models.as_config", shape, store="cfg", send=False),
            call("lib:course_lib.models.LlamaForCausalLM", ref("cfg"), store="m", send=False),
            call("$m.load_state_dict", model.state_dict(), send=False), call("$m.eval", send=False),
            call("$m.requires_grad_", False, send=False)]


@torch.no_grad()
def run_positions(step, model, prompts, max_len, fill):
    """`step` (a function of (tok, pos, k, v)) at every position of `prompts` from caches holding `fill`:
    the logits [B, T, V] and the caches after the last position."""
    k, v = static_caches(model, prompts.shape[0], max_len, fill=fill)
    out = []
    for p in range(prompts.shape[1]):
        logits, k, v = step(prompts[:, p:p + 1], torch.tensor(p), k, v)
        out.append(logits)
    return torch.stack(out, 1), k, v


@judge.part("static_step_tests", groups={"values": 3, "static": 1, "errors": 1})
def static_step(t):
    # (shape, batch, slots, prompt length, fill of the unwritten slots): the visible model, then an edge (batch 1,
    # every slot written) and drawn models
    cases = [(VISIBLE, 2, 8, 6, 1e3)]
    shape = drawn_config(t.rng)
    cases.append((shape, 1, (n := t.rng.randint(3, 7)), n, -1e3))
    for _ in range(2):
        slots = t.rng.randint(4, 12)
        cases.append((drawn_config(t.rng), t.rng.randint(1, 4), slots, t.rng.randint(2, slots),
                      t.rng.choice([50.0, -200.0, 1e3])))
    for k, (shape, batch, slots, length, fill) in enumerate(cases):
        model = drawn_model(t, shape)
        prompts = torch.randint(0, shape["vocab_size"], (batch, length), generator=t.torch_generator())
        label = "the visible model's shape" if k == 0 else "a drawn model"
        what = (f"static_step, {label} ({shape['num_hidden_layers']} layers, {shape['num_attention_heads']} heads, "
                f"{shape['num_key_value_heads']} KV heads, head_dim {shape['head_dim']}), batch {batch}, {slots} slots")
        out = t.run(model_ops(model, shape) + [call("lib:course_lib.compile_tools.export_step", notebook("static_step"),
                                                    ref("m"), batch, slots)])[-1]
        graph = None
        with t.case(f"{what}: exported as one static graph", group="static"):
            graph = out.get()
            report = graph_report(graph)
            t.expect(not report["data_dependent"], f"{what}: the exported graph reads a tensor's value on the host "
                     f"(ops {report['data_dependent'][:4]}): {t.mistake('int_position')}")
            t.expect(report["static"], f"{what}: the exported graph has shapes that are not fixed "
                     f"({report['symbolic'][:4]})")
        want = torch.stack([model(prompts)[:, p] for p in range(length)], 1)
        wrong, _, _ = run_positions(lambda *a: ref_static_step(model, *a, masked=False), model, prompts, slots, fill)
        _, k_want, v_want = run_positions(lambda *a: ref_static_step(model, *a), model, prompts, slots, fill)
        got_k = got_v = None
        with t.case(f"{what}: the logits at every position of {length} (unwritten slots hold {fill:g})",
                    group="values"):
            t.expect(isinstance(graph, dict), f"{what}: no graph to run (the export failed: {out.raised or out.error})")
            logits, got_k, got_v = run_positions(lambda *a: _three(run_exported(graph, model, *a), what), model,
                                                 prompts, slots, fill)
            t.expect(shape_of(logits) == shape_of(want), f"{what}: logits of shape {shape_of(logits)[::2]} per "
                     f"position, expected {shape_of(want)[::2]} ([B, V])")
            check_close(logits, want, f"{what}: the logits at positions 0..{length - 1}", rtol=1e-4, atol=1e-4,
                        mistakes={t.mistake("unmasked_slots"): wrong})
        with t.case(f"{what}: the caches after position {length - 1}", group="values"):
            t.expect(got_k is not None, f"{what}: no caches (the graph did not run)")
            check_close(got_k, k_want, f"{what}: k_cache (slots 0..{length - 1} written, the rest as given)",
                        rtol=1e-4, atol=1e-4)
            check_close(got_v, v_want, f"{what}: v_cache", rtol=1e-4, atol=1e-4)
    # bad input raises ValueError, called directly in the kernel
    shape, batch = cases[2][0], 2
    model = drawn_model(t, shape)
    L, KV, Dh = shape["num_hidden_layers"], shape["num_key_value_heads"], shape["head_dim"]
    kc = torch.zeros(L, batch, KV, 6, Dh)
    tok = torch.tensor([[1], [2]])
    bad = [("tok of shape [2]", tok[:, 0], torch.tensor(0), kc, kc), ("tok [2, 2]", tok.repeat(1, 2),
                                                                      torch.tensor(0), kc, kc),
           ("pos a Python int", tok, 0, kc, kc), ("pos of shape [1]", tok, torch.tensor([0]), kc, kc),
           ("k_cache with one layer too many", tok, torch.tensor(0), torch.zeros(L + 1, batch, KV, 6, Dh), kc),
           ("v_cache with head_dim + 1", tok, torch.tensor(0), kc, torch.zeros(L, batch, KV, 6, Dh + 1)),
           ("caches for batch 3, tok for 2", tok, torch.tensor(0), torch.zeros(L, 3, KV, 6, Dh),
            torch.zeros(L, 3, KV, 6, Dh))]
    outs = t.run(model_ops(model, shape) + [call("static_step", ref("m"), *args) for _, *args in bad])[-len(bad):]
    for (what, *_), o in zip(bad, outs):
        with t.case(f"static_step with {what}", group="errors"):
            t.raises(o, "ValueError", what=f"static_step with {what}")


def _three(outputs, what):
    if not (isinstance(outputs, list) and len(outputs) == 3):
        raise AssertionError(f"{what}: static_step must return (logits, k_cache, v_cache), the graph returns "
                             f"{len(outputs) if isinstance(outputs, list) else outputs!r} outputs")
    return outputs


# ---------------------------------------------------------------------------------------------------
# Part B

NAMES = ["aten::linear", "aten::addmm", "aten::mm", "aten::t", "aten::add", "aten::mul", "aten::view", "aten::copy_",
         "aten::scaled_dot_product_attention", "## decode ##", "## layer ##"]


def event(i, name, parent, self_us, device="cpu"):
    return {"id": i, "name": name, "parent": parent, "device": device, "self_us": self_us, "total_us": self_us}


def with_totals(events):
    """Fill total_us: self plus the children's totals (children come after their parents)."""
    by_id = {e["id"]: e for e in events}
    for e in events:
        e["total_us"] = e["self_us"]
    for e in reversed(events):
        if e["parent"] is not None:
            by_id[e["parent"]]["total_us"] += e["total_us"]
    return events


def drawn_trace(rng, n):
    """n events, parents first, ids neither 0.. nor in order."""
    ids = rng.sample(range(10, 10 * n + 10), n)
    events = []
    for i, eid in enumerate(ids):
        if rng.random() < 0.15:
            events.append(event(eid, f"kernel_{rng.randrange(4)}", None, round(rng.uniform(0, 50), 3), "cuda"))
            continue
        parents = [e["id"] for e in events if e["device"] == "cpu"]
        parent = rng.choice(parents) if parents and rng.random() < 0.7 else None
        events.append(event(eid, rng.choice(NAMES), parent, round(rng.uniform(0, 100), 3)))
    return with_totals(events)


@torch.no_grad()
def recorded_trace(t, tokens):
    """A trace the grader records here: `tokens` decode steps of a model it draws, each inside a label."""
    shape = drawn_config(t.rng)
    model = drawn_model(t, shape)
    cache = StaticCache.for_model(model, 1, tokens + 4)
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    tok = torch.tensor([[4]])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(tokens):
            with record_function("## decode ##"):
                tok = model(tok, cache=cache)[:, -1].argmax(-1, keepdim=True)
    return trace_events(prof)


def nested_count(events, tokens):
    return sum(str(e["name"]).startswith("aten::") and e["device"] != "cuda" for e in events) / tokens


def inclusive_top(events):
    total = {}
    for e in events:
        if str(e["name"]).startswith("aten::") and e["device"] != "cuda":
            total[e["name"]] = total.get(e["name"], 0.0) + e["total_us"]
    return max(total, key=total.get) if total else None


def check_reading(t, got, events, tokens, what):
    want = ref_read_trace(events, tokens)
    t.expect(isinstance(got, dict) and set(want) <= set(got),
             f"{what}: expected a dict with keys {sorted(want)}, got {got!r}"[:300])
    check_close(got["ops_per_token"], want["ops_per_token"], f"{what}: ops_per_token", rtol=1e-9,
                mistakes={t.mistake("nested_ops"): nested_count(events, tokens)})
    check_close(got["kernels_per_token"], want["kernels_per_token"], f"{what}: kernels_per_token", rtol=1e-9)
    check_equal(got["top_op"], want["top_op"], f"{what}: top_op",
                mistakes={t.mistake("inclusive_time"): inclusive_top(events)})
    check_close(got["top_share"], want["top_share"], f"{what}: top_share", rtol=1e-9, atol=1e-12)


@judge.part("trace_tests", groups={"recorded": 1, "values": 2, "errors": 1})
def trace(t):
    recorded = [(recorded_trace(t, n), n) for n in (t.rng.randint(2, 4), t.rng.randint(1, 3))]
    e = event
    grid = [([], 1),                                                       # no event at all
            ([e(0, "## idle ##", None, 3.0)], 2),                            # no aten event
            (with_totals([e(5, "## decode ##", None, 1.0), e(3, "aten::linear", 5, 2.0), e(9, "aten::mm", 3, 30.0),
                          e(1, "aten::add", 5, 4.0)]), 1),                   # a label above: still top-level
            (with_totals([e(0, "aten::linear", None, 1.0), e(1, "## inner ##", 0, 1.0), e(2, "aten::mm", 1, 9.0)]),
             3),                                                             # an op under a label under an op
            (with_totals([e(0, "aten::add", None, 0.0), e(1, "aten::mul", None, 0.0)]), 1),   # no time at all
            (with_totals([e(0, "gemm", None, 40.0, "cuda"), e(1, "aten::mm", None, 5.0), e(2, "elementwise", None,
                                                                                          3.0, "cuda")]), 2)]
    drawn = [(drawn_trace(t.rng, t.rng.randint(1, 40)), t.rng.randint(1, 8)) for _ in range(30)]
    items = [(f"read_trace of a decode trace recorded by the grader ({len(ev)} events, {n} tokens)", "recorded", ev, n)
             for ev, n in recorded]
    items += [(f"read_trace({ev}, {n})"[:400], "values", ev, n) for ev, n in grid + drawn]
    outs = t.run([call("read_trace", ev, n) for _, _, ev, n in items])
    for (what, group, ev, n), o in zip(items, outs):
        with t.case(what, group=group):
            check_reading(t, o.get(), ev, n, what)
    ok = drawn[0][0] or grid[2][0]
    bad = [("tokens 0", ok, 0), ("tokens -2", ok, -2), ("tokens 1.5", ok, 1.5),
           ("a parent that is not in the trace", [e(1, "aten::add", 7, 1.0)], 1),
           ("a negative self time", [e(0, "aten::mm", None, -0.5)], 1)]
    for (what, ev, n), o in zip(bad, t.run([call("read_trace", ev, n) for _, ev, n in bad])):
        with t.case(f"read_trace with {what}", group="errors"):
            t.raises(o, "ValueError", what=f"read_trace with {what}")


# ---------------------------------------------------------------------------------------------------
# Part C

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
# Part D

def drawn_llama(rng):
    """A model shape of the size people serve: 8 to 100 layers, grouped-query attention or not."""
    head_dim = rng.choice([64, 80, 128])
    kv = rng.choice([1, 2, 4, 8, 16])
    heads = kv * rng.choice([1, 2, 4, 8])
    hidden = heads * head_dim
    return as_config(dict(vocab_size=rng.choice([32000, 49152, 128256]), hidden_size=hidden,
                          intermediate_size=int(hidden * rng.uniform(2.5, 3.6)) // 256 * 256 + 256,
                          num_hidden_layers=rng.randint(8, 100), num_attention_heads=heads,
                          num_key_value_heads=kv, head_dim=head_dim, max_position_embeddings=131072))


def as_dict(cfg):
    return {**{k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str, bool))},
            "params": cfg.num_parameters()}


def ref_step(cfg, gpu, batch, context, bpe, kernels, launch_s, graphs):
    """The expected seconds, and the known wrong answers: the KV of the query heads, the roofline's sides added,
    the launches added."""
    device = DeviceSpec("the grader's card", bandwidth_gbs=gpu["bandwidth"] / 1e9,
                        peak_tflops={"fp16": gpu["peak_flops"] / 1e12})
    step = ref_decode_step(cfg, device, bpe, batch=batch, context=context)
    launches = (1 if graphs else kernels) * launch_s
    # the KV cache of as many KV heads as query heads, on the same weights (the params stay the model's)
    heads = dataclasses.replace(cfg, num_key_value_heads=cfg.num_attention_heads)
    wrong_kv = ref_decode_step(cfg, device, bpe, batch=batch, kv_bytes=heads.kv_cache_bytes(context, batch, bpe))
    return {"want": max(step.time, launches), "sum_not_max": max(step.memory_s + step.compute_s, launches),
            "kv_query_heads": max(wrong_kv.time, launches), "launch_added": step.time + launches}


@judge.part("predict_step_tests", groups={"values": 3, "errors": 1})
def predict_step(t):
    h100, t4 = dict(bandwidth=3.35e12, peak_flops=989e12), dict(bandwidth=3.2e11, peak_flops=65e12)
    c70, c1 = drawn_llama(t.rng), drawn_llama(t.rng)
    step = ref_decode_step(c1, DeviceSpec("g", bandwidth_gbs=3350, peak_tflops={"fp16": 989}), 2, batch=1, context=0)
    grid = [(c70, h100, 1, 0, 2, 1000, 4e-6, False),          # no KV cache yet
            (c70, h100, 4096, 8192, 2, 1000, 4e-6, False),    # a large batch: compute against the KV reads
            (c70, t4, 1, 32768, 1, 800, 5e-6, True),          # 8-bit numbers, CUDA graphs
            (c1, h100, 1, 0, 2, 500, step.time / 500, False),  # launches exactly as long as the device's work
            (c1, h100, 1, 16, 2, 1, 0.0, True), (c1, t4, 3, 1, 4, 7, 1e-3, False)]
    drawn = []
    for _ in range(40):
        cfg = drawn_llama(t.rng)
        d = get_gpu(t.rng.choice(gpu_names()))
        bpe = t.rng.choice([1, 2, 4])
        peak = d.peak_flops("fp16") if d.supports("fp16") else d.peak_flops(d.default_dtype)
        drawn.append((cfg, {"bandwidth": d.bandwidth, "peak_flops": peak}, t.rng.choice([1, 2, 8, 64, 256, 1024]),
                      t.rng.choice([0, t.rng.randint(1, 131072)]), bpe, t.rng.randint(100, 3000),
                      t.rng.uniform(1e-6, 2e-5), t.rng.random() < 0.5))
    cases = grid + drawn
    outs = t.run([call("predict_step_s", as_dict(c), g, *rest) for c, g, *rest in cases])
    for (cfg, gpu, *rest), o in zip(cases, outs):
        r = ref_step(cfg, gpu, *rest)
        what = (f"predict_step_s({cfg.num_hidden_layers} layers, {cfg.num_attention_heads}/{cfg.num_key_value_heads} "
                f"heads/KV heads, {cfg.num_parameters():.3g} params; {gpu['bandwidth']:.3g} B/s, "
                f"{gpu['peak_flops']:.3g} FLOP/s; batch {rest[0]}, context {rest[1]}, {rest[2]} B, {rest[3]} kernels "
                f"x {rest[4]:.3g} s, CUDA graphs {rest[5]})")
        with t.case(what, group="values"):
            check_close(o.get(), r["want"], what, rtol=1e-9, mistakes={
                t.mistake(k): r[k] for k in ("sum_not_max", "kv_query_heads", "launch_added")
                if not math.isclose(r[k], r["want"], rel_tol=1e-6)})
    base = (as_dict(c1), h100, 1, 16, 2, 100, 1e-6, False)
    bad = [dict(batch=0), dict(batch=2.0), dict(context=-1), dict(context=1.5), dict(kernels=0), dict(launch_s=-1e-6),
           dict(gpu=dict(h100, bandwidth=0.0)), dict(gpu=dict(h100, peak_flops=-1.0)), dict(bpe=0)]
    names = ["config", "gpu", "batch", "context", "bpe", "kernels", "launch_s", "graphs"]
    calls = [call("predict_step_s", *[b.get(n, v) for n, v in zip(names, base)]) for b in bad]
    for b, o in zip(bad, t.run(calls)):
        with t.case(f"predict_step_s with {b}", group="errors"):
            t.raises(o, "ValueError", what=f"predict_step_s with {b}")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("the position read on the host to place the new K/V; every aten event counted; the KV bytes of the query "
         "heads",
         {"static_step_answer": solution_with("lab12", "static_step_answer", {
             "    here = (slots == pos).view(1, 1, S, 1)": "    here = (slots == int(pos)).view(1, 1, S, 1)"}),
          "trace_answer": solution_with("lab12", "trace_answer", {
              '"ops_per_token": sum(top_level(e) for e in aten) / tokens': '"ops_per_token": len(aten) / tokens'}),
          "predict_step_answer": solution_with("lab12", "predict_step_answer", {
              'config["num_key_value_heads"] * config["head_dim"]':
              'config["num_attention_heads"] * config["head_dim"]'})},
         ["int_position", "nested_ops", "kv_query_heads"]),
        ("attention over every slot, written or not; operators ranked by total time; shares computed linearly; the "
         "launches added to the device's time",
         {"static_step_answer": solution_with("lab12", "static_step_answer", {
             "    mask = (slots <= pos).view(1, 1, 1, S)": "    mask = None"}),
          "trace_answer": solution_with("lab12", "trace_answer", {
              'self_us.get(e["name"], 0.0) + e["self_us"]': 'self_us.get(e["name"], 0.0) + e["total_us"]'}),
          "attribution_answer": solution_with("lab12", "attribution_answer", {
              "math.log(speedup) / math.log(total)": "(speedup - 1) / (total - 1)"}),
          "predict_step_answer": solution_with("lab12", "predict_step_answer", {
              "    return max(memory_s, compute_s, launches_s)": "    return max(memory_s, compute_s) + launches_s"})},
         ["unmasked_slots", "inclusive_time", "linear_shares", "launch_added"]),
        ("the roofline's memory and compute times added instead of their max",
         {"predict_step_answer": solution_with("lab12", "predict_step_answer", {
             "    return max(memory_s, compute_s, launches_s)": "    return max(memory_s + compute_s, launches_s)"})},
         ["sum_not_max"]),
    ]
