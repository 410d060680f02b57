"""FlashAttention's forward pass and flash-decoding, as Triton kernels.

**Forward** (``flash_attention_triton``), q [B, H, T, Dh], k/v [B, K, S, Dh] -> [B, H, T, Dh]:
one program per (tile of BLOCK_M queries, batch * query head). It loads its Q tile once, walks the keys
in tiles of BLOCK_N (K and V read straight from the caller's tensors: GQA reads KV head h // G, no copy),
and keeps the running max m, sum l and unnormalized output acc in registers, fp32, in log2 units
(``exp2``, the scale folded with log2(e)). Only the output (and the log-sum-exp of every row) goes back to
memory. The key loop is cut in two so that the common case pays no masking:

* non-causal: the full key tiles without any mask, then the last, partial tile masked by length;
* causal (query t at position S - T + t sees keys <= its position): the tiles every row of the Q tile
  may read in full, without a mask, then the few tiles that cross the diagonal, masked; tiles in the
  future of the whole Q tile are never visited (about half the work at T == S).

Tile sizes, warps and pipeline stages are autotuned on a GPU (keyed on head dim, causal and the length
rounded to a power of two); under the interpreter one small config runs, and the key loop is one loop over
every tile with both masks on (host-known bounds, see ``triton_online_softmax``). Head dims need not be
powers of two (padded and masked); fp16/bf16/fp32 inputs (fp32 dots in IEEE fp32), fp32 accumulation.

**Flash-decoding** (``flash_decode_triton``), one new query per sequence, q [B, H, Dh], a contiguous cache
k/v [B, K, S, Dh] with optional per-sequence lengths: one program per (sequence, KV head, split). The G
query heads of a group are the rows of its tile (each K/V byte read once per group), and a third grid
axis cuts the keys into ``num_splits`` chunks so that a batch of one still fills the GPU. Every split
writes (m, l, acc) to fp32 scratch and ``triton_splitkv.combine_splits_triton`` (the same reduction
as the paged decode kernel) merges them with log-sum-exp weights. A sequence of length 0 gets a zero row;
lengths outside [0, S] raise under ``validate=True`` and are clamped into [0, S] without it (see
``flash_decoding``: checking a GPU tensor's values would be a host sync on the decode path).

The loop body of both, one tile of keys folded into the running (m, l, acc), is
``triton_online_softmax.online_softmax_tile``, the step the paged decode kernel calls too; the end of a
decode program (normalize, or store the split's partials) is ``triton_splitkv.store_split``, also shared.

Both run on CUDA tensors, or on CPU tensors when ``TRITON_INTERPRET=1`` was set before triton was
imported (correctness only: the interpreter is slow).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from course_lib.env import use_triton
from course_lib.validate import integer, power_of_two

from .flash_decoding import check_lengths
from .reference import check_qkv
from .triton_online_softmax import (LOG2E, SUPPORTED_DTYPES, decode_configs, interpreting, online_softmax_tile,
                                    static_tokens)
from .triton_splitkv import combine_splits_triton, store_split


def _fwd_configs():
    if interpreting():
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    # Eight points across the space, not its 35-point grid: each config is compiled before it is timed, and the
    # whole grid took minutes to tune on an H100 with other processes compiling (the GPU check of 2026-11-28).
    # Tall query tiles with 8 warps for long prefills, short ones with 4 for short or decode-like shapes, 2-3
    # stages (4 overflows shared memory at 128 x 128 tiles and Dh = 128).
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in ((64, 32, 4, 3), (64, 64, 4, 3), (64, 64, 8, 2), (64, 128, 4, 2),
                                 (128, 32, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2))]


def _prune(configs, named_args, **kwargs):
    """Drop tiles far taller than the queries (decode-like shapes) so the autotuner does not time them."""
    T = named_args["T"]
    keep = [c for c in configs if c.kwargs["BLOCK_M"] <= max(64, triton.next_power_of_2(T))]
    return keep or configs


@triton.jit
def _rows_mask(rows, n_rows, dmask, ROW_MASK: tl.constexpr, EVEN_D: tl.constexpr):
    """The load mask of a [rows, BLOCK_D] tile: rows >= n_rows out (if ROW_MASK), padded head-dim columns out
    (unless EVEN_D). With neither the caller loads without a mask."""
    if ROW_MASK:
        if EVEN_D:
            mask = (rows < n_rows)[:, None]
        else:
            mask = (rows < n_rows)[:, None] & dmask[None, :]
    else:
        mask = dmask[None, :]
    return mask


@triton.jit
def _fwd_tiles(q, m_i, l_i, acc, k_base, v_base, s_ks, s_vs, pos_m, lo, hi, S, d, dmask, qk_scale,
               BLOCK_N: tl.constexpr, MASK_CAUSAL: tl.constexpr, MASK_LEN: tl.constexpr, EVEN_D: tl.constexpr,
               DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """Fold key tiles [lo, hi) into the running (m_i, l_i, acc) of one Q tile (scores in log2 units); K/V
    rows straight from the caller's tensors, masks only where asked (MASK_LEN: keys >= S, MASK_CAUSAL: keys
    after a row's position pos_m)."""
    for start_n in range(lo, hi, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)
        valid = n[None, :] < S                                             # [1, BLOCK_N]
        if MASK_CAUSAL:
            valid = valid & (n[None, :] <= pos_m[:, None])                 # [BLOCK_M, BLOCK_N]
        m_i, l_i, acc = online_softmax_tile(q, m_i, l_i, acc, k_base + n[:, None] * s_ks + d[None, :],
                                            v_base + n[:, None] * s_vs + d[None, :],
                                            _rows_mask(n, S, dmask, MASK_LEN, EVEN_D), valid, qk_scale,
                                            MASK_LEN or not EVEN_D, MASK_CAUSAL or MASK_LEN, DOT_PRECISION,
                                            UPCAST_DOT)
    return m_i, l_i, acc


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, LSE, qk_scale, T, S, n_ctx_bucket,
                      s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_ot,
                      H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr, STATIC_TOKENS: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = h // GROUP                                           # GQA: the KV head this query head reads
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    q = tl.load(Q + b.to(tl.int64) * s_qb + h * s_qh + offs_m[:, None] * s_qt + d[None, :],
                mask=_rows_mask(offs_m, T, dmask, True, EVEN_D), other=0.0)    # [BLOCK_M, BLOCK_D], read once
    k_base = K + b.to(tl.int64) * s_kb + kvh * s_kh
    v_base = V + b.to(tl.int64) * s_vb + kvh * s_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)        # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)                      # running sum of exp2(score - max)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)             # running sum of exp2(score - max) * v
    offset = S - T                                             # query t sits at position offset + t
    pos_m = offs_m + offset
    if STATIC_TOKENS > 0:      # interpreter: every key tile, every mask (host-known bounds; see triton_online_softmax)
        m_i, l_i, acc = _fwd_tiles(q, m_i, l_i, acc, k_base, v_base, s_ks, s_vs, pos_m, 0, STATIC_TOKENS, S, d,
                                   dmask, qk_scale, BLOCK_N, CAUSAL, True, EVEN_D, DOT_PRECISION, UPCAST_DOT)
    elif CAUSAL:
        # keys < start_m + offset + 1 are visible to every row of the tile: whole tiles there, no mask
        full_hi = ((start_m + offset + 1) // BLOCK_N) * BLOCK_N
        m_i, l_i, acc = _fwd_tiles(q, m_i, l_i, acc, k_base, v_base, s_ks, s_vs, pos_m, 0, full_hi, S, d, dmask,
                                   qk_scale, BLOCK_N, False, False, EVEN_D, DOT_PRECISION, UPCAST_DOT)
        diag_hi = tl.minimum(S, start_m + BLOCK_M + offset)    # the tile's last position + 1
        m_i, l_i, acc = _fwd_tiles(q, m_i, l_i, acc, k_base, v_base, s_ks, s_vs, pos_m, full_hi, diag_hi, S, d,
                                   dmask, qk_scale, BLOCK_N, True, True, EVEN_D, DOT_PRECISION, UPCAST_DOT)
    else:
        full_hi = (S // BLOCK_N) * BLOCK_N
        m_i, l_i, acc = _fwd_tiles(q, m_i, l_i, acc, k_base, v_base, s_ks, s_vs, pos_m, 0, full_hi, S, d, dmask,
                                   qk_scale, BLOCK_N, False, False, EVEN_D, DOT_PRECISION, UPCAST_DOT)
        m_i, l_i, acc = _fwd_tiles(q, m_i, l_i, acc, k_base, v_base, s_ks, s_vs, pos_m, full_hi, S, S, d, dmask,
                                   qk_scale, BLOCK_N, False, True, EVEN_D, DOT_PRECISION, UPCAST_DOT)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    omask = (offs_m < T)[:, None] & dmask[None, :]
    tl.store(O + b.to(tl.int64) * s_ob + h * s_oh + offs_m[:, None] * s_ot + d[None, :],
             out.to(O.dtype.element_ty), mask=omask)
    if STORE_LSE:          # natural-log log-sum-exp of each row: (m + log2 l) / log2(e)
        lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) / LOG2E, float("-inf"))
        tl.store(LSE + bh.to(tl.int64) * T + offs_m, lse, mask=offs_m < T)


