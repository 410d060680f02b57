"""The one paged KV store: ``KVPool`` (the physical blocks) and ``PagedCache`` (the model's cache on them).

Used by Module 06 (the course model generating through paged memory) and by the serving engine of
Module 09 (``course_lib.serving.engine``), which drives the same object for every forward.

Who owns what:

* ``BlockManager`` (``manager.py``): the bookkeeping, and the only source of block tables: which physical
  blocks each sequence owns, in order, the free list, copy-on-write, prefix caching.
* ``KVPool``: the memory, per layer a K and a V tensor ``[num_blocks, kv_heads, block_size, head_dim]``.
* ``PagedCache`` (a ``KVCache``): which sequences the next forward runs (``set_active``), how many of
  their tokens are already in the pool (``computed``), and the model's cache contract on top of both.

Per forward the cache builds a **plan** once, on the host, from the bookkeeping (in ``positions(T)``,
which the model calls before its first layer, or at layer 0): the positions of the new tokens
[B, T], the slot mapping (physical block and offset of every new token), the block tables
[B, max_blocks] and the context lengths [B]. They go to the pool's device in one copy; every layer then
reuses them: no per-layer or per-row Python work, no host sync inside the forward.

``attend(q, k, v, layer)`` (what the model calls) writes the new K/V into their slots with one batched
``index_put`` per layer and then

* decode (one new token per row, no mask from the caller): ``paged_attention`` reads K/V in place
  through the block tables (``backend``: "auto" = the Triton kernel on a GPU that Triton supports, compute
  capability >= 8.0, the vectorized PyTorch gather elsewhere, a T4 included; or "torch", "triton",
  "reference"), the step vLLM's PagedAttention kernel does;
* prefill, chunked prefill after cached context, or an explicit mask: one vectorized gather of each
  row's blocks into [B, K, S, Dh] and ordinary attention with the [B, 1, T, S] causal mask of the rows.

Rows may bring different numbers of new tokens in one forward (``set_active(seqs, num_new=[...])``, the
input right-padded to T): the padding tokens are not written anywhere and their queries (which repeat
the row's last position) are harmless; read a row's logits at ``num_new[b] - 1``.
"""
from __future__ import annotations

import torch

from course_lib.attention import attention
from course_lib.kvcache.base import KVCache, check_kv

