"""Lab 11's judge: the shards, the all-reduce's bytes, the column/row-parallel MLP on real gloo ranks, the bubble.

Inputs are drawn here and compared with `course_lib.parallel`'s references, computed here. Exercise 3 runs the
student's `parallel_mlp` as the lab's visible test does: in the kernel, the library's `run_parallel_mlp` sends
the function's source (with the shard helpers') to fresh processes that form a gloo group over 127.0.0.1, and
every rank's output comes back; the unsharded MLP and the known mistakes' outputs are computed here. Exercise 4's
bubble (an uneven split of the layers, a head on the last stage) is compared with the GPipe timeline built here
from the course's split, micro-batch by micro-batch, not with the solution's closed form.
"""
import torch
import torch.nn.functional as F

from course_grading.judging import Judge, call, notebook
from course_lib.checks import check_close, check_equal
from course_lib.models.config import LlamaConfig
from course_lib.parallel.checks import mlp_reference
from course_lib.parallel.cost import ring_allreduce_bytes as ref_ring_bytes
from course_lib.parallel.cost import tp_comm_per_token as ref_tp_comm
from course_lib.parallel.layers import shard_range as ref_shard_range
from course_lib.parallel.pipeline import bubble_fraction as ref_bubble_fraction
from course_lib.parallel.pipeline import gpipe_schedule as ref_gpipe_schedule
from course_lib.parallel.pipeline import split_layers as ref_split_layers

judge = Judge(references={
    "shards_tests": ["course_lib.parallel.layers.shard_range"],
    "cost_tests": ["course_lib.parallel.cost.ring_allreduce_bytes", "course_lib.parallel.cost.tp_comm_per_token"],
    "parallel_mlp_tests": ["course_lib.parallel.checks.mlp_reference",
                           "course_lib.parallel.layers.parallel_mlp_reference"],
    "predict_bubble_tests": ["course_lib.parallel.pipeline.bubble_fraction",
                             "course_lib.parallel.pipeline.bubble_formula",
                             "course_lib.parallel.pipeline.gpipe_schedule"],
})


def randn(t, *shape):
    return torch.randn(*shape, generator=t.torch_generator())


def as_tensor_pair(got, what):
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise AssertionError(f"{what}: expected (weight_shard, bias_shard), got {got!r}"[:300])
    return got


# ---------------------------------------------------------------------------------------------------
# Exercise 1

@judge.part("shards_tests", groups={"values": 3, "errors": 1})
def shards(t):
    visible = (torch.arange(24.0).reshape(4, 6), torch.tensor([10.0, 11.0, 12.0, 13.0]))
    # (weight, bias, world size): the visible layer, on two ranks and on one (the whole layer); one row and one
    # column per rank; one column per rank; one row per rank
    layers = [(*visible, 2), (*visible, 1), (randn(t, 3, 3), randn(t, 3), 3), (randn(t, 8, 4), randn(t, 8), 4),
              (randn(t, 6, 12), randn(t, 6), 6)]
    for _ in range(5):
        p = t.rng.randint(1, 4)
        out, inp = p * t.rng.randint(1, 4), p * t.rng.randint(1, 4)
        layers.append((randn(t, out, inp), randn(t, out), p))
    for w, b, p in layers:
        out, inp = w.shape
        ops = []
        for r in range(p):
            ops += [call("shard_column", w, b, r, p), call("shard_row", w, r, p)]
        got = t.run(ops)
        for r in range(p):
            rows, cols = ref_shard_range(out, r, p), ref_shard_range(inp, r, p)
            what = f"rank {r} of {p}, weight [{out}, {inp}]"
            with t.case(f"shard_column and shard_row, {what}", group="values"):
                ws, bs = as_tensor_pair(got[2 * r].get(), f"shard_column(W, b, {r}, {p})")
                check_equal(ws, w[rows], f"shard_column, {what}: the weight rows {rows.start}..{rows.stop - 1}")
                check_equal(bs, b[rows], f"shard_column, {what}: the bias slice {rows.start}..{rows.stop - 1}")
                check_equal(got[2 * r + 1].get(), w[:, cols],
                            f"shard_row, {what}: the columns {cols.start}..{cols.stop - 1}")
    bad = [("shard_column(W [4, 6], b, rank=0, world_size=3)", call("shard_column", *visible, 0, 3)),
           ("shard_column(W [6, 4], b, rank=1, world_size=4)",
            call("shard_column", randn(t, 6, 4), randn(t, 6), 1, 4)),
           ("shard_column(W [5, 2], b, rank=1, world_size=2)",
            call("shard_column", randn(t, 5, 2), randn(t, 5), 1, 2)),
           ("shard_row(W [4, 6], rank=0, world_size=4)", call("shard_row", visible[0], 0, 4)),
           ("shard_row(W [3, 7], rank=1, world_size=2)", call("shard_row", randn(t, 3, 7), 1, 2)),
           ("shard_row(W [2, 9], rank=5, world_size=6)", call("shard_row", randn(t, 2, 9), 5, 6))]
    for (what, _), o in zip(bad, t.run([op for _, op in bad])):
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=f"{what}: the world size does not divide the dimension split")


