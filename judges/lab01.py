"""Lab 01's judge: the roofline's formulas, on inputs the grader draws and an edge grid of its own.

Every case calls the student's function in their kernel with plain numbers and compares what comes back
with `course_lib.perf`'s reference here, in the grader's process. Exercise 6, the prediction, is judged against
`decode_step` (the step, each user's and the server's tokens/s, with every sequence's KV cache read) and
`decode_step_critical_batch` (the batch where that step turns compute-bound, judged on its definition, as
exercise 5's batch is), on Llama-shaped models, mixed weight and KV formats, datasheet and drawn devices, and
contexts on either side of the one past which no batch is compute-bound."""
import math

from course_grading.judging import Judge, call
from course_lib.checks import check_close, check_equal
from course_lib.perf.hardware import DeviceSpec
from course_lib.perf.ops import matmul_cost as ref_matmul_cost
from course_lib.perf.roofline import attainable_flops as ref_attainable
from course_lib.perf.roofline import classify as ref_classify
from course_lib.perf.roofline import critical_batch as ref_critical
from course_lib.perf.roofline import decode_step as ref_step
from course_lib.perf.roofline import decode_step_critical_batch as ref_step_batch
from course_lib.perf.roofline import min_decode_latency as ref_latency
from course_lib.perf.roofline import ridge_point as ref_ridge
from course_lib.perf.roofline import roofline_time as ref_time

judge = Judge(references={
    "matmul_cost_tests": ["course_lib.perf.ops.matmul_cost"],
    "roofline_tests": ["course_lib.perf.roofline.attainable_flops", "course_lib.perf.roofline.ridge_point"],
    "bound_and_time_tests": ["course_lib.perf.roofline.classify", "course_lib.perf.roofline.roofline_time"],
    "decode_latency_tests": ["course_lib.perf.roofline.min_decode_latency"],
    "critical_batch_tests": ["course_lib.perf.roofline.critical_batch"],
    "predict_decode_tests": ["course_lib.perf.roofline.decode_step",
                             "course_lib.perf.roofline.decode_step_critical_batch"],
})


def device(peak, bw):
    return DeviceSpec("drawn device", bandwidth_gbs=bw / 1e9, peak_tflops={"fp16": peak / 1e12})


def draw_device(t, peak=(1e12, 2e15), bw=(1e11, 8e12)):
    return t.rng.uniform(*peak), t.rng.uniform(*bw)


@judge.part("matmul_cost_tests")
def matmul_cost(t):
    grid = [(1, 1, 1, 2), (1, 4096, 4096, 2), (2048, 4096, 4096, 0.5), (7, 3, 5, 1), (9000, 1, 9000, 4)]
    drawn = [(t.rng.randint(1, 9000), t.rng.randint(1, 9000), t.rng.randint(1, 9000), t.rng.choice([0.5, 1, 2, 4]))
             for _ in range(20)]

    def check(m, n, k, b, what):
        def judged(got):
            t.expect(isinstance(got, (tuple, list)) and len(got) == 3,
                     f"{what}: expected a tuple (flops, nbytes, intensity), got {got!r}")
            ref = ref_matmul_cost(m, n, k, b)
            check_close(got[0], ref.flops, what + ": FLOPs", rtol=1e-9, mistakes={t.mistake("flops_mnk"): m * n * k})
            check_close(got[1], ref.bytes, what + ": bytes", rtol=1e-9)
            check_close(got[2], ref.intensity, what + ": FLOP/byte", rtol=1e-9,
                        mistakes={t.mistake("flops_mnk"): m * n * k / ref.bytes})
        return judged
    t.batch((f"matmul_cost({m}, {n}, {k}, {b})", "main", call("matmul_cost", m, n, k, b),
             check(m, n, k, b, f"matmul_cost({m}, {n}, {k}, {b})")) for m, n, k, b in grid + drawn)


def close_to(want, what, **kw):
    return lambda got: check_close(got, want, what, **kw)


