"""Lab 10's judge: the Wanda 2:4 mask, the expert capacity, the batched MoE dispatch and the expected drops.

Inputs are drawn here and compared with `course_lib.sparsity`'s references, computed here. The dispatch's experts
are built in the kernel by the library (`torch.nn.Linear`, the course's SwiGLU `Expert`) and given weights drawn
here (`load_state_dict`); the grader computes the same experts as plain functions of those weights. Each expert
in the kernel carries a forward pre-hook that reports every batch it is called on to an object of the grader's
(`Trial.remote`): the contract's cost (each expert called once, on all of its kept assignments, never on an
empty batch) is judged on those reports, from the reference's load per expert. Exercise 4's expected drops
for a router's probabilities are compared with an enumeration here: each expert's load distribution built
token by token, not the binomial formula of the solution.
"""
import torch
import torch.nn.functional as F

from course_grading.judging import Judge, Let, call, ref
from course_lib.checks import check_close, check_equal, diagnose
from course_lib.sparsity.moe import dispatch_loop as ref_loop
from course_lib.sparsity.moe import expert_capacity as ref_capacity
from course_lib.sparsity.wanda import wanda_mask as ref_wanda_mask

judge = Judge(references={
    "wanda_tests": ["course_lib.sparsity.wanda.wanda_mask", "course_lib.sparsity.wanda.wanda_scores",
                    "course_lib.sparsity.nm.nm_mask"],
    "capacity_tests": ["course_lib.sparsity.moe.expert_capacity"],
    "dispatch_tests": ["course_lib.sparsity.moe.dispatch_loop", "course_lib.sparsity.moe.dispatch"],
    "predict_dropped_tests": ["course_lib.sparsity.moe.dispatch_loop", "course_lib.sparsity.moe.dispatch",
                              "course_lib.sparsity.moe.expert_capacity"],
})


def randn(t, *shape, scale=1.0):
    return torch.randn(*shape, generator=t.torch_generator()) * scale


def loud(t, tokens, features):
    """Activations whose features have norms spread over 20x (what lets Wanda differ from magnitude)."""
    return randn(t, tokens, features) * (torch.rand(features, generator=t.torch_generator()) * 20)


def shape_of(x):
    return tuple(getattr(x, "shape", ()))


# ---------------------------------------------------------------------------------------------------
# Exercise 1