from . import attention as _paged          # paged_attention, looked up at call time
from .allocator import OutOfBlocks, PagingError
from .manager import BlockManager, blocks_needed

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

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    def copy_block(self, src: int, dst: int):
        for pool in self.k + self.v:
            pool[dst] = pool[src]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class _Plan:
    """Everything one forward needs to find its K/V, built once on the host and moved to the device."""

    def __init__(self, cache: "PagedCache", T: int):
        mgr, bs, dev = cache.manager, cache.pool.block_size, cache.pool.device
        seqs = cache.active
        if not seqs:
            raise ValueError("no active sequences: call set_active([...]) before the forward")
        B = len(seqs)
        counts = [T] * B if cache.num_new is None else list(cache.num_new)
        if len(counts) != B or any(not 1 <= n <= T for n in counts):
            raise ValueError(f"num_new {counts} must give 1..T={T} new tokens for each of the {B} active sequences")
        starts = [cache.computed[s] for s in seqs]
        tables = []
        for s, start, n in zip(seqs, starts, counts):
            have = mgr.num_tokens(s)
            if start + n > have:
                raise ValueError(f"sequence {s!r}: {n} new tokens but only {have - start} were registered; "
                                 "call add_sequence/append first")
            tables.append(mgr.seqs[s].table)
        ends = [s + n for s, n in zip(starts, counts)]
        S = max(ends)
        nb = blocks_needed(S, bs)
        # slot mapping of the real new tokens, and (if some rows are padded) which of the B*T inputs they are
        blk, off, sel = [], [], []
        for b, (table, start, n) in enumerate(zip(tables, starts, counts)):
            for p in range(start, start + n):
                blk.append(table[p // bs])
                off.append(p % bs)
            sel.extend(range(b * T, b * T + n))
        padded = len(sel) != B * T
        rows = [t[:nb] + [0] * (nb - len(t[:nb])) for t in tables]     # entries past a row's end: ignored
        pos = [[st + min(t, n - 1) for t in range(T)] for st, n in zip(starts, counts)]  # padding: last pos
        flat = blk + off + (sel if padded else []) + [x for r in rows for x in r] + ends + [x for r in pos for x in r]
        data = torch.tensor(flat, dtype=torch.long, device="cpu").to(dev)   # one host -> device copy
        N = len(blk)
        parts = data.split([N, N, N if padded else 0, B * nb, B, B * T])
        self.blk, self.off = parts[0], parts[1]
        self.sel = parts[2] if padded else None
        self.tables_long = parts[3].view(B, nb)
        self.tables = self.tables_long.to(torch.int32)                  # the kernels' block tables
        self.lens = parts[4].to(torch.int32)                            # context lengths after this forward
        self.pos = parts[5].view(B, T)
        self.T, self.B, self.S, self.nb = T, B, S, nb
        self.counts, self.starts = counts, starts
        # every row starts at the same position with T real tokens: the plain causal rule is the mask
        self.causal = not padded and len(set(starts)) == 1
        self._mask = None

    def mask(self) -> torch.Tensor:
        """[B, 1, T, S]: query t of row b sees the keys up to its own position."""
        if self._mask is None:
            keys = torch.arange(self.S, device=self.pos.device)
            self._mask = (keys[None, None, :] <= self.pos[:, :, None])[:, None]
        return self._mask


class PagedCache(KVCache):
    """The course model's cache contract on top of paged memory (a ``KVCache``).

    Typical use (see Module 06):
        cache = PagedCache(BlockManager(num_blocks, bs, prefix_caching=True), KVPool.for_model(model, ...))
        skip = cache.add_sequence("a", prompt)          # tokens whose KV the prefix cache already holds
        cache.set_active(["a"])
        logits = model(prompt[skip:][None], cache=cache)
        cache.append(["a"], [next_token]); logits = model(next_token[None, None], cache=cache)

    ``add_sequence``/``append`` register tokens with the block manager (allocating blocks; ``OutOfBlocks``
    if memory is short); the model's forward then writes their K/V into the pool slots and reads each
    sequence's K/V back through its block table (see the module docstring). Batch rows may have different
    lengths: the model takes the positions from ``cache.positions(T)`` itself (passing
    ``positions=cache.positions(T), attn_mask=cache.attn_mask(T)`` explicitly gives the same result).
    ``set_active(seqs, num_new=[...])``: rows with different numbers of new tokens, right-padded.

    backend: the decode attention, ``paged_attention(..., backend=backend)`` ("auto": Triton on a GPU
    that Triton supports, the vectorized PyTorch gather elsewhere; "torch", "triton", "reference");
    ``decode_backend`` says which one runs on the pool's device.

    With prefix caching, the block manager registers a prompt's full blocks when the sequence is added,
    before its prefill has written them: run a sequence's prefill before adding another sequence that
    may share its prefix (vLLM marks blocks "computed" after the forward for the same reason).
    """

    def __init__(self, manager: BlockManager, pool: KVPool, backend: str = "auto"):
        if manager.block_size != pool.block_size or manager.num_blocks != pool.num_blocks:
            raise ValueError("manager and pool disagree on block_size or num_blocks")
        if backend not in _paged.BACKENDS:
            raise ValueError(f"backend must be one of {_paged.BACKENDS}, got {backend!r}")
        self.manager, self.pool, self.backend = manager, pool, backend
        self.computed: dict = {}     # seq -> tokens whose K/V are in the pool
        self.active: list = []
        self.num_new: list | None = None   # new tokens per active row in the next forward (None: all T)
        self._plan: _Plan | None = None

    @property
    def decode_backend(self) -> str:
        """The implementation a decode step runs here: "triton", "torch" or "reference" ("auto" resolved
        for the pool's device by ``paged.attention.resolve_backend``)."""
        return _paged.resolve_backend(self.backend, self.pool.device)

    # --- sequence management -----------------------------------------------------------------------
    def add_sequence(self, seq_id, prompt) -> int:
        prompt = [int(t) for t in (prompt.tolist() if torch.is_tensor(prompt) else prompt)]
        cached = self.manager.add_sequence(seq_id, prompt)
        self.computed[seq_id] = cached
        self._plan = None
        return cached

    def append(self, seq_ids, tokens) -> None:
        """One new token per sequence (before the forward that computes it)."""
        tokens = tokens.tolist() if torch.is_tensor(tokens) else list(tokens)
        need = sum(self.manager.blocks_needed(s, 1) for s in seq_ids)
        if need > self.manager.num_free_blocks:
            raise OutOfBlocks(need, self.manager.num_free_blocks, "decode step")
        self._plan = None
        for s, t in zip(seq_ids, tokens):
            for src, dst in self.manager.append(s, int(t)):
                self.pool.copy_block(src, dst)

    def fork(self, parent, child) -> None:
        self.manager.fork(parent, child)
        self.computed[child] = self.computed[parent]
        self._plan = None

    def free(self, seq_id) -> None:
        self.manager.free(seq_id)
        del self.computed[seq_id]
        self.active = [s for s in self.active if s != seq_id]
        self.num_new = None
        self._plan = None

    def set_active(self, seq_ids, num_new=None) -> None:
        """The sequences of the next forward, in batch-row order. num_new: how many new tokens each row
        brings in the next forward (rows right-padded to the longest); None: every row brings all T."""
        seq_ids = list(seq_ids)
        for s in seq_ids:
            if s not in self.computed:
                raise PagingError(f"unknown sequence {s!r}")
        if len(set(seq_ids)) != len(seq_ids):
            raise PagingError(f"a sequence appears twice in the batch: {seq_ids}")
        if num_new is not None:
            num_new = [int(n) for n in num_new]
            if len(num_new) != len(seq_ids) or min(num_new, default=1) < 1:
                raise ValueError(f"num_new must be one count >= 1 per sequence, got {num_new} for {len(seq_ids)}")
        self.active, self.num_new = seq_ids, num_new
        self._plan = None

    # --- the per-forward plan ----------------------------------------------------------------------
    def plan(self, num_new: int) -> _Plan:
        """The plan of the next forward of `num_new` (= T) input tokens per row (built once, reused)."""
        if self._plan is None or self._plan.T != num_new:
            self._plan = _Plan(self, num_new)
        return self._plan

    def _layer_plan(self, k, layer: int) -> _Plan:
        B, T = k.shape[0], k.shape[2]
        if B != len(self.active):
            raise ValueError(f"update: batch {B} but {len(self.active)} active sequences (call set_active)")
        if layer >= self.pool.num_layers:
            raise ValueError(f"layer {layer} but the pool has {self.pool.num_layers} layers")
        if self._plan is None or self._plan.T != T:
            if layer != 0:
                raise ValueError(f"layer {layer} of a forward whose layer 0 did not run through this cache")
            self._plan = _Plan(self, T)
        return self._plan

    def _write(self, k, v, layer: int, plan: _Plan) -> None:
        """Store the real new tokens' K/V [B, K, T, Dh] in their slots: one index_put per pool."""
        B, K, T, Dh = k.shape
        kf = k.transpose(1, 2).reshape(B * T, K, Dh)                     # [B*T, K, Dh], token-major
        vf = v.transpose(1, 2).reshape(B * T, K, Dh)
        if plan.sel is not None:                                          # drop the padding tokens
            kf, vf = kf[plan.sel], vf[plan.sel]
        self.pool.k[layer][plan.blk, :, plan.off] = kf                    # pool [N, K, bs, Dh]
        self.pool.v[layer][plan.blk, :, plan.off] = vf

    def _gather(self, layer: int, plan: _Plan):
        """Each row's keys 0..S-1 through its block table: [B, K, S, Dh] (past a row's length: junk)."""
        return (_paged.gather_blocks(self.pool.k[layer], plan.tables_long, plan.S),
                _paged.gather_blocks(self.pool.v[layer], plan.tables_long, plan.S))

    def _end_layer(self, layer: int, plan: _Plan) -> None:
        if layer == self.pool.num_layers - 1:                              # the forward is done
            for s, n in zip(self.active, plan.counts):
                self.computed[s] += n
            self._plan, self.num_new = None, None

    # --- the model's cache contract ----------------------------------------------------------------
    def get_seq_length(self) -> int:
        lens = {self.computed[s] for s in self.active}
        if len(lens) != 1:
            raise ValueError(f"the active sequences have different lengths {sorted(lens)}: call the model with "
                             "positions=cache.positions(T) and attn_mask=cache.attn_mask(T)")
        return lens.pop()

    def positions(self, num_new: int) -> torch.Tensor:
        """[B, T] positions of the next forward's tokens, on the pool's device (a padding token repeats
        its row's last position)."""
        return self.plan(num_new).pos

    def attn_mask(self, num_new: int, device=None) -> torch.Tensor:
        """[B, 1, T, S]: row b's query t sees its own keys up to its position (padding excluded)."""
        return self.plan(num_new).mask()

    def nbytes(self) -> int:
        return self.pool.nbytes()

    def update(self, k, v, layer, q=None):
        """The plain contract: write k, v [B, K, T, Dh]; return every row's K/V [B, K, S, Dh] read back
        through its block table (S = the longest row; past a row's length the values are junk: mask).
        q (the new queries) is not needed: paging decides where tokens live, not which ones stay."""
        check_kv(k, v, layer)
        plan = self._layer_plan(k, layer)
        self._write(k, v, layer, plan)
        out = self._gather(layer, plan)
        self._end_layer(layer, plan)
        return out

    def attend(self, q, k, v, layer, attn_mask=None):
        """Write k, v; decode -> ``paged_attention`` through the block tables; else gather + attention."""
        plan = self._layer_plan(k, layer)
        self._write(k, v, layer, plan)
        own = attn_mask is None or attn_mask is plan._mask                # our own mask: the rows' causal rule
        if own and plan.T == 1:
            out = _paged.paged_attention(q[:, :, 0], self.pool.k[layer], self.pool.v[layer], plan.tables,
                                         plan.lens, backend=self.backend)[:, :, None]   # [B, H, 1, Dh]
        else:
            k_all, v_all = self._gather(layer, plan)
            mask = attn_mask if not own else None if plan.causal else plan.mask()
            out = attention(q, k_all, v_all, mask)
        self._end_layer(layer, plan)
        return out
