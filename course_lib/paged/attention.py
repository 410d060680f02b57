"""Paged attention: attention whose K/V are read through a block table.

Layout of the physical KV memory (one pool per layer, for K and for V):

    k_pool, v_pool: [num_blocks, K, block_size, Dh]       K = KV heads, Dh = head dim
    block_tables:   [B, max_blocks] integer               row b: physical blocks of sequence b, in order
    context_lens:   [B]                                   tokens of sequence b (the rest of its last
                                                          block, and unused table entries, are ignored)

Lengths, the rule of every backend (as flash-decoding's, ``course_lib.attention.flash_decoding``): 0 <=
context_lens[b] <= max_blocks * block_size; an empty sequence (0) gets a zero row (a padded batch slot). A
length outside that range is a ValueError naming ``context_lens[b]``: the reference always checks; the
torch and Triton backends only with ``validate=True`` (reading the lengths is a host sync on the decode
path) and otherwise clamp each length into the range (never reading outside the table).

Three implementations of one decode step (one query per sequence), all -> [B, H, Dh]:

* ``paged_attention_reference``: gathers each sequence's blocks into a contiguous [K, L, Dh] tensor and
  calls ordinary attention, one row at a time: the readable definition (and it checks everything).
* ``paged_attention(..., backend="torch")``: the same without a Python loop or a host sync: gather every
  row's blocks at once (``gather_blocks``), mask each row past its length, and run the course's one
  batched attention (``course_lib.attention``, GQA without repeating K/V).
* ``course_lib.paged.triton_paged``: a Triton kernel that reads the blocks in place, following the
  table, with an online softmax (and a split-KV variant for small batches).

``course_lib.paged.cache`` (``KVPool``, ``PagedCache``) runs the course model on paged memory and
decodes through ``paged_attention``.
"""
from __future__ import annotations

import math

import torch

from course_lib.attention import attention
from course_lib.env import use_triton
from course_lib.validate import integer, optional

from .checks import check_paged_args
from .manager import blocks_needed

BACKENDS = ("auto", "torch", "triton", "reference")


def gather_kv(pool: torch.Tensor, table, length: int) -> torch.Tensor:
    """Contiguous [K, length, Dh] from a pool [N, K, bs, Dh] and a block table (list or tensor)."""
    bs = pool.shape[2]
    nb = blocks_needed(length, bs)
    idx = torch.as_tensor(table[:nb], device=pool.device).long()
    blocks = pool[idx]                                               # [nb, K, bs, Dh]
    return blocks.permute(1, 0, 2, 3).reshape(pool.shape[1], nb * bs, pool.shape[3])[:, :length]


