"""Lab 00's judge: latency metrics on traces the grader draws, percentiles, and sampling on drawn logits.

Parts A, B and F call the student's functions with plain numbers and lists (numpy arrays where the contract
allows them) and compare with `course_lib.perf.metrics` here (Part F with `queue_traces`, the request model's
traces of a one-at-a-time server, on queues drawn with bursts, idle gaps and ties); Parts C to E send logits
as tensors and compare with `course_lib.sampling`. An input that must not change is kept in the kernel (`Let`)
and read back after the call. Part B's contract forbids numpy's percentile: the names the student's function
calls are read in the kernel (`percentile.__code__.co_names`, an observation a student who rewrites the driver
could falsify); a function that calls one earns nothing in the part, as before. Values of p are drawn away
from the cumulative probabilities, where a correct answer summed in another order could keep one token more.
Part E is judged with Part D's known mistake excused: its planted distribution is computed here, so a top-p
that drops the crossing token is charged once.
"""
import math

import numpy as np
import torch

from course_grading.judging import Get, Judge, Let, call, generator, ref
from course_lib.checks import check_close, check_equal
from course_lib.perf.metrics import e2e_latency as ref_e2e
from course_lib.perf.metrics import percentile as ref_percentile
from course_lib.perf.metrics import queue_traces as ref_queue
from course_lib.perf.metrics import tokens_per_second as ref_tps
from course_lib.perf.metrics import tpot as ref_tpot
from course_lib.perf.metrics import ttft as ref_ttft
from course_lib.sampling import sampling_probs as ref_probs
from course_lib.sampling import top_k_filter as ref_top_k
from course_lib.sampling import top_p_filter as ref_top_p

METRICS = "course_lib.perf.metrics"
SAMPLING = "course_lib.sampling"
judge = Judge(references={
    "ttft_e2e_tests": [f"{METRICS}.ttft", f"{METRICS}.e2e_latency"],
    "tpot_tps_tests": [f"{METRICS}.tpot", f"{METRICS}.tokens_per_second"],
    "percentile_tests": [f"{METRICS}.percentile"],
    "top_k_tests": [f"{SAMPLING}.top_k_filter"],
    "top_p_tests": [f"{SAMPLING}.top_p_filter"],
    "sampling_tests": [f"{SAMPLING}.sampling_probs", f"{SAMPLING}.sample"],
    "predict_queue_tests": [f"{METRICS}.queue_traces"],
})

INF = float("inf")


# ---------------------------------------------------------------------------------------------------
# Parts A and B: traces and values

def draw_trace(t, n):
    """A request's start and n token times: a prefill, then exponential gaps (one clock, in order)."""
    start = t.rng.uniform(0, 1e3)
    times = [start + t.rng.expovariate(5.0)]
    for _ in range(n - 1):
        times.append(times[-1] + t.rng.expovariate(1 / 0.03))
    return start, times


def shown(times) -> str:
    kind = "np.array" if isinstance(times, np.ndarray) else "list"
    if len(times) <= 4:
        return f"{kind} {[round(float(x), 6) for x in times]}"
    return f"{kind} of {len(times)} values from {float(times[0]):.6g} to {float(times[-1]):.6g}"


def maybe_array(t, times):
    """The contract takes a list or a numpy array: a third of the drawn traces go as arrays."""
    return np.array(times) if t.rng.random() < 1 / 3 else list(times)


def error_cases(t, calls, also=None):
    """[(label, Call)] that must raise ValueError: one round trip, one case each in group "errors" (`also()`:
    a further condition of each case)."""
    outs = t.run([c for _, c in calls])
    for (label, _), o in zip(calls, outs):
        with t.case(label, group="errors"):
            t.raises(o, "ValueError", what=label)
            if also:
                also()