@judge.part("wanda_tests", groups={"values": 3, "errors": 1})
def wanda(t):
    visible_w = torch.tensor([[0.9, -0.5, 0.1, 0.2, 1.0, 2.0, -3.0, 4.0]])
    visible_x = torch.tensor([[1.0, 1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0]] * 2)
    cases = [("the visible example (a small weight on a loud feature)", visible_w, visible_x)]
    # one group, one token (the norm is |x|, signs included), a few loud outlier features, quiet and loud
    # scales of the same X (the mask must not change), a wide layer
    w, x = randn(t, 5, 16), randn(t, 7, 16)
    x[:, [1, 6, 11]] *= 100
    cases += [("one group of 4, one token", randn(t, 1, 4), randn(t, 1, 4)),
              ("one token of mixed signs", randn(t, 3, 8), randn(t, 1, 8, scale=5)),
              ("three outlier features 100x louder", w, x),
              ("X scaled by 1e-3", w, x * 1e-3), ("X scaled by 10", w, x * 10),
              ("a wide layer", randn(t, 64, 128), loud(t, 9, 128))]
    for _ in range(10):
        o, i, n = t.rng.randint(1, 24), 4 * t.rng.randint(1, 16), t.rng.randint(1, 32)
        cases.append(("drawn", randn(t, o, i), loud(t, n, i)))
    outcomes = t.run([call("wanda_24_mask", w, x) for _, w, x in cases])
    for (kind, w, x), o in zip(cases, outcomes):
        what = f"wanda_24_mask(W {list(w.shape)}, X {list(x.shape)}) ({kind})"
        with t.case(what, group="values"):
            got = o.get()
            t.expect(isinstance(got, torch.Tensor), f"{what}: expected a torch.Tensor mask, got {got!r}"[:300])
            check_equal(got.dtype, torch.bool, f"{what}: dtype of the mask")
            t.expect(shape_of(got) == tuple(w.shape), f"{what}: expected shape {tuple(w.shape)}, got {shape_of(got)}")
            kept = got.reshape(w.shape[0], -1, 4).sum(-1)
            t.expect(bool((kept == 2).all()), f"{what}: every group of 4 inputs must keep exactly 2, got "
                                              f"{sorted(set(kept.reshape(-1).tolist()))} kept")
            magnitude = ref_wanda_mask(w, torch.ones(w.shape[1]), n=2, m=4)
            check_equal(got, ref_wanda_mask(w, x.norm(dim=0), n=2, m=4), what,
                        mistakes={t.mistake("magnitude_only"): magnitude})
    bad = [("W [2, 6], X [3, 6] (6 is not a multiple of 4)", randn(t, 2, 6), randn(t, 3, 6)),
           ("W [3, 5], X [2, 5] (5 is not a multiple of 4)", randn(t, 3, 5), randn(t, 2, 5)),
           ("W [2, 8], X [3, 4] (X has 4 features)", randn(t, 2, 8), randn(t, 3, 4)),
           ("W [2, 8], X [3, 12] (X has 12 features)", randn(t, 2, 8), randn(t, 3, 12)),
           ("W [2, 8], X of 1 dimension [8]", randn(t, 2, 8), randn(t, 8)),
           ("W [2, 8], X of 3 dimensions [2, 3, 8]", randn(t, 2, 8), randn(t, 2, 3, 8))]
    for (what, w, x), o in zip(bad, t.run([call("wanda_24_mask", w, x) for _, w, x in bad])):
        with t.case(f"wanda_24_mask with {what}", group="errors"):
            t.raises(o, "ValueError", what=f"wanda_24_mask with {what}")


# ---------------------------------------------------------------------------------------------------
# Exercise 2

@judge.part("capacity_tests")
def capacity(t):
    grid = [(100, 8, 2, 1.0), (100, 8, 2, 1.25), (10, 2, 2, 4.0), (10, 4, 1, None),   # the visible examples
            (1, 1, 1, None), (1, 1, 1, 1.0), (7, 3, 1, 1.0), (8, 4, 2, 1.0), (8, 4, 2, 0.5), (5, 5, 5, 1.0),
            (100, 64, 1, 0.25), (3, 8, 1, 1.0), (64, 8, 2, 1.25), (1000, 8, 2, None), (6, 4, 4, 2.0)]
    drawn = []
    for _ in range(20):
        n, e = t.rng.randint(1, 499), t.rng.randint(1, 63)
        drawn.append((n, e, t.rng.randint(1, e), t.rng.uniform(0.1, 3.1)))
    cases = grid + drawn
    for (n, e, k, cf), o in zip(cases, t.run([call("expert_capacity", *c) for c in cases])):
        what = f"expert_capacity(N={n}, E={e}, k={k}, capacity_factor={cf!r})"
        with t.case(what):
            floor = None if cf is None else min(n, int(cf * n * k / e))
            check_equal(o.get(), ref_capacity(n, e, k, cf), what, mistakes={t.mistake("capacity_floor"): floor})


# ---------------------------------------------------------------------------------------------------
# Exercise 3

class Calls:
    """The batches one expert of the kernel was called on, as its forward pre-hook reports them."""

    def __init__(self):
        self.sizes = []

    def seen(self, module, args):
        x = args[0] if isinstance(args, (tuple, list)) and args else None
        self.sizes.append(int(x.shape[0]) if len(shape_of(x)) else -1)


def linear_expert(weight):
    return ("linear", {"weight": weight})


def swiglu_expert(t, dim, hidden):
    return ("swiglu", {"gate_proj.weight": randn(t, hidden, dim, scale=0.5),
                       "up_proj.weight": randn(t, hidden, dim, scale=0.5),
                       "down_proj.weight": randn(t, dim, hidden, scale=0.5)})