_flash_fwd_autotuned = triton.autotune(configs=_fwd_configs(), key=["HEAD_DIM", "CAUSAL", "n_ctx_bucket"],
                                       prune_configs_by={"early_config_prune": _prune})(_flash_fwd_kernel)


def _check_device_dtype(q, what: str, asked_by: str):
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"the Triton kernels support {SUPPORTED_DTYPES}, got dtype {q.dtype}")
    use_triton(q.device, "triton", what, asked_by)      # ValueError where it cannot run; on a T4 a warning


def _unit_stride(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def flash_attention_triton(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False,
                           block_m: int | None = None, block_n: int | None = None):
    """FlashAttention forward: q [B, H, T, Dh], k/v [B, K, S, Dh] -> [B, H, T, Dh] in q's dtype (with
    ``return_lse`` also the natural log-sum-exp [B, H, T] fp32). ``causal``: query t at position
    S - T + t (needs S >= T). ``block_m``/``block_n`` fix the tiles, bypassing the autotuner."""
    B, H, K, T, S, Dh = check_qkv(q, k, v)
    _check_device_dtype(q, "the FlashAttention kernel", "flash_attention_triton")
    if causal and T > S:
        raise ValueError(f"causal attention needs at least as many keys as queries, got T={T} > S={S}")
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    out = torch.empty(B, H, T, Dh, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device) if return_lse else out
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    args = (q, k, v, out, lse, scale * LOG2E.value, T, S, triton.next_power_of_2(max(T, S)),
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2))
    meta = dict(H=H, GROUP=H // K, HEAD_DIM=Dh, BLOCK_D=max(16, triton.next_power_of_2(Dh)), CAUSAL=bool(causal),
                STORE_LSE=bool(return_lse), STATIC_TOKENS=static_tokens(S),
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
                UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16)
    if block_m is None and block_n is None:
        grid = lambda cfg: (triton.cdiv(T, cfg["BLOCK_M"]), B * H)  # noqa: E731
        _flash_fwd_autotuned[grid](*args, **meta)
    else:
        # tl.dot's smallest side is 16
        bm = power_of_two(block_m if block_m is not None else 64, "block_m", low=16)
        bn = power_of_two(block_n if block_n is not None else 64, "block_n", low=16)
        _flash_fwd_kernel[(triton.cdiv(T, bm), B * H)](*args, **meta, BLOCK_M=bm, BLOCK_N=bn,
                                                        num_warps=4 if bm * bn <= 64 * 64 else 8,
                                                        num_stages=1 if interpreting() else 2)
    return (out, lse) if return_lse else out