@judge.part("ttft_e2e_tests", groups={"values": 3, "errors": 1})
def ttft_e2e(t):
    grid = [(100.0, [100.25, 100.30, 100.45, 100.50]), (2.0, np.array([2.5])), (5.0, [5.0, 5.0]),
            (0.0, [0.1, 0.1, 0.1]), (1.7e9, [1.7e9 + 0.3, 1.7e9 + 0.31, 1.7e9 + 2.5]),
            (12.5, np.array([12.75, 13.0, 13.0, 14.5]))]
    drawn = []
    for _ in range(30):
        start, times = draw_trace(t, t.rng.choice([1, 2, t.rng.randint(3, 40)]))
        drawn.append((start, maybe_array(t, times)))
    calls = []
    for start, times in grid + drawn:
        ts = [float(x) for x in times]
        for name, ref_fn in (("ttft", ref_ttft), ("e2e_latency", ref_e2e)):
            what = f"{name}({start:.6g}, {shown(times)})"
            calls.append((what, "values", call(name, start, times),
                          lambda got, what=what, want=ref_fn(start, ts): check_close(got, want, what, rtol=1e-9)))
    t.batch(calls)
    error_cases(t, [(f"{name}(3.0, {label}) (no token)", call(name, 3.0, empty))
                    for name in ("ttft", "e2e_latency")
                    for label, empty in (("[]", []), ("np.array([])", np.array([])))])


@judge.part("tpot_tps_tests", groups={"values": 3, "errors": 1})
def tpot_tps(t):
    grid = [(100.0, [100.25, 100.30, 100.45, 100.50]), (0.0, np.array([1.0, 1.5])), (0.0, [0.25]),
            (7.0, [7.5, 7.5, 7.5]), (1.7e9, [1.7e9 + 0.3, 1.7e9 + 0.31, 1.7e9 + 2.5]), (3.0, [3.1, 3.2]),
            (0.0, np.array([0.2]))]
    drawn = []
    for _ in range(30):
        start, times = draw_trace(t, t.rng.choice([1, 2, t.rng.randint(3, 40)]))
        drawn.append((start, maybe_array(t, times)))
    calls = []
    for start, times in grid + drawn:
        ts = [float(x) for x in times]
        if len(ts) >= 2:
            what = f"tpot({shown(times)})"
            wrong = {t.mistake("tpot_n"): (ts[-1] - ts[0]) / len(ts)}
            calls.append((what, "values", call("tpot", times),
                          lambda got, what=what, want=ref_tpot(ts), wrong=wrong:
                          check_close(got, want, what, rtol=1e-9, mistakes=wrong)))
        what = f"tokens_per_second({start:.6g}, {shown(times)})"
        calls.append((what, "values", call("tokens_per_second", start, times),
                      lambda got, what=what, want=ref_tps(start, ts): check_close(got, want, what, rtol=1e-9)))
    t.batch(calls)
    error_cases(t, [("tpot([1.0]) (one token: no gap)", call("tpot", [1.0])),
                    ("tpot([]) (no tokens)", call("tpot", [])),
                    ("tpot(np.array([3.0])) (one token)", call("tpot", np.array([3.0]))),
                    ("tokens_per_second(0.0, []) (no tokens)", call("tokens_per_second", 0.0, [])),
                    ("tokens_per_second(1.0, np.array([])) (no tokens)",
                     call("tokens_per_second", 1.0, np.array([])))])


def percentile_at_n(values, q):
    """The planted mistake: the position q/100 * n instead of q/100 * (n - 1)."""
    v = sorted(float(x) for x in values)
    r = min(q / 100 * len(v), len(v) - 1)
    i = math.floor(r)
    return v[i] if i >= len(v) - 1 else v[i] + (r - i) * (v[i + 1] - v[i])


FORBIDDEN = {"percentile", "quantile", "nanpercentile", "nanquantile"}