@judge.part("roofline_tests")
def roofline(t):
    devices = [(312e12, 2039e9), (989.4e12, 3350e9), (1e12, 1e12)] + [draw_device(t) for _ in range(12)]
    items = []
    for peak, bw in devices:
        dev = device(peak, bw)
        ridge = ref_ridge(dev, "fp16")
        what = f"ridge_point({peak:.6g}, {bw:.6g})"
        items.append((what, "main", call("ridge_point", peak, bw), close_to(ridge, what, rtol=1e-9)))
        # below, exactly at and above the ridge, and far on either side
        for intensity in (ridge * 0.5, ridge, ridge * 2, t.rng.uniform(0.01, 10), t.rng.uniform(0, 1e5)):
            what = f"attainable({intensity:.6g}, {peak:.6g}, {bw:.6g})"
            items.append((what, "main", call("attainable", intensity, peak, bw),
                          close_to(ref_attainable(intensity, dev, "fp16"), what, rtol=1e-9)))
    t.batch(items)


@judge.part("bound_and_time_tests")
def bound_and_time(t):
    cases = [(1.0, 312e12, 2039e9), (200.0, 989.4e12, 3350e9), (10.0, 100.0, 10.0)]   # the last: exactly the ridge
    for _ in range(25):
        peak, bw = draw_device(t)
        cases.append((t.rng.choice([t.rng.uniform(0.01, 50), t.rng.uniform(50, 5000)]), peak, bw))
    items = []
    for intensity, peak, bw in cases:
        what = f"classify({intensity:.6g}, peak_flops={peak:.6g}, bandwidth={bw:.6g})"
        want = ref_classify(intensity, device(peak, bw), "fp16")
        items.append((what, "classify", call("classify", intensity, peak, bw),
                      lambda got, want=want, what=what: check_equal(got, want, what)))
    for _ in range(25):
        peak, bw = draw_device(t)
        f, nb = t.rng.uniform(1e6, 1e14), t.rng.uniform(1e5, 1e11)
        what = f"op_time({f:.6g}, {nb:.6g}, peak_flops={peak:.6g}, bandwidth={bw:.6g})"
        items.append((what, "op_time", call("op_time", f, nb, peak, bw),
                      close_to(ref_time(f, nb, device(peak, bw), "fp16"), what, rtol=1e-9)))
    t.batch(items)


@judge.part("decode_latency_tests")
def decode_latency(t):
    cases = [(7e9, 2, 2039e9, 0), (7e9, 0.5, 3350e9, 2e9), (1e8, 4, 1e11, 0)]
    cases += [(t.rng.uniform(1e8, 5e11), t.rng.choice([0.5, 1, 2, 4]), t.rng.uniform(1e11, 8e12),
               t.rng.choice([0, t.rng.uniform(1e6, 1e11)])) for _ in range(25)]
    items = []
    for n, b, bw, kv in cases:
        what = f"min_decode_latency({n:.6g}, {b}, {bw:.6g}, kv_cache_bytes={kv:.6g})"
        want = ref_latency(n, DeviceSpec("drawn device", bandwidth_gbs=bw / 1e9, peak_tflops={"fp16": 100}), b,
                           kv_cache_bytes=kv)
        items.append((what, "main", call("min_decode_latency", n, b, bw, kv_cache_bytes=kv), close_to(want, what,
                                                                                                      rtol=1e-9)))
    t.batch(items)


@judge.part("critical_batch_tests")
def critical_batch(t):
    grid = [(4096, 4096, 2, 312e12, 2039e9), (64, 64, 2, 989.4e12, 3350e9), (4096, 4096, 1, 1e12, 1e12),
            (16, 32768, 0.5, 1e15, 1e11), (32768, 32768, 4, 2e15, 1e11)]
    drawn = []
    for _ in range(30):
        d_in = t.rng.choice([t.rng.randint(16, 512), t.rng.randint(512, 32768)])
        peak, bw = t.rng.uniform(5e12, 2e15), t.rng.uniform(1e11, 8e12)
        drawn.append((d_in, t.rng.randint(16, 32768), t.rng.choice([1, 2, 4]), peak, bw))

    def check(d_in, d_out, b, peak, bw, what):
        ridge = peak / bw
        ref = ref_critical(d_in, d_out, device(peak, bw), b, peak_dtype="fp16")
        want = None if math.isinf(ref) else max(1, math.ceil(ref))
        wrong = {t.mistake("critical_weights_only"): max(1, math.ceil(ridge * b / 2))}

        def judged(got):
            if want is None:
                check_equal(got, None, what + " (never compute-bound)", mistakes=wrong)
                return
            t.expect(isinstance(got, int) and not isinstance(got, bool) and got >= 1,
                     f"{what}: expected a positive integer batch size, got {got!r}")
            # judged on the definition (smallest compute-bound batch), not on the formula's rounding
            bound = ref_matmul_cost(got, d_out, d_in, b).intensity >= ridge * (1 - 1e-12)
            earlier = got > 1 and ref_matmul_cost(got - 1, d_out, d_in, b).intensity >= ridge * (1 + 1e-12)
            if not bound or earlier:
                check_equal(got, want, what, mistakes=wrong)
        return judged
    items = []
    for d_in, d_out, b, peak, bw in grid + drawn:
        what = f"critical_batch({d_in}, {d_out}, {b}, {peak:.6g}, {bw:.6g})"
        items.append((what, "main", call("critical_batch", d_in, d_out, b, peak, bw),
                      check(d_in, d_out, b, peak, bw, what)))
    t.batch(items)


