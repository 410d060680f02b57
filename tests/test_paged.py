"""Module 06: block allocator, block tables, copy-on-write, prefix caching, waste simulation."""
import pytest

from course_lib.paged import (BlockAllocator, BlockManager, ContiguousArena, OutOfBlocks, PagingError,
                              simulate_waste)
from course_lib.perf.workload import Request, limited_workload


# --- allocator ----------------------------------------------------------------------------------------
def test_allocator_free_list_and_refcounts():
    a = BlockAllocator(3)
    b0, b1 = a.allocate(), a.allocate()
    assert (b0, b1) == (0, 1) and a.num_free == 1
    a.incref(b0)
    a.free(b0)
    assert a.refcount[b0] == 1 and a.num_free == 1          # still referenced once
    a.free(b0)
    assert a.is_free(b0) and a.free_blocks() == [2, 0]      # freed blocks go to the tail
    assert a.allocate() == 2 and a.allocate() == 0
    with pytest.raises(OutOfBlocks) as e:
        a.allocate()
    assert e.value.needed == 1 and e.value.free == 0


def test_allocator_errors_are_clear():
    a = BlockAllocator(2)
    b = a.allocate()
    a.free(b)
    with pytest.raises(PagingError, match="double free of block 0"):
        a.free(b)
    with pytest.raises(PagingError, match="unknown block 7"):
        a.free(7)
    with pytest.raises(PagingError, match="unknown block -1"):
        a.free(-1)
    with pytest.raises(PagingError, match="is free"):
        a.incref(1)
    with pytest.raises(PagingError):
        BlockAllocator(0)
    assert issubclass(PagingError, ValueError) and issubclass(OutOfBlocks, RuntimeError)