@judge.part("percentile_tests", groups={"values": 3, "errors": 1})
def percentile(t):
    names = t.run([Get("percentile.__code__.co_names")])[0]
    used = sorted(FORBIDDEN & set(names.value)) if names.ok and isinstance(names.value, (list, tuple)) else None

    def own_interpolation():
        t.expect(used is not None, "percentile must be a function defined in the notebook")
        t.expect(not used, f"percentile calls {used}: the contract asks for the interpolation, written by you")

    v5 = [15, 20, 35, 40, 50]
    grid = [(v5, q) for q in (0, 25, 40, 50, 90, 99, 100)]
    grid += [([40, 15, 50, 35, 20], 40), ([7.0], 99), ([7.0], 0), (np.array([1.0, 2.0]), 25), ([2.0, 1.0], 50),
             ([3, 3, 3, 3], 37), ([-5.0, 2.5, -1.0, 0.0], 60), (np.array([0.3, 0.1, 0.2]), 100.0),
             ([1e-3, 1e3, 1.0, 10.0, 0.1, 100.0], 99.9), (list(range(1000, 0, -1)), 12.345)]
    drawn = []
    for _ in range(120):
        n = t.rng.choice([1, 2, 3, t.rng.randint(4, 50), t.rng.randint(50, 400)])
        vals = [t.rng.lognormvariate(-3, 1) for _ in range(n)]
        q = t.rng.choice([0, 50, 90, 99, 100]) if t.rng.random() < 0.3 else t.rng.uniform(0, 100)
        drawn.append((np.array(vals) if t.rng.random() < 0.3 else vals, q))
    calls = []
    for vals, q in grid + drawn:
        floats = [float(x) for x in vals]
        want, wrong = ref_percentile(floats, q), percentile_at_n(floats, q)
        what = f"percentile({shown(vals) if len(vals) > 6 else vals!r}, {q:.6g})"
        mistakes = {t.mistake("percentile_n"): wrong} if abs(wrong - want) > 1e-9 * abs(want) else None

        def check(got, what=what, want=want, mistakes=mistakes):
            own_interpolation()
            t.expect(isinstance(got, (int, float)) and not isinstance(got, bool),
                     f"{what}: expected a number, got {got!r}"[:300])
            check_close(got, want, what, rtol=1e-9, atol=1e-12, mistakes=mistakes)
        calls.append((what, "values", call("percentile", vals, q), check))
    t.batch(calls)
    # invariants: the values are not modified (a list and an array kept in the kernel); non-decreasing in q
    arr = np.array([t.rng.lognormvariate(-3, 1) for _ in range(31)])
    for kind, vals in (("np.array", arr), ("list", list(arr[:17]))):
        with t.case(f"percentile of a {kind} of {len(vals)} values leaves the values unchanged", group="values"):
            got = t.run([Let("v", vals), call("percentile", ref("v"), 90), Get("$v")])
            got[1].get()
            own_interpolation()
            check_equal(np.asarray(got[2].get(), dtype=float), np.asarray(vals, dtype=float),
                        f"the {kind} of values after percentile (must not change)")
    qs = sorted([0, 100] + [t.rng.uniform(0, 100) for _ in range(39)])
    with t.case(f"percentile of {len(arr)} values at {len(qs)} values of q, in order", group="values"):
        ps = [o.get() for o in t.run([call("percentile", arr, q) for q in qs])]
        own_interpolation()
        for a, b, qa, qb in zip(ps, ps[1:], qs, qs[1:]):
            t.expect(b >= a, f"percentile decreases as q grows: {a!r} at q={qa:.6g}, {b!r} at q={qb:.6g}")
    error_cases(t, [("percentile([], 50)", call("percentile", [], 50)),
                    ("percentile(np.array([]), 50)", call("percentile", np.array([]), 50)),
                    ("percentile([1, 2], 101)", call("percentile", [1, 2], 101)),
                    ("percentile([1, 2], -1)", call("percentile", [1, 2], -1)),
                    ("percentile([1.0, 2.0, 3.0], 100.5)", call("percentile", [1.0, 2.0, 3.0], 100.5)),
                    ("percentile([4.0], -0.001)", call("percentile", [4.0], -0.001))], also=own_interpolation)


# ---------------------------------------------------------------------------------------------------
# Parts C and D: filters

def randn(t, *shape, scale=1.0):
    return torch.randn(*shape, generator=t.torch_generator()) * scale


def filtered_case(t, fn, x, arg, what, expect):
    """One call on logits kept in the kernel: `expect(got)` judges the result, then the input must be as sent."""
    got = t.run([Let("x", x), call(fn, ref("x"), arg), Get("$x")])
    out = got[1].get()
    t.expect(isinstance(out, torch.Tensor), f"{what}: expected a tensor, got {out!r}"[:300])
    t.expect(tuple(out.shape) == tuple(x.shape), f"{what}: expected shape {tuple(x.shape)}, got {tuple(out.shape)}")
    expect(out)
    check_equal(got[2].get(), x, f"{what}: the input logits after the call (must not change)")


