"""Lab 07's judge: online softmax, tiled attention (memory and work bounds), the IO prediction, the Triton kernel,
its backward pass.

Inputs are drawn here and sent as tensors; outputs are compared with `course_lib.attention.reference_attention`
here. The memory and work bounds of Parts B, C and E are what the driver's watch saw inside the kernel (every
tensor a torch operation returned during the call, the elements of the matmul results): an observation made in
the student's process, which a student who attacks the driver could falsify; the outputs themselves are judged
here. Part C is judged with Part B's known mistakes excused when Part B was charged for them (each planted
mistake has its causal version below), so one bug in the shared loop costs one part. Part E's shapes include a
grid over every residue of S and of S - T modulo the key tile, so a kernel whose loop stops one tile short
fails on every run, not on the shapes a draw happens to give. Part F's gradients are compared with
torch.autograd through `reference_attention`, here; its grid covers T < S, a decode row, T > S (non-causal)
and exact tile multiples.
"""
import math

import torch

from course_grading.judging import Judge, call
from course_lib.attention import count_io, online_softmax_stats, reference_attention
from course_lib.checks import check_close

judge = Judge(references={
    "online_tests": ["course_lib.attention.online_softmax.online_softmax_stats",
                     "course_lib.attention.online_softmax.online_softmax",
                     "course_lib.attention.online_softmax.softmax_stats_update"],
    "tiled_tests": ["course_lib.attention.reference.reference_attention", "course_lib.attention.tiled.tiled_attention"],
    "causal_tests": ["course_lib.attention.reference.reference_attention",
                     "course_lib.attention.tiled.tiled_attention"],
    "predict_flash_io_tests": ["course_lib.attention.io_model.flash_attention_io",
                               "course_lib.attention.io_model.count_io"],
    "flash_kernel_tests": ["course_lib.attention.reference.reference_attention",
                           "course_lib.attention.triton_flash.flash_attention_triton",
                           "course_lib.attention.triton_flash._flash_fwd_kernel"],
    "flash_backward_tests": ["course_lib.attention.reference.reference_attention",
                             "course_lib.attention.backward.tiled_attention_backward",
                             "course_lib.attention.triton_flash_backward.flash_attention_backward_triton",
                             "course_lib.attention.triton_flash_backward.flash_attention_autograd",
                             "course_lib.attention.triton_flash_backward._bwd_dkdv_kernel",
                             "course_lib.attention.triton_flash_backward._bwd_dq_kernel"],
})


def randn(t, *shape, scale=1.0):
    return torch.randn(*shape, generator=t.torch_generator()) * scale


# ---------------------------------------------------------------------------------------------------
# planted mistakes, computed here

def planted_tiled(q, k, v, bq, bk, causal=False, rescale_l=True, rescale_acc=True, top_left=False):
    """Tiled attention as the lab's loop, with a mistake planted: the running sum l or the accumulator acc
    not rescaled when the running max grows, or the causal mask aligned top-left."""
    B, H, Tq, d = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    out = torch.empty_like(q)
    offset = 0 if top_left else Tk - Tq
    for i0 in range(0, Tq, bq):
        i1 = min(i0 + bq, Tq)
        qi = q[:, :, i0:i1]
        m = torch.full(qi.shape[:-1], -math.inf)
        l = torch.zeros(qi.shape[:-1])
        acc = torch.zeros_like(qi)
        k_end = min(Tk, offset + i1) if causal else Tk
        for j0 in range(0, k_end, bk):
            j1 = min(j0 + bk, Tk)
            s = qi @ kr[:, :, j0:j1].transpose(-1, -2) / math.sqrt(d)
            if causal:
                rows = torch.arange(i0, i1)[:, None] + offset
                s = s.masked_fill(torch.arange(j0, j1)[None, :] > rows, -math.inf)
            m_new = torch.maximum(m, s.max(-1).values)
            alpha = torch.exp(m - m_new).nan_to_num(0.0)
            p = torch.exp(s - m_new[..., None]).nan_to_num(0.0)
            l = (alpha * l if rescale_l else l) + p.sum(-1)
            acc = (alpha[..., None] * acc if rescale_acc else acc) + p @ vr[:, :, j0:j1]
            m = m_new
        out[:, :, i0:i1] = acc / l[..., None]
    return out