# --- block tables ------------------------------------------------------------------------------------
def test_new_block_exactly_when_the_last_one_fills():
    m = BlockManager(10, 4)
    m.add_sequence("a", [1, 2, 3])
    assert len(m.block_table("a")) == 1
    m.append("a", 4)                                  # fills block 0: no new block yet
    assert len(m.block_table("a")) == 1 and m.num_free_blocks == 9
    m.append("a", 5)                                  # the 5th token needs a block
    assert len(m.block_table("a")) == 2 and m.num_free_blocks == 8
    for n in range(6, 30):
        m.append("a", n)
        assert len(m.block_table("a")) == -(-n // 4)
    assert m.slot("a", 0) == (m.block_table("a")[0], 0) and m.slot("a", 5) == (m.block_table("a")[1], 1)
    m.check_invariants()
    m.free("a")
    assert m.num_free_blocks == 10
    m.check_invariants()


def test_manager_errors():
    m = BlockManager(4, 2)
    with pytest.raises(PagingError, match="empty"):
        m.add_sequence("a", [])
    m.add_sequence("a", [1])
    with pytest.raises(PagingError, match="already exists"):
        m.add_sequence("a", [1])
    with pytest.raises(PagingError, match="unknown sequence 'zz'"):
        m.free("zz")
    with pytest.raises(PagingError, match="unknown sequence"):
        m.append("zz", 1)
    with pytest.raises(PagingError, match="num_new"):
        m.blocks_needed("a", -1)
    with pytest.raises(PagingError, match="block_size"):
        BlockManager(4, 0)
    with pytest.raises(PagingError, match="out of range"):
        m.slot("a", 1)
    m.free("a")
    with pytest.raises(PagingError):
        m.free("a")                                   # double free of a sequence


def test_out_of_blocks_changes_nothing():
    m = BlockManager(3, 2)
    m.add_sequence("a", [1, 2, 3, 4])                 # 2 blocks
    with pytest.raises(OutOfBlocks):
        m.add_sequence("b", [1, 2, 3])                # needs 2, 1 free
    assert "b" not in m.seqs and m.num_free_blocks == 1
    m.add_sequence("b", [9])
    with pytest.raises(OutOfBlocks):
        m.append_tokens("b", [1, 2])                  # needs a 2nd block: none left
    assert m.tokens("b") == [9]
    m.append("b", 1)
    assert not m.can_append("a") and m.blocks_needed("a") == 1
    with pytest.raises(OutOfBlocks):
        m.append("a", 5)
    assert m.tokens("a") == [1, 2, 3, 4]
    m.check_invariants()


# --- fork and copy-on-write -------------------------------------------------------------------------
def test_fork_shares_then_copies_the_partial_block_on_write():
    m = BlockManager(10, 4)
    m.add_sequence("p", list(range(6)))               # blocks: [full, 2 of 4]
    m.fork("p", "c1")
    m.fork("p", "c2")
    t = m.block_table("p")
    assert m.block_table("c1") == t and [m.refcount(b) for b in t] == [3, 3]
    assert m.num_used_blocks == 2
    copies = m.append("c1", 100)                      # c1 writes into the shared partial block
    assert copies == [(t[1], m.block_table("c1")[1])] and m.refcount(t[1]) == 2
    assert m.block_table("c1")[0] == t[0]             # the full block stays shared
    assert m.append("c1", 101) == []                  # now private: no more copies
    m.append("p", 200)                                # p copies too (c2 still shares the original)
    assert m.append("c2", 300) == []                  # c2 is now the only owner: writes in place
    assert m.block_table("c2")[1] == t[1]
    assert [m.tokens(s)[6:] for s in ("p", "c1", "c2")] == [[200], [100, 101], [300]]
    m.check_invariants()
    for s in ("p", "c1", "c2"):
        m.free(s)
    assert m.num_free_blocks == 10
    m.check_invariants()


def test_fork_at_a_block_boundary_needs_no_copy():
    m = BlockManager(6, 4)
    m.add_sequence("p", list(range(8)))               # two full blocks
    m.fork("p", "c")
    assert m.blocks_needed("c", 1) == 1
    assert m.append("c", 9) == [] and m.append("p", 9) == []
    assert m.block_table("c")[:2] == m.block_table("p")[:2]
    assert m.block_table("c")[2] != m.block_table("p")[2]
    m.check_invariants()


def test_beam_search_pattern():
    """Beams fork from the best candidates and the others are freed: memory follows the live beams."""
    m = BlockManager(40, 4)
    m.add_sequence(0, list(range(10)))
    beams = [0]
    nid = 1
    for step in range(12):
        new = []
        for b in beams:
            for _ in range(2):
                m.fork(b, nid)
                m.append(nid, step * 10 + nid % 7)
                new.append(nid)
                nid += 1
        for b in beams:
            m.free(b)
        for b in new[2:]:                               # keep two beams
            m.free(b)
        beams = new[:2]
        m.check_invariants()
    assert m.stats()["sharing_saves_blocks"] > 0


# --- prefix caching ---------------------------------------------------------------------------------
def test_prefix_cache_reuses_full_blocks_and_counts_hits():
    m = BlockManager(20, 4, prefix_caching=True)
    system = list(range(100, 110))                    # 10 tokens: 2 full blocks + 2
    assert m.add_sequence("a", system + [1, 2, 3]) == 0
    hit = m.add_sequence("b", system + [7, 8])
    assert hit == 8                                   # the two full blocks of the shared prefix
    assert m.block_table("b")[:2] == m.block_table("a")[:2]
    assert m.block_table("b")[2] != m.block_table("a")[2]   # tokens 8..11 differ (7, 8 vs 1, 2, 3)
    m.check_invariants()
    # freed blocks stay cached: a later request still hits
    m.free("a")
    m.free("b")
    assert m.add_sequence("c", system + [5]) == 8
    m.check_invariants()


def test_prefix_cache_never_reuses_the_last_prompt_token_block():
    m = BlockManager(10, 4, prefix_caching=True)
    m.add_sequence("a", list(range(8)))
    assert m.add_sequence("b", list(range(8))) == 4   # block 1 holds the last token: recomputed
    m.check_invariants()


def test_prefix_cache_chained_hash_depends_on_the_whole_prefix():
    m = BlockManager(20, 4, prefix_caching=True)
    m.add_sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    # same second block, different first block: no hit on the second block either
    assert m.add_sequence("b", [0, 2, 3, 4, 5, 6, 7, 8, 9]) == 0
    m.check_invariants()


def test_prefix_cache_verifies_tokens_on_a_hash_collision():
    m = BlockManager(20, 4, prefix_caching=True, hash_fn=lambda prev, toks: 42)   # everything collides
    m.add_sequence("a", [1, 2, 3, 4, 5])
    assert m.add_sequence("b", [9, 9, 9, 9, 5]) == 0  # same hash, other tokens: must not reuse
    assert m.block_table("b")[0] != m.block_table("a")[0]
    assert m.add_sequence("c", [1, 2, 3, 4, 6]) == 4  # the genuine match still hits
    m.check_invariants()


def test_prefix_cache_entry_is_dropped_when_its_block_is_recycled():
    m = BlockManager(3, 2, prefix_caching=True)
    m.add_sequence("a", [1, 2, 3])
    m.free("a")                                       # blocks stay cached while free
    m.add_sequence("x", [7, 7, 7, 7, 7, 7])           # needs all 3 blocks: evicts the cached ones
    m.free("x")
    assert m.add_sequence("b", [1, 2, 3]) == 0
    m.check_invariants()


def test_prefix_cache_hit_on_a_free_block_counts_against_memory():
    m = BlockManager(3, 2, prefix_caching=True)
    m.add_sequence("a", [1, 2, 3])                    # 2 blocks
    m.free("a")
    m.add_sequence("z", [5])                          # takes the never-used block
    assert m.add_sequence("b", [1, 2, 9]) == 2        # revives block 0, allocates one more
    assert m.num_free_blocks == 0
    m.check_invariants()


# --- waste ------------------------------------------------------------------------------------------
def test_contiguous_arena_first_fit_and_merge():
    a = ContiguousArena(10)
    x, y, z = a.allocate(3), a.allocate(3), a.allocate(3)
    a.release(y)
    assert a.allocate(4) is None and a.free == 4      # 4 free but the hole is 3 + 1 apart
    a.release(x)
    assert a.largest_hole == 6 and a.allocate(6) == 0
    with pytest.raises(ValueError):
        a.release(5)
    assert z == 6


def test_paged_waste_is_small_and_contiguous_waste_is_large():
    w = limited_workload(120, seed=1)
    assert w == limited_workload(120, seed=1)          # seeded
    assert len({r.prompt_tokens for r in w}) > 30 and len({r.output_tokens for r in w}) > 30
    cont = simulate_waste(w, 16384, "contiguous")
    paged = simulate_waste(w, 16384, "paged", block_size=16)
    assert cont.finished == paged.finished == 120
    assert paged.waste <= 0.04 and cont.waste >= 0.60
    assert paged.reserved == 0 and paged.external == 0 and cont.external > 0
    # internal waste of paging: less than one block per running sequence, on average
    assert paged.internal < paged.batch_sum * 16
    assert paged.mean_batch > 1.3 * cont.mean_batch and paged.steps < cont.steps
    ctx = simulate_waste(w, 16384, "contiguous", reserve="context")   # reserve the whole 2048-token context
    assert ctx.external == 0 and ctx.waste > cont.waste and ctx.finished == 120
    bigger = simulate_waste(w, 16384, "paged", block_size=128)
    assert bigger.waste > paged.waste
    with pytest.raises(ValueError):
        simulate_waste(w, 100, "contiguous")                # a request can never fit
    with pytest.raises(ValueError):
        simulate_waste(w, 32768, "buddy")
    with pytest.raises(ValueError):
        simulate_waste(w, 32768, "contiguous", reserve="max")
    with pytest.raises(TypeError, match="Request"):
        simulate_waste([(0, 10, 5)], 32768)
    assert all(r.arrival_s == 0 and r.output_tokens <= r.max_new_tokens == r.limit for r in w)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request(0, 0.0, 10, 5, max_new_tokens=4)      # a limit below what it generates