@judge.part("top_k_tests", groups={"values": 3, "errors": 1})
def top_k(t):
    x = torch.tensor([0.1, 2.0, -1.0, 0.5])
    grid = [(x, 2), (x, 1), (x, 4), (x, 10), (torch.tensor([1.0, 3.0, 3.0, 2.0]), 1),
            (torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0]), 3), (torch.full((6,), 0.5), 1),
            (torch.tensor([[0.0, 1.0, 2.0], [5.0, 4.0, 3.0]]), 2), (torch.tensor([-INF, 1.0, -INF, 0.0]), 3),
            (torch.tensor([[2.0, 2.0, 1.0], [0.0, 7.0, 7.0]], dtype=torch.float64), 1)]
    for _ in range(30):
        lead = [t.rng.randint(1, 5) for _ in range(t.rng.randint(0, 2))]
        V = t.rng.choice([2, 3, t.rng.randint(4, 300)])
        logits = randn(t, *lead, V, scale=3)
        if t.rng.random() < 0.3:
            logits = logits.round()                          # ties with the k-th largest
        grid.append((logits, t.rng.choice([1, V - 1 or 1, V, V + 3, t.rng.randint(1, V)])))
    for logits, k in grid:
        what = (f"top_k_filter({logits.tolist()}, k={k})" if logits.numel() <= 8 else
                f"top_k_filter(logits of shape {tuple(logits.shape)}, k={k}, {int(logits.unique().numel())} "
                "distinct values)")
        with t.case(what, group="values"):
            filtered_case(t, "top_k_filter", logits, k, what,
                          lambda out, what=what, want=ref_top_k(logits, k): check_equal(out, want, what))
    error_cases(t, [(f"top_k_filter(x, k={k!r})", call("top_k_filter", x, k)) for k in (0, -2, 2.5)])


def p_off_boundaries(logits, p, gap=1e-4):
    """No token's probability before it lies within `gap` of p (the reference's probabilities, in float64)."""
    probs = torch.softmax(logits.double(), dim=-1).sort(dim=-1, descending=True).values
    before = probs.cumsum(-1) - probs
    return bool(((before - p).abs() > gap).all())


def draw_p(t, logits, low=0.01):
    p = t.rng.uniform(low, 1.0)
    while not p_off_boundaries(logits, p):
        p = t.rng.uniform(low, 1.0)
    return p


def top_p_drops_crossing(logits, p):
    """The planted mistake: a token removed once the cumulative probability, its own included, exceeds p."""
    if p >= 1:
        return logits.clone()
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(sorted_logits.double(), dim=-1).cumsum(-1)
    remove_sorted = cum > p
    remove_sorted[..., 0] = False
    return logits.masked_fill(torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted), -INF)


@judge.part("top_p_tests", groups={"values": 3, "errors": 1})
def top_p(t):
    x = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    grid = [(x, p) for p in (0.45, 0.55, 0.7, 0.9, 0.97, 1.0, 1e-6)]
    grid += [(x[torch.tensor([2, 0, 3, 1])], 0.55), (torch.stack([x, x.flip(0)]), 0.55), (torch.tensor([1.5]), 0.3),
             (torch.tensor([8.0, 0.0, 0.0, 0.0]), 0.99), (torch.stack([x, x.flip(0)]).double(), 0.85),
             (torch.stack([x, x.flip(0), x]).reshape(3, 1, 4), 0.6), (torch.tensor([0.0, -INF, 1.0, -INF]), 0.5)]
    for _ in range(35):
        logits = randn(t, t.rng.randint(1, 4), t.rng.choice([2, 3, t.rng.randint(4, 300)]), scale=t.rng.uniform(0.3, 6))
        grid.append((logits, draw_p(t, logits)))
    for logits, p in grid:
        what = (f"top_p_filter({[round(v, 4) for v in logits.tolist()]}, p={p:.6g})" if logits.dim() == 1 else
                f"top_p_filter(logits of shape {tuple(logits.shape)}, {str(logits.dtype)[6:]}, p={p:.6g})")
        want, wrong = ref_top_p(logits, p), top_p_drops_crossing(logits, p)
        mistakes = {t.mistake("top_p_drop"): torch.isinf(wrong)} if not torch.equal(wrong, want) else None

        def expect(out, what=what, want=want, mistakes=mistakes, dtype=logits.dtype):
            check_equal(torch.isinf(out), torch.isinf(want), f"{what}: which logits are removed (True: -inf)",
                        mistakes=mistakes)
            check_close(out, want, f"{what}: the kept logits (they keep their values)")
            t.expect(out.dtype == dtype, f"{what}: expected dtype {dtype}, got {out.dtype}")
        with t.case(what, group="values"):
            filtered_case(t, "top_p_filter", logits, p, what, expect)
    error_cases(t, [(f"top_p_filter(x, p={p!r})", call("top_p_filter", x, p))
                    for p in (0.0, 1.5, -0.2, 1.0000001, math.nan, "0.5")])


