"""Lab 02's judge: the quantizers, packing, SQNR and NF4 on tensors the grader draws, against `course_lib.quant`.

Each case sends a tensor (kept in the kernel where the contract says it must not change, and read back after
the call) and compares the codes, scales and zero points with the reference's here. Codes may differ from the
reference by one step on a rare value that sits on a rounding tie (x / scale computed in another order): at
most one code in a thousand, by at most one; NF4 codes may differ only where x / absmax sits on a midpoint
between two levels (the contract allows either neighbour). Each dequantizer is judged on its own, on the
reference's codes, so a wrong quantizer does not cost its inverse too.
"""
import math

import torch

from course_grading.judging import Get, Judge, Let, call, ref
from course_lib.checks import check_close, check_equal, check_shape
from course_lib.quant.core import absmax_quantize as ref_absmax
from course_lib.quant.core import zeropoint_quantize as ref_zeropoint
from course_lib.quant.memory import bits_per_weight as ref_bits
from course_lib.quant.metrics import sqnr_db as ref_sqnr
from course_lib.quant.nf4 import nf4_codebook
from course_lib.quant.nf4 import nf4_quantize as ref_nf4
from course_lib.quant.packing import pack_int4 as ref_pack
from course_lib.quant.packing import unpack_int4 as ref_unpack

CORE = "course_lib.quant.core"
NF4_MODULE = "course_lib.quant.nf4"
judge = Judge(references={
    # the quantizers' shared engine (`quantize`) answers them too
    "absmax_tests": [f"{CORE}.absmax_quantize", f"{CORE}.quantize"],
    "zeropoint_tests": [f"{CORE}.zeropoint_quantize", f"{CORE}.quantize"],
    "group_tests": [f"{CORE}.absmax_quantize", f"{CORE}.quantize"],
    "packing_tests": ["course_lib.quant.packing.pack_int4", "course_lib.quant.packing.unpack_int4"],
    "sqnr_tests": ["course_lib.quant.metrics.sqnr_db"],
    # nearest_code and the blockwise step are the exercise itself; the codebook (the setup cell's NF4) stays
    "nf4_tests": [f"{NF4_MODULE}.nf4_quantize", f"{NF4_MODULE}.nf4_dequantize", f"{NF4_MODULE}.nearest_code",
                  f"{NF4_MODULE}._blockwise_absmax_codes"],
    "predict_bits_per_weight_tests": ["course_lib.quant.memory.bits_per_weight"],
})

NF4 = nf4_codebook()


def randn(t, *shape, scale=1.0):
    return torch.randn(*shape, generator=t.torch_generator()) * scale


def draw_shape(t, dims=(1, 3), size=(1, 39)):
    return [t.rng.randint(*size) for _ in range(t.rng.randint(*dims))]


def named(x) -> str:
    return f"{[round(v, 4) for v in x.tolist()]}" if x.dim() == 1 and x.numel() <= 6 else \
        f"x of shape {tuple(x.shape)}"


def as_scalar(v):
    """A 0-d or one-element tensor, or a number, as a 0-d tensor (the contract's 0-d scale)."""
    v = torch.as_tensor(v)
    return v.reshape(()) if v.numel() == 1 else v


def pair(t, got, n, what, names):
    t.expect(isinstance(got, (tuple, list)) and len(got) == n, f"{what}: expected a tuple ({names}), got {got!r}"[:300])
    return got


