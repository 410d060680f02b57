"""Block tables for sequences: allocation on demand, fork with copy-on-write, prefix caching.

A sequence's KV lives in blocks of ``block_size`` token slots; its **block table** maps logical block i
(tokens i*bs .. i*bs+bs-1) to a physical block. Rules:

* A new block is allocated exactly when a token has nowhere to go: when the sequence's length is a
  multiple of ``block_size`` (its last block is full, or it has none). So a sequence of n tokens always
  owns ``ceil(n / block_size)`` blocks, and at most ``block_size - 1`` slots are wasted, in its last block.
* ``fork(parent, child)`` shares every block (reference counts + 1): parallel sampling and beam search
  start from one prompt without copying it. Full blocks are never written again, so sharing them is
  safe forever; the partial last block is **copied on write**: the first sequence to append to a shared
  partial block gets a private copy (``append`` returns the (src, dst) copies the KV memory must do).
* With ``prefix_caching=True`` every full block gets a **chained hash**, h_i = hash(h_{i-1}, tokens of
  block i), so equal hashes mean equal whole prefixes (up to collisions). ``add_sequence`` looks each
  full prompt block up and reuses it on a hit: the prefill of those tokens can be skipped. A hit is
  **verified**: the cached block's tokens must equal ours and its parent must be the block we matched
  just before (a hash collision must never give wrong KV). Freed cached blocks stay in the cache until
  the allocator hands them out again (least recently freed first). The block holding the prompt's last
  token is never taken from the cache: that token must be computed anyway to get the next-token logits.
* Running out of blocks raises ``OutOfBlocks`` and changes nothing (check first with ``can_append`` or
  ``blocks_needed``), so a scheduler can preempt a sequence and retry.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from course_lib.validate import integer

from .allocator import BlockAllocator, OutOfBlocks, PagingError


def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens of KV: ceil(tokens / block_size), 0 for 0 tokens.

    The course's one block count: the block manager, the engine (its admission and its scheduler), the
    serving simulator's policies and the capstone all ask it. Integer arithmetic (a float ceil is wrong for
    huge counts); plain ints take the first line, cheap enough for the simulator's inner loop.
    """
    if type(tokens) is int and type(block_size) is int and tokens >= 0 and block_size >= 1:
        return -(-tokens // block_size)
    block_size = integer(block_size, "block_size", low=1)
    return -(-integer(tokens, "tokens", low=0) // block_size)


def default_hash(prev, tokens: tuple) -> int:
    return hash((prev, tokens))


@dataclass
class SeqState:
    tokens: list = field(default_factory=list)
    table: list = field(default_factory=list)      # logical block -> physical block
    hashes: list = field(default_factory=list)     # chained hash of each full block


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False, hash_fn=None):
        if not isinstance(block_size, int) or block_size < 1:
            raise PagingError(f"block_size must be a positive int, got {block_size!r}")
        self.allocator = BlockAllocator(num_blocks)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = bool(prefix_caching)
        self.hash_fn = hash_fn or default_hash
        self.seqs: dict = {}
        self.block_tokens: list[list] = [[] for _ in range(num_blocks)]   # what each block holds
        self.generation = [0] * num_blocks                               # bumped on every allocation
        self.cached: dict = {}      # chained hash -> block
        self.block_key: dict = {}   # block -> (hash, parent block, parent generation)
        self.prefix_hits = 0        # blocks reused from the prefix cache
        self.cow_copies = 0

    # --- queries -----------------------------------------------------------------------------------
    def _seq(self, seq_id) -> SeqState:
        try:
            return self.seqs[seq_id]
        except KeyError:
            raise PagingError(f"unknown sequence {seq_id!r}") from None

    def block_table(self, seq_id) -> list[int]:
        return list(self._seq(seq_id).table)

    def tokens(self, seq_id) -> list:
        return list(self._seq(seq_id).tokens)

    def num_tokens(self, seq_id) -> int:
        return len(self._seq(seq_id).tokens)

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.allocator.num_used

    def refcount(self, block: int) -> int:
        self.allocator._check(block)
        return self.allocator.refcount[block]

    def slot(self, seq_id, index: int) -> tuple[int, int]:
        """(physical block, offset) of token `index` of a sequence."""
        seq = self._seq(seq_id)
        if not 0 <= index < len(seq.tokens):
            raise PagingError(f"token index {index} out of range for sequence {seq_id!r} of {len(seq.tokens)}")
        return seq.table[index // self.block_size], index % self.block_size

    def blocks_needed(self, seq_id, num_new: int = 1) -> int:
        """Free blocks that appending `num_new` tokens would take (new blocks + a copy-on-write copy)."""
        if not isinstance(num_new, int) or num_new < 0:
            raise PagingError(f"num_new must be an int >= 0, got {num_new!r}")
        seq, bs = self._seq(seq_id), self.block_size
        n = len(seq.tokens)
        new = blocks_needed(n + num_new, bs) - blocks_needed(n, bs)
        cow = int(num_new > 0 and n % bs != 0 and self.allocator.refcount[seq.table[-1]] > 1)
        return new + cow

    def can_append(self, seq_id, num_new: int = 1) -> bool:
        return self.blocks_needed(seq_id, num_new) <= self.num_free_blocks

    # --- allocation --------------------------------------------------------------------------------
    def _alloc_block(self) -> int:
        b = self.allocator.allocate()
        if b in self.block_key:                     # a cached free block is being recycled: forget it
            h = self.block_key.pop(b)[0]
            if self.cached.get(h) == b:
                del self.cached[h]
        self.generation[b] += 1
        self.block_tokens[b] = []
        return b

    def _lookup(self, h, toks: tuple, prev_block):
        b = self.cached.get(h)
        if b is None:
            return None
        _, parent, parent_gen = self.block_key[b]
        want_parent = (prev_block, self.generation[prev_block]) if prev_block is not None else (None, None)
        if tuple(self.block_tokens[b]) != toks or (parent, parent_gen) != want_parent:
            return None                             # hash collision or stale entry: a miss
        return b

    def _register(self, seq: SeqState, i: int):
        b, h = seq.table[i], seq.hashes[i]
        if not self.prefix_caching or b in self.block_key:
            return
        old = self.cached.get(h)
        if old is not None and old != b:
            return                                  # an equal (or colliding) block is already cached
        parent = seq.table[i - 1] if i > 0 else None
        self.cached[h] = b
        self.block_key[b] = (h, parent, self.generation[parent] if parent is not None else None)

    def add_sequence(self, seq_id, tokens) -> int:
        """Allocate blocks for a new sequence's prompt. Returns how many leading tokens were found in
        the prefix cache (their KV is already there: the prefill can start after them)."""
        if seq_id in self.seqs:
            raise PagingError(f"sequence {seq_id!r} already exists")
        tokens = list(tokens)
        if not tokens:
            raise PagingError(f"sequence {seq_id!r}: the prompt is empty (need at least one token)")
        bs, n = self.block_size, len(tokens)
        hits, hashes, prev_h, prev_b = [], [], None, None
        for i in range(n // bs):
            toks = tuple(tokens[i * bs:(i + 1) * bs])
            h = self.hash_fn(prev_h, toks)
            hashes.append(h)
            if self.prefix_caching and len(hits) == i and i < (n - 1) // bs:
                b = self._lookup(h, toks, prev_b)
                if b is not None:
                    hits.append(b)
                    prev_b = b
            prev_h = h
        need_new = blocks_needed(n, bs) - len(hits)
        revive = sum(1 for b in hits if self.allocator.refcount[b] == 0)
        if need_new + revive > self.num_free_blocks:
            raise OutOfBlocks(need_new + revive, self.num_free_blocks, f"prompt of sequence {seq_id!r}")
        for b in hits:                              # take the hits first so allocation cannot evict them
            if self.allocator.refcount[b] == 0:
                self.allocator.reuse(b)
            else:
                self.allocator.incref(b)
        self.prefix_hits += len(hits)
        table = hits + [self._alloc_block() for _ in range(need_new)]
        for i in range(len(hits), len(table)):
            self.block_tokens[table[i]] = tokens[i * bs:(i + 1) * bs]
        seq = SeqState(tokens, table, hashes)
        self.seqs[seq_id] = seq
        for i in range(len(hashes)):
            self._register(seq, i)
        return len(hits) * bs

    def append(self, seq_id, token) -> list[tuple[int, int]]:
        """Add one token. Returns the block copies [(src, dst)] copy-on-write needs (usually [])."""
        seq, bs = self._seq(seq_id), self.block_size
        n = len(seq.tokens)
        copies = []
        if n % bs == 0:                                       # last block full (or none): a new block
            seq.table.append(self._alloc_block())
        else:
            last = seq.table[-1]
            if self.allocator.refcount[last] > 1:             # shared partial block: copy on write
                new = self._alloc_block()
                self.block_tokens[new] = list(self.block_tokens[last])
                self.allocator.free(last)
                seq.table[-1] = new
                copies.append((last, new))
                self.cow_copies += 1
        self.block_tokens[seq.table[-1]].append(token)
        seq.tokens.append(token)
        if len(seq.tokens) % bs == 0:                         # the block just filled: hash it
            prev = seq.hashes[-1] if seq.hashes else None
            seq.hashes.append(self.hash_fn(prev, tuple(self.block_tokens[seq.table[-1]])))
            self._register(seq, len(seq.hashes) - 1)
        return copies

    def append_tokens(self, seq_id, tokens) -> list[tuple[int, int]]:
        """Add several tokens, all or nothing (OutOfBlocks before any change)."""
        tokens = list(tokens)
        need = self.blocks_needed(seq_id, len(tokens))
        if need > self.num_free_blocks:
            raise OutOfBlocks(need, self.num_free_blocks, f"append to sequence {seq_id!r}")
        copies = []
        for t in tokens:
            copies += self.append(seq_id, t)
        return copies

    def fork(self, parent_id, child_id) -> None:
        """The child shares all of the parent's blocks (copy-on-write later)."""
        parent = self._seq(parent_id)
        if child_id in self.seqs:
            raise PagingError(f"sequence {child_id!r} already exists")
        for b in parent.table:
            self.allocator.incref(b)
        self.seqs[child_id] = SeqState(list(parent.tokens), list(parent.table), list(parent.hashes))

    def free(self, seq_id) -> None:
        """Release a finished (or preempted) sequence's blocks; shared blocks stay with the others."""
        seq = self._seq(seq_id)
        for b in reversed(seq.table):   # tail first: the tail gets recycled before the shared prefix
            self.allocator.free(b)
        del self.seqs[seq_id]

    # --- accounting and checks ---------------------------------------------------------------------
    def stats(self) -> dict:
        bs = self.block_size
        used = self.num_used_blocks
        filled = sum(len(self.block_tokens[b]) for b in range(self.num_blocks) if self.allocator.refcount[b] > 0)
        logical = sum(len(s.tokens) for s in self.seqs.values())
        shared = sum(1 for r in self.allocator.refcount if r > 1)
        return {"sequences": len(self.seqs), "blocks_used": used, "blocks_free": self.num_free_blocks,
                "blocks_shared": shared, "slots_allocated": used * bs, "slots_filled": filled,
                "logical_tokens": logical,
                "utilization": filled / (used * bs) if used else 1.0,
                "internal_waste": (used * bs - filled) / (used * bs) if used else 0.0,
                "sharing_saves_blocks": sum(blocks_needed(len(s.tokens), bs) for s in self.seqs.values()) - used,
                "prefix_hits": self.prefix_hits, "cow_copies": self.cow_copies,
                "cached_blocks": len(self.block_key)}

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by the property tests)."""
        bs, alloc = self.block_size, self.allocator
        refs = [0] * self.num_blocks
        for sid, s in self.seqs.items():
            assert len(s.table) == blocks_needed(len(s.tokens), bs), \
                f"seq {sid}: {len(s.table)} blocks for {len(s.tokens)} tokens"
            assert len(s.hashes) == len(s.tokens) // bs, f"seq {sid}: {len(s.hashes)} hashes"
            for i, b in enumerate(s.table):
                refs[b] += 1
                want = s.tokens[i * bs:(i + 1) * bs]
                assert self.block_tokens[b] == want, \
                    f"seq {sid}: block {b} holds {self.block_tokens[b]}, expected {want}"
        free = set(alloc.free_blocks())
        assert len(free) == alloc.num_free
        for b in range(self.num_blocks):
            assert alloc.refcount[b] >= 0, f"block {b}: negative refcount"
            assert alloc.refcount[b] == refs[b], f"block {b}: refcount {alloc.refcount[b]} but {refs[b]} tables use it"
            assert (b in free) == (refs[b] == 0), f"block {b}: free list disagrees with refcount {refs[b]}"
        for h, b in self.cached.items():
            assert self.block_key[b][0] == h and len(self.block_tokens[b]) == bs, f"cached block {b} is not full"
        assert alloc.num_free + sum(1 for r in refs if r > 0) == self.num_blocks
