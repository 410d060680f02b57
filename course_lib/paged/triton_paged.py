"""A Triton decode kernel for paged attention: K/V read in place through the block table.

Design (one decode query per sequence, K/V in a pool [N, K, block_size, Dh]):

* One program per (sequence b, KV head kvh[, split s]). It serves the whole GQA group: the G = H // K
  query heads that share KV head kvh are the rows of a [BLOCK_G, BLOCK_D] query tile (G padded to a
  power of two >= 16, the smallest ``tl.dot`` shape), so each K/V byte is read once per group, not once
  per query head.
* K/V are walked in tiles of TILE_N tokens (several blocks per tile). For each token of the tile the
  kernel loads its physical block id from the table (the repeated entries of one block are the same
  address and come from L1), and the token's address is ``pool + block * s_n + kvh * s_h + (t % bs) *
  s_s``: no gathered copy is made. What the kernel does with the tile is the course's one online-softmax
  tile step, ``course_lib.attention.triton_online_softmax.online_softmax_tile`` (flash-decoding and the
  FlashAttention forward call it too): scores ``q @ k^T`` and ``p @ v`` are two ``tl.dot``, the softmax is
  online (running max, running sum, weighted V) in fp32, in the log2 domain (``exp2``).
* Split-KV (flash-decoding): with ``num_splits = S > 1`` a third grid axis cuts each sequence's tiles
  into S chunks; every program writes its partial (max, sum, unnormalised acc) to fp32 scratch, and a
  second kernel combines the S partials of each (sequence, head) with log-sum-exp weights (the end of a
  program, ``store_split``, and the reduction are flash-decoding's too: ``attention/triton_splitkv.py``).
  It pays when B * K programs cannot fill the GPU (small batches, long contexts); ``num_splits=None``
  picks S from B * K and the number of SMs.
* Tokens past a sequence's length (and the rest of its last block) are masked; empty splits write
  (-inf, 0, 0) and weigh nothing in the combination. A sequence of length 0 gets a zero row (no 0/0);
  lengths are checked only with ``validate=True`` (a host sync) and otherwise clamped into
  [0, max_blocks * block_size], so the kernel never reads past a table row.

Runs on CUDA, and on CPU tensors under the interpreter (set ``TRITON_INTERPRET=1`` before importing
triton); any block_size (each token finds its block by a division, a shift for powers of two), any
head_dim (padded to a power of two and masked); fp32 (dots in IEEE fp32, not tf32), fp16 and bf16
(fp32 accumulation).

Under the interpreter the tile loop runs a host-known number of times (the table's width), as every
kernel of the course does there (``triton_online_softmax`` says why: triton 3.6's interpreter refuses a
runtime loop bound under NumPy >= 2.4); compiled kernels keep the runtime, per-sequence trip count.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# the tile step, the end of a split and the reduction: shared with flash-decoding (the FlashAttention forward
# calls the step too); combine_splits_kernel is imported for the tests
from course_lib.attention.triton_online_softmax import (LOG2E, SUPPORTED_DTYPES, decode_configs, interpreting,
                                                        online_softmax_tile, static_tokens)
from course_lib.attention.triton_splitkv import (combine_splits_kernel, combine_splits_triton,  # noqa: F401
                                                 store_split)
from course_lib.env import use_triton
from course_lib.validate import integer, optional, power_of_two

from .checks import check_paged_args


# On a GPU a small autotune (keyed on head_dim, block_size, group rows, splits and the dtypes) picks the
# tile length, warps and pipeline depth once per shape family, from the decode kernels' space
# (``decode_configs``); under the interpreter one small config (tiles of several blocks even at the small
# block sizes of the tests). A tile need not hold whole blocks: each token looks up its own block, so any
# power-of-two TILE_N >= 16 works with any block size (a block larger than the tile is read over several
# tiles).
@triton.jit
def _paged_tile(tile, tok_hi, tbl_row, k_base, v_base, s_kn, s_ks, s_vn, s_vs, d, dmask,
                BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr):
    """Where the tokens [tile * TILE_N, (tile + 1) * TILE_N) are, through the block table, for
    ``online_softmax_tile``: K and V pointers [TILE_N, BLOCK_D], their load mask, and which scores count
    (tokens < tok_hi)."""
    tok = tile * TILE_N + tl.arange(0, TILE_N)
    tmask = tok < tok_hi
    blk = tl.load(tbl_row + tok // BLOCK_SIZE, mask=tmask, other=0).to(tl.int64)   # physical block per token
    slot = tok % BLOCK_SIZE
    return (k_base + blk[:, None] * s_kn + slot[:, None] * s_ks + d[None, :],
            v_base + blk[:, None] * s_vn + slot[:, None] * s_vs + d[None, :],
            tmask[:, None] & dmask[None, :], tmask[None, :])


@triton.autotune(configs=decode_configs(), key=["HEAD_DIM", "BLOCK_SIZE", "BLOCK_G", "NUM_SPLITS"])
@triton.jit
def _paged_decode_kernel(Q, KP, VP, TBL, LENS, OUT, M_PART, L_PART, ACC_PART, qk_scale, max_blocks,
                         s_qb, s_qh, s_kn, s_kh, s_ks, s_vn, s_vh, s_vs, s_tb, s_ob, s_oh,
                         GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr,
                         STATIC_TOKENS: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
                         TILE_N: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    gmask = g < GROUP
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    head = kvh * GROUP + g                                                   # query heads of this group
    q = tl.load(Q + b * s_qb + head[:, None] * s_qh + d[None, :], mask=gmask[:, None] & dmask[None, :],
                other=0.0)                                                   # [BLOCK_G, BLOCK_D]
    L = tl.maximum(tl.minimum(tl.load(LENS + b), max_blocks * BLOCK_SIZE), 0)   # never read past the table
    n_tiles = tl.cdiv(L, TILE_N)
    per_split = tl.cdiv(n_tiles, NUM_SPLITS)                                 # tiles of each split
    tile_lo = split * per_split
    tok_hi = tl.minimum((tile_lo + per_split) * TILE_N, L)                  # this split's tokens end
    tbl_row = TBL + b * s_tb
    k_base = KP + kvh * s_kh
    v_base = VP + kvh * s_vh
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)   # running max of the scores (log2 units)
    l_i = tl.zeros([BLOCK_G], tl.float32)                  # running sum of exp2(score - max)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)         # running sum of exp2(score - max) * v
    if STATIC_TOKENS > 0:   # interpreter: host-known trip count (see triton_online_softmax)
        for i in range(0, (STATIC_TOKENS + TILE_N * NUM_SPLITS - 1) // (TILE_N * NUM_SPLITS)):
            k_ptrs, v_ptrs, kv_mask, valid = _paged_tile(tile_lo + i, tok_hi, tbl_row, k_base, v_base, s_kn, s_ks,
                                                         s_vn, s_vs, d, dmask, BLOCK_SIZE, TILE_N)
            m_i, l_i, acc = online_softmax_tile(q, m_i, l_i, acc, k_ptrs, v_ptrs, kv_mask, valid, qk_scale,
                                                True, True, DOT_PRECISION, UPCAST_DOT)
    else:                   # compiled: this split's own tiles only
        for i in range(0, tl.maximum(tl.minimum(per_split, n_tiles - tile_lo), 0)):
            k_ptrs, v_ptrs, kv_mask, valid = _paged_tile(tile_lo + i, tok_hi, tbl_row, k_base, v_base, s_kn, s_ks,
                                                         s_vn, s_vs, d, dmask, BLOCK_SIZE, TILE_N)
            m_i, l_i, acc = online_softmax_tile(q, m_i, l_i, acc, k_ptrs, v_ptrs, kv_mask, valid, qk_scale,
                                                True, True, DOT_PRECISION, UPCAST_DOT)
    store_split(OUT, M_PART, L_PART, ACC_PART, m_i, l_i, acc, b, head, split, tl.num_programs(1) * GROUP,
                s_ob, s_oh, d, gmask, dmask, HEAD_DIM, NUM_SPLITS)


_SM_COUNT: dict = {}


def _sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def choose_num_splits(batch: int, kv_heads: int, max_tokens: int, num_sms: int, programs_per_sm: int = 2,
                      min_tokens_per_split: int = 256, max_splits: int = 32) -> int:
    """How many KV chunks per (sequence, KV head): 1 when B * K programs already fill the GPU (about
    ``programs_per_sm`` resident per SM), else the smallest split whose waves are at least 85% as
    efficient as the best one (FlashAttention's ``num_splits_heuristic``), with each chunk at least
    ``min_tokens_per_split`` tokens of the table's width (a bound known without reading the lengths)."""
    programs, slots = batch * kv_heads, num_sms * programs_per_sm
    if programs >= 0.8 * slots:
        return 1
    limit = max(1, min(max_splits, max_tokens // min_tokens_per_split))

    def efficiency(s):
        waves = programs * s / slots
        return waves / math.ceil(waves)

    best = max(efficiency(s) for s in range(1, limit + 1))
    return next(s for s in range(1, limit + 1) if efficiency(s) >= 0.85 * best)


def paged_attention_triton(q, k_pool, v_pool, block_tables, context_lens, scale: float | None = None,
                           num_splits: int | None = None, validate: bool = False, tile_n: int | None = None):
    """Same contract as ``paged_attention_reference``: q [B, H, Dh] -> out [B, H, Dh].

    ``num_splits``: KV chunks per sequence (split-KV, flash-decoding); None = a heuristic (1 under the
    interpreter). ``validate``: also run the checks that read the tables and lengths on the host (a
    device sync; without it a length is clamped into [0, max_blocks * block_size], and 0 gives a zero
    row). ``tile_n``: tokens per K/V tile (a power of two >= 16; it need not be a multiple of the
    block size, every token finds its own block), bypassing the autotuner (tests, experiments)."""
    check_paged_args(q, k_pool, v_pool, block_tables, context_lens, sync_checks=validate)
    B, H, Dh = q.shape
    N, K, bs, _ = k_pool.shape
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"the Triton kernel supports {SUPPORTED_DTYPES}, got dtype {q.dtype}")
    use_triton(q.device, "triton", "the paged attention kernel", "paged_attention_triton")   # T4: a warning
    max_blocks = block_tables.shape[1]
    if num_splits is None:
        num_splits = choose_num_splits(B, K, max_blocks * bs, _sm_count(q.device)) if q.is_cuda else 1
    num_splits = integer(num_splits, "num_splits", low=1)
    tile_n = optional(power_of_two, tile_n, "tile_n", low=16)      # tl.dot's smallest side
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_pool = k_pool if k_pool.stride(-1) == 1 else k_pool.contiguous()
    v_pool = v_pool if v_pool.stride(-1) == 1 else v_pool.contiguous()
    tables = block_tables if block_tables.dtype == torch.int32 and block_tables.stride(1) == 1 \
        else block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32)
    out = torch.empty(B, H, Dh, dtype=q.dtype, device=q.device)
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    G = H // K
    if num_splits > 1:
        m_part = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
        l_part = torch.empty_like(m_part)
        acc_part = torch.empty(B, H, num_splits, Dh, dtype=torch.float32, device=q.device)
    else:
        m_part = l_part = acc_part = out                   # unused (NUM_SPLITS == 1 writes out directly)
    args = (q, k_pool, v_pool, tables, lens, out, m_part, l_part, acc_part, scale * LOG2E.value, max_blocks,
            q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
            v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), tables.stride(0), out.stride(0), out.stride(1))
    meta = dict(GROUP=G, BLOCK_G=max(16, triton.next_power_of_2(G)), HEAD_DIM=Dh,
                BLOCK_D=max(16, triton.next_power_of_2(Dh)), BLOCK_SIZE=bs, NUM_SPLITS=num_splits,
                STATIC_TOKENS=static_tokens(max_blocks * bs),
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
                UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16)
    grid = (B, K, num_splits)
    if tile_n is None:
        _paged_decode_kernel[grid](*args, **meta)
    else:
        _paged_decode_kernel.fn[grid](*args, **meta, TILE_N=tile_n, num_warps=4 if tile_n <= 64 else 8,
                                      num_stages=1 if interpreting() else 2)
    if num_splits > 1:
        combine_splits_triton(m_part, l_part, acc_part, out)    # shared with flash-decoding
    return out
