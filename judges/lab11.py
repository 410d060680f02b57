"""Lab 11's judge: the shards, the all-reduce's bytes, the column/row-parallel MLP and the head-parallel GQA
attention on real gloo ranks, the bubble.

Inputs are drawn here and compared with `course_lib.parallel`'s references, computed here. Exercises 3 and 4 run
the student's `parallel_mlp` and `parallel_attention` as the lab's visible tests do: in the kernel, the library's
`run_on_ranks` sends the function's source (with the shard helpers') to fresh processes that form a gloo group
over 127.0.0.1, runs every case of one world size in that one group (a start-up per world size, not per case)
and brings back each rank's output of each case and the torch.distributed calls it made; the unsharded MLP and
attention block (`mlp_reference`, `attention_reference` on `course_lib.attention`'s reference) and the known
mistakes' outputs are computed here. The collectives are counted in the ranks, children of the student's kernel:
the count diagnoses honest code; the values are what is trusted. The refusals are called in the kernel, outside
any process group: an attention that does not refuse would reach the all-reduce and fail with torch's own
ValueError, so its message must name `num_kv_heads`. Exercise 5's bubble (an uneven split of the layers, a
head on the last stage) is compared with the GPipe timeline built here from the course's split, micro-batch by
micro-batch, not with the solution's closed form.
"""
import torch
import torch.nn.functional as F

from course_grading.judging import Judge, call, notebook
from course_lib.checks import check_close, check_equal
from course_lib.models.config import LlamaConfig
from course_lib.parallel.checks import attention_reference, kv_group_mistake, mlp_reference
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
    "parallel_attention_tests": ["course_lib.parallel.checks.attention_reference",
                                 "course_lib.parallel.layers.ShardedAttention",
                                 "course_lib.parallel.layers.shard_fused_qkv"],
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

def on_ranks(t, fn, calls, p):
    """The outcome of `fn` run on every call of `calls` in one p-rank gloo group (run_on_ranks, in the kernel)."""
    return t.outcome("lib:course_lib.parallel.checks.run_on_ranks", notebook(fn), calls, world_size=p,
                     helpers=[notebook("shard_column"), notebook("shard_row")])


def rank_results(t, o, i, n, p, what):
    """Each rank's result of call i (of n) in the outcome `o` of `on_ranks`, every rank having returned."""
    ranks = o.get()
    t.expect(isinstance(ranks, list) and len(ranks) == p and all(isinstance(r, list) and len(r) == n for r in ranks),
             f"{what}: expected one list of results per rank, got {ranks!r}"[:300])
    out = [r[i] for r in ranks]
    for r, res in enumerate(out):
        t.expect(isinstance(res, dict) and "raised" not in res,
                 f"{what}: rank {r} raised {res.get('raised') if isinstance(res, dict) else res!r}"[:600])
    return out


def communication(t, label, values, ranks, one, mistakes):
    """The case that one call made exactly the collectives `one` on every rank ([name, shape] each, as the
    ranks recorded them; `ranks()` gives each rank's result, called inside the case so that its failures are
    the case's). A rank that made none, in a call whose `values` case already failed, is not charged again:
    the missing all-reduce is one bug, and the values charged it. (With right values and no collective a rank
    computed without its shards: charged here.)"""
    with t.case(label, group="communication") as case:
        for r, res in enumerate(ranks()):
            got = res.get("collectives")
            if got == [] and not values.passed:
                case.note = f"{label}: rank {r} made no collective; its values already failed: not charged again"
                continue
            check_equal(got, one, f"{label}: rank {r}'s torch.distributed calls ([name, shape of the tensor]); "
                        f"expected {one}", mistakes=mistakes)