# ---------------------------------------------------------------------------------------------------
# Part E

def planted_probs(logits, temperature, k, p):
    """sampling_probs with Part D's planted mistake (the token that crosses p dropped)."""
    x = logits.float() / temperature
    if k is not None:
        x = ref_top_k(x, k)
    return torch.softmax(top_p_drops_crossing(x, p).float(), dim=-1)


def probs_mistakes(t, logits, temperature, k, p):
    if p is None or temperature == 0:
        return None
    return {t.mistake("top_p_drop"): planted_probs(logits, temperature, k, p)}


@judge.part("sampling_tests", groups={"probs": 3, "sample": 2, "errors": 1})
def sampling(t):
    x = torch.tensor([2.0, 1.0, 0.5, -1.0])
    grid = [(x, 1.0, None, None), (x, 0.0, None, None), (x, 0.5, 2, None), (x, 2.0, None, 0.8), (x, 0.0, 1, 0.3),
            (torch.tensor([1.0, 3.0, 3.0, 0.0]), 0.0, None, None), (x, 0.05, None, None), (x, 50.0, 3, None),
            (x, 1.0, 1, None), (x, 1.0, 10, 0.99), (x, 0.7, 3, 0.75), (x.double(), 1.3, None, 0.5),
            (torch.stack([x, x.flip(0), -x]).reshape(3, 1, 4), 0.8, 3, 0.6)]
    drawn = []
    for _ in range(25):
        logits = randn(t, t.rng.randint(1, 4), t.rng.randint(2, 200), scale=3)
        temperature, V = t.rng.uniform(0.2, 2.5), logits.shape[-1]
        k = t.rng.randint(1, V + 2) if t.rng.random() < 0.6 else None
        scaled = ref_top_k(logits / temperature, k) if k is not None else logits / temperature
        p = draw_p(t, scaled, low=0.05) if t.rng.random() < 0.6 else None
        drawn.append((logits, temperature, k, p))
    cases = grid + drawn
    calls = []
    for logits, temperature, k, p in cases + [(c[0], 0.0, None, None) for c in drawn]:
        named = logits.tolist() if logits.numel() <= 4 else f"logits of shape {tuple(logits.shape)}"
        what = (f"sampling_probs({named}, "
                f"temperature={temperature:.4g}, top_k={k}, top_p={p if p is None else round(p, 6)})")
        calls.append((what, "probs", call("sampling_probs", logits, temperature, k, p),
                      lambda got, what=what, want=ref_probs(logits, temperature, k, p),
                      wrong=probs_mistakes(t, logits, temperature, k, p):
                      check_close(got, want, what, rtol=1e-5, atol=1e-6, mistakes=wrong)))
    # temperature 0: the argmax (first among equal maxima), whatever top-k and top-p say
    for logits, _, k, p in cases[:6] + drawn:
        what = f"sample(logits of shape {tuple(logits.shape)}, temperature=0, top_k={k}, top_p={p})"

        def greedy(got, what=what, want=logits.argmax(-1)):
            t.expect(isinstance(got, torch.Tensor), f"{what}: expected a tensor of token ids, got {got!r}"[:300])
            check_equal(got, want, what + " (the argmax of each row)")
        calls.append((what, "sample", call("sample", logits, 0.0, k, p), greedy))
    t.batch(calls)
    # drawn tokens: shape, dtype, support, the generator's seed decides them
    for logits, temperature, k, p in grid[2:4] + grid[-1:] + drawn[:12]:
        seed = t.rng.getrandbits(62)
        what = f"sample(logits of shape {tuple(logits.shape)}, temperature={temperature:.4g}, top_k={k}, top_p={p})"
        with t.case(what, group="sample"):
            got = t.run([call("sample", logits, temperature, k, p, generator=generator(seed)),
                         call("sample", logits, temperature, k, p, generator=generator(seed))])
            a, b = got[0].get(), got[1].get()
            t.expect(isinstance(a, torch.Tensor), f"{what}: expected a tensor of token ids, got {a!r}"[:300])
            t.expect(tuple(a.shape) == tuple(logits.shape[:-1]),
                     f"{what}: expected shape {tuple(logits.shape[:-1])}, got {tuple(a.shape)}")
            t.expect(a.dtype == torch.int64, f"{what}: expected dtype torch.int64, got {a.dtype}")
            t.expect(bool(((a >= 0) & (a < logits.shape[-1])).all()), f"{what}: token ids out of range: {a.tolist()}")
            allowed = ref_probs(logits, temperature, k, p).gather(-1, a[..., None]).squeeze(-1) > 0
            t.expect(bool(allowed.all()), f"{what}: drew a token whose probability is 0 (filtered out): "
                                          f"{a[~allowed].tolist()}")
            check_equal(b, a, f"{what}: two draws with generators of the same seed (the generator decides the draw)")
    # frequencies: many rows of one distribution
    N = 20_000
    for logits, temperature, k, p in [(x, 1.0, 3, None), (x, 2.0, None, 0.8),
                                      (randn(t, 6, scale=2), t.rng.uniform(0.5, 2), None, None)]:
        want = ref_probs(logits, temperature, k, p)
        what = (f"the frequencies of {N} draws of sample({[round(v, 3) for v in logits.tolist()]}, "
                f"temperature={temperature:.4g}, top_k={k}, top_p={p})")
        with t.case(what, group="sample"):
            got = t.call("sample", logits.expand(N, -1).contiguous(), temperature, k, p,
                         generator=generator(t.rng.getrandbits(62)))
            t.expect(isinstance(got, torch.Tensor) and tuple(got.shape) == (N,),
                     f"{what}: expected {N} token ids, got {getattr(got, 'shape', got)!r}"[:300])
            freq = torch.bincount(got.long().clamp(0, len(want) - 1), minlength=len(want)).double() / N
            check_close(freq, want.double(), what, atol=0.02, rtol=0,
                        mistakes=probs_mistakes(t, logits, temperature, k, p))
    error_cases(t, [("sampling_probs(x, temperature=-1.0)", call("sampling_probs", x, -1.0)),
                    ("sampling_probs(x, temperature=-0.001, top_k=2)", call("sampling_probs", x, -0.001, 2)),
                    ("sample(x, temperature=-0.5)", call("sample", x, -0.5))])