def as_function(expert):
    """The grader's copy of a kernel expert: a plain function of the same weights."""
    kind, s = expert
    if kind == "linear":
        return lambda x: F.linear(x, s["weight"])
    return lambda x: F.linear(F.silu(F.linear(x, s["gate_proj.weight"])) * F.linear(x, s["up_proj.weight"]),
                              s["down_proj.weight"])


def expert_ops(t, experts, calls=None):
    """Ops that build `experts` in the kernel as $e0, $e1, ...; with `calls` (a Calls each), a forward pre-hook
    on each that reports its batches to the grader."""
    ops = []
    for e, (kind, state) in enumerate(experts):
        if kind == "linear":
            d = state["weight"].shape[0]
            ops.append(call("lib:torch.nn.Linear", d, d, bias=False, store=f"e{e}", send=False))
        else:
            hidden, d = state["gate_proj.weight"].shape
            ops.append(call("lib:course_lib.sparsity.moe.Expert", d, hidden, store=f"e{e}", send=False))
        ops.append(call(f"$e{e}.load_state_dict", state, send=False))
        if calls is not None:
            ops += [Let(f"calls{e}", t.remote(f"calls{e}", calls[e], methods=["seen"])),
                    call(f"$calls{e}.__getattr__", "seen", store=f"hook{e}", send=False),
                    call(f"$e{e}.register_forward_pre_hook", ref(f"hook{e}"), send=False)]
    return ops