def step_parts(n, b, peak, bw, batch, context, kv):
    """(memory_s, compute_s) of the course's step: the weights once, each sequence's KV cache, 2 n FLOPs each."""
    one = ref_step(n, device(peak, bw), dtype=b, batch=batch, kv_bytes=batch * context * kv)
    return one.memory_s, one.compute_s


def planted_steps(n, b, peak, bw, batch, context, kv):
    """{mistake key: (step_s, user tokens/s, server tokens/s)} of the known wrong models of the step."""
    memory, compute = step_parts(n, b, peak, bw, batch, context, kv)
    steps = {"decode_weights_per_sequence": max((n * b * batch + batch * context * kv) / bw, compute),
             "decode_memory_only": memory,
             "kv_read_once": max((n * b + context * kv) / bw, compute)}
    out = {key: (s, 1 / s, batch / s) for key, s in steps.items()}
    step = max(memory, compute)
    out["user_is_total"] = (step, batch / step, batch / step)
    return out


def planted_batches(n, b, peak, bw, context, kv):
    """{mistake key: batch or None} of the known wrong crossovers."""
    def first(weights_s, per_sequence):                  # smallest B >= 1 with B * per_sequence >= weights_s
        return None if per_sequence <= 0 else max(1, math.ceil(weights_s / per_sequence))
    seq_compute = 2 * n / peak
    return {"kv_read_once": first((n * b + context * kv) / bw, seq_compute),
            "batch_without_kv": first(n * b / bw, seq_compute),
            "decode_weights_per_sequence": 1 if seq_compute >= (n * b + context * kv) / bw else None,
            "decode_memory_only": None}


LLAMA2_7B, LLAMA3_8B, TINY = (6_738_415_616, 524_288), (8_030_261_248, 131_072), (4_680_960, 3072)
A100, H100, H200, H100_FP8 = (312e12, 2039e9), (989.4e12, 3350e9), (989.4e12, 4800e9), (1978.9e12, 3350e9)
CPU = (2e11, 3e10)          # a laptop-like measured CPU: 200 GFLOP/s fp32, 30 GB/s


def draw_decode(t):
    """A model, a weight format, a device, a context and KV bytes per token (0: no KV read)."""
    n = t.rng.choice([t.rng.uniform(1e6, 1e9), t.rng.uniform(1e9, 5e11)])
    peak, bw = t.rng.uniform(1e11, 2e15), t.rng.uniform(1e10, 8e12)
    context = t.rng.choice([0, t.rng.randint(1, 512), t.rng.randint(512, 131_072)])
    kv = t.rng.choice([0, t.rng.uniform(1e3, 1e6)])
    return n, t.rng.choice([0.5, 1, 2, 4]), peak, bw, context, kv


