"""Physical KV blocks: a free list and reference counts.

The KV memory of a serving engine is cut into ``num_blocks`` blocks of ``block_size`` token slots each.
The allocator only hands out block numbers and counts how many block tables point at each one; what the
blocks contain is the block manager's business (``manager.py``).

Errors:
* ``OutOfBlocks`` (a ``RuntimeError``): no free block. Not a bug but a signal: a scheduler catches it
  and preempts a sequence (frees it to recompute later, or swaps it out) or waits.
* ``PagingError`` (a ``ValueError``): a bug in the caller: double free, unknown block or sequence,
  negative or empty lengths.
"""
from __future__ import annotations

from collections import OrderedDict


class PagingError(ValueError):
    """Misuse of the paged KV memory: double free, unknown block or sequence, bad sizes."""


class OutOfBlocks(RuntimeError):
    """Not enough free blocks; nothing was changed. A scheduler should preempt or wait."""

    def __init__(self, needed: int, free: int, what: str = ""):
        self.needed, self.free = needed, free
        super().__init__(f"out of KV blocks{': ' + what if what else ''}: need {needed}, {free} free")


class BlockAllocator:
    """Free list + reference counts for ``num_blocks`` physical blocks.

    ``allocate()`` takes the block at the head of the free list (refcount 1); ``free(b)`` drops one
    reference and puts the block at the tail of the free list when none are left, so the blocks freed
    longest ago are reused first (which is LRU eviction when freed blocks stay in a prefix cache).
    """

    def __init__(self, num_blocks: int):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise PagingError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.refcount = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_blocks(self) -> list[int]:
        """Free blocks in the order they will be handed out."""
        return list(self._free)

    def _check(self, block):
        if not isinstance(block, int) or isinstance(block, bool) or not 0 <= block < self.num_blocks:
            raise PagingError(f"unknown block {block!r}: blocks are numbered 0..{self.num_blocks - 1}")

    def is_free(self, block: int) -> bool:
        self._check(block)
        return self.refcount[block] == 0

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocks(1, 0)
        block, _ = self._free.popitem(last=False)
        self.refcount[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more block table points at an allocated block (sharing)."""
        self._check(block)
        if self.refcount[block] == 0:
            raise PagingError(f"block {block} is free: it cannot be shared (use reuse() for a cached free block)")
        self.refcount[block] += 1

    def reuse(self, block: int) -> None:
        """Take a specific free block off the free list (a prefix-cache hit on a freed block)."""
        self._check(block)
        if self.refcount[block] != 0:
            raise PagingError(f"block {block} is in use (refcount {self.refcount[block]}), not free")
        del self._free[block]
        self.refcount[block] = 1

    def free(self, block: int) -> None:
        """Drop one reference; the block returns to the free list when none are left."""
        self._check(block)
        if self.refcount[block] == 0:
            raise PagingError(f"double free of block {block}: it is already free")
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self._free[block] = None
