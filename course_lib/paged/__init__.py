"""Module 06: paged KV memory (PagedAttention).

    from course_lib.paged import BlockManager, OutOfBlocks
    mgr = BlockManager(num_blocks=64, block_size=16, prefix_caching=True)
    mgr.add_sequence("a", prompt_tokens); mgr.append("a", token); mgr.fork("a", "b"); mgr.free("a")

Pieces: BlockAllocator (free list, reference counts), BlockManager (block tables, copy-on-write fork,
prefix caching with chained hashes), blocks_needed (the one ceil(tokens / block_size)), paged_attention_reference /
paged_attention (PyTorch, and a Triton
decode kernel in ``triton_paged``), KVPool + PagedCache (the course model on paged memory),
simulate_waste (waste of contiguous vs paged, on ``course_lib.perf.workload.limited_workload``),
PagedPlayground (the visualizer's state).
Errors: OutOfBlocks (a signal for the scheduler), PagingError (misuse: double free, unknown ids, ...).
"""
from .allocator import BlockAllocator, OutOfBlocks, PagingError
from .attention import (contiguous_to_paged, gather_blocks, gather_kv, paged_attention,
                        paged_attention_reference)
from .cache import KVPool, PagedCache
from .manager import BlockManager, SeqState, blocks_needed, default_hash
from .playground import PagedPlayground
from .waste import ContiguousArena, WasteReport, simulate_waste

__all__ = ["BlockAllocator", "OutOfBlocks", "PagingError", "KVPool", "PagedCache", "contiguous_to_paged",
           "gather_blocks", "gather_kv", "paged_attention", "paged_attention_reference", "BlockManager", "SeqState",
           "blocks_needed", "default_hash", "PagedPlayground", "ContiguousArena", "WasteReport", "simulate_waste"]