# ---------------------------------------------------------------------------------------------------
# Part F

def planted_queue(requests, tpot, gaps_n=False, no_wait=False, prefills_only=False, from_zero=False):
    """The known wrong predictions of a one-at-a-time server: `gaps_n` counts n TPOT gaps for n tokens;
    `no_wait` serves every request on arrival; `prefills_only` frees the server at a request's first token;
    `from_zero` reads the latencies from time 0 instead of each arrival."""
    free, ttfts, e2es = 0.0, [], []
    for arrival, first_s, n in requests:
        first = (arrival if no_wait else max(arrival, free)) + first_s
        last = first + (n if gaps_n else n - 1) * tpot
        free = first if prefills_only else last
        origin = 0.0 if from_zero else arrival
        ttfts.append(first - origin)
        e2es.append(last - origin)
    return ttfts, e2es


def draw_queue(t):
    """1 to 30 requests: a burst, a steady stream at some load, or sparse arrivals; tokens from 1 to 500."""
    n = t.rng.choice([1, 2, t.rng.randint(3, 12), t.rng.randint(12, 30)])
    tpot = 0.0 if t.rng.random() < 0.1 else t.rng.uniform(1e-4, 0.1)
    first = [t.rng.uniform(1e-3, 1.0) if t.rng.random() < 0.9 else 0.0 for _ in range(n)]
    tokens = [t.rng.choice([1, 2, t.rng.randint(3, 60), t.rng.randint(60, 500)]) for _ in range(n)]
    service = sum(f + (k - 1) * tpot for f, k in zip(first, tokens)) / n
    load = t.rng.choice([0.0, 0.5, 0.9, 1.5, 4.0])            # 0: a burst; arrivals ~ service / load apart
    clock, arrivals = t.rng.choice([0.0, t.rng.uniform(0, 1e3)]), []
    for _ in range(n):
        arrivals.append(clock)
        if load:
            clock += t.rng.expovariate(load / service) if service > 0 else t.rng.uniform(0, 1)
    return [(a, f, k) for a, f, k in zip(arrivals, first, tokens)], tpot