# --- flash-decoding ------------------------------------------------------------------------------------
@triton.jit
def _contiguous_tile(tile, tok_hi, k_base, v_base, s_ks, s_vs, d, dmask, TILE_N: tl.constexpr):
    """Where the keys [tile * TILE_N, (tile + 1) * TILE_N) of a contiguous cache are, for
    ``online_softmax_tile``: K and V pointers [TILE_N, BLOCK_D], their load mask, and which scores count
    (keys < tok_hi)."""
    n = tile * TILE_N + tl.arange(0, TILE_N)
    nmask = n < tok_hi
    return (k_base + n[:, None] * s_ks + d[None, :], v_base + n[:, None] * s_vs + d[None, :],
            nmask[:, None] & dmask[None, :], nmask[None, :])


@triton.autotune(configs=decode_configs(), key=["HEAD_DIM", "BLOCK_G", "NUM_SPLITS"])
@triton.jit
def _flash_decode_kernel(Q, K, V, LENS, OUT, M_PART, L_PART, ACC_PART, qk_scale, S,
                         s_qb, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh,
                         GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         NUM_SPLITS: tl.constexpr, HAS_LENS: tl.constexpr, STATIC_TOKENS: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, TILE_N: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    gmask = g < GROUP
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    head = kvh * GROUP + g                                     # the query heads of this KV head's group
    q = tl.load(Q + b * s_qb + head[:, None] * s_qh + d[None, :], mask=gmask[:, None] & dmask[None, :],
                other=0.0)                                     # [BLOCK_G, BLOCK_D]: heads as rows
    if HAS_LENS:
        L = tl.maximum(tl.minimum(tl.load(LENS + b), S), 0)      # unvalidated lengths: clamped to [0, S]
    else:
        L = S
    n_tiles = tl.cdiv(L, TILE_N)
    per_split = tl.cdiv(n_tiles, NUM_SPLITS)
    tile_lo = split * per_split
    tile_hi = tl.minimum(tile_lo + per_split, n_tiles)
    k_base = K + b.to(tl.int64) * s_kb + kvh * s_kh
    v_base = V + b.to(tl.int64) * s_vb + kvh * s_vh
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)   # running max of the scores (log2 units)
    l_i = tl.zeros([BLOCK_G], tl.float32)                  # running sum of exp2(score - max)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)         # running sum of exp2(score - max) * v
    if STATIC_TOKENS > 0:   # interpreter: host-known trip count (see triton_online_softmax)
        tok_hi = tl.minimum((tile_lo + per_split) * TILE_N, L)            # this split's keys end
        for i in range(0, (STATIC_TOKENS + TILE_N * NUM_SPLITS - 1) // (TILE_N * NUM_SPLITS)):
            k_ptrs, v_ptrs, kv_mask, valid = _contiguous_tile(tile_lo + i, tok_hi, k_base, v_base, s_ks, s_vs, d,
                                                              dmask, TILE_N)
            m_i, l_i, acc = online_softmax_tile(q, m_i, l_i, acc, k_ptrs, v_ptrs, kv_mask, valid, qk_scale,
                                                True, True, DOT_PRECISION, UPCAST_DOT)
    else:                   # compiled: this split's own tiles only, so the length is their only bound
        for t in range(tile_lo, tile_hi):
            k_ptrs, v_ptrs, kv_mask, valid = _contiguous_tile(t, L, k_base, v_base, s_ks, s_vs, d, dmask, TILE_N)
            m_i, l_i, acc = online_softmax_tile(q, m_i, l_i, acc, k_ptrs, v_ptrs, kv_mask, valid, qk_scale,
                                                True, True, DOT_PRECISION, UPCAST_DOT)
    store_split(OUT, M_PART, L_PART, ACC_PART, m_i, l_i, acc, b, head, split, tl.num_programs(1) * GROUP,
                s_ob, s_oh, d, gmask, dmask, HEAD_DIM, NUM_SPLITS)


def flash_decode_triton(q, k, v, lengths=None, num_splits: int = 1, scale: float | None = None,
                        tile_n: int | None = None, validate: bool = False):
    """Flash-decoding: one query per sequence, q [B, H, Dh], against a contiguous cache k/v [B, K, S, Dh]
    (sequence b uses its first lengths[b] keys; None: all S) -> [B, H, Dh]. ``num_splits`` chunks of keys
    per (sequence, KV head) run as separate programs and are merged by the shared log-sum-exp reduction.
    ``tile_n`` fixes the key tile, bypassing the autotuner.

    ``lengths`` [B] integer tensor, each in [0, S]; a length of 0 gives a zero row (as ``reference_attention``
    for a row with no key). ``validate=True`` reads the lengths on the host (a device sync) and raises a
    ValueError naming ``lengths[b]`` outside [0, S]; without it the kernel clamps each length into [0, S]
    (it never reads outside the cache), so check bad lengths upstream or pass ``validate=True``."""
    if not torch.is_tensor(q) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor [B, H, Dh] (one query per sequence), got "
                         f"{tuple(q.shape) if torch.is_tensor(q) else type(q).__name__}")
    B, H, K, _, S, Dh = check_qkv(q[:, :, None], k, v)
    _check_device_dtype(q, "the flash-decoding kernel", "flash_decode_triton")
    num_splits = integer(num_splits, "num_splits", low=1)
    if lengths is not None:
        if not torch.is_tensor(lengths) or lengths.shape != (B,) or lengths.dtype.is_floating_point \
                or lengths.dtype == torch.bool:
            raise ValueError(f"lengths must be an integer tensor [B={B}], got {lengths!r}")
        if validate:
            check_lengths(lengths, B, S)
        lengths = lengths.to(device=q.device, dtype=torch.int32)
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    out = torch.empty(B, H, Dh, dtype=q.dtype, device=q.device)
    if num_splits > 1:
        m_part = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
        l_part = torch.empty_like(m_part)
        acc_part = torch.empty(B, H, num_splits, Dh, dtype=torch.float32, device=q.device)
    else:
        m_part = l_part = acc_part = out
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    G = H // K
    args = (q, k, v, lengths if lengths is not None else out, out, m_part, l_part, acc_part, scale * LOG2E.value, S,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1))
    meta = dict(GROUP=G, BLOCK_G=max(16, triton.next_power_of_2(G)), HEAD_DIM=Dh,
                BLOCK_D=max(16, triton.next_power_of_2(Dh)), NUM_SPLITS=num_splits, HAS_LENS=lengths is not None,
                STATIC_TOKENS=static_tokens(S),
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
                UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16)
    grid = (B, K, num_splits)
    if tile_n is None:
        _flash_decode_kernel[grid](*args, **meta)
    else:
        tile_n = power_of_two(tile_n, "tile_n", low=16)          # tl.dot's smallest side
        _flash_decode_kernel.fn[grid](*args, **meta, TILE_N=tile_n, num_warps=4,
                                      num_stages=1 if interpreting() else 2)
    if num_splits > 1:
        combine_splits_triton(m_part, l_part, acc_part, out)     # the reduction the paged kernel uses too
    return out


__all__ = ["flash_attention_triton", "flash_decode_triton", "interpreting", "SUPPORTED_DTYPES"]
