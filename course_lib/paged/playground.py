"""A small paged KV memory to experiment with: the state behind the Module 06 visualizer.

Plain Python (no widgets), so tests drive it directly and the widget only displays it. Every action
returns normally and leaves a message in ``last_message``; running out of blocks is a message too.
"""
from __future__ import annotations

import random

from .allocator import OutOfBlocks, PagingError
from .manager import BlockManager


class PagedPlayground:
    def __init__(self, num_blocks: int = 24, block_size: int = 4, prefix_caching: bool = True,
                 vocab: int = 50, max_len: int = 32, seed: int = 0):
        self.manager = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching)
        self.rng = random.Random(seed)
        self.vocab, self.max_len = vocab, max_len
        self.prompts: dict[str, list[int]] = {}
        self.order: list[str] = []            # every sequence ever created (stable colours)
        self._next = 0
        self.last_message = "ready"

    # --- queries -----------------------------------------------------------------------------------
    @property
    def sequences(self) -> list[str]:
        return [s for s in self.order if s in self.manager.seqs]

    def color_index(self, seq_id: str) -> int:
        return self.order.index(seq_id)

    def block_owners(self) -> list[list[str]]:
        owners = [[] for _ in range(self.manager.num_blocks)]
        for s in self.sequences:
            for b in self.manager.seqs[s].table:
                owners[b].append(s)
        return owners

    def block_fill(self) -> list[int]:
        return [len(t) if self.manager.refcount(b) else 0 for b, t in enumerate(self.manager.block_tokens)]

    def is_cached_free(self, block: int) -> bool:
        return self.manager.refcount(block) == 0 and block in self.manager.block_key

    def tables(self) -> dict[str, list[int]]:
        return {s: self.manager.block_table(s) for s in self.sequences}

    def stats(self) -> dict:
        st = self.manager.stats()
        n = len(self.sequences)
        st["contiguous_slots"] = n * self.max_len        # reserving max_len per sequence instead
        st["contiguous_waste"] = 1 - st["logical_tokens"] / st["contiguous_slots"] if n else 0.0
        return st

    # --- actions -----------------------------------------------------------------------------------
    def _new_id(self) -> str:
        s = f"s{self._next}"
        self._next += 1
        return s

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1, self.vocab) for _ in range(n)]

    def _say(self, msg: str):
        self.last_message = msg
        return msg

    def add_sequence(self, prompt_len: int, prompt: list[int] | None = None):
        """A new sequence with a random prompt. Returns its id, or None when memory is full."""
        if prompt is None:
            if not isinstance(prompt_len, int) or prompt_len < 1:
                raise PagingError(f"prompt_len must be an int >= 1, got {prompt_len!r}")
            prompt = self._tokens(prompt_len)
        if len(prompt) > self.max_len:
            self._say(f"prompt of {len(prompt)} tokens exceeds max_len={self.max_len}")
            return None
        sid = self._new_id()
        try:
            hit = self.manager.add_sequence(sid, prompt)
        except OutOfBlocks as e:
            self._say(f"cannot add: {e}")
            return None
        self.prompts[sid] = list(prompt)
        self.order.append(sid)
        self._say(f"added {sid} ({len(prompt)} prompt tokens, {hit} from the prefix cache)")
        return sid

    def share_prefix(self, seq_id: str, extra: int = 2):
        """A new sequence whose prompt is `seq_id`'s prompt + `extra` new tokens (prefix cache hits)."""
        if seq_id not in self.prompts:
            raise PagingError(f"unknown sequence {seq_id!r}")
        return self.add_sequence(0, self.prompts[seq_id] + self._tokens(max(1, extra)))

    def generate(self, seq_id: str | None = None, n: int = 1) -> int:
        """Append n random tokens to one sequence (or to every sequence). Returns tokens appended."""
        targets = [seq_id] if seq_id is not None else self.sequences
        done = 0
        for _ in range(n):
            for s in targets:
                if self.manager.num_tokens(s) >= self.max_len:
                    continue
                try:
                    copies = self.manager.append(s, self._tokens(1)[0])
                except OutOfBlocks:
                    self._say(f"out of blocks after {done} tokens: finish or preempt a sequence")
                    return done
                done += 1
                if copies:
                    self._say(f"copy-on-write: {s} copied block {copies[0][0]} -> {copies[0][1]}")
        if not self.last_message.startswith("copy-on-write") or done == 0:
            self._say(f"generated {done} tokens")
        return done

    def finish(self, seq_id: str):
        self.manager.free(seq_id)
        self._say(f"finished {seq_id}: its private blocks are free again")

    def fork(self, seq_id: str):
        child = self._new_id()
        self.manager.fork(seq_id, child)
        self.prompts[child] = self.prompts[seq_id]
        self.order.append(child)
        self._say(f"forked {seq_id} -> {child}: all {len(self.manager.seqs[child].table)} blocks shared")
        return child