def loop_mistakes(t, q, k, v, bq, bk, causal):
    """{explanation: the output that mistake gives} for the shared loop of Parts B and C."""
    out = {t.mistake("acc_not_rescaled"): planted_tiled(q, k, v, bq, bk, causal, rescale_acc=False),
           t.mistake("sum_not_rescaled"): planted_tiled(q, k, v, bq, bk, causal, rescale_l=False)}
    if causal and q.shape[2] != k.shape[2]:
        out[t.mistake("causal_top_left")] = reference_top_left(q, k, v)
    return out


def reference_top_left(q, k, v):
    """Causal attention with the mask aligned top-left (query t sees keys up to t)."""
    G = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(G, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    Tq, Tk = s.shape[-2:]
    s = s.masked_fill(torch.arange(Tk)[None, :] > torch.arange(Tq)[:, None], -math.inf)
    return s.softmax(-1) @ v.repeat_interleave(G, 1)


def planted_kernel_acc(q, k, v, causal, block_n):
    """The kernel's planted mistake, per row: l rescaled (the true sum in the end) but acc never."""
    G, T, S = q.shape[1] // k.shape[1], q.shape[2], k.shape[2]
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = q @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.arange(S)[None, :] > torch.arange(T)[:, None] + S - T, -math.inf)
    tiles = -(-S // block_n)
    padded = torch.cat([s, s.new_full((*s.shape[:-1], tiles * block_n - S), -math.inf)], -1)
    m_then = padded.reshape(*s.shape[:-1], tiles, block_n).amax(-1).cummax(-1).values
    acc = torch.exp(s - m_then.repeat_interleave(block_n, -1)[..., :S]) @ vr
    return acc / torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True)