@judge.part("parallel_mlp_tests", groups={"values": 2, "communication": 1, "errors": 1})
def parallel_mlp(t):
    # (what, x shape, f, world size): the visible example's shapes, one hidden unit per rank with a 2-D x, four
    # ranks, drawn shapes; the cases of a world size run in one group (one start-up)
    cases = [("the visible example's shapes", (2, 3, 4), 6, 2),
             ("one hidden unit per rank, x of 2 dimensions", (7, 3), 2, 2), ("four ranks", (2, 3, 8), 8, 4)]
    for _ in range(2):
        d = t.rng.randint(2, 11)
        cases.append(("drawn", (t.rng.randint(1, 3), 3, d), 2 * t.rng.randint(1, 9), 2))
    tensors = []
    for _, shape, f, _ in cases:
        d = shape[-1]
        tensors.append((randn(t, *shape), randn(t, f, d), randn(t, f), randn(t, d, f), randn(t, d)))
    for p in sorted({c[3] for c in cases}):
        mine = [(c, args) for c, args in zip(cases, tensors) if c[3] == p]
        o = on_ranks(t, "parallel_mlp", [args for _, args in mine], p)
        for i, ((kind, shape, f, _), (x, w1, b1, w2, b2)) in enumerate(mine):
            what = f"parallel_mlp on {p} gloo ranks (x {list(shape)}, f={f}) ({kind})"
            with t.case(what, group="values") as values:
                want = mlp_reference(x, w1, b1, w2, b2)
                for r, res in enumerate(rank_results(t, o, i, len(mine), p, what)):
                    y = res.get("output")
                    h = F.relu(F.linear(x, w1.chunk(p)[r], b1.chunk(p)[r]))
                    partial = F.linear(h, w2.chunk(p, dim=1)[r])
                    t.expect(getattr(y, "shape", None) == want.shape,
                             f"{what}: rank {r} returned {getattr(y, 'shape', type(y).__name__)}; expected the whole "
                             f"output of shape {tuple(want.shape)} on every rank")
                    check_close(y, want, f"{what}: rank {r}'s output vs the unsharded MLP", rtol=1e-4, atol=1e-4,
                                mistakes={t.mistake("bias_every_rank"): want + (p - 1) * b2,
                                          t.mistake("no_allreduce"): partial + b2})
            communication(t, f"{what}: one all-reduce of the output per call", values,
                          lambda: rank_results(t, o, i, len(mine), p, what), [["all_reduce", list(shape)]],
                          {t.mistake("mlp_gathered_hidden"): [["all_gather", [*shape[:-1], f // p]]]})
    # the shard functions' ValueError, raised before any collective (run in the kernel, no group needed)
    for d, f, r, p in ((4, 6, 0, 4), (3, 5, 1, 2), (2, 4, 2, 3)):
        what = f"parallel_mlp with f={f} on rank {r} of {p}"
        with t.case(what, group="errors"):
            t.raises(t.outcome("parallel_mlp", randn(t, 2, d), randn(t, f, d), randn(t, f), randn(t, d, f), randn(t, d),
                               r, p), "ValueError", what=f"{what} ({p} does not divide f)")


# ---------------------------------------------------------------------------------------------------
# Exercise 4

def random_block(t, B, T, D, H, K, Dh):
    """x [B, T, D] and the block's weights (scaled by 1/sqrt(fan-in): scores neither flat nor one-hot)."""
    return (randn(t, B, T, D), randn(t, H * Dh, D) / D ** 0.5, randn(t, K * Dh, D) / D ** 0.5,
            randn(t, K * Dh, D) / D ** 0.5, randn(t, D, H * Dh) / (H * Dh) ** 0.5, randn(t, D))


def attention_shapes(t):
    """{world size: [(what, (B, T, D, H, K, Dh)), ...]}: the edge grid, then drawn shapes (K a multiple of p)."""
    grid = {2: [("the visible example's shapes", (2, 5, 8, 4, 2, 3)),
                ("one token, one head and one KV head per rank (no grouping)", (1, 1, 4, 2, 2, 2)),
                ("4 query heads per KV head, one KV head per rank", (3, 4, 6, 8, 2, 2)),
                ("two heads per rank without grouping, D != H*Dh", (2, 3, 5, 4, 4, 2)),
                ("3 query heads per rank, head dimension 1", (1, 6, 3, 6, 2, 1))],
            4: [("one head per rank", (2, 3, 8, 4, 4, 2)),
                ("2 query heads per KV head", (1, 5, 6, 8, 4, 3)),
                ("4 query heads per KV head, one token", (2, 1, 4, 16, 4, 1)),
                ("two KV heads per rank", (1, 4, 5, 8, 8, 2))]}
    for p, n in ((2, 3), (4, 2)):
        for _ in range(n):
            K = p * t.rng.randint(1, 2)
            grid[p].append(("drawn", (t.rng.randint(1, 3), t.rng.randint(1, 7), t.rng.randint(2, 12),
                                      K * t.rng.randint(1, 4), K, t.rng.randint(1, 8))))
    return grid


@judge.part("parallel_attention_tests", groups={"values": 2, "communication": 1, "errors": 1})
def parallel_attention(t):
    for p, shapes in attention_shapes(t).items():
        calls = [random_block(t, *shape) + (shape[3], shape[4]) for _, shape in shapes]
        o = on_ranks(t, "parallel_attention", calls, p)      # every shape of this world size in one group
        for i, ((kind, (B, T, D, H, K, Dh)), args) in enumerate(zip(shapes, calls)):
            what = f"parallel_attention on {p} gloo ranks (x [{B}, {T}, {D}], {H} heads, {K} KV heads, head dim {Dh})"
            want = attention_reference(*args)
            one = [["all_reduce", [B, T, D]]]
            with t.case(f"{what} ({kind}): the output on every rank", group="values") as values:
                for r, res in enumerate(rank_results(t, o, i, len(calls), p, what)):
                    y = res.get("output")
                    t.expect(getattr(y, "shape", None) == want.shape,
                             f"{what}: rank {r} returned {getattr(y, 'shape', type(y).__name__)}; expected the whole "
                             f"output of shape {tuple(want.shape)} on every rank")
                    check_close(y, want, f"{what}: rank {r}'s output vs the unsharded attention block", rtol=1e-4,
                                atol=1e-4, mistakes={t.mistake("bias_every_rank"): want + (p - 1) * args[5],
                                                     t.mistake("kv_group"): kv_group_mistake(*args, p)})
            communication(t, f"{what} ({kind}): one all-reduce of the output per call", values,
                          lambda: rank_results(t, o, i, len(calls), p, what), one,
                          {t.mistake("allreduce_per_head"): one * (H // p)})
    # the refusals, called in the kernel outside any process group: before any collective, naming num_kv_heads
    bad = [("1 KV head (multi-query) on 2 ranks", (1, 2, 4, 4, 1, 2), 0, 2),
           ("3 KV heads on 2 ranks (their rows, 6, split evenly)", (1, 3, 6, 6, 3, 2), 1, 2),
           ("2 KV heads on 4 ranks", (2, 2, 8, 8, 2, 1), 3, 4),
           ("6 KV heads on 4 ranks (the 12 query heads split evenly)", (1, 2, 4, 12, 6, 2), 0, 4),
           ("4 KV heads do not divide 6 query heads", (1, 2, 4, 6, 4, 1), 0, 2)]
    K = 2 * t.rng.randint(1, 3) + 1
    bad.append(("drawn: an odd number of KV heads on 2 ranks", (1, 2, 5, K * t.rng.randint(1, 3), K, 2),
                t.rng.randint(0, 1), 2))
    ops = [call("parallel_attention", *random_block(t, *shape), shape[3], shape[4], r, p) for _, shape, r, p in bad]
    for (kind, (B, T, D, H, K, Dh), r, p), o in zip(bad, t.run(ops)):
        what = f"parallel_attention with {H} heads, {K} KV heads on rank {r} of {p} ({kind})"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what)
            t.expect("num_kv_heads" in o.raised.message, f"{what}: the ValueError must name num_kv_heads (and be "
                     f"raised before any collective), got: {o.raised.message}"[:500])


# ---------------------------------------------------------------------------------------------------
# Exercise 5

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
        ("the MLP without its all-reduce: each rank returns its partial sum (charged in the values only, not "
         "again in the communication)",
         {"parallel_mlp": solution_with("lab11", "parallel_mlp", {
             "    dist.all_reduce(y)                                # the sum over the ranks, on every rank\n": ""})},
         ["no_allreduce"]),
        ("the MLP's hidden slices all-gathered and the whole second layer run on every rank: the right values, "
         "the wrong communication",
         {"parallel_mlp": solution_with("lab11", "parallel_mlp", {
             "    y = F.linear(h, shard_row(w2, rank, world_size))  # [..., d]: a partial sum":
             "    parts = [torch.empty_like(h) for _ in range(world_size)]\n"
             "    dist.all_gather(parts, h)\n"
             "    y = F.linear(torch.cat(parts, -1), w2)",
             "    dist.all_reduce(y)                                # the sum over the ranks, on every rank\n": ""})},
         ["mlp_gathered_hidden"]),
        ("attention's query heads split over the ranks, every KV head kept on every rank and read by the local "
         "head index (the groups of rank 0's heads on every rank)",
         {"parallel_attention": solution_with("lab11", "parallel_attention", {
             "kv_rows = slice(rank * k * Dh, (rank + 1) * k * Dh)": "kv_rows, k = slice(None), K"})},
         ["kv_group"]),
        ("attention's output bias bo added on every rank before the all-reduce",
         {"parallel_attention": solution_with("lab11", "parallel_attention", {
             "y = F.linear(o, shard_row(wo, rank, world_size))": "y = F.linear(o, shard_row(wo, rank, world_size), bo)",
             "return y + bo": "return y"})},
         ["bias_every_rank"]),
        ("attention's output all-reduced head by head: the right values, H/p all-reduces per block",
         {"parallel_attention": solution_with("lab11", "parallel_attention", {
             "y = F.linear(o, shard_row(wo, rank, world_size))": "wo_r, y = shard_row(wo, rank, world_size), 0",
             "dist.all_reduce(y)": "for j in range(h):\n"
                                   "        c = slice(j * Dh, (j + 1) * Dh)\n"
                                   "        part = F.linear(o[..., c], wo_r[:, c])\n"
                                   "        dist.all_reduce(part)\n"
                                   "        y = y + part"})},
         ["allreduce_per_head"]),
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