# ---------------------------------------------------------------------------------------------------
# Exercise 2

def ref_tp_bytes(hidden, layers, p, bpe):
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=1, num_key_value_heads=1,
                      head_dim=2)
    return ref_tp_comm(cfg, p, bpe=bpe)["sent_bytes"]


@judge.part("cost_tests", groups={"ring": 1, "per token": 1})
def cost(t):
    ring = [(1000, 1), (1000, 2), (1000, 8), (0, 4), (1, 3), (4096, 16), (1e12, 1024), (7.5, 2)]
    ring += [(float(t.rng.randint(1, 10**6)), t.rng.randint(1, 16)) for _ in range(12)]
    for (n, p), o in zip(ring, t.run([call("ring_allreduce_bytes", n, p) for n, p in ring])):
        what = f"ring_allreduce_bytes({n!r}, p={p})"
        with t.case(what, group="ring"):
            check_close(o.get(), ref_ring_bytes(n, p), what, rtol=1e-9)
    # None: the default bytes_per_element (2, bf16)
    per_token = [(8192, 80, 8, None), (4096, 32, 1, None), (8192, 80, 8, 1), (16, 1, 2, 4), (5120, 40, 2, 2),
                 (1, 1, 16, 4)]
    per_token += [(16 * t.rng.randint(1, 1024), t.rng.randint(1, 120), t.rng.randint(1, 16),
                   t.rng.choice([1, 2, 4, None])) for _ in range(12)]
    ops = [call("tp_bytes_per_token", d, L, p) if b is None else call("tp_bytes_per_token", d, L, p, b)
           for d, L, p, b in per_token]
    for (d, L, p, b), o in zip(per_token, t.run(ops)):
        what = f"tp_bytes_per_token({d}, {L}, {p}{'' if b is None else f', {b}'})"
        with t.case(what, group="per token"):
            check_close(o.get(), ref_tp_bytes(d, L, p, 2 if b is None else b), what, rtol=1e-9)


# ---------------------------------------------------------------------------------------------------
# Exercise 3

@judge.part("parallel_mlp_tests", groups={"values": 3, "errors": 1})
def parallel_mlp(t):
    # (what, x shape, f, world size): each case starts its ranks (a second or more): the visible example's
    # shapes, one hidden unit per rank with a 2-D x, four ranks, drawn shapes
    cases = [("the visible example's shapes", (2, 3, 4), 6, 2),
             ("one hidden unit per rank, x of 2 dimensions", (7, 3), 2, 2), ("four ranks", (2, 3, 8), 8, 4)]
    for _ in range(2):
        d = t.rng.randint(2, 11)
        cases.append(("drawn", (t.rng.randint(1, 3), 3, d), 2 * t.rng.randint(1, 9), 2))
    for kind, shape, f, p in cases:
        d = shape[-1]
        x, w1, b1, w2, b2 = randn(t, *shape), randn(t, f, d), randn(t, f), randn(t, d, f), randn(t, d)
        what = f"parallel_mlp on {p} gloo ranks (x {list(shape)}, f={f}) ({kind})"
        with t.case(what, group="values"):
            outs = t.call("lib:course_lib.parallel.checks.run_parallel_mlp", notebook("parallel_mlp"), x, w1, b1, w2,
                          b2, world_size=p, helpers=[notebook("shard_column"), notebook("shard_row")])
            t.expect(isinstance(outs, list) and len(outs) == p,
                     f"{what}: expected one output per rank, got {outs!r}"[:300])
            want = mlp_reference(x, w1, b1, w2, b2)
            for r, y in enumerate(outs):
                h = F.relu(F.linear(x, w1.chunk(p)[r], b1.chunk(p)[r]))
                partial = F.linear(h, w2.chunk(p, dim=1)[r])
                t.expect(getattr(y, "shape", None) == want.shape,
                         f"{what}: rank {r} returned {getattr(y, 'shape', type(y).__name__)}; expected the whole "
                         f"output of shape {tuple(want.shape)} on every rank")
                check_close(y, want, f"{what}: rank {r}'s output vs the unsharded MLP", rtol=1e-4, atol=1e-4,
                            mistakes={t.mistake("bias_every_rank"): want + (p - 1) * b2,
                                      t.mistake("no_allreduce"): partial + b2})
    # the shard functions' ValueError, raised before any collective (run in the kernel, no group needed)
    for d, f, r, p in ((4, 6, 0, 4), (3, 5, 1, 2), (2, 4, 2, 3)):
        what = f"parallel_mlp with f={f} on rank {r} of {p}"
        with t.case(what, group="errors"):
            t.raises(t.outcome("parallel_mlp", randn(t, 2, d), randn(t, f, d), randn(t, f), randn(t, d, f), randn(t, d),
                               r, p), "ValueError", what=f"{what} ({p} does not divide f)")


# ---------------------------------------------------------------------------------------------------
# Exercise 4