def crowded_router(t, n, e, k):
    """indices [n, k] of distinct experts per token, expert 0 the first choice of the first half of the tokens."""
    idx = torch.stack([torch.randperm(e, generator=t.torch_generator())[:k] for _ in range(n)])
    for row in idx[: n // 2]:
        j = (row == 0).nonzero()
        if len(j):
            row[int(j[0])] = row[0].clone()
        row[0] = 0
    return idx


def dispatch_case(t, what, x, experts, w, idx, cap):
    """One dispatch in the kernel: its values (group values) and its calls of the experts (group cost)."""
    calls = [Calls() for _ in experts]
    kernel_experts = [ref(f"e{e}") for e in range(len(experts))]
    got = t.run(expert_ops(t, experts, calls) + [call("moe_dispatch", x, kernel_experts, w, idx, cap)])[-1]
    fns = [as_function(ex) for ex in experts]
    with torch.no_grad():
        ry, load, dropped = ref_loop(x, fns, w, idx, cap)
        no_cap = ref_loop(x, fns, w, idx, None)[0]
    with t.case(what, group="values"):
        out = got.get()
        t.expect(isinstance(out, (tuple, list)) and len(out) == 2, f"{what}: expected (y, dropped), got {out!r}"[:300])
        y, d = out
        t.expect(shape_of(y) == tuple(x.shape), f"{what}: expected y of shape {tuple(x.shape)}, got {shape_of(y)}")
        check_close(y, ry, what + ": y", rtol=1e-4, atol=1e-5, mistakes={t.mistake("no_capacity"): no_cap})
        check_equal(d, dropped, what + ": dropped", mistakes={t.mistake("no_capacity"): 0})
    with t.case(what + ": calls of each expert", group="cost"):
        got.get()
        want = [[int(n)] if n else [] for n in load.tolist()]
        seen = [c.sizes for c in calls]
        t.expect(seen == want, f"{what}: an expert that keeps assignments must be called once, on all of them "
                               f"together, and an expert that keeps none never (no empty batch): expected the batch "
                               f"sizes {want} (one list per expert), got {seen}")


@judge.part("dispatch_tests", groups={"values": 2, "cost": 1, "errors": 1})
def moe_dispatch(t):
    scale = [linear_expert(torch.tensor([[c]])) for c in (1.0, 10.0, 100.0, 1000.0)]
    col = torch.tensor([[1.0], [2.0], [3.0]])
    w3 = torch.tensor([[0.75, 0.25]] * 3)
    grid = [("the visible example, no capacity", col, scale[:2], w3, torch.tensor([[1, 0]] * 3), None),
            ("the visible example, capacity 2: token 2 loses both", col, scale[:2], w3, torch.tensor([[1, 0]] * 3), 2),
            ("first choices before any second choice", col, scale[:2], w3, torch.tensor([[0, 1], [1, 0], [0, 1]]), 2),
            ("capacity 0: every assignment dropped, no expert called", col, scale[:2], w3,
             torch.tensor([[0, 1], [1, 0], [0, 1]]), 0),
            ("one token, one expert, k=1", randn(t, 1, 1), scale[:1], torch.tensor([[0.5]]), torch.tensor([[0]]), None),
            ("second choices fill the other expert's spare slots", randn(t, 4, 1), scale[:2], randn(t, 4, 2),
             torch.tensor([[0, 1]] * 3 + [[1, 0]]), 3),
            ("every token picks expert 0 first, capacity 1", randn(t, 5, 1), scale[:3], randn(t, 5, 2),
             torch.tensor([[0, 1], [0, 2], [0, 1], [0, 2], [0, 1]]), 1),
            ("an expert nobody picks", randn(t, 6, 1), scale, randn(t, 6, 2),
             torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2], [1, 0], [2, 1]]), 6),
            ("k = E: every token to every expert, capacity 2", randn(t, 5, 1), scale[:3], randn(t, 5, 3),
             torch.tensor([[0, 1, 2], [2, 1, 0], [1, 0, 2], [0, 2, 1], [2, 0, 1]]), 2),
            ("a capacity above N * k", randn(t, 4, 1), scale[:2], randn(t, 4, 2), torch.tensor([[0, 1], [1, 0]] * 2),
             100)]
    for what, x, experts, w, idx, cap in grid:
        dispatch_case(t, f"moe_dispatch: {what}", x, experts, w, idx, cap)
    for _ in range(6):
        n, d, e = t.rng.randint(1, 59), t.rng.randint(2, 11), t.rng.randint(1, 6)
        k = t.rng.randint(1, e)
        experts = [swiglu_expert(t, d, 8) for _ in range(e)]
        x, idx = randn(t, n, d), crowded_router(t, n, e, k)
        w = torch.softmax(randn(t, n, k), -1)
        for cf in (None, 0.5, 1.0):
            cap = None if cf is None else ref_capacity(n, e, k, cf)
            dispatch_case(t, f"moe_dispatch(N={n}, D={d}, E={e}, k={k}, capacity={cap}) (drawn)", x, experts, w, idx,
                          cap)
    x, w, idx = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[0.75, 0.25]] * 3), torch.tensor([[0, 1]] * 3)
    bad = [("weights [3, 1] and indices [3, 2]", (x, w[:, :1], idx, 2)),
           ("weights and indices of 2 tokens for x of 3", (x, w[:2], idx[:2], 2)),
           ("weights and indices of 1 dimension", (x, w[:, 0], idx[:, 0], 2)),
           ("expert 2 of 2 experts", (x, w, torch.tensor([[0, 2]] * 3), 2)),
           ("expert -1", (x, w, torch.tensor([[0, 1], [-1, 0], [1, 0]]), 2)),
           ("capacity -1", (x, w, idx, -1))]
    experts = expert_ops(t, scale[:2])
    outcomes = t.run(experts + [call("moe_dispatch", a[0], [ref("e0"), ref("e1")], *a[1:]) for _, a in bad])
    for (what, _), o in zip(bad, outcomes[len(experts):]):
        with t.case(f"moe_dispatch with {what}", group="errors"):
            t.raises(o, "ValueError", what=f"moe_dispatch with {what}")


# ---------------------------------------------------------------------------------------------------
# Exercise 4