def paged_attention_reference(q, k_pool, v_pool, block_tables, context_lens, scale: float | None = None):
    """Decode attention through block tables: out[b] = softmax(q[b] K_b^T * scale) V_b, [B, H, Dh].
    One sequence at a time, in fp32, with every argument checked (this reads the lengths on the host).
    A sequence of length 0 gets a zero row (softmax over no key is taken as zero weights)."""
    check_paged_args(q, k_pool, v_pool, block_tables, context_lens)
    B, H, Dh = q.shape
    K = k_pool.shape[1]
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        if n == 0:                                                                # nothing to attend to
            out[b] = 0
            continue
        k = gather_kv(k_pool, block_tables[b], n).repeat_interleave(H // K, dim=0)   # [H, n, Dh]
        v = gather_kv(v_pool, block_tables[b], n).repeat_interleave(H // K, dim=0)
        att = (q[b, :, None, :].float() @ k.float().transpose(1, 2)) * scale        # [H, 1, n]
        out[b] = (att.softmax(-1) @ v.float())[:, 0].to(q.dtype)
    return out


def gather_blocks(pool: torch.Tensor, block_tables: torch.Tensor, num_tokens: int | None = None) -> torch.Tensor:
    """Every row's blocks in table order, as contiguous K/V: pool [N, K, bs, Dh], block_tables
    [B, max_blocks] -> [B, K, num_tokens, Dh] (default: all max_blocks * bs tokens; past a row's length
    the values are whatever its table points at: mask them). One ``index_select`` on the block axis (about
    twice as fast on a CPU as ``pool[block_tables]``), then one copy; no Python loop over rows."""
    N, K, bs, Dh = pool.shape
    B, nb = block_tables.shape
    blocks = pool.index_select(0, block_tables.reshape(-1).long()).view(B, nb, K, bs, Dh)
    return blocks.permute(0, 2, 1, 3, 4).reshape(B, K, nb * bs, Dh)[:, :, :num_tokens]


def paged_attention_torch(q, k_pool, v_pool, block_tables, context_lens, scale: float | None = None):
    """Vectorized paged decode attention: no Python loop over rows, no host sync.

    ``gather_blocks`` collects every row's blocks at once -> [B, K, max_blocks * bs, Dh], a length mask
    [B, 1, 1, S] hides the tokens past each row's length, and the course's one attention (GQA without
    repeating K/V) runs the whole batch. Table entries past a row's last used block are ignored (replaced
    by block 0 before the gather, so they need not point inside the pool). Lengths are not checked (no
    sync): the masks clamp each into [0, max_blocks * bs] (a row of length 0, or less, gets zeros)."""
    B, H, Dh = q.shape
    bs, max_blocks = k_pool.shape[2], block_tables.shape[1]
    lens = context_lens.to(device=q.device, dtype=torch.long)
    used = torch.arange(max_blocks, device=q.device) * bs < lens[:, None]              # [B, max_blocks]
    tables = torch.where(used, block_tables.long(), 0)
    mask = (torch.arange(max_blocks * bs, device=q.device) < lens[:, None])[:, None, None, :]   # [B, 1, 1, S]
    out = attention(q[:, :, None], gather_blocks(k_pool, tables), gather_blocks(v_pool, tables), mask,
                    scale=scale)                                                      # [B, H, 1, Dh]
    # an empty row: zeros whatever SDPA makes of a fully masked row (NaN before torch 2.5's safe softmax)
    return torch.where((lens > 0)[:, None, None], out[:, :, 0], 0)


def paged_attention(q, k_pool, v_pool, block_tables, context_lens, scale=None, backend: str = "auto",
                    num_splits: int | None = None, validate: bool = False):
    """Paged decode attention: q [B, H, Dh], pools [N, K, bs, Dh], block_tables [B, max_blocks],
    context_lens [B] -> [B, H, Dh].

    backend: ``reference`` (per-row loop, everything checked), ``torch`` (vectorized, no host sync),
    ``triton`` (the kernel of ``triton_paged``: CUDA, or CPU with TRITON_INTERPRET=1), or ``auto``
    (``resolve_backend``: triton on a CUDA GPU that Triton supports, compute capability >= 8.0, else torch;
    a T4 gets torch and a one-line notice). Shapes, dtypes and devices are always checked;
    ``validate=True`` adds the checks that read lengths and tables on the host (a sync), which the
    reference always does. ``num_splits``: split-KV chunks for the triton kernel (None: a heuristic)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    num_splits = optional(integer, num_splits, "num_splits", low=1)
    if backend == "reference":
        return paged_attention_reference(q, k_pool, v_pool, block_tables, context_lens, scale)
    check_paged_args(q, k_pool, v_pool, block_tables, context_lens, sync_checks=validate)
    if resolve_backend(backend, q.device) == "triton":
        from .triton_paged import paged_attention_triton   # triton is optional: imported when used
        return paged_attention_triton(q, k_pool, v_pool, block_tables, context_lens, scale,
                                      num_splits=num_splits, validate=False)
    return paged_attention_torch(q, k_pool, v_pool, block_tables, context_lens, scale)


def resolve_backend(backend: str, device) -> str:
    """The implementation ``paged_attention(..., backend=backend)`` runs for tensors on ``device``: "auto"
    becomes "triton" or "torch" (``course_lib.env.use_triton``, the course's one decision); "triton" stays
    "triton" where it can run (on a GPU Triton does not support, e.g. a T4, with a one-time warning) and
    raises a ValueError naming ``backend`` where it cannot (a CPU without the interpreter, no triton)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend in ("auto", "triton"):
        return "triton" if use_triton(device, backend, "the paged attention kernel") else "torch"
    return backend


def contiguous_to_paged(k: torch.Tensor, v: torch.Tensor, lengths, block_size: int, num_blocks: int | None = None,
                        generator: torch.Generator | None = None):
    """Scatter contiguous K/V [B, K, S, Dh] (row b valid up to lengths[b]) into pools with shuffled,
    non-contiguous blocks. Returns (k_pool, v_pool, block_tables [B, max_blocks] int32, context_lens
    int32), all on k's device; the rest of each last block and of the pool is zeros. A length may be 0 (no
    block; its table row is padding). ``generator`` (on any device) draws the shuffle."""
    B, K, S, Dh = k.shape
    lengths = [int(x) for x in (lengths.tolist() if torch.is_tensor(lengths) else lengths)]
    if len(lengths) != B or min(lengths) < 0 or max(lengths) > S:
        raise ValueError(f"lengths must be {B} values in [0, {S}], got {lengths}")
    need = [blocks_needed(n, block_size) for n in lengths]
    total = sum(need)
    num_blocks = num_blocks or total + 3
    if num_blocks < total:
        raise ValueError(f"num_blocks={num_blocks} < {total} blocks needed")
    gen_device = generator.device if generator is not None else "cpu"
    perm = torch.randperm(num_blocks, generator=generator, device=gen_device).tolist()
    k_pool = torch.zeros(num_blocks, K, block_size, Dh, dtype=k.dtype, device=k.device)
    v_pool = torch.zeros_like(k_pool)
    rows = []
    for b in range(B):
        blocks = [perm.pop() for _ in range(need[b])]
        rows.append(blocks + [0] * (max(1, max(need)) - need[b]))       # a table has >= 1 column
        idx = torch.tensor(blocks, dtype=torch.long, device=k.device)
        for src, pool in ((k, k_pool), (v, v_pool)):
            x = src.new_zeros(K, need[b] * block_size, Dh)
            x[:, :lengths[b]] = src[b, :, :lengths[b]]
            pool[idx] = x.reshape(K, need[b], block_size, Dh).transpose(0, 1)
    tables = torch.tensor(rows, dtype=torch.int32, device=k.device)
    return k_pool, v_pool, tables, torch.tensor(lengths, dtype=torch.int32, device=k.device)