def shown_queue(requests) -> str:
    if len(requests) <= 4:
        return repr([tuple(round(x, 6) if isinstance(x, float) else x for x in r) for r in requests])
    return (f"{len(requests)} requests arriving from {requests[0][0]:.6g} s to {requests[-1][0]:.6g} s, "
            f"{sum(r[2] for r in requests)} tokens in all")


@judge.part("predict_queue_tests", groups={"values": 3, "errors": 1})
def predict_queue(t):
    burst = [(0.0, 0.3, 12), (0.0, 0.3, 4), (0.0, 0.3, 20), (0.0, 0.3, 8)]
    mixed = [(0.0, 0.3, 16), (0.0, 0.3, 4), (0.35, 0.3, 24), (1.0, 0.3, 8), (1.0, 0.3, 12), (2.8, 0.3, 2),
             (2.9, 0.3, 20), (3.0, 0.3, 6)]
    # edge grid: alone, a one-token answer, a burst, an idle server, an arrival exactly as the server frees, no
    # decode time, no prefill, the measurement's schedule, a late lone arrival, one long answer ahead of short ones
    grid = [([(0.0, 0.25, 11)], 0.05), ([(0.0, 0.4, 1)], 0.02), (burst, 0.04), (burst[::-1], 0.04),
            ([(0.0, 0.2, 5), (10.0, 0.2, 5), (20.0, 0.1, 3)], 0.01), ([(0.0, 0.25, 3), (0.375, 0.25, 2)], 0.0625),
            ([(0.0, 0.1, 50), (0.05, 0.1, 3)], 0.0), ([(0.0, 0.0, 5), (0.0, 0.0, 5)], 0.1), (mixed, 0.04),
            ([(5.0, 0.3, 20)], 0.04), ([(0.0, 0.5, 400)] + [(0.01 * k, 0.05, 1) for k in range(1, 6)], 0.02),
            ([(1e3, 1e-3, 2), (1e3 + 1e-4, 1e-3, 2000)], 1e-4)]
    cases = grid + [draw_queue(t) for _ in range(40)]
    calls = []
    for requests, tpot in cases:
        traces = ref_queue(requests, tpot)
        want = ([tr.ttft for tr in traces], [tr.e2e for tr in traces])
        planted = {t.mistake(key): planted_queue(requests, tpot, **{flag: True})
                   for key, flag in (("e2e_n_gaps", "gaps_n"), ("queue_ignored", "no_wait"),
                                     ("queue_prefills_only", "prefills_only"),
                                     ("latency_from_first_arrival", "from_zero"))}
        what = f"predict_queue({shown_queue(requests)}, tpot={tpot:.6g})"

        def check(got, what=what, want=want, planted=planted, n=len(requests)):
            t.expect(isinstance(got, (tuple, list)) and len(got) == 2,
                     f"{what}: expected a pair (ttfts, e2es), got {got!r}"[:300])
            for k, name in enumerate(("TTFTs", "E2Es")):
                t.expect(isinstance(got[k], (tuple, list)) and len(got[k]) == n,
                         f"{what}: expected {n} {name}, one per request, got {got[k]!r}"[:300])
                wrong = {key: value[k] for key, value in planted.items() if value[k] != want[k]}
                check_close(got[k], want[k], f"{what}: the {name} (seconds, from each arrival)", rtol=1e-9,
                            atol=1e-12, mistakes=wrong)
        calls.append((what, "values", call("predict_queue", requests, tpot), check))
    t.batch(calls)
    bad = [([], 0.04), ([(0.0, 0.3, 0)], 0.04), ([(0.0, 0.3, -2)], 0.04), ([(0.0, 0.3, 2.5)], 0.04),
           ([(0.0, 0.3, 3.0)], 0.04), ([(0.0, 0.3, True)], 0.04), ([(0.0, -0.1, 5)], 0.04),
           ([(-1.0, 0.3, 5)], 0.04), ([(1.0, 0.3, 5), (0.5, 0.3, 5)], 0.04), ([(0.0, 0.3, 5)], -0.04)]
    error_cases(t, [(f"predict_queue({requests!r}, tpot={tpot})", call("predict_queue", requests, tpot))
                    for requests, tpot in bad])


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("TPOT divides by the number of tokens, not the number of gaps (n - 1); the percentile's position is "
         "q/100 * n instead of q/100 * (n - 1) (Part B, contract)",
         {"metrics": solution_with("lab00", "metrics", {
             "    return (float(times[-1]) - float(times[0])) / (len(times) - 1)":
             "    return (float(times[-1]) - float(times[0])) / len(times)"}),
          "percentile": solution_with("lab00", "percentile", {
              "    r = q / 100 * (len(v) - 1)": "    r = min(q / 100 * len(v), len(v) - 1)"})},
         ["tpot_n", "percentile_n"]),
        ("top-p drops the token that crosses p (Part D, contract; Part E is not charged again); the queue's "
         "prediction counts n TPOT gaps for n tokens (Part F, the prediction)",
         {"top_p": solution_with("lab00", "top_p", {
             "    before = torch.cumsum(probs, dim=-1) - probs  # probability of the tokens before each one\n"
             "    remove_sorted = before >= p":
             "    remove_sorted = torch.cumsum(probs, dim=-1) > p"}),
          "predict_queue": solution_with("lab00", "predict_queue", {
              "        free = first + (n - 1) * tpot": "        free = first + n * tpot"})},
         ["top_p_drop", "e2e_n_gaps"]),
        ("the queue's prediction frees the server once a request's first token is out: a request waits only for "
         "the prefills ahead of it",
         {"predict_queue": solution_with("lab00", "predict_queue", {
             "        free = first + (n - 1) * tpot           # busy until its last token: n - 1 gaps after the first\n"
             "        ttfts.append(first - arrival)\n"
             "        e2es.append(free - arrival)":
             "        ttfts.append(first - arrival)\n"
             "        e2es.append(first + (n - 1) * tpot - arrival)\n"
             "        free = first"})},
         ["queue_prefills_only"]),
        ("the queue's prediction reads every latency from time 0, not from the request's own arrival",
         {"predict_queue": solution_with("lab00", "predict_queue", {
             "        ttfts.append(first - arrival)\n        e2es.append(free - arrival)":
             "        ttfts.append(first)\n        e2es.append(free)"})},
         ["latency_from_first_arrival"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_queue": {"points": 2, "rubric": [
        (1, "quotes their own predicted and measured p50 and p90 TTFT and E2E and the p90 E2E ratio, and "
            "attributes the longest TTFTs to waiting behind the requests ahead (named from their table), not "
            "to the prefill, which is the same for every request"),
        (1, "names what moves the measured ratio (TTFT and TPOT from the fastest of a few short runs, an "
            "error every later user inherits through the wait; the server's own work between requests; a busy "
            "machine) and answers the order question with numbers: the shorter request first lowers the pair's "
            "mean E2E and leaves their common finish, so the later requests, unchanged; shortest first in a "
            "burst"),
    ]},
}