def stage_times(L, p, head):
    """The stages' times per micro-batch: the course's contiguous split (its rule, not the student's), the
    head on the last stage."""
    times = [float(len(r)) for r in ref_split_layers(L, p)]
    times[-1] += head
    return times


@judge.part("predict_bubble_tests", groups={"values": 3, "errors": 1})
def predict_bubble(t):
    # edge grid: one stage, one micro-batch, one layer per stage, an even split (the notebook's case), a head
    # that makes the last stage the slowest, one that evens the stages out, a remainder of p - 1
    grid = [(8, 1, 8, 0.0), (1, 1, 1, 0.0), (4, 4, 1, 0.0), (8, 4, 6, 0.0), (10, 4, 8, 0.0), (10, 4, 8, 1.5),
            (10, 4, 1, 0.0), (5, 4, 3, 1.0), (7, 4, 100, 0.0), (32, 3, 64, 2.0), (6, 6, 2, 0.25), (9, 2, 5, 0.0),
            (2, 2, 1, 0.0), (80, 16, 64, 3.0), (3, 2, 1000, 0.0)]
    drawn = []
    for _ in range(30):
        L = t.rng.randint(1, 80)
        p = t.rng.randint(1, min(L, 16))
        drawn.append((L, p, t.rng.randint(1, 64), t.rng.choice([0.0, round(t.rng.uniform(0, 3), 2),
                                                                float(t.rng.randint(1, 4))])))
    cases = grid + drawn
    outs = t.run([call("predict_bubble", L, p, m, h) for L, p, m, h in cases])
    for (L, p, m, h), o in zip(cases, outs):
        times = stage_times(L, p, h)
        want = ref_bubble_fraction(ref_gpipe_schedule(p, m, times), p)     # the timeline, built here
        busy, span = m * sum(times), sum(times) + (m - 1) * max(times)
        what = f"predict_bubble(num_layers={L}, p={p}, m={m}, head_cost={h!r}) (stage times {times})"
        with t.case(what, group="values"):
            check_close(o.get(), want, what, rtol=1e-9, atol=1e-12,
                        mistakes={t.mistake("bubble_balanced"): (p - 1) / (m + p - 1),
                                  t.mistake("bubble_slowest_fill"): 1 - busy / (p * (m + p - 1) * max(times)),
                                  t.mistake("bubble_idle_over_busy"): (p * span - busy) / busy})
    bad = [(8, 0, 4, 0.0), (8, 4, 0, 0.0), (8.0, 4, 4, 0.0), (8, 2.0, 4, 0.0), (8, 4, 4.0, 0.0), (-1, 1, 3, 0.0),
           (3, 4, 2, 0.0), (8, 9, 1, 0.0), (8, 4, 4, -0.5), (8, 4, 4, "1"), ("8", 2, 4, 0.0), (8, True, 4, 0.0)]
    for (L, p, m, h), o in zip(bad, t.run([call("predict_bubble", L, p, m, h) for L, p, m, h in bad])):
        what = f"predict_bubble({L!r}, {p!r}, {m!r}, head_cost={h!r})"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what + " (integers >= 1 with p <= num_layers; head_cost a number >= 0)")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("the row-parallel bias b2 added on every rank before the all-reduce (summed world_size times); the "
         "bubble predicted with the equal stages' formula (p - 1) / (m + p - 1) whatever the split",
         {"parallel_mlp": solution_with("lab11", "parallel_mlp", {
             "    y = F.linear(h, shard_row(w2, rank, world_size))  # [..., d]: a partial sum":
             "    y = F.linear(h, shard_row(w2, rank, world_size), b2)",
             "    return y + b2                                     # the bias once, after the sum":
             "    return y"}),
          "predict_bubble": solution_with("lab11", "predict_bubble", {
              "    return 1.0 - m * sum(times) / (p * makespan)     # busy: every micro-batch through every stage once":
              "    return (p - 1) / (m + p - 1)"})},
         ["bias_every_rank", "bubble_balanced"]),
        ("the whole run taken at the slowest stage's pace, (m + p - 1) max(stage time)",
         {"predict_bubble": solution_with("lab11", "predict_bubble", {
             "    makespan = sum(times) + (m - 1) * max(times)": "    makespan = (m + p - 1) * max(times)"})},
         ["bubble_slowest_fill"]),
        ("the bubble as idle rank-time over busy rank-time",
         {"predict_bubble": solution_with("lab11", "predict_bubble", {
             "    return 1.0 - m * sum(times) / (p * makespan)     # busy: every micro-batch through every stage once":
             "    return (p * makespan - m * sum(times)) / (m * sum(times))"})},
         ["bubble_idle_over_busy"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_bubble": {"points": 2, "rubric": [
        (1, "quotes their own predicted, ideal-timeline and measured bubbles for two m, explains the exact "
            "match of the ideal timeline ((p-1) slots of start-up over m+p-1) and why a slow stage enlarges "
            "the bubble"),
        (1, "explains the measured excess (transfers, CPU sharing; per micro-batch, so not removed by larger "
            "m), and computes m >= 28 for p = 4 under 10% with the cost of small micro-batches"),
    ]},
}