def load_distributions(probs, n):
    """P(load of expert e = x) for x = 0..n, every expert at once, built token by token (each token adds one
    assignment to expert e with probability probs[e]): an enumeration, not the binomial formula."""
    r = torch.tensor(probs, dtype=torch.float64)[:, None]
    dist = torch.zeros(len(probs), n + 1, dtype=torch.float64)
    dist[:, 0] = 1.0
    for i in range(n):
        dist[:, 1:i + 2] = dist[:, 1:i + 2] * (1 - r) + dist[:, :i + 1] * r
        dist[:, 0] *= (1 - r[:, 0])
    return dist


def expected_drops(probs, n, cap):
    """E[sum_e max(0, load_e - cap)] from the loads' distributions."""
    dist = load_distributions(probs, n)
    over = (torch.arange(n + 1, dtype=torch.float64) - cap).clamp(min=0)
    return float((dist * over).sum())


def draw_router(t, e, k):
    """route_probs for top-k of e experts: skewed weights scaled to add up to k, the excess over 1 spread over
    the experts below 1 (water-filling) until every one is in [0, 1]."""
    w = [t.rng.choice([t.rng.uniform(0.05, 1), t.rng.expovariate(1.0), 1.0]) + 1e-3 for _ in range(e)]
    r = [k * x / sum(w) for x in w]
    while any(x > 1 + 1e-12 for x in r):
        full = [x >= 1 for x in r]
        excess = sum(x - 1 for x in r if x > 1)
        rest = sum(x for x, f in zip(r, full) if not f)
        r = [1.0 if f else x + excess * x / rest for x, f in zip(r, full)]
    return [min(1.0, x) for x in r]