def check_codes(t, got, want, what, mistakes=None):
    """Codes equal to the reference's, but for a rare tie rounded the other way (one step, one in a thousand)."""
    t.expect(isinstance(got, torch.Tensor), f"{what}: expected a tensor of codes, got {got!r}"[:300])
    check_shape(got, want.shape, what)
    diff = (got.long() - want.long()).abs()
    if diff.numel() and (int(diff.max()) > 1 or int((diff > 0).sum()) > max(1, diff.numel() // 1000)):
        check_equal(got, want, what, mistakes=mistakes)


def run_cases(t, calls):
    """[(label, group, Call, check(value))]: the calls in one round trip, then one case each."""
    outs = t.run([c for _, _, c, _ in calls])
    for (label, group, _, check), o in zip(calls, outs):
        with t.case(label, group=group):
            check(o.get())


def error_cases(t, calls):
    """[(label, Call)] that must raise ValueError: one round trip, one case each in group "errors"."""
    outs = t.run([c for _, c in calls])
    for (label, _), o in zip(calls, outs):
        with t.case(label, group="errors"):
            t.raises(o, "ValueError", what=label)


# ---------------------------------------------------------------------------------------------------
# Exercises 1 and 2: one scale per tensor

@judge.part("absmax_tests", groups={"values": 3, "errors": 1})
def absmax(t):
    fixed = randn(t, 3, 7, scale=2)
    grid = [(torch.tensor([0.1, 3.2, -1.7]), 8), (torch.tensor([-1.4, 0.25, 0.66]), 4), (torch.zeros(5), 4),
            (torch.tensor(-2.5), 4), (torch.tensor([0.7]), 2), (torch.tensor([-3.0, -1.0, -0.5]), 3),
            (torch.tensor([1e30, -2e29, 3e28]), 8), (randn(t, 4, 5).double(), 6), (randn(t, 2, 3, 4, scale=1e-3), 5)]
    grid += [(fixed, bits) for bits in range(2, 9)]
    grid += [(randn(t, *draw_shape(t), scale=t.rng.uniform(1e-3, 10)), t.rng.randint(2, 8)) for _ in range(20)]
    calls = []
    for x, bits in grid:
        r = ref_absmax(x, bits)
        what = f"absmax_quantize({named(x)}, bits={bits})"

        def check(got, what=what, x=x, bits=bits, r=r):
            codes, scale = pair(t, got, 2, what, "codes, scale")
            check_close(as_scalar(scale), r.scale.reshape(()), what + ": scale", rtol=1e-6,
                        mistakes={t.mistake("absmax_128"): x.abs().max() / 2 ** (bits - 1)})
            check_codes(t, codes, r.codes, what + ": codes")
        calls.append((what, "values", call("absmax_quantize", x, bits), check))
        # the inverse on the reference's codes
        what = f"absmax_dequantize(the codes and scale of {named(x)} at {bits} bits)"
        calls.append((what, "values", call("absmax_dequantize", r.codes, r.scale.reshape(())),
                      lambda got, what=what, want=r.dequantize(): check_close(got, want, what, rtol=1e-6, atol=0)))
    run_cases(t, calls)
    error_cases(t, [(f"absmax_quantize(x, bits={b})", call("absmax_quantize", torch.ones(3), b))
                    for b in (1, 9, 0, -1)])


@judge.part("zeropoint_tests", groups={"values": 3, "errors": 1})
def zeropoint(t):
    fixed = randn(t, 5, 6) + 0.7
    grid = [(torch.tensor([0.1, 3.2, -3.0]), 8), (torch.tensor([1.0, 2.0, 3.0]), 2), (torch.zeros(4), 8),
            (torch.tensor([-1.0, -2.0, -0.5]), 4), (torch.tensor([2.5]), 3), (torch.tensor([-0.25]), 5),
            (torch.tensor([100.0, 101.0, 102.0]), 8), (torch.tensor([0.0, -7.5, 2.5, 0.0]), 4),
            (randn(t, 3, 4, 2, scale=3) - 1.0, 7)]
    grid += [(fixed, bits) for bits in range(2, 9)]
    for _ in range(20):
        x = randn(t, *draw_shape(t), scale=t.rng.uniform(1e-3, 10))
        grid.append((x + t.rng.gauss(0, 1) * float(x.abs().max()), t.rng.randint(2, 8)))    # lopsided ranges too
    calls = []
    for x, bits in grid:
        r = ref_zeropoint(x, bits)
        zp = int(r.zero_point.reshape(-1)[0])
        what = f"zeropoint_quantize({named(x)}, bits={bits})"

        def check(got, what=what, r=r, zp=zp):
            codes, scale, zero_point = pair(t, got, 3, what, "codes, scale, zero_point")
            check_close(as_scalar(scale), r.scale.reshape(()), what + ": scale", rtol=1e-6)
            check_close(as_scalar(zero_point), zp, what + ": zero point", rtol=0, atol=0)
            check_codes(t, codes, r.codes, what + ": codes")
        calls.append((what, "values", call("zeropoint_quantize", x, bits), check))
        what = f"zeropoint_dequantize(the codes, scale and zero point of {named(x)} at {bits} bits)"
        calls.append((what, "values", call("zeropoint_dequantize", r.codes, r.scale.reshape(()), zp),
                      lambda got, what=what, want=r.dequantize(): check_close(got, want, what, rtol=1e-6, atol=1e-12)))
    run_cases(t, calls)
    error_cases(t, [(f"zeropoint_quantize(x, bits={b})", call("zeropoint_quantize", torch.ones(3), b))
                    for b in (0, 1, 9)])


# ---------------------------------------------------------------------------------------------------
# Exercise 3: per group

def strided_scales(w, bits, group_size):
    """The planted mistake: groups of every (cols // group_size)-th value instead of consecutive values."""
    rows, cols = w.shape
    return w.reshape(rows, group_size, cols // group_size).abs().amax(dim=1) / (2 ** (bits - 1) - 1)


def strided_dequantize(codes, scales, group_size):
    """The same mistake in the inverse: scale j applied to every (cols // group_size)-th code."""
    rows, cols = codes.shape
    return (codes.float().reshape(rows, group_size, cols // group_size) * scales.unsqueeze(1)).reshape(rows, cols)


@judge.part("group_tests", groups={"values": 3, "errors": 1})
def group(t):
    w = torch.tensor([[0.4, -1.0, 0.2, 0.05], [3.0, 0.0, -0.7, 0.7], [0.0, 0.0, 0.0, 0.0]])
    zero_group = randn(t, 3, 8)
    zero_group[1, 4:] = 0.0
    grid = [(w, 4, 2), (w, 8, 4), (w, 3, 1), (randn(t, 1, 12), 4, 3), (zero_group, 5, 4), (randn(t, 4, 8), 2, 2),
            (randn(t, 2, 6), 8, 6), (-randn(t, 5, 16).abs(), 4, 8)]
    for _ in range(20):
        gs = t.rng.choice([4, 8, 16, 32, 64])
        rows, ng = t.rng.randint(1, 29), t.rng.randint(1, 5)
        x = randn(t, rows, ng * gs, scale=0.02)
        x[t.rng.randrange(rows), t.rng.randrange(ng * gs)] = t.rng.choice([1.0, -1.0])      # an outlier in one group
        grid.append((x, t.rng.randint(2, 8), gs))
    for x, bits, gs in grid:
        r = ref_absmax(x, bits, "group", axis=-1, group_size=gs)
        rows, cols = x.shape
        qmax = 2 ** (bits - 1) - 1
        what = f"group_quantize(w [{rows}, {cols}], bits={bits}, group_size={gs})"
        with t.case(what, group="values"):
            got = t.run([Let("w", x), call("group_quantize", ref("w"), bits, gs), Get("$w")])
            codes, scales = pair(t, got[1].get(), 2, what, "codes, scales")
            check_shape(scales, (rows, cols // gs), what + ": scales")
            check_close(scales, r.scale, what + ": scales", rtol=1e-6,
                        mistakes={t.mistake("group_strided"): strided_scales(x, bits, gs)})
            check_codes(t, codes, r.codes, what + ": codes")
            # the largest-magnitude weight of each group lands on the end of the grid
            groups = x.reshape(rows, -1, gs)
            top = groups.abs().argmax(-1, keepdim=True)
            at_top = codes.long().reshape(rows, -1, gs).gather(-1, top).squeeze(-1)
            sign = groups.gather(-1, top).squeeze(-1).sign().long()
            check_equal(at_top, sign * qmax, what + ": the code of each group's largest-magnitude weight (+-qmax, "
                                                    "0 for an all-zero group)")
            check_equal(got[2].get(), x, what + ": w after group_quantize (must not change)")
        what = f"group_dequantize(the codes and scales of w [{rows}, {cols}], group_size={gs})"
        with t.case(what, group="values"):
            check_close(t.call("group_dequantize", r.codes, r.scale, gs), r.dequantize(), what, rtol=1e-6, atol=0,
                        mistakes={t.mistake("group_strided"): strided_dequantize(r.codes, r.scale, gs)})
    error_cases(t, [(f"group_quantize(w [3, 4], bits={b}, group_size={g!r})", call("group_quantize", w, b, g))
                    for b, g in ((4, 3), (4, 0), (4, -2), (4, 2.0), (4, 8), (9, 2), (1, 2))])


# ---------------------------------------------------------------------------------------------------
# Exercises 4 and 5

@judge.part("packing_tests")
def packing(t):
    g = t.torch_generator()
    every = torch.arange(-8, 8, dtype=torch.int8)
    codes = [torch.tensor([1, -2, 7, -8], dtype=torch.int8), every, every.flip(0).reshape(2, 8),
             torch.tensor([[1, 2, 3, 4, 5, 6], [-1, -2, -3, -4, -5, -6]], dtype=torch.int8),
             torch.tensor([-8, -8], dtype=torch.int8), torch.tensor([[0, 7]], dtype=torch.int64),
             torch.randint(-8, 8, (3, 4, 10), generator=g, dtype=torch.int8).to(torch.int32)]
    for _ in range(20):
        shape = draw_shape(t, size=(1, 11))
        shape[-1] *= 2
        codes.append(torch.randint(-8, 8, shape, generator=g, dtype=torch.int8))
    packed = [torch.arange(256, dtype=torch.uint8), torch.tensor([[0xE1], [0x87]], dtype=torch.uint8)]
    packed += [torch.randint(0, 256, draw_shape(t, size=(1, 11)), generator=g, dtype=torch.uint8) for _ in range(10)]
    calls = []
    for c in codes:
        what = f"pack_int4({c.tolist() if c.numel() <= 8 else f'codes of shape {tuple(c.shape)}'}, {str(c.dtype)[6:]})"

        def check_pack(got, what=what, want=ref_pack(c)):
            t.expect(isinstance(got, torch.Tensor) and got.dtype == torch.uint8,
                     f"{what}: expected a torch.uint8 tensor, got {getattr(got, 'dtype', got)!r}"[:300])
            check_equal(got, want, what + ": bytes")
        calls.append((what, "main", call("pack_int4", c), check_pack))
    for p in packed + [ref_pack(c) for c in codes[:3]]:
        what = f"unpack_int4({p.tolist() if p.numel() <= 4 else f'bytes of shape {tuple(p.shape)}'})"

        def check_unpack(got, what=what, want=ref_unpack(p)):
            t.expect(isinstance(got, torch.Tensor) and not got.is_floating_point(),
                     f"{what}: expected an integer tensor, got {getattr(got, 'dtype', got)!r}"[:300])
            check_equal(got, want, what + ": codes")
        calls.append((what, "main", call("unpack_int4", p), check_unpack))
    run_cases(t, calls)


@judge.part("sqnr_tests")
def sqnr(t):
    x = torch.tensor([1.0, -2.0, 3.0, -4.0], dtype=torch.float64)
    w = randn(t, 16, 32)
    grid = [(x, x * 1.1), (x, x + 1.0), (x, x.clone()), (x, torch.zeros(4, dtype=torch.float64)), (x, -x),
            (w, w.clone()), (w, w + 1e-4 * randn(t, 16, 32)), (w, (w * 8).round() / 8), (w.double(), w + 0.5)]
    for _ in range(20):
        a = randn(t, t.rng.randint(2, 500))
        noise = t.rng.uniform(0, 0.5)
        grid.append((a, a + noise * randn(t, *a.shape)))
    calls = []
    for a, b in grid:
        want = ref_sqnr(a, b)
        level = "no noise" if math.isinf(want) else f"an SQNR of {want:.4g} dB"
        what = f"sqnr_db(x of shape {tuple(a.shape)}, x_hat with {level})"
        check = (lambda got, what=what: check_equal(got, math.inf, what)) if math.isinf(want) else \
            (lambda got, what=what, want=want: check_close(got, want, what, rtol=1e-6))
        calls.append((what, "main", call("sqnr_db", a, b), check))
    run_cases(t, calls)


# ---------------------------------------------------------------------------------------------------
# Exercise 6

@judge.part("nf4_tests", groups={"values": 3, "errors": 1})
def nf4(t):
    mid = (NF4[:-1] + NF4[1:]) / 2
    visible = torch.tensor([[0.5, -1.0, 0.02, 0.2], [0.0, 0.0, 0.0, 0.0], [2.0, -0.39, 0.31, 1.3]])
    zero_block = randn(t, 4, 32)
    zero_block[1] = 0.0
    grid = [(visible, 4), (torch.tensor([1.0, -2.0, 0.0, 0.5, 0.0, -0.0]), 1), (randn(t, 64), 64),
            (zero_block, 32), (-randn(t, 2, 16).abs(), 16), ((NF4 * 2.5).reshape(2, 8), 16),
            (torch.cat([torch.ones(1), mid]), 16), (randn(t, 2, 4, 8, scale=0.1), 16), (randn(t, 256, scale=5), 128)]
    for _ in range(20):
        bs, nb = t.rng.choice([16, 32, 64, 128]), t.rng.randint(1, 39)
        shape = [nb * bs // 8, 8] if t.rng.random() < 0.5 else [nb * bs]
        x = randn(t, *shape, scale=t.rng.uniform(1e-3, 3))
        if nb > 1:
            x.view(-1)[:bs] = 0.0                                            # an all-zero block
        grid.append((x, bs))
    for x, bs in grid:
        r = ref_nf4(x, blocksize=bs)
        want = r.codes()
        scaled = (x.reshape(-1, bs) / r.absmax.clamp(min=1e-38)[:, None]).reshape(-1)
        on_midpoint = (scaled[:, None] - mid[None, :]).abs().min(dim=1).values < 1e-6
        wrong = torch.bucketize(scaled.clamp(-1, 1), NF4).clamp(max=15)
        codes_in = want.reshape(x.shape).to(torch.uint8)
        what = f"nf4_quantize({named(x)}, blocksize={bs})"
        got = t.run([Let("x", x), call("nf4_quantize", ref("x"), bs), Get("$x"),
                     call("nf4_dequantize", codes_in, r.absmax, bs)])
        with t.case(what, group="values"):
            codes, absmax = pair(t, got[1].get(), 2, what, "codes, absmax")
            t.expect(isinstance(absmax, torch.Tensor), f"{what}: expected a tensor of absmax, got {absmax!r}"[:300])
            check_close(absmax.float(), r.absmax, what + ": absmax", rtol=1e-6)
            t.expect(isinstance(codes, torch.Tensor), f"{what}: expected a tensor of codes, got {codes!r}"[:300])
            check_shape(codes, tuple(x.shape), what + ": codes")
            flat = codes.long().reshape(-1)
            if bool(((flat != want) & ~on_midpoint).any()):
                check_equal(flat, want, what + ": codes (the indices of the nearest levels, flattened)",
                            mistakes={t.mistake("nf4_bucketize"): wrong})
            check_equal(got[2].get(), x, what + ": x after nf4_quantize (must not change)")
        what = f"nf4_dequantize(the reference's codes of {named(x)}, blocksize={bs})"
        with t.case(what, group="values"):
            out = got[3].get()
            check_shape(out, tuple(x.shape), what)
            check_close(out, r.dequantize(), what, rtol=1e-6, atol=0)
    error_cases(t, [(f"nf4_quantize({n} values, blocksize={bs!r})", call("nf4_quantize", torch.ones(n), bs))
                    for n, bs in ((10, 4), (8, 0), (96, 64), (64, 2.0), (64, -8), (12, 24))])


# ---------------------------------------------------------------------------------------------------
# Exercise 7

def stored_bits(bits, group_size, scale_bits, numel, scale_group=None, outer_bits=32, *, partial=True, outer=True):
    """Every bit a tensor of `numel` weights stores, by enumeration: the groups cut from the start (the short
    last one kept; `partial=False` drops it: the planted mistake), their scales, the groups of scales with
    their outer scales and the per-tensor offset (`outer=False` leaves both out: the planted mistake)."""
    groups = [range(i, min(i + group_size, numel)) for i in range(0, numel,
                                                                  group_size)] if group_size else [range(numel)]
    if not partial:
        groups = [g for g in groups if len(g) == (group_size or numel)]
    total = bits * numel + scale_bits * len(groups)
    if scale_group is not None and outer:
        total += outer_bits * len(range(0, len(groups), scale_group)) + outer_bits
    return total


def limit_bits(bits, group_size, scale_bits, scale_group=None, outer_bits=32):
    """The long-tensor limit: the course's memory model (`course_lib.quant.memory`), plus the outer scales
    spread over the group_size x scale_group weights that share one."""
    outer = 0.0 if scale_group is None else outer_bits / (group_size * scale_group)
    return ref_bits(bits, group_size, scale_bits) + outer


@judge.part("predict_bits_per_weight_tests", groups={"values": 3, "errors": 1})
def predict_bits(t):
    # (bits, group_size, scale_bits, numel, scale_group, outer_bits)
    grid = [(4, 32, 16, None, None, 32), (4, 64, 8, None, 256, 32), (8, None, 16, None, None, 32),
            (4, 256, 16, 11008, None, 32), (4, 64, 8, 11008, 256, 32), (4, 64, 32, 4096, None, 32),
            (4, 64, 8, 64 * 256, 256, 32), (4, 64, 8, 64 * 256 + 1, 256, 32), (8, 32, 16, 31, None, 32),
            (8, 32, 16, 33, None, 32), (3, 1, 16, 7, None, 32), (4, None, 16, 10, None, 32), (2, 48, 8, 1, None, 32),
            (4, 16, 8, 4096, 1, 16), (1, 1024, 16, 1025, 3, 32), (5, 100, 12.5, 1001, None, 32)]
    for _ in range(30):
        g = t.rng.choice([16, 32, 64, 128, 256, t.rng.randint(1, 512)])
        numel = t.rng.choice([None, t.rng.randint(1, 50_000), g * t.rng.randint(1, 2000), g * t.rng.randint(1,
                                                                                                            2000) + 1])
        sg = t.rng.choice([None, None, 256, t.rng.randint(1, 300)])
        grid.append((t.rng.randint(1, 8), g, t.rng.choice([8, 16, 32]), numel, sg, t.rng.choice([16, 32])))
    calls = []
    for b, gs, sb, numel, sg, ob in grid:
        what = f"predict_bits_per_weight({b}, {gs}, {sb}, numel={numel}, scale_group={sg}, outer_bits={ob})"
        if numel is None:
            want = float(b) if gs is None else limit_bits(b, gs, sb, sg, ob)
            wrong = {t.mistake("bits_no_scales"): b}
            if sg is not None:
                wrong[t.mistake("dq_outer_forgotten")] = limit_bits(b, gs, sb)
        else:
            want = stored_bits(b, gs, sb, numel, sg, ob) / numel
            if b == 4 and gs and sb in (8, 32) and (sg is None) == (sb == 32) and ob == 32 and numel <= 50_000:
                # the course's NF4 quantizer stores exactly this: its bits, counted on a real tensor
                r = ref_nf4(torch.randn(numel, generator=t.torch_generator()), gs, double_quant=sg is not None,
                            dq_blocksize=sg or 256)
                assert math.isclose(r.bits_per_value(), want, rel_tol=1e-12), (what, r.bits_per_value(), want)
            wrong = {t.mistake("bits_no_scales"): float(b),
                     t.mistake("partial_group_dropped"): stored_bits(b, gs, sb, numel, sg, ob, partial=False) / numel}
            if sg is not None:
                wrong[t.mistake("dq_outer_forgotten")] = stored_bits(b, gs, sb, numel, sg, ob, outer=False) / numel
        wrong = {k: v for k, v in wrong.items() if not math.isclose(v, want, rel_tol=1e-9)}
        calls.append((what, "values", call("predict_bits_per_weight", b, gs, sb, numel, sg, ob),
                      lambda got, what=what, want=want, wrong=wrong:
                      check_close(got, want, what, rtol=1e-9, mistakes=wrong)))
    run_cases(t, calls)
    error_cases(t, [(f"predict_bits_per_weight({b}, group_size={g!r}, {kw})", call("predict_bits_per_weight", b, g,
                                                                                   **kw))
                    for b, g, kw in ((0, 32, {}), (-1, None, {}), (4, 0, {}), (4, -32, {}), (4, 2.5, {}),
                                     (4, 32, {"numel": 0}), (4, 32, {"numel": 10.0}), (4, 32, {"scale_group": 0}),
                                     (4, None, {"scale_group": 256}))])


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("int8 absmax scales by 2**(bits-1) = 128 instead of 127; per-group scales over strided groups "
         "(reshape(rows, group_size, -1)) instead of consecutive values (exercise 3, contract)",
         {"absmax": solution_with("lab02", "absmax", {
             "    qmax = 2 ** (bits - 1) - 1\n": "    qmax = 2 ** (bits - 1)\n",
             "torch.clamp(torch.round(x / scale), -qmax, qmax)":
             "torch.clamp(torch.round(x / scale), -qmax, qmax - 1)"}),
          "group": solution_with("lab02", "group", {
              "    groups = w.reshape(rows, cols // group_size, group_size)\n"
              "    scales = groups.abs().amax(dim=-1) / qmax":
              "    groups = w.reshape(rows, group_size, cols // group_size)\n"
              "    scales = groups.abs().amax(dim=1) / qmax",
              "torch.round(groups / safe.unsqueeze(-1))": "torch.round(groups / safe.unsqueeze(1))",
              "    groups = codes.float().reshape(rows, cols // group_size, group_size)\n"
              "    return (groups * scales.unsqueeze(-1))":
              "    groups = codes.float().reshape(rows, group_size, cols // group_size)\n"
              "    return (groups * scales.unsqueeze(1))"})},
         ["absmax_128", "group_strided"]),
        ("NF4 codes from torch.bucketize on the levels (the level at or above, not the nearest; exercise 6, "
         "contract); bits per weight without the scales (exercise 7, the prediction)",
         {"nf4": solution_with("lab02", "nf4", {
             "    codes = torch.bucketize(scaled, (NF4[:-1] + NF4[1:]) / 2)":
             "    codes = torch.bucketize(scaled, NF4).clamp(max=15)"}),
          "predict_bits_per_weight": solution_with("lab02", "predict_bits_per_weight", {
              "    scales = 1 if group_size is None else -(-numel // group_size)":
              "    scales = 1 if group_size is None else numel // group_size"})},
         ["nf4_bucketize", "partial_group_dropped"]),
        ("double quantization counted as the quantized scales alone (exercise 7, the prediction)",
         {"predict_bits_per_weight": solution_with("lab02", "predict_bits_per_weight", {
             "        total += outer_bits * (-(-scales // scale_group)) + outer_bits  # outer scales, and the offset":
             "        total += 0",
             "        outer = 0.0 if scale_group is None else outer_bits / (group_size * scale_group)":
             "        outer = 0.0"})},
         ["dq_outer_forgotten"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_bits_and_error": {"points": 2, "rubric": [
        (1, "quotes their own dB per bit per tensor and per group, explains the ~6 dB per bit by the step "
            "halving, and where it departs at 2-3 bits (the largest weight sets the step, most weights round "
            "to 0)"),
        (1, "explains why groups help (each group's own maximum, a smaller step: about the same dB gain at "
            "every width, which matters where the error does, at low widths) and compares NF4 with int4 "
            "at the same block, attributing the gain to levels at normal quantiles; notes predicted and "
            "measured bits agree because both count the same stored bytes"),
    ]},
}
