"""Paged attention: attention whose K/V are read through a block table.

Layout of the physical KV memory (one pool per layer, for K and for V):

    k_pool, v_pool: [num_blocks, K, block_size, Dh]       K = KV heads, Dh = head dim
    block_tables:   [B, max_blocks] integer               row b: physical blocks of sequence b, in order
    context_lens:   [B]                                   tokens of sequence b (the rest of its last
                                                          block, and unused table entries, are ignored)

``paged_attention_reference`` gathers each sequence's blocks into a contiguous [K, L, Dh] tensor and
calls ordinary attention: the readable definition. ``course_lib.paged.triton_paged`` computes the
same thing for decoding (one query per sequence) without gathering: each program reads the blocks in
place, following the table, with an online softmax.

``PagedCache`` plugs a ``BlockManager`` and a ``KVPool`` into the course model's cache contract, so the
model generates through paged memory (batch rows may have different lengths: pass
``positions=cache.positions(T)`` and ``attn_mask=cache.attn_mask(T)``).
"""
from __future__ import annotations

import math

import torch

from .allocator import PagingError
from .manager import BlockManager


def _check_paged_args(q, k_pool, v_pool, block_tables, context_lens):
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, heads, head_dim] (one decode query per sequence), got {tuple(q.shape)}")
    if k_pool.dim() != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(f"k_pool and v_pool must be equal [num_blocks, kv_heads, block_size, head_dim], got "
                         f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}")
    B, H, Dh = q.shape
    N, K, bs, Dh2 = k_pool.shape
    if Dh != Dh2:
        raise ValueError(f"q head_dim {Dh} != pool head_dim {Dh2}")
    if H % K:
        raise ValueError(f"query heads {H} must be a multiple of kv heads {K}")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or block_tables.dtype.is_floating_point:
        raise ValueError(f"block_tables must be an integer [batch={B}, max_blocks] tensor, got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if context_lens.shape != (B,) or context_lens.dtype.is_floating_point:
        raise ValueError(f"context_lens must be an integer [batch={B}] tensor, got {tuple(context_lens.shape)}")
    if q.device != k_pool.device or q.device != block_tables.device or q.device != context_lens.device:
        raise ValueError("q, pools, block_tables and context_lens must be on the same device")
    if q.dtype != k_pool.dtype:
        raise ValueError(f"q ({q.dtype}) and the pools ({k_pool.dtype}) must share a dtype")
    lens = context_lens.tolist()
    if min(lens) < 1 or max(lens) > block_tables.shape[1] * bs:
        raise ValueError(f"context_lens must be in [1, max_blocks * block_size = {block_tables.shape[1] * bs}], "
                         f"got {lens}")
    for b, n in enumerate(lens):
        used = block_tables[b, :-(-n // bs)]
        if int(used.min()) < 0 or int(used.max()) >= N:
            raise ValueError(f"block_tables[{b}] points outside the pool of {N} blocks: {used.tolist()}")


def gather_kv(pool: torch.Tensor, table, length: int) -> torch.Tensor:
    """Contiguous [K, length, Dh] from a pool [N, K, bs, Dh] and a block table (list or tensor)."""
    bs = pool.shape[2]
    nb = -(-length // bs)
    idx = torch.as_tensor(table[:nb] if not torch.is_tensor(table) else table[:nb], device=pool.device).long()
    blocks = pool[idx]                                               # [nb, K, bs, Dh]
    return blocks.permute(1, 0, 2, 3).reshape(pool.shape[1], nb * bs, pool.shape[3])[:, :length]


def paged_attention_reference(q, k_pool, v_pool, block_tables, context_lens, scale: float | None = None):
    """Decode attention through block tables: out[b] = softmax(q[b] K_b^T * scale) V_b, [B, H, Dh]."""
    _check_paged_args(q, k_pool, v_pool, block_tables, context_lens)
    B, H, Dh = q.shape
    K = k_pool.shape[1]
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        k = gather_kv(k_pool, block_tables[b], n).repeat_interleave(H // K, dim=0)   # [H, n, Dh]
        v = gather_kv(v_pool, block_tables[b], n).repeat_interleave(H // K, dim=0)
        att = (q[b, :, None, :].float() @ k.float().transpose(1, 2)) * scale        # [H, 1, n]
        out[b] = (att.softmax(-1) @ v.float())[:, 0].to(q.dtype)
    return out


def paged_attention(q, k_pool, v_pool, block_tables, context_lens, scale=None, backend: str = "auto"):
    """Dispatch: ``triton`` (CUDA, or TRITON_INTERPRET=1 on CPU), ``reference``, or ``auto`` (Triton on
    CUDA when it is installed, the reference elsewhere)."""
    if backend not in ("auto", "triton", "reference"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'reference', got {backend!r}")
    if backend == "auto":
        from course_lib.env import has_package
        backend = "triton" if q.is_cuda and has_package("triton") else "reference"
    if backend == "triton":
        from .triton_paged import paged_attention_triton
        return paged_attention_triton(q, k_pool, v_pool, block_tables, context_lens, scale)
    return paged_attention_reference(q, k_pool, v_pool, block_tables, context_lens, scale)


def contiguous_to_paged(k: torch.Tensor, v: torch.Tensor, lengths, block_size: int, num_blocks: int | None = None,
                        generator: torch.Generator | None = None):
    """Scatter contiguous K/V [B, K, S, Dh] (row b valid up to lengths[b]) into pools with shuffled,
    non-contiguous blocks. Returns (k_pool, v_pool, block_tables [B, max_blocks] int32, context_lens)."""
    B, K, S, Dh = k.shape
    lengths = [int(x) for x in lengths]
    need = [-(-n // block_size) for n in lengths]
    total = sum(need)
    num_blocks = num_blocks or total + 3
    if num_blocks < total:
        raise ValueError(f"num_blocks={num_blocks} < {total} blocks needed")
    perm = torch.randperm(num_blocks, generator=generator).tolist()
    k_pool = torch.zeros(num_blocks, K, block_size, Dh, dtype=k.dtype, device=k.device)
    v_pool = torch.zeros_like(k_pool)
    tables = torch.zeros(B, max(need), dtype=torch.int32, device=k.device)
    for b in range(B):
        for i in range(need[b]):
            blk = perm.pop()
            tables[b, i] = blk
            a, e = i * block_size, min((i + 1) * block_size, lengths[b])
            k_pool[blk, :, :e - a] = k[b, :, a:e]
            v_pool[blk, :, :e - a] = v[b, :, a:e]
    return k_pool, v_pool, tables, torch.tensor(lengths, dtype=torch.int32, device=k.device)


class KVPool:
    """The physical KV memory of a model: per layer, K and V pools [num_blocks, K, block_size, Dh]."""

    def __init__(self, num_layers: int, num_blocks: int, kv_heads: int, block_size: int, head_dim: int,
                 dtype=torch.float32, device="cpu"):
        shape = (num_blocks, kv_heads, block_size, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int):
        c = model.config
        return cls(c.num_hidden_layers, num_blocks, c.num_key_value_heads, block_size, c.head_dim,
                   model.dtype, model.device)

    def copy_block(self, src: int, dst: int):
        for pool in self.k + self.v:
            pool[dst] = pool[src]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class PagedCache:
    """The course model's cache contract on top of paged memory.

    Typical use (see Module 06):
        cache = PagedCache(BlockManager(num_blocks, bs, prefix_caching=True), KVPool.for_model(model, ...))
        skip = cache.add_sequence("a", prompt)          # tokens whose KV the prefix cache already holds
        cache.set_active(["a"])
        logits = model(prompt[skip:][None], cache=cache)
        cache.append(["a"], [next_token]); logits = model(next_token[None, None], cache=cache)

    ``add_sequence``/``append`` register tokens with the block manager (allocating blocks; ``OutOfBlocks``
    if memory is short); the model's forward then writes their K/V into the pool slots and reads each
    sequence's K/V back through its block table.

    With prefix caching, the block manager registers a prompt's full blocks when the sequence is added,
    before its prefill has written them: run a sequence's prefill before adding another sequence that
    may share its prefix (vLLM marks blocks "computed" after the forward for the same reason).
    """

    def __init__(self, manager: BlockManager, pool: KVPool):
        if manager.block_size != pool.block_size or manager.num_blocks != pool.num_blocks:
            raise ValueError("manager and pool disagree on block_size or num_blocks")
        self.manager, self.pool = manager, pool
        self.computed: dict = {}     # seq -> tokens whose K/V are in the pool
        self.active: list = []

    # --- sequence management -----------------------------------------------------------------------
    def add_sequence(self, seq_id, prompt) -> int:
        prompt = [int(t) for t in (prompt.tolist() if torch.is_tensor(prompt) else prompt)]
        cached = self.manager.add_sequence(seq_id, prompt)
        self.computed[seq_id] = cached
        return cached

    def append(self, seq_ids, tokens) -> None:
        """One new token per sequence (before the forward that computes it)."""
        tokens = tokens.tolist() if torch.is_tensor(tokens) else list(tokens)
        need = sum(self.manager.blocks_needed(s, 1) for s in seq_ids)
        if need > self.manager.num_free_blocks:
            from .allocator import OutOfBlocks
            raise OutOfBlocks(need, self.manager.num_free_blocks, "decode step")
        for s, t in zip(seq_ids, tokens):
            for src, dst in self.manager.append(s, int(t)):
                self.pool.copy_block(src, dst)

    def fork(self, parent, child) -> None:
        self.manager.fork(parent, child)
        self.computed[child] = self.computed[parent]

    def free(self, seq_id) -> None:
        self.manager.free(seq_id)
        del self.computed[seq_id]
        self.active = [s for s in self.active if s != seq_id]

    def set_active(self, seq_ids) -> None:
        """The sequences of the next forward, in batch-row order."""
        for s in seq_ids:
            if s not in self.computed:
                raise PagingError(f"unknown sequence {s!r}")
        self.active = list(seq_ids)

    # --- the model's cache contract ----------------------------------------------------------------
    def get_seq_length(self) -> int:
        lens = {self.computed[s] for s in self.active}
        if len(lens) != 1:
            raise ValueError(f"the active sequences have different lengths {sorted(lens)}: call the model with "
                             "positions=cache.positions(T) and attn_mask=cache.attn_mask(T)")
        return lens.pop()

    def positions(self, num_new: int) -> torch.Tensor:
        dev = self.pool.k[0].device
        return torch.stack([torch.arange(self.computed[s], self.computed[s] + num_new, device=dev)
                            for s in self.active])                                         # [B, T]

    def attn_mask(self, num_new: int, device=None) -> torch.Tensor:
        """[B, 1, T, S]: row b's query t sees its own keys up to its position (padding excluded)."""
        pos = self.positions(num_new)                                                        # [B, T]
        S = int(pos[:, -1].max()) + 1
        j = torch.arange(S, device=pos.device)
        return (j[None, None, :] <= pos[:, :, None])[:, None]

    def update(self, k, v, layer):
        B, K, T, Dh = k.shape
        if B != len(self.active):
            raise ValueError(f"update: batch {B} but {len(self.active)} active sequences (call set_active)")
        mgr, bs = self.manager, self.pool.block_size
        pk, pv = self.pool.k[layer], self.pool.v[layer]
        lens = []
        for b, s in enumerate(self.active):
            start = self.computed[s]
            if start + T > mgr.num_tokens(s):
                raise ValueError(f"sequence {s!r}: {T} new tokens but only {mgr.num_tokens(s) - start} were "
                                 "registered; call add_sequence/append first")
            table = mgr.seqs[s].table
            idx = range(start, start + T)
            blocks = torch.tensor([table[i // bs] for i in idx], device=pk.device)
            offs = torch.tensor([i % bs for i in idx], device=pk.device)
            pk[blocks, :, offs] = k[b].transpose(0, 1)                    # [T, K, Dh] into the slots
            pv[blocks, :, offs] = v[b].transpose(0, 1)
            lens.append(start + T)
        S = max(lens)
        k_all = k.new_zeros(B, K, S, Dh)
        v_all = v.new_zeros(B, K, S, Dh)
        for b, s in enumerate(self.active):                               # read back through the table
            k_all[b, :, :lens[b]] = gather_kv(pk, mgr.seqs[s].table, lens[b])
            v_all[b, :, :lens[b]] = gather_kv(pv, mgr.seqs[s].table, lens[b])
        if layer == self.pool.num_layers - 1:
            for s in self.active:
                self.computed[s] += T
        return k_all, v_all