@judge.part("predict_dropped_tests", groups={"values": 3, "errors": 1})
def predict_dropped(t):
    def even(e, k):
        return [k / e] * e

    # edge grid: no capacity, every load fixed (probabilities 0 and 1), k = E (every expert on every token),
    # one token, one expert, an even router exactly at its capacity (the mean load's 0), a tiny factor,
    # a factor that the ceiling rounds up, skewed routers
    grid = [(even(8, 2), 256, 2, None), ([1.0, 1.0, 0.0, 0.0], 40, 2, 0.5), ([1.0, 0.0, 0.0], 30, 1, 1.0),
            (even(4, 4), 50, 4, 0.5), ([0.5, 0.5], 1, 1, 1.0), ([1.0], 17, 1, 0.3), (even(8, 2), 256, 2, 1.0),
            (even(8, 2), 512, 2, 1.0), (even(16, 1), 64, 1, 1.0), (even(4, 1), 100, 1, 0.1), (even(3, 1), 10, 1, 1.1),
            ([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.55], 256, 2, 1.5), ([0.9, 0.9, 0.1, 0.1], 200, 2, 1.0),
            ([0.6, 0.2, 0.2], 300, 1, 2.0)]
    drawn = []
    for _ in range(30):
        e = t.rng.randint(1, 16)
        k = t.rng.randint(1, min(e, 4))
        drawn.append((draw_router(t, e, k), t.rng.randint(1, 400), k,
                      t.rng.choice([None, round(t.rng.uniform(0.25, 2.25), 2), round(t.rng.uniform(0.9, 1.4), 3)])))
    cases = grid + drawn
    outcomes = t.run([call("predict_dropped", probs, n, k, cf) for probs, n, k, cf in cases])
    # the student's own Exercise 2 on the same batches: the contract has predict_dropped use it, so an answer
    # exact for the capacity it gives is accepted (a wrong capacity is charged once, in Exercise 2)
    own_caps = t.run([call("expert_capacity", n, len(probs), k, cf) for probs, n, k, cf in cases])
    for (probs, n, k, cf), o, mine in zip(cases, outcomes, own_caps):
        e = len(probs)
        cap = ref_capacity(n, e, k, cf)
        want = expected_drops(probs, n, cap)
        own = mine.value if (mine.ok and isinstance(mine.value, int) and not isinstance(mine.value, bool)
                             and mine.value >= 0 and cf is not None) else None
        shown = [round(x, 4) for x in probs]
        what = (f"predict_dropped(route_probs={shown}, N={n}, k={k}, capacity_factor={cf!r}) (capacity {cap} per "
                f"expert)")
        with t.case(what, group="values"):
            got = o.get()
            if own is not None and own != cap and diagnose(got, {"own": expected_drops(probs, n, own)},
                                                            rtol=1e-6, atol=1e-9):
                continue                           # right for the capacity your Exercise 2 gives
            check_close(got, want, what, rtol=1e-6, atol=1e-9,
                        mistakes={t.mistake("drops_at_mean_load"): sum(max(0.0, n * r - cap) for r in probs),
                                  t.mistake("pooled_capacity"): float(max(0, n * k - e * cap)),
                                  t.mistake("assignments_independent"):
                                      expected_drops([r / k for r in probs], n * k, cap)})
    bad = [([0.5, 0.5], 10, 2, 1.0), ([1.2, -0.2], 10, 1, 1.0), ([1.0], 10, 2, 1.0), ([0.5, 0.5], 0, 1, 1.0),
           ([0.5, 0.5], 10.0, 1, 1.0), ([0.5, 0.5], 10, 0, 1.0), ([0.3, 0.3], 10, 1, None), ([0.5, 0.5], True, 1, 1.0)]
    for (probs, n, k, cf), o in zip(bad, t.run([call("predict_dropped", *b) for b in bad])):
        what = f"predict_dropped(route_probs={probs}, N={n!r}, k={k!r}, capacity_factor={cf!r})"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what + " (N and k integers, 1 <= k <= E; probabilities in [0, 1] "
                                                  "adding up to k)")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("Wanda scored by the weight only (|W|, no activation norm): plain magnitude 2:4",
         {"wanda": solution_with("lab10", "wanda", {
             "    scores = W.abs() * X.float().norm(dim=0)[None, :]": "    scores = W.abs()"})},
         ["magnitude_only"]),
        ("the dispatch ignores the capacity (no assignment is ever dropped); the prediction pools the capacity "
         "over the experts",
         {"dispatch": solution_with("lab10", "dispatch", {
             "    cap = N * k if capacity is None else capacity": "    cap = N * k"}),
          "predict_dropped": solution_with("lab10", "predict_dropped", {
              "    expected = 0.0\n": "    return float(max(0, N * k - len(probs) * cap))\n"})},
         ["no_capacity", "pooled_capacity"]),
        ("the capacity rounded down (only Exercise 2 is charged: Exercise 4 runs on the student's own capacity)",
         {"capacity": solution_with("lab10", "capacity", {
             "    return min(N, math.ceil(capacity_factor * N * k / E))":
             "    return min(N, int(capacity_factor * N * k / E))"})},
         ["capacity_floor"]),
        ("the expected drops taken as the drops of the mean load, max(0, N r - capacity) per expert",
         {"predict_dropped": solution_with("lab10", "predict_dropped", {
             "    for r in probs:               # linearity": "    for r in []:                  # linearity",
             "    return expected": "    return sum(max(0.0, N * r - cap) for r in probs)"})},
         ["drops_at_mean_load"]),
        ("each expert's load drawn over the N * k assignments, Binomial(N * k, r / k), not over the N tokens",
         {"predict_dropped": solution_with("lab10", "predict_dropped", {
             "    for r in probs:               # linearity": "    N, probs = N * k, [r / k for r in probs]\n"
                                                            "    for r in probs:               # linearity"})},
         ["assignments_independent"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_capacity": {"points": 2, "rubric": [
        (1, "quotes their own route_probs and predicted, measured and mean-load drops at two capacity factors, "
            "and explains why prediction and measurement agree on average only (an expectation against random "
            "batches) and why the order picks which assignments drop, not how many (min(load, capacity) kept)"),
        (1, "explains why the mean load's drops match where loads sit far above the capacity and miss near it "
            "(the even router at 1.0: batches above count, those below give nothing back), why drops fall fast "
            "then slowly, and weighs what a drop costs (residual only) against more capacity (padding) or a "
            "balancing loss (router constrained)"),
    ]},
}