def planted_kernel_padding(q, k, v, block_n):
    """The kernel's planted mistake (non-causal): the keys past S in the last tile not masked; loaded as zeros,
    they score 0 and weigh exp(0 - m) with a value of 0."""
    S = k.shape[2]
    pad = -(-S // block_n) * block_n - S
    if pad == 0:
        return None
    kz = torch.cat([k, k.new_zeros(*k.shape[:2], pad, k.shape[3])], 2)
    vz = torch.cat([v, v.new_zeros(*v.shape[:2], pad, v.shape[3])], 2)
    return reference_attention(q, kz, vz)


# ---------------------------------------------------------------------------------------------------
# Part A

@judge.part("online_tests")
def online(t):
    shapes = [(1, 1, 1), (2, 7, 7), (3, 7, 1), (1, 90, 40), (4, 33, 32)]
    shapes += [(t.rng.randint(1, 5), t.rng.randint(1, 89), t.rng.randint(1, 39)) for _ in range(16)]
    for rows, n, bs in shapes:
        x = randn(t, rows, n, scale=t.rng.uniform(0.1, 20))
        rm, rl = online_softmax_stats(x, bs)
        wl = sum(torch.exp(x[:, s:s + bs] - x[:, :s + bs].max(-1).values[:, None]).sum(-1) for s in range(0, n, bs))
        what = f"online_softmax(x [{rows}, {n}], block_size={bs})"
        with t.case(what):
            check_close(t.call("online_softmax", x, bs), x.softmax(-1), what, rtol=1e-4, atol=1e-6,
                        mistakes={t.mistake("sum_not_rescaled"): torch.exp(x - rm[:, None]) / wl[:, None]})
        # the update alone, piece by piece, each call from the true running state (one step's error is not carried)
        with t.case(what + ": online_softmax_update, piece by piece"):
            m, l = torch.full((rows,), -math.inf), torch.zeros(rows)
            ops, states = [], []
            for s0 in range(0, n, bs):
                p = x[:, s0:s0 + bs]
                ops.append(call("online_softmax_update", m, l, p))
                m_new = torch.maximum(m, p.max(-1).values)
                l_new = l * torch.exp(m - m_new) + torch.exp(p - m_new[:, None]).sum(-1)
                states.append((l, p, m_new, l_new))
                m, l = m_new, l_new
            for k, (o, (l0, p, mw, lw)) in enumerate(zip(t.run(ops), states)):
                got = o.get()
                t.expect(isinstance(got, (tuple, list)) and len(got) == 2,
                         f"{what}: online_softmax_update must return (m, l), got {got!r}"[:300])
                check_close(got[0], mw, f"{what}: m after piece {k}")
                check_close(got[1], lw, f"{what}: l after piece {k}", rtol=1e-4,
                            mistakes={t.mistake("sum_not_rescaled"): l0 + torch.exp(p - mw[:, None]).sum(-1)})
    for bs in (0, -3):
        with t.case(f"online_softmax(x, block_size={bs})"):
            t.raises(t.outcome("online_softmax", randn(t, 2, 5), bs), "ValueError",
                     what=f"online_softmax with block_size={bs}")


# ---------------------------------------------------------------------------------------------------
# Parts B and C

def tiled_case(t, what, q, k, v, bq, bk, causal):
    """One call under the driver's watch: the output checked against the reference, the memory bound (and,
    causal, the work bound) checked on what the watch saw."""
    o = t.run([call("tiled_attention", q, k, v, bq, bk, causal=causal, watch="tensors")])[0]
    got = o.get()
    t.expect(getattr(got, "shape", None) == q.shape, f"{what}: expected shape {tuple(q.shape)}, got "
                                                        f"{tuple(getattr(got, 'shape', ()))}")
    check_close(got, reference_attention(q, k, v, causal=causal), what + (" (are the diagonal tiles masked?)"
                                                                           if causal else ""),
                rtol=1e-4, atol=1e-5, mistakes=loop_mistakes(t, q, k, v, bq, bk, causal))
    B, H, Tq, d = q.shape
    limit = max(q.numel(), k.numel() * (H // k.shape[1]), B * H * bq * bk)
    watch = o.watch or {}
    t.expect(watch.get("largest", 0) <= limit,
             f"{what}: a tensor of {watch.get('largest')} elements (shape {watch.get('largest_shape')}) was created, "
             f"more than the contract's bound {limit}: attention must go tile by tile, never holding the Tq x Tk "
             "scores or a mask of that size")
    if causal:
        allowed = causal_work(B, H, Tq, k.shape[2], d, bq, bk)
        t.expect(watch.get("matmul_elements", 0) <= allowed,
                 f"{what}: your matmuls produced {watch.get('matmul_elements')} elements, more than the {allowed} of "
                 "the tiles a query may read: skip the key tiles wholly in the future")


def causal_work(B, H, Tq, Tk, d, bq, bk):
    """The matmul elements of the tiles some query may read: their scores and their p @ v products."""
    total = 0
    for i0 in range(0, Tq, bq):
        rows, last = min(bq, Tq - i0), Tk - Tq + min(i0 + bq, Tq) - 1
        for j0 in range(0, last + 1, bk):
            total += B * H * rows * (min(bk, Tk - j0) + d)
    return total


def draw_shape(t, causal=False):
    B, Hkv, G, d = t.rng.randint(1, 2), t.rng.randint(1, 3), t.rng.randint(1, 3), t.rng.randint(1, 8)
    Tk, bq, bk = t.rng.randint(1, 70), t.rng.randint(2, 24), t.rng.randint(2, 24)
    Tq = (Tk if t.rng.random() < 0.3 else t.rng.randint(1, Tk)) if causal else t.rng.randint(1, 70)
    return B, Hkv, G, d, Tq, Tk, bq, bk


@judge.part("tiled_tests", groups={"values": 3, "errors": 1})
def tiled(t):
    shapes = [(1, 1, 1, 1, 1, 2, 1, 1), (1, 2, 2, 4, 40, 50, 16, 5), (1, 2, 2, 4, 40, 50, 7, 50),
              (2, 1, 3, 8, 17, 33, 64, 64), (1, 3, 1, 5, 9, 9, 3, 4)]
    shapes += [draw_shape(t) for _ in range(12)]
    for B, Hkv, G, d, Tq, Tk, bq, bk in shapes:
        q = randn(t, B, Hkv * G, Tq, d, scale=2)
        k, v = randn(t, B, Hkv, Tk, d, scale=2), randn(t, B, Hkv, Tk, d, scale=2)
        what = f"tiled_attention(q {list(q.shape)}, k/v {list(k.shape)}, block_q={bq}, block_k={bk})"
        with t.case(what, group="values"):
            tiled_case(t, what, q, k, v, bq, bk, False)
    q, k = randn(t, 1, 4, 6, 3), randn(t, 1, 2, 7, 3)
    for bad, args in (("block sizes (1, 0)", (q, k, k, 1, 0)), ("block sizes (0, 3)", (q, k, k, 0, 3)),
                      ("block_q=True", (q, k, k, True, 3)), ("block_k=2.5", (q, k, k, 3, 2.5)),
                      ("3 query heads over 2 KV heads", (q[:, :3], k, k, 2, 2)),
                      ("k and v of different lengths", (q, k, k[:, :, :6], 2, 2)),
                      ("a head dim other than q's", (q, randn(t, 1, 2, 7, 4), randn(t, 1, 2, 7, 4), 2, 2)),
                      ("a batch other than q's", (q, randn(t, 2, 2, 7, 3), randn(t, 2, 2, 7, 3), 2, 2)),
                      ("q of 3 dimensions", (q[0], k, k, 2, 2))):
        with t.case(f"tiled_attention with {bad}", group="errors"):
            t.raises(t.outcome("tiled_attention", *args), "ValueError", what=f"tiled_attention with {bad}")


@judge.part("causal_tests", groups={"values": 3, "errors": 1})
def causal(t):
    shapes = [(1, 1, 1, 4, 4, 4, 2, 2), (1, 2, 2, 4, 40, 40, 5, 7), (1, 2, 2, 4, 1, 50, 4, 16),
              (1, 2, 2, 4, 12, 50, 8, 16), (2, 1, 2, 3, 50, 50, 64, 64), (1, 1, 3, 5, 33, 34, 16, 16)]
    shapes += [draw_shape(t, causal=True) for _ in range(12)]
    for B, Hkv, G, d, Tq, Tk, bq, bk in shapes:
        q = randn(t, B, Hkv * G, Tq, d, scale=2)
        k, v = randn(t, B, Hkv, Tk, d, scale=2), randn(t, B, Hkv, Tk, d, scale=2)
        what = (f"tiled_attention(q {list(q.shape)}, k/v {list(k.shape)}, block_q={bq}, block_k={bk}, causal=True)"
                + (f": {Tq} new queries after {Tk - Tq} cached keys" if Tq < Tk else ""))
        with t.case(what, group="values"):
            tiled_case(t, what, q, k, v, bq, bk, True)
    for Tk in (1, 5, 30):
        q, k = randn(t, 1, 2, Tk + 1, 4), randn(t, 1, 1, Tk, 4)
        with t.case(f"causal with {Tk + 1} queries and {Tk} keys", group="errors"):
            t.raises(t.outcome("tiled_attention", q, k, k, 4, 4, causal=True), "ValueError",
                     what=f"causal with {Tk + 1} queries and {Tk} keys")


def flash_io_by_tiles(T, S, d, bq, bk, causal, top_left=False, whole_tiles=True):
    """The contract's count, tile by tile (`top_left`, `whole_tiles=False`: two planted mistakes)."""
    keys = 0
    for i0 in range(0, T, bq):
        i1 = min(i0 + bq, T)
        last = (min(S, i1 if top_left else S - T + i1)) if causal else S
        keys += min(S, -(-last // bk) * bk) if whole_tiles else last
    return 2 * T * d + 2 * keys * d


@judge.part("predict_flash_io_tests")
def predict_flash_io(t):
    """Causal chunks after a cache (T < S) are the point; T == S and decode rows are in the grid. The count is
    checked against the IO model's own loops (count_io) where T == S."""
    grid = [(5, 12, 8, 4, 4, True), (1, 4096, 128, 64, 64, True), (4096, 4096, 64, 128, 64, True),
            (4096, 4096, 64, 128, 64, False), (100, 100, 16, 32, 16, True), (64, 1000, 128, 16, 128, True),
            (33, 97, 16, 32, 32, True), (3, 3, 8, 16, 16, True), (512, 8192, 128, 64, 128, True),
            (512, 8192, 128, 64, 128, False)]
    drawn = []
    for _ in range(30):
        S = t.rng.randint(1, 20000)
        drawn.append((t.rng.randint(1, S), S, t.rng.choice([64, 80, 128]), t.rng.choice([16, 32, 64, 128]),
                      t.rng.choice([16, 32, 64, 128]), t.rng.random() < 0.8))
    for T, S, d, bq, bk, causal in grid + drawn:
        what = f"predict_flash_io({T}, {S}, {d}, {bq}, {bk}, causal={causal})"
        want = flash_io_by_tiles(T, S, d, bq, bk, causal)
        if T == S and S <= 5000:              # the IO model's loops, where they run in a moment
            assert want == count_io(S, d, bq, bk, "query_outer", causal)["total"], what
        mistakes = {t.mistake("io_kv_once"): 2 * T * d + 2 * S * d}
        if causal:
            mistakes[t.mistake("io_causal_no_skip")] = flash_io_by_tiles(T, S, d, bq, bk, False)
            mistakes[t.mistake("io_causal_top_left")] = flash_io_by_tiles(T, S, d, bq, bk, True, top_left=True)
            mistakes[t.mistake("io_keys_not_tiles")] = flash_io_by_tiles(T, S, d, bq, bk, True, whole_tiles=False)
        with t.case(what):
            check_close(t.call("predict_flash_io", T, S, d, bq, bk, causal), want, what, rtol=1e-9,
                        mistakes={k: v for k, v in mistakes.items() if v != want})


# ---------------------------------------------------------------------------------------------------
# Part E

def kernel_case(t, what, q, k, v, causal, bm=16, bn=16, rtol=1e-4, atol=1e-5, want=None):
    o = t.run([call("flash_attention", q, k, v, causal=causal, block_m=bm, block_n=bn, watch="tensors")])[0]
    got = o.get()
    t.expect(getattr(got, "shape", None) == q.shape, f"{what}: expected shape {tuple(q.shape)}, got "
                                                        f"{tuple(getattr(got, 'shape', ()))}")
    t.expect(got.dtype == q.dtype, f"{what}: the output must have q's dtype {q.dtype}, got {got.dtype}")
    qf, kf, vf = q.float(), k.float(), v.float()
    mistakes = {t.mistake("kernel_acc_not_rescaled"): planted_kernel_acc(qf, kf, vf, causal, bn)}
    if causal and q.shape[2] != k.shape[2]:
        mistakes[t.mistake("kernel_causal_top_left")] = reference_top_left(qf, kf, vf)
    if not causal:
        padded = planted_kernel_padding(qf, kf, vf, bn)
        if padded is not None:
            mistakes = {t.mistake("kernel_padding_unmasked"): padded, **mistakes}
    check_close(got.float(), want if want is not None else reference_attention(qf, kf, vf, causal=causal), what,
                rtol=rtol, atol=atol, mistakes=mistakes)
    watch = o.watch or {}
    t.expect(not watch.get("matmul_elements"), f"{what}: PyTorch matmuls produced {watch.get('matmul_elements')} "
                                               "elements: the attention must be computed by your Triton kernel, not "
                                               "by torch in the launcher")
    limit = max(q.numel(), k.numel())
    t.expect(watch.get("largest", 0) <= limit,
             f"{what}: a tensor of {watch.get('largest')} elements (shape {watch.get('largest_shape')}) was created, "
             f"more than the contract's bound {limit}: read KV head h // G in the kernel instead of copying K and V "
             "for every query head")


@judge.part("flash_kernel_tests", groups={"values": 2, "grid": 1, "errors": 1})
def flash_kernel(t):
    # drawn shapes: every case of the contract
    for causal, kind, bm, bn in ((False, "T != S", 16, 16), (True, "T < S", 16, 16), (True, "decode", 16, 16),
                                 (True, "T == S", 16, 16), (False, "decode", 16, 16), (True, "T < S", 32, 16),
                                 (False, "T != S", 16, 32)):
        B, Hkv, G, D = t.rng.randint(1, 2), t.rng.randint(1, 2), t.rng.randint(1, 3), t.rng.choice([16, 32])
        S = 16 * t.rng.randint(1, 3) + t.rng.randint(1, 15)
        T = {"T != S": t.rng.randint(1, 48), "T < S": t.rng.randint(2, S - 1), "decode": 1, "T == S": S}[kind]
        q = randn(t, B, Hkv * G, T, D, scale=2)
        k, v = randn(t, B, Hkv, S, D, scale=2), randn(t, B, Hkv, S, D, scale=2)
        what = (f"flash_attention(q {list(q.shape)}, k/v {list(k.shape)}, causal={causal}, block_m={bm}, "
                f"block_n={bn}) ({kind})")
        with t.case(what, group="values"):
            kernel_case(t, what, q, k, v, causal, bm, bn)
    # float16: the same fp16 inputs against the fp32 reference
    S = 16 * t.rng.randint(1, 2) + t.rng.randint(1, 15)
    q, k, v = randn(t, 1, 4, t.rng.randint(2, S - 1), 32).half(), randn(t, 1, 2, S, 32).half(), randn(t, 1, 2, S,
                                                                                                      32).half()
    what = f"flash_attention in float16 (q {list(q.shape)}, k/v {list(k.shape)}, causal=True)"
    with t.case(what, group="values"):
        kernel_case(t, what, q, k, v, True, rtol=2e-3, atol=2e-3)
    # the grid: every residue of S and of S - T modulo the key tile (16), causal, T above and below the query
    # tile; a loop bound one tile short fails here whatever the draw
    for r in range(16):
        S = 32 + r
        T = S - ((r * 7 + 3) % 16) - (16 if r % 2 else 0)
        q, k, v = randn(t, 1, 2, T, 16), randn(t, 1, 1, S, 16), randn(t, 1, 1, S, 16)
        what = f"flash_attention(q [1, 2, {T}, 16], k/v [1, 1, {S}, 16], causal=True) (grid: S % 16 = {S % 16}, " \
               f"(S - T) % 16 = {(S - T) % 16})"
        with t.case(what, group="grid"):
            kernel_case(t, what, q, k, v, True)
    for S in (17, 31):
        q, k, v = randn(t, 1, 2, 5, 16), randn(t, 1, 1, S, 16), randn(t, 1, 1, S, 16)
        what = f"flash_attention(q [1, 2, 5, 16], k/v [1, 1, {S}, 16]) (grid: padded keys, non-causal)"
        with t.case(what, group="grid"):
            kernel_case(t, what, q, k, v, False)
    q, k = randn(t, 1, 4, 20, 16), randn(t, 1, 2, 30, 16)
    for bad, args, kw in (("3 query heads over 2 KV heads", (q[:, :3], k, k), {}),
                          ("k and v of different lengths", (q, k, k[:, :, :29]), {}),
                          ("a head dim of 24", (randn(t, 1, 4, 20, 24), randn(t, 1, 2, 30, 24), randn(t, 1, 2, 30,
                                                                                                      24)), {}),
                          ("float64 inputs", (q.double(), k.double(), k.double()), {}),
                          ("mixed float32 and float16", (q, k.half(), k.half()), {}),
                          ("causal with 20 queries and 10 keys", (q, k[:, :, :10], k[:, :, :10]), {"causal": True}),
                          ("block_n=8", (q, k, k), {"block_n": 8}), ("block_m=24", (q, k, k), {"block_m": 24}),
                          ("block_m=True", (q, k, k), {"block_m": True})):
        with t.case(f"flash_attention with {bad}", group="errors"):
            t.raises(t.outcome("flash_attention", *args, **kw), "ValueError", what=f"flash_attention with {bad}")


# ---------------------------------------------------------------------------------------------------
# Part F

def backward_inputs(t, B, Hkv, G, T, S, D, causal):
    """The inputs of flash_attention_backward (q, k, v, the forward's out and lse, dout), autograd's gradients
    through the reference, and the gradients with the planted mistake (dS = P * dP, D not subtracted)."""
    H = Hkv * G
    q, do = randn(t, B, H, T, D), randn(t, B, H, T, D)
    k, v = randn(t, B, Hkv, S, D), randn(t, B, Hkv, S, D)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = reference_attention(*leaves, causal=causal, return_lse=True)
    want = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, do)))
    scale = 1 / math.sqrt(D)
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = q @ kr.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.arange(S)[None, :] > torch.arange(T)[:, None] + S - T, -math.inf)
    ds = s.softmax(-1) * (do @ vr.transpose(-1, -2))                      # no "- D"
    planted = {"dq": ds @ kr * scale,
               "dk": (ds.transpose(-1, -2) @ q * scale).reshape(B, Hkv, G, S, D).sum(2)}
    return (q, k, v, out.detach(), lse.detach(), do), want, planted


def backward_case(t, what, inputs, want, planted, causal, bm=16, bn=16):
    o = t.run([call("flash_attention_backward", *inputs, causal=causal, block_m=bm, block_n=bn,
                    watch="tensors")])[0]
    got = o.get()
    t.expect(isinstance(got, (tuple, list)) and len(got) == 3,
             f"{what}: flash_attention_backward must return (dq, dk, dv), got {type(got).__name__}")
    for (name, w), x, g in zip(want.items(), inputs[:3], got):
        t.expect(getattr(g, "shape", None) == x.shape, f"{what}: {name} must have shape {tuple(x.shape)}, got "
                                                        f"{tuple(getattr(g, 'shape', ()))}")
        check_close(g, w, f"{what}: {name}", rtol=1e-4, atol=1e-4,
                    mistakes={t.mistake("bwd_no_delta"): planted[name]} if name in planted else None)
    watch = o.watch or {}
    t.expect(not watch.get("matmul_elements"), f"{what}: PyTorch matmuls produced {watch.get('matmul_elements')} "
                                               "elements: the gradients must be computed by your Triton kernels, "
                                               "not by torch in the launcher")
    limit = max(inputs[0].numel(), inputs[1].numel())
    t.expect(watch.get("largest", 0) <= limit,
             f"{what}: a tensor of {watch.get('largest')} elements (shape {watch.get('largest_shape')}) was created, "
             f"more than the contract's bound {limit}")


@judge.part("flash_backward_tests", groups={"values": 3, "errors": 1})
def flash_backward(t):
    # (B, Hkv, G, T, S, D, causal, block_m, block_n): the grid, then drawn shapes
    shapes = [(1, 1, 1, 1, 1, 16, False, 16, 16), (1, 1, 2, 16, 16, 16, True, 16, 16),
              (1, 2, 2, 17, 33, 16, True, 16, 16), (1, 1, 3, 1, 40, 32, True, 16, 16),
              (2, 1, 1, 31, 17, 16, False, 16, 16), (1, 1, 2, 20, 20, 64, False, 16, 16),
              (1, 1, 2, 9, 45, 16, True, 32, 16)]
    for bm, bn in ((16, 16), (16, 16), (16, 16), (16, 32), (32, 16), (16, 16)):
        causal = t.rng.random() < 0.6
        S = t.rng.randint(1, 48)
        T = t.rng.randint(1, S) if causal else t.rng.randint(1, 48)
        shapes.append((t.rng.randint(1, 2), t.rng.randint(1, 2), t.rng.randint(1, 3), T, S, t.rng.choice([16, 32]),
                       causal, bm, bn))
    for B, Hkv, G, T, S, D, causal, bm, bn in shapes:
        inputs, want, planted = backward_inputs(t, B, Hkv, G, T, S, D, causal)
        what = (f"flash_attention_backward(q [{B}, {Hkv * G}, {T}, {D}], k/v [{B}, {Hkv}, {S}, {D}], "
                f"causal={causal}, block_m={bm}, block_n={bn})")
        with t.case(what, group="values"):
            backward_case(t, what, inputs, want, planted, causal, bm, bn)
    (q, k, v, out, lse, do), _, _ = backward_inputs(t, 1, 2, 2, 10, 12, 16, False)
    for bad, args, kw in (("lse of 9 rows for 10 queries", (q, k, v, out, lse[:, :, :9], do), {}),
                          ("dout of 3 heads", (q, k, v, out, lse, do[:, :3]), {}),
                          ("3 query heads over 2 KV heads", (q[:, :3], k, v, out[:, :3], lse[:, :3], do[:, :3]), {}),
                          ("a head dim of 24", tuple(torch.zeros(*x.shape[:-1], 24) for x in (q, k, v, out))
                           + (lse, torch.zeros(*do.shape[:-1], 24)), {}),
                          ("float64 inputs", tuple(x.double() for x in (q, k, v, out, lse, do)), {}),
                          ("causal with 10 queries and 8 keys", (q, k[:, :, :8], v[:, :, :8], out, lse, do),
                           {"causal": True}),
                          ("block_n=8", (q, k, v, out, lse, do), {"block_n": 8}),
                          ("block_m=24", (q, k, v, out, lse, do), {"block_m": 24})):
        with t.case(f"flash_attention_backward with {bad}", group="errors"):
            t.raises(t.outcome("flash_attention_backward", *args, **kw), "ValueError",
                     what=f"flash_attention_backward with {bad}")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("the running sum is not rescaled in Part A; the causal mask aligned top-left in Part C's loop and in the "
         "Triton kernel",
         {"online_answer": solution_with("lab07", "online_answer", {
             "    l_new = l * torch.exp(m - m_safe) + torch.exp(piece - m_safe[:, None]).sum(dim=-1)":
             "    l_new = l + torch.exp(piece - m_safe[:, None]).sum(dim=-1)"}),
          "tiled_answer": solution_with("lab07", "tiled_answer", {
              "    offset = Tk - Tq                                      # query t sits at position offset + t":
              "    offset = 0"}),
          "flash_kernel_answer": solution_with("lab07", "flash_kernel_answer", {
              "    pos = rows + S - T ": "    pos = rows ",
              "hi = tl.minimum(S, (i + 1) * BLOCK_M + S - T)": "hi = tl.minimum(S, (i + 1) * BLOCK_M)"}),
          "predict_flash_io": solution_with("lab07", "predict_flash_io", {
              "min(kv_len, kv_len - q_len + i1) if causal": "min(kv_len, i1) if causal"})},
         ["sum_not_rescaled", "causal_top_left", "kernel_causal_top_left", "io_causal_top_left"]),
        ("the accumulator is not rescaled in the tiled loop (charged in Part B only, not again in Part C) and in the "
         "kernel; the predicted traffic reads K and V once",
         {"tiled_answer": solution_with("lab07", "tiled_answer", {
             "            acc = alpha[..., None] * acc + p @ v[:, :, None, j0:j1]":
             "            acc = acc + p @ v[:, :, None, j0:j1]"}),
          "flash_kernel_answer": solution_with("lab07", "flash_kernel_answer", {
              "        acc = acc * alpha[:, None] + tl.dot(": "        acc = acc + tl.dot("}),
          "predict_flash_io": "def predict_flash_io(q_len, kv_len, head_dim, block_q, block_k, causal):\n"
                              "    return 2 * q_len * head_dim + 2 * kv_len * head_dim\n"},
         ["acc_not_rescaled", "kernel_acc_not_rescaled", "io_kv_once"]),
        ("the kernel's causal loop stops one key tile short when the last needed key starts a tile",
         {"flash_kernel_answer": solution_with("lab07", "flash_kernel_answer", {
             "    for start in range(0, hi, BLOCK_N):": "    for start in range(0, hi - 1, BLOCK_N):"}),
          "predict_flash_io": solution_with("lab07", "predict_flash_io", {
              "keys += min(kv_len, -(-last // block_k) * block_k)": "keys += last"})},
         ["io_keys_not_tiles"]),
        ("the backward forgets D = rowsum(dO * O): dS = P * dP in both kernels",
         {"flash_backward_answer": solution_with("lab07", "flash_backward_answer", {
             "            ds_t = p_t * (dp_t - delta[None, :])": "            ds_t = p_t * dp_t",
             "        ds = p * (dp - delta[:, None])": "        ds = p * dp"}),
          "predict_flash_io": solution_with("lab07", "predict_flash_io", {
              "if causal else kv_len": "if False else kv_len"})},
         ["bwd_no_delta", "io_causal_no_skip"]),
    ]


# Written parts: graded by the instructor from this rubric (never shown in the student's notebook).
WRITTEN = {
    "written_flash_io": {"points": 2, "rubric": [
        (0.5, "compares the predicted and counted traffic with the student's own numbers, and if they differ names "
              "the term and whether the loop or the model is off"),
        (0.75, "gives the causal saving as a measured factor and explains it by the cached prefix that every query "
               "must read, against the chunk's own triangle (half the tiles only when T = S)"),
        (0.75, "names the K and V rereads (one pass per query tile, growing as T / block_q) and concludes that "
               "block_q should be as large as the SRAM allows"),
    ]},
}