@judge.part("predict_decode_tests", groups={"step": 3, "batch": 3, "errors": 2})
def predict_decode(t):
    (p7, kv7), (p8, kv8), (pt, kvt) = LLAMA2_7B, LLAMA3_8B, TINY
    # (params, bytes per weight, peak, bandwidth, batch, context, KV bytes per token): batch 1 with no KV (exercise
    # 4), the weights shared at 64, compute-bound at 512, Llama-2-7B's KV taking over at 4096 tokens, int4 weights
    # with an fp8 KV cache on an H200, the bundled model on a CPU, a context with no KV bytes and KV bytes with no
    # context, fp8 weights at the fp8 rate
    grid = [(7e9, 2, *A100, 1, 0, 0), (7e9, 2, *A100, 64, 0, 0), (7e9, 2, *A100, 512, 0, 0),
            (p7, 2, *A100, 16, 4096, kv7), (p7, 2, *A100, 1, 4096, kv7), (p8, 0.5, *H200, 32, 8192, kv8 / 2),
            (pt, 4, *CPU, 8, 64, kvt), (pt, 4, *CPU, 64, 511, kvt), (7e9, 2, *A100, 1, 1000, 0),
            (7e9, 2, *A100, 4, 0, kv7), (7e9, 1, *H100_FP8, 1024, 128, kv8), (1e6, 0.5, 1e12, 1e10, 4096, 0, 0)]
    for _ in range(30):
        n, b, peak, bw, context, kv = draw_decode(t)
        grid.append((n, b, peak, bw, t.rng.choice([1, t.rng.randint(2, 64), t.rng.randint(64, 4096)]), context, kv))
    items = []
    for n, b, peak, bw, batch, context, kv in grid:
        memory, compute = step_parts(n, b, peak, bw, batch, context, kv)
        step = max(memory, compute)
        want = (step, 1 / step, batch / step)
        planted = planted_steps(n, b, peak, bw, batch, context, kv)
        what = (f"predict_decode({n:.6g}, {b}, {peak:.6g}, {bw:.6g}, batch={batch}, context={context}, "
                f"kv_bytes_per_token={kv:.6g})")

        def check(got, what=what, want=want, planted=planted):
            t.expect(isinstance(got, (tuple, list)) and len(got) == 3,
                     f"{what}: expected a tuple (step_s, user_tokens_per_s, total_tokens_per_s), got {got!r}"[:300])
            for k, name in enumerate(("the step (s)", "one user's tokens/s", "the server's tokens/s")):
                wrong = {t.mistake(key): value[k] for key, value in planted.items()
                         if not math.isclose(value[k], want[k], rel_tol=1e-9)}
                check_close(got[k], want[k], f"{what}: {name}", rtol=1e-9, mistakes=wrong)
        items.append((what, "step", call("predict_decode", n, b, peak, bw, batch, context, kv), check))
    # compute_bound_batch: no KV (the ridge in fp16), Llama-2-7B on either side of 168 tokens (25,700 just below),
    # an exact tie at batch 2, a device whose ridge is below 1, KV bytes with no context, Llama-3-8B int4 with fp8 KV
    # on either side of 829 tokens, the bundled model on a CPU, and fp8 weights at the fp8 rate
    batches = [(p7, 2, *A100, 0, 0), (p7, 2, *A100, 4096, kv7), (p7, 2, *A100, 100, kv7), (p7, 2, *A100, 167, kv7),
               (p7, 2, *A100, 168, kv7), (1e9, 2, 2e12, 1e12, 0, 0), (1e9, 2, 1e11, 1e12, 0, 0),
               (7e9, 2, *A100, 0, kv7), (p8, 0.5, *H100, 512, kv8 / 2), (p8, 0.5, *H100, 829, kv8 / 2),
               (p8, 0.5, *H100, 830, kv8 / 2), (pt, 4, *CPU, 64, kvt), (pt, 4, *CPU, 511, kvt),
               (p8, 1, *H100_FP8, 2048, kv8 / 2)]
    batches += [draw_decode(t) for _ in range(30)]
    for n, b, peak, bw, context, kv in batches:
        ref = ref_step_batch(n, device(peak, bw), dtype=b, kv_bytes=context * kv)
        want = None if math.isinf(ref) else max(1, math.ceil(ref))
        planted = {t.mistake(key): value for key, value in planted_batches(n, b, peak, bw, context, kv).items()
                   if value != want}
        what = (f"compute_bound_batch({n:.6g}, {b}, {peak:.6g}, {bw:.6g}, context={context}, "
                f"kv_bytes_per_token={kv:.6g})")

        def bound(B, slack, n=n, b=b, peak=peak, bw=bw, context=context, kv=kv):
            memory, compute = step_parts(n, b, peak, bw, B, context, kv)
            return compute >= memory * (1 + slack)

        def judged(got, what=what, want=want, planted=planted, bound=bound):
            if want is None:
                check_equal(got, None, what + " (no batch is compute-bound)", mistakes=planted)
                return
            t.expect(got is None or (isinstance(got, int) and not isinstance(got, bool) and got >= 1),
                     f"{what}: expected a positive integer batch size or None, got {got!r}"[:300])
            # judged on the definition (the smallest compute-bound batch), not on the formula's rounding
            if got is None or not bound(got, -1e-12) or (got > 1 and bound(got - 1, 1e-12)):
                check_equal(got, want, what, mistakes=planted)
        items.append((what, "batch", call("compute_bound_batch", n, b, peak, bw, context, kv), judged))
    t.batch(items)
    args = (7e9, 2, 1e14, 1e12)
    bad = [("predict_decode", args, {"batch": 0}), ("predict_decode", args, {"batch": 2.0}),
           ("predict_decode", args, {"batch": True}), ("predict_decode", args, {"context": -1}),
           ("predict_decode", args, {"context": 1.5}), ("predict_decode", args, {"kv_bytes_per_token": -1}),
           ("predict_decode", (0, 2, 1e14, 1e12), {}), ("predict_decode", (7e9, 0, 1e14, 1e12), {}),
           ("predict_decode", (7e9, 2, -1.0, 1e12), {}), ("predict_decode", (7e9, 2, 1e14, -1.0), {}),
           ("compute_bound_batch", args, {"context": -4}), ("compute_bound_batch", args, {"kv_bytes_per_token": -1}),
           ("compute_bound_batch", (7e9, 2, 1e14, 0), {}), ("compute_bound_batch", (-7e9, 2, 1e14, 1e12), {})]
    outs = t.run([call(fn, *a, **kw) for fn, a, kw in bad])
    for (fn, a, kw), o in zip(bad, outs):
        what = f"{fn}{a + tuple(f'{k}={v!r}' for k, v in kw.items())}"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what)


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py): (what,
    {answer grade_id: source}, [MISTAKES keys the verdict must name])."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    memory = "    memory = (num_params * bytes_per_param + batch * context * kv_bytes_per_token) / bandwidth"
    return [
        ("a matmul counted as m*n*k FLOPs; the decode step reads the weights once per sequence",
         {"matmul_cost": solution_with("lab01", "matmul_cost", {"    flops = 2 * m * n * k": "    flops = m * n * k"}),
          "predict_decode": solution_with("lab01", "predict_decode", {
              memory: "    memory = batch * (num_params * bytes_per_param + context * kv_bytes_per_token)"
                      " / bandwidth"})},
         ["flops_mnk", "decode_weights_per_sequence"]),
        ("the critical batch from the weights-only approximation intensity = 2B / bytes_per_element",
         {"critical_batch": '''\
def critical_batch(d_in, d_out, bytes_per_element, peak_flops, bandwidth):
    ridge = peak_flops / bandwidth
    if 2 * d_in * d_out / (bytes_per_element * (d_in + d_out)) < ridge:
        return None
    return max(1, math.ceil(ridge * bytes_per_element / 2))
'''},
         ["critical_weights_only"]),
        ("the KV cache read once for the whole batch, like the weights (in the step and in the crossover)",
         {"predict_decode": solution_with("lab01", "predict_decode", {
             memory: "    memory = (num_params * bytes_per_param + context * kv_bytes_per_token) / bandwidth",
             "            (num_params * bytes_per_param + b * context * kv_bytes_per_token) / bandwidth":
             "            (num_params * bytes_per_param + context * kv_bytes_per_token) / bandwidth",
             "    weights_s = num_params * bytes_per_param / bandwidth      # read once, whatever the batch":
             "    weights_s = (num_params * bytes_per_param + context * kv_bytes_per_token) / bandwidth",
             "    per_sequence = 2 * num_params / peak_flops - context * kv_bytes_per_token / bandwidth":
             "    per_sequence = 2 * num_params / peak_flops"})},
         ["kv_read_once"]),
        ("each user's tokens/s taken as the server's",
         {"predict_decode": solution_with("lab01", "predict_decode", {
             "    return step, 1 / step, batch / step": "    return step, batch / step, batch / step"})},
         ["user_is_total"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_roofline_gap": {"points": 2, "rubric": [
        (1, "quotes their own predicted and measured steps at batch 1 and at their largest batch with the ratios "
            "and their compute_bound_batch at 64 tokens, and names the binding floor at each batch (memory at "
            "batch 1; compute past the crossover)"),
        (1, "explains the gap by a fixed per-operator cost paid once per step, estimated per operator from their "
            "numbers, and why the ratio falls with the batch (the cost is shared by more tokens); and explains "
            "with their compute_bound_batch at longer contexts that each sequence's own KV read pushes the "
            "crossover up until, once it costs more than the sequence's arithmetic, no batch reaches it (a 7B "
            "model at 4096 tokens stays memory-bound)"),
    ]},
}
