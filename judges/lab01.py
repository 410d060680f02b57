"""Lab 01's judge: the roofline's formulas, on inputs the grader draws and an edge grid of its own.

Every case calls the student's function in their kernel with plain numbers and compares what comes back
with `course_lib.perf`'s reference here, in the grader's process."""
import math

from course_grading.judging import Judge, call
from course_lib.checks import check_close, check_equal
from course_lib.perf.hardware import DeviceSpec
from course_lib.perf.ops import matmul_cost as ref_matmul_cost
from course_lib.perf.roofline import attainable_flops as ref_attainable
from course_lib.perf.roofline import classify as ref_classify
from course_lib.perf.roofline import critical_batch as ref_critical
from course_lib.perf.roofline import decode_step as ref_step
from course_lib.perf.roofline import min_decode_latency as ref_latency
from course_lib.perf.roofline import ridge_point as ref_ridge
from course_lib.perf.roofline import roofline_time as ref_time

judge = Judge(references={
    "matmul_cost_tests": ["course_lib.perf.ops.matmul_cost"],
    "roofline_tests": ["course_lib.perf.roofline.attainable_flops", "course_lib.perf.roofline.ridge_point"],
    "bound_and_time_tests": ["course_lib.perf.roofline.classify", "course_lib.perf.roofline.roofline_time"],
    "decode_latency_tests": ["course_lib.perf.roofline.min_decode_latency"],
    "critical_batch_tests": ["course_lib.perf.roofline.critical_batch"],
    "predict_decode_step_tests": ["course_lib.perf.roofline.decode_step"],
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


@judge.part("predict_decode_step_tests", groups={"values": 3, "errors": 1})
def predict_decode_step(t):
    grid = [(7e9, 2, 312e12, 2039e9, 1, 0), (7e9, 2, 312e12, 2039e9, 64, 0), (7e9, 2, 312e12, 2039e9, 512, 0),
            (7e9, 2, 989.4e12, 3350e9, 8, 2e9), (1e6, 0.5, 1e12, 1e10, 4096, 0)]
    drawn = [(t.rng.uniform(1e6, 5e11), t.rng.choice([0.5, 1, 2, 4]), t.rng.uniform(1e12, 2e15),
              t.rng.uniform(1e10, 8e12), t.rng.choice([1, t.rng.randint(2, 64), t.rng.randint(64, 4096)]),
              t.rng.choice([0, t.rng.uniform(1e6, 1e11)])) for _ in range(30)]
    items = []
    for n, b, peak, bw, batch, kv in grid + drawn:
        want = ref_step(n, device(peak, bw), dtype=b, batch=batch, kv_bytes=kv).time
        wrong = {t.mistake("decode_weights_per_sequence"): max((n * b * batch + kv) / bw, 2 * n * batch / peak),
                 t.mistake("decode_memory_only"): (n * b + kv) / bw}
        what = f"predict_decode_step({n:.6g}, {b}, {peak:.6g}, {bw:.6g}, batch={batch}, kv_cache_bytes={kv:.6g})"
        items.append((what, "values", call("predict_decode_step", n, b, peak, bw, batch, kv),
                      close_to(want, what, rtol=1e-9, mistakes=wrong)))
    t.batch(items)
    bad = [((7e9, 2, 1e14, 1e12), {"batch": 0}), ((7e9, 2, 1e14, 1e12), {"batch": 2.0}),
           ((7e9, 2, 1e14, 1e12), {"batch": True}), ((7e9, 2, 1e14, 1e12), {"kv_cache_bytes": -1}),
           ((0, 2, 1e14, 1e12), {}), ((7e9, 0, 1e14, 1e12), {}), ((7e9, 2, -1.0, 1e12), {}),
           ((7e9, 2, 1e14, -1.0), {})]
    outs = t.run([call("predict_decode_step", *args, **kwargs) for args, kwargs in bad])
    for (args, kwargs), o in zip(bad, outs):
        what = f"predict_decode_step{args + tuple(f'{k}={v!r}' for k, v in kwargs.items())}"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what)


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py): (what,
    {answer grade_id: source}, [MISTAKES keys the verdict must name])."""
    return [
        ("a matmul counted as m*n*k FLOPs; the decode step reads the weights once per sequence",
         {"matmul_cost": '''\
def matmul_cost(m, n, k, bytes_per_element):
    flops = m * n * k
    nbytes = bytes_per_element * (m * k + k * n + m * n)
    return flops, nbytes, flops / nbytes
''', "predict_decode_step": '''\
def predict_decode_step(num_params, bytes_per_param, peak_flops, bandwidth, batch=1, kv_cache_bytes=0):
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    for name, value in (("num_params", num_params), ("bytes_per_param", bytes_per_param),
                        ("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    if not kv_cache_bytes >= 0:
        raise ValueError(f"kv_cache_bytes must be >= 0, got {kv_cache_bytes!r}")
    memory = (num_params * bytes_per_param * batch + kv_cache_bytes) / bandwidth
    compute = 2 * num_params * batch / peak_flops
    return max(memory, compute)
'''},
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
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_roofline_gap": {"points": 2, "rubric": [
        (1, "quotes their own predicted and measured step and ratio, and identifies the memory floor as "
            "binding because a batch-1 step's intensity (about 0.5 FLOP/byte for fp32 weights) is below their"
            " ridge"),
        (1, "explains the gap by a fixed per-operator cost the roofline leaves out, estimated per operator "
            "from their numbers, and argues the ratio falls towards 1 for a 7B model (bytes per operator "
            "grow, the overhead does not)"),
    ]},
}
