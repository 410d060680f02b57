# %% [markdown] id="c002"
# # Lab 06 · Paged KV memory
#
# In this lab you write the memory manager at the heart of PagedAttention [@kwon2023efficient] (Module 06),
# and the attention
# that reads through it:
#
# * **Part A (3 points): a block allocator.** A free list and reference counts.
# * **Part B (4 points, contract): block tables.** Sequences get blocks exactly when they need them and
#   give them back when they finish; you design the bookkeeping from its contract.
# * **Part C (1 point): predict the waste.** How much of the memory paging leaves empty for a mix of chat
#   turns, documents and templated requests, exactly, where the notebook's rule of thumb only estimates it;
#   then your block tables measure it.
# * **Part D (3 points): fork with copy-on-write.** Parallel samples share their prompt's blocks.
# * **Part E (4 points, contract): attention through a block table.** A decode step whose keys and values
#   are scattered over a pool of blocks.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell with fixed examples. When grading, the grader also runs long
#   random sequences of operations on your code and on the course's reference implementation and compares
#   them after every step, so follow the specification exactly (including the order of the free list).
# * Plain Python for Parts A to D, PyTorch for Part E. The exceptions `OutOfBlocks` and `PagingError` are
#   imported for you; do not use anything else from `course_lib.paged` in your answers: the grader flags an
#   answer that does, and while it grades, the course's allocator, block manager and paged attention are
#   not in the library at all.
# * Everything runs on a CPU in seconds. Total: 17 points, 2 of them a written analysis your
#   instructor grades (Part F).

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import os

import torch

from course_lib.checks import check_close, check_equal, check_raises, check_shape
from course_lib.paged import OutOfBlocks, PagingError   # OutOfBlocks(needed, free); PagingError(message)
from course_lib.paged import BlockAllocator as CourseAllocator   # the course's allocator, for the tests
from course_lib.paged import contiguous_to_paged, paged_attention_reference   # for Part E's tests

# The misconceptions the tests recognize: when your result matches one, the message names it.
MISTAKES = {
    "late_block": "a new block was allocated one token late: a sequence of n tokens owns exactly "
                  "ceil(n / block_size) blocks, so the append that finds the last block full (the length a "
                  "multiple of block_size) allocates, not the one after; see notebook 06, section "
                  "'2. Blocks, block tables, and running out'",
    "waste_uniform_tail": "the rule of thumb, (block_size - 1) / 2 empty slots per sequence, was applied whatever "
                          "the lengths: it holds only when the lengths fall evenly over every position in a block; a "
                          "narrow range of lengths, or one that stops partway through a cycle of block_size lengths, "
                          "leaves a different number of slots empty on average; see notebook 06, section 'The block "
                          "size knob', and lab 06 Part C's hints",
    "waste_full_block": "a length that is a multiple of block_size was counted with a whole empty block: such a "
                        "sequence fills its last block exactly and wastes nothing (it owns ceil(n / block_size) "
                        "blocks), so the empty slots of a length run 0 to block_size - 1, not 1 to block_size; see "
                        "notebook 06, section '2. Blocks, block tables, and running out'",
    "waste_mean_of_ratios": "the waste fraction averaged each sequence's own fraction: the pool's fraction is its "
                            "empty slots over its allocated slots, totals over the batch, so a long sequence counts "
                            "for more of the pool than a short one; see lab 06 Part C's hints",
    "free_order": "free gave the blocks back first to last: the contract gives them back last to first, so that a "
                  "sequence's tail goes to the free list first and is recycled first (the allocator hands out the "
                  "blocks freed longest ago first); see notebook 06, section '2. Blocks, block tables, and running out'",
    "stale_tail": "the slots past a sequence's length in its last block were attended to: a block is filled "
                  "only up to context_lens[b], the rest holds stale K/V of earlier owners and must be masked; "
                  "see notebook 06, section '3. Attention through a block table'",
    "gqa_modulo": "query head h read KV head h % Hkv: in grouped-query attention the G = H / Hkv query heads of a "
                  "group are consecutive, so head h reads KV head h // G (the Hugging Face layout); see notebook 05, "
                  "section on MQA and GQA",
}


# %% [markdown] id="c004"
# ## Part A · The block allocator (3 points)
#
# The KV memory is cut into `num_blocks` physical blocks, numbered `0 .. num_blocks - 1`. Implement
# `BlockAllocator(num_blocks)` with:
#
# * `refcount`: a list, `refcount[b]` = how many block tables use block `b` (0 = free);
# * `num_free`: a **property**, the number of free blocks;
# * `allocate()`: take the block at the **head** of the free list, set its count to 1 and return it; raise
#   `OutOfBlocks(1, 0)` when no block is free. At the start the free list is `0, 1, ..., num_blocks - 1`;
# * `incref(b)`: one more table uses the allocated block `b`;
# * `free(b)`: one table less; when the count reaches 0 the block goes to the **tail** of the free list.
#
# Raise `PagingError` (with a clear message) for: `num_blocks` not a positive integer; a block number that
# is not an integer in range ("unknown block"; a bool, a float or a string is not a block number); `free` of a block that is already free ("double free");
# `incref` of a free block. A `collections.deque` or a plain list is fine for the free list.

# %% id="c005" nbgrader={"grade": false, "grade_id": "allocator_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class BlockAllocator:
    def __init__(self, num_blocks):
        ### BEGIN SOLUTION
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise PagingError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.refcount = [0] * num_blocks
        self.free_list = list(range(num_blocks))
        ### END SOLUTION

    @property
    def num_free(self):
        ### BEGIN SOLUTION
        return len(self.free_list)
        ### END SOLUTION

    def allocate(self):
        ### BEGIN SOLUTION
        if not self.free_list:
            raise OutOfBlocks(1, 0)
        b = self.free_list.pop(0)
        self.refcount[b] = 1
        return b
        ### END SOLUTION

    def incref(self, b):
        ### BEGIN SOLUTION
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < self.num_blocks:
            raise PagingError(f"unknown block {b!r}")
        if self.refcount[b] == 0:
            raise PagingError(f"block {b} is free: it cannot be shared")
        self.refcount[b] += 1
        ### END SOLUTION

    def free(self, b):
        ### BEGIN SOLUTION
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < self.num_blocks:
            raise PagingError(f"unknown block {b!r}")
        if self.refcount[b] == 0:
            raise PagingError(f"double free of block {b}")
        self.refcount[b] -= 1
        if self.refcount[b] == 0:
            self.free_list.append(b)
        ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "allocator_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
a = BlockAllocator(3)
check_equal(a.num_free, 3, "num_free of a new BlockAllocator(3)")
check_equal([a.allocate(), a.allocate()], [0, 1], "the first two allocate() calls")
check_equal(a.refcount, [1, 1, 0], "refcount after allocating blocks 0 and 1")
a.incref(0)
a.free(0)
check_equal((a.refcount[0], a.num_free), (1, 1), "(refcount[0], num_free) after incref(0) then free(0)")
a.free(0)
check_equal(a.num_free, 2, "num_free after block 0's last reference is freed")
check_equal([a.allocate(), a.allocate()], [2, 0], "allocate() twice more: the head of the free list first (2), "
            "then the block freed last (0)")
check_raises(lambda: a.allocate(), OutOfBlocks, "allocate() with no free block")
a.free(1)
check_raises(lambda: a.free(1), PagingError, "free(1) twice (double free)")
check_raises(lambda: a.free(7), PagingError, "free(7) on 3 blocks (unknown block)")
check_raises(lambda: a.incref(1), PagingError, "incref(1) of a free block")
check_raises(lambda: BlockAllocator(0), PagingError, "BlockAllocator(0)")
print("Part A: visible tests passed")

# %% [markdown] id="c007"
# ## Part B · Block tables (4 points, contract)
#
# A sequence of `n` tokens stores its K/V in blocks of `block_size` token slots; its **block table** lists
# them in order (logical block i -> physical block).
#
# **Contract.** `BlockManager(allocator, block_size)` keeps one block table per sequence:
#
# * **methods**: `add_sequence(seq_id, num_tokens)` (a new sequence with a prompt of `num_tokens >= 1`
#   tokens), `append_token(seq_id)` (one more token), `free(seq_id)` (the sequence is finished: its blocks
#   go back and it is forgotten), `block_table(seq_id)` (a list, in logical order) and `num_tokens(seq_id)`;
# * **invariant, after every call**: a sequence of `n` tokens owns exactly `ceil(n / block_size)` blocks:
#   a block is allocated by the token that has nowhere else to go, never earlier, never later; blocks are
#   taken from the allocator in logical order, and `free` gives them back from the **last to the first** (so
#   that a sequence's tail is recycled first);
# * **all or nothing**: when the allocator has too few free blocks, `add_sequence` raises
#   `OutOfBlocks(needed, free)` and `append_token` raises `OutOfBlocks(1, 0)`, and **nothing changes** (a
#   scheduler will preempt a sequence and retry);
# * **raises** `PagingError` for an unknown `seq_id`, an `add_sequence` with an existing `seq_id`, a
#   `num_tokens` that is not an integer >= 1, a `block_size` that is not a positive integer;
# * **uses** only the allocator's `allocate`, `free`, `incref`, `num_free` and `refcount` (the tests give
#   you the course's allocator, so this part does not depend on Part A; while grading, the allocator your
#   manager gets answers from the grader's side, and only those five names).
#
# When grading, long random sequences of operations run on your manager and on the course's, and the
# tables, lengths and free blocks are compared after every step.
#
# <details><summary>Hint 1: when exactly does a block come?</summary>
#
# Before a token is added, ask whether the blocks the sequence already owns have a free slot left for it; only
# when they are all full does that token bring a block. Pitfall: deciding from the length after the token is
# counted, which allocates one token late (or early). Test it at the lengths where a block fills up.
# </details>
#
# <details><summary>Hint 2: all or nothing</summary>
#
# A call that cannot finish must leave the manager and the allocator as they were. Pitfall: allocating blocks
# one at a time and discovering halfway that the pool ran dry; know how many a call needs, and whether the
# allocator has them, before you take the first.
# </details>

# %% id="c008" nbgrader={"grade": false, "grade_id": "blocks_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class BlockManager:
    def __init__(self, allocator, block_size):
        ### BEGIN SOLUTION
        if not isinstance(block_size, int) or block_size < 1:
            raise PagingError(f"block_size must be a positive int, got {block_size!r}")
        self.allocator, self.block_size = allocator, block_size
        self.tables, self.lengths = {}, {}
        ### END SOLUTION

    def add_sequence(self, seq_id, num_tokens):
        ### BEGIN SOLUTION
        if seq_id in self.tables:
            raise PagingError(f"sequence {seq_id!r} already exists")
        if not isinstance(num_tokens, int) or num_tokens < 1:
            raise PagingError(f"num_tokens must be an int >= 1, got {num_tokens!r}")
        need = -(-num_tokens // self.block_size)
        if need > self.allocator.num_free:
            raise OutOfBlocks(need, self.allocator.num_free)
        self.tables[seq_id] = [self.allocator.allocate() for _ in range(need)]
        self.lengths[seq_id] = num_tokens
        ### END SOLUTION

    def append_token(self, seq_id):
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise PagingError(f"unknown sequence {seq_id!r}")
        if self.lengths[seq_id] % self.block_size == 0:
            if self.allocator.num_free == 0:
                raise OutOfBlocks(1, 0)
            self.tables[seq_id].append(self.allocator.allocate())
        self.lengths[seq_id] += 1
        ### END SOLUTION

    def free(self, seq_id):
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise PagingError(f"unknown sequence {seq_id!r}")
        for b in reversed(self.tables[seq_id]):
            self.allocator.free(b)
        del self.tables[seq_id], self.lengths[seq_id]
        ### END SOLUTION

    def block_table(self, seq_id):
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise PagingError(f"unknown sequence {seq_id!r}")
        return list(self.tables[seq_id])
        ### END SOLUTION

    def num_tokens(self, seq_id):
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise PagingError(f"unknown sequence {seq_id!r}")
        return self.lengths[seq_id]
        ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "blocks_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
m = BlockManager(CourseAllocator(6), block_size=4)
m.add_sequence("a", 6)
check_equal(m.block_table("a"), [0, 1], "block_table('a') after add_sequence('a', 6) with block_size 4")
m.append_token("a")
m.append_token("a")
check_equal((m.num_tokens("a"), m.block_table("a")), (8, [0, 1]), "(num_tokens, table) at 8 tokens: 2 full blocks")
m.append_token("a")
check_equal(m.block_table("a"), [0, 1, 2], "block_table('a') after the 9th token: a new block, not earlier",
            mistakes={MISTAKES["late_block"]: [0, 1]})
m.add_sequence("b", 4)
check_equal(m.block_table("b"), [3], "block_table('b') for a 4-token prompt")
check_raises(lambda: m.add_sequence("c", 9), OutOfBlocks, "add_sequence('c', 9) with 2 free blocks")
check_equal(m.allocator.num_free, 2, "free blocks after the failed add_sequence (nothing may be allocated)")
m.free("a")
check_equal(m.allocator.num_free, 5, "free blocks after free('a')")
m.add_sequence("c", 9)
check_equal(m.block_table("c"), [4, 5, 2], "block_table('c'): fresh blocks 4, 5 first, then a's tail (2)")
check_raises(lambda: m.append_token("zz"), PagingError, "append_token of an unknown sequence")
check_raises(lambda: m.free("a"), PagingError, "free('a') twice")
check_raises(lambda: m.add_sequence("d", 0), PagingError, "add_sequence('d', 0)")
check_raises(lambda: m.add_sequence("b", 2), PagingError, "add_sequence('b', 2) when 'b' exists")
full = BlockManager(CourseAllocator(1), block_size=2)
full.add_sequence("x", 2)
check_raises(lambda: full.append_token("x"), OutOfBlocks, "append_token past the last free block")
check_equal(full.num_tokens("x"), 2, "num_tokens after a failed append_token (unchanged)")
print("Part B: visible tests passed")

# %% [markdown] id="c020"
# ## Part C · Predict the waste (1 point)
#
# Paging's only waste is the unfilled tail of each sequence's last block. Notebook 06 ("The block size
# knob") estimates it with a rule of thumb, about `(block_size - 1) / 2` empty slots per sequence, which
# assumes that a length is as likely to end anywhere in its last block. Real traffic is lumpier: a service
# gets short chat turns, long documents, and templated requests whose lengths barely vary. Here you predict
# the waste exactly for such a mix.
#
# Implement `predict_paged_waste(mix, block_size)`:
#
# * **takes** `mix`, a list of request kinds `(weight, lo, hi)`: a request is of that kind with probability
#   `weight` (the weights add up to 1), and its length (the tokens its KV cache holds) is then equally likely
#   to be any integer from `lo` to `hi` inclusive (`1 <= lo <= hi`); and `block_size`, a positive integer;
# * **returns** a pair `(empty_slots, waste_fraction)`: `empty_slots` is the expected number of KV slots
#   that a sequence's blocks hold and no token fills (in slots); `waste_fraction` is the fraction of the
#   allocated slots of the KV pool that are empty when a large batch of requests drawn from the mix is
#   resident (a number between 0 and 1);
# * uses the lab's model of paging (Part B: a sequence of `n` tokens owns exactly `ceil(n / block_size)`
#   blocks), exactly: the grader draws its own mixes and block sizes and compares with the exact
#   expectation, within `1e-6` relative. Ranges span at most a few thousand tokens.
#
# The visible tests check the units and what must hold whatever the formula; the cell after them compares
# your prediction with what your Part B manager measures.
#
# <details><summary>Hint 1: the empty slots of one length</summary>
#
# A sequence's waste depends only on where its length falls inside a block, not on how many blocks come
# before. Pitfall: a length that fills its last block exactly leaves nothing empty; it does not own a spare,
# empty block.
# </details>
#
# <details><summary>Hint 2: averaging over a range</summary>
#
# As the length grows by one token at a time, the waste goes round a cycle of `block_size` values. A range
# that covers whole cycles averages to the notebook's rule of thumb; a narrow range (templated requests)
# does not, and neither does the part of a range left over after its whole cycles. Adding up every length of
# a range is fine at these sizes; counting whole cycles is faster. Pitfall: applying the rule of thumb to
# every range.
# </details>
#
# <details><summary>Hint 3: from slots to the pool's fraction</summary>
#
# The pool's fraction is its empty slots over its allocated slots, both totals over the whole batch.
# Pitfall: averaging each sequence's own fraction instead; a long document holds many more of the pool's
# slots than a chat turn, so the two do not count alike.
# </details>

# %% id="c021" nbgrader={"grade": false, "grade_id": "predict_waste", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_paged_waste(mix, block_size):
    """(expected empty KV slots per sequence, fraction of the pool's allocated slots left empty) for request
    lengths drawn from mix = [(weight, lo, hi), ...], each kind uniform over the integers lo..hi."""
    ### BEGIN SOLUTION
    empty = tokens = 0.0
    for weight, lo, hi in mix:
        count = hi - lo + 1
        cycles, rest = divmod(count, block_size)           # the waste of length n repeats every block_size lengths
        per_cycle = block_size * (block_size - 1) // 2     # one cycle: every residue once, 0 + 1 + ... + (bs - 1)
        empty += weight * (cycles * per_cycle + sum(-n % block_size for n in range(lo, lo + rest))) / count
        tokens += weight * (lo + hi) / 2
    return empty, empty / (tokens + empty)                 # totals over a large batch: a ratio of expectations
    ### END SOLUTION


# %% id="c022" nbgrader={"grade": true, "grade_id": "predict_waste_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
def _predicted(mix, bs):
    got = predict_paged_waste(mix, bs)
    check_equal(len(got) if isinstance(got, (tuple, list)) else type(got).__name__, 2,
                f"predict_paged_waste({mix}, {bs}) returns a pair (empty_slots, waste_fraction)")
    return float(got[0]), float(got[1])


def _in_bounds(mix, bs):
    slots, frac = _predicted(mix, bs)
    what = f"predict_paged_waste({mix}, {bs})"
    check_equal(0 <= slots <= bs - 1, True, f"{what}: empty slots per sequence {slots:g} in [0, block_size - 1] "
                f"(in slots: a sequence leaves 0 to block_size - 1 slots of its last block empty, never a whole block)")
    check_equal(0 <= frac < 1, True, f"{what}: waste fraction {frac:g} in [0, 1) (a fraction, not a percentage "
                f"or a count of slots)")
    return slots, frac


_chat, _docs, _form = (20, 300), (1500, 4000), (129, 136)       # a chat turn, a document, a templated request
_mix = [(0.5, *_form), (0.3, *_chat), (0.2, *_docs)]
check_close(_predicted([(1.0, 64, 64)], 16)[0], 0.0, "predict_paged_waste([(1.0, 64, 64)], 16): a length that "
            "fills its blocks exactly leaves no slot empty",
            mistakes={MISTAKES["waste_uniform_tail"]: 7.5, MISTAKES["waste_full_block"]: 16.0})
check_close(_predicted([(0.5, 32, 32), (0.5, 256, 256)], 16), (0.0, 0.0), "lengths 32 and 256 in blocks of 16",
            mistakes={MISTAKES["waste_uniform_tail"]: (7.5, 7.5 / (144 + 7.5)),
                      MISTAKES["waste_full_block"]: (16.0, 16 / (144 + 16))})
check_close(_predicted(_mix, 1), (0.0, 0.0), "blocks of one token waste nothing",
            mistakes={MISTAKES["waste_full_block"]: (1.0, 1 / (1 + sum(w * (lo + hi) / 2 for w, lo, hi in _mix)))})
for _bs in (4, 16, 256):
    _parts = [_in_bounds([(1.0, lo, hi)], _bs)[0] for _, lo, hi in _mix]
    _slots, _frac = _in_bounds(_mix, _bs)
    check_close(_slots, sum(w * s for (w, _, _), s in zip(_mix, _parts)), f"empty slots of the mix in blocks of "
                f"{_bs}: each kind's expected empty slots, weighted by how often the kind comes")
    _longer = [(w, lo + 10 * _bs, hi + 10 * _bs) for w, lo, hi in _mix]
    _slots2, _frac2 = _in_bounds(_longer, _bs)
    check_close(_slots2, _slots, f"every length {10 * _bs} tokens longer (10 blocks of {_bs}): the last block "
                f"ends alike, so the same empty slots")
    check_equal(_frac2 < _frac, True, f"every length 10 blocks of {_bs} longer: the waste fraction must fall "
                f"({_frac:.4g} before, {_frac2:.4g} after)")
print("Part C: visible tests passed")

# %% [markdown] id="c023"
# ### Your prediction against your block tables (not graded)
#
# 400 requests drawn from the mix above (half templated requests of 129 to 136 tokens, 30% chat turns of 20
# to 300, 20% documents of 1,500 to 4,000), each given to your `BlockManager`: the measured waste is the
# fraction of the allocated slots that hold no token. The rule of thumb's column applies
# `(block_size - 1) / 2` empty slots to every sequence. A sample of 400 is not the large batch of the
# prediction: expect the measurement to differ from it by a little sampling noise, and look at where the rule
# of thumb goes wrong.

# %% id="c024"
import random

_mix = [(0.5, 129, 136), (0.3, 20, 300), (0.2, 1500, 4000)]    # templated requests, chat turns, documents
_rng = random.Random(0)
_lengths = []
for _ in range(400):
    _w, _lo, _hi = _rng.choices(_mix, weights=[w for w, _, _ in _mix])[0]
    _lengths.append(_rng.randint(_lo, _hi))
_mean = sum(_lengths) / len(_lengths)
for _bs in (() if os.environ.get("NBGRADER_EXECUTION") else (1, 8, 16, 64, 256)):   # not run while grading
    try:
        _slots, _pred = predict_paged_waste(_mix, _bs)
        _mgr = BlockManager(CourseAllocator(sum(-(-n // _bs) for n in _lengths)), _bs)
        for _i, _n in enumerate(_lengths):
            _mgr.add_sequence(_i, _n)
    except NotImplementedError:
        print("finish Parts B and C first")
        break
    except (OutOfBlocks, PagingError) as _e:
        print(f"your BlockManager raised {type(_e).__name__}: {_e} (Part B's tests say where)")
        break
    _held = sum(len(_mgr.block_table(_i)) for _i in range(len(_lengths))) * _bs
    _thumb = (_bs - 1) / 2
    print(f"block_size {_bs:3d}: predicted {_slots:6.2f} empty slots per sequence, waste {_pred:6.2%}; measured "
          f"with your tables {(_held - sum(_lengths)) / len(_lengths):6.2f}, {1 - sum(_lengths) / _held:6.2%}; "
          f"rule of thumb {_thumb:6.2f}, {_thumb / (_mean + _thumb):6.2%}")

# %% [markdown] id="c010"
# ## Part D · Fork with copy-on-write (3 points)
#
# To sample several continuations of one prompt, a sequence is **forked**: the child gets the parent's
# block table and length, and every block's reference count goes up by one - nothing is copied. Full
# blocks are never written again, so they can stay shared forever. The last block may be partial: the
# first sequence that appends a token to a **shared partial block** must get its own copy first
# (copy-on-write).
#
# Implement `CowBlockManager(BlockManager)` with:
#
# * `fork(parent_id, child_id)`: `PagingError` if the parent is unknown or the child exists;
# * `append_token(seq_id)`, now returning the list of block copies the KV memory must perform:
#   * last block full (length a multiple of `block_size`): allocate a new block as before, return `[]`;
#   * last block partial and shared (`refcount > 1`): allocate a new block `new`, drop this sequence's
#     reference to the old block `old` (`allocator.free(old)`), put `new` in its place, return
#     `[(old, new)]`;
#   * last block partial and private: return `[]`.
#   If a needed block cannot be allocated, raise `OutOfBlocks(1, 0)` and change nothing.

# %% id="c011" nbgrader={"grade": false, "grade_id": "cow_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class CowBlockManager(BlockManager):
    def fork(self, parent_id, child_id):
        ### BEGIN SOLUTION
        if parent_id not in self.tables:
            raise PagingError(f"unknown sequence {parent_id!r}")
        if child_id in self.tables:
            raise PagingError(f"sequence {child_id!r} already exists")
        for b in self.tables[parent_id]:
            self.allocator.incref(b)
        self.tables[child_id] = list(self.tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]
        ### END SOLUTION

    def append_token(self, seq_id):
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise PagingError(f"unknown sequence {seq_id!r}")
        table, n = self.tables[seq_id], self.lengths[seq_id]
        copies = []
        if n % self.block_size == 0:
            if self.allocator.num_free == 0:
                raise OutOfBlocks(1, 0)
            table.append(self.allocator.allocate())
        elif self.allocator.refcount[table[-1]] > 1:
            if self.allocator.num_free == 0:
                raise OutOfBlocks(1, 0)
            old, new = table[-1], self.allocator.allocate()
            self.allocator.free(old)
            table[-1] = new
            copies.append((old, new))
        self.lengths[seq_id] = n + 1
        return copies
        ### END SOLUTION


# %% id="c012" nbgrader={"grade": true, "grade_id": "cow_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
m = CowBlockManager(CourseAllocator(8), block_size=4)
m.add_sequence("p", 6)                               # blocks [0, 1]: one full, one with 2 of 4 tokens
m.fork("p", "c")
check_equal(m.block_table("c"), [0, 1], "block_table('c') after fork('p', 'c')")
check_equal(m.allocator.refcount[:2], [2, 2], "refcounts of blocks 0 and 1 after the fork")
check_equal(m.allocator.num_free, 6, "free blocks after the fork (a fork allocates nothing)")
check_equal(m.append_token("c"), [(1, 2)], "append_token('c'): copy-on-write of the shared partial block 1")
check_equal((m.block_table("c"), m.block_table("p")), ([0, 2], [0, 1]), "tables of c and p after the copy")
check_equal(m.allocator.refcount[:3], [2, 1, 1], "refcounts of blocks 0, 1, 2 after the copy")
check_equal(m.append_token("p"), [], "append_token('p'): block 1 is now p's alone, no copy")
check_equal(m.append_token("c"), [], "append_token('c') again: its copy is private")
m.append_token("c")
check_equal(m.block_table("c"), [0, 2, 3], "c's table at 9 tokens: a new block after its copy filled")
check_raises(lambda: m.fork("nope", "x"), PagingError, "fork of an unknown parent")
check_raises(lambda: m.fork("p", "c"), PagingError, "fork into an existing child")
m.free("p")
m.free("c")
check_equal(m.allocator.num_free, 8, "free blocks after freeing both (every shared block released once per user)")
print("Part D: visible tests passed")

# %% [markdown] id="c013"
# ## Part E · Attention through a block table (4 points, contract)
#
# In a decode step each sequence brings one query, and its keys and values lie in blocks anywhere in the
# pool, found through its block table (notebook 06, section 3). Write the attention that reads them there.
#
# **Contract.** `paged_attention(q, k_pool, v_pool, block_tables, context_lens)`:
#
# * **takes** `q` `[B, H, d]` (one query per sequence), `k_pool` and `v_pool` `[num_blocks, Hkv, block_size,
#   d]` (the physical KV memory, float32, as `q`), `block_tables` `[B, max_blocks]` (integers: row `b` lists the
#   physical blocks of sequence `b` in order) and `context_lens` `[B]` (integers: its number of tokens).
#   Token `t` of sequence `b` is in slot `t % block_size` of block `block_tables[b, t // block_size]`;
# * **returns** `[B, H, d]` in `q`'s dtype: for each sequence, `softmax(q K^T / sqrt(d)) V` over its `context_lens[b]`
#   tokens, with query head `h` reading KV head `h // (H // Hkv)` (grouped-query attention); equal to the
#   course's reference within `1e-5`; a sequence of length 0 gets a row of zeros;
# * **reads only what the sequence owns**: the first `ceil(context_lens[b] / block_size)` entries of row `b`
#   of the table and, in the last of those blocks, only the slots below the length. Everything else (the
#   rest of the table row, the rest of the last block, the other blocks of the pool) may hold anything:
#   stale K/V of earlier owners, `-1` table entries;
# * **raises** `ValueError` for shapes that do not fit (`q` not 3-D, pools not equal and 4-D, a different
#   `d`, `H` not a multiple of `Hkv`, tables or lengths not `B` rows), a length outside
#   `[0, max_blocks * block_size]`, and a used table entry outside the pool (negative or `>= num_blocks`: a
#   `-1` may sit only where the sequence does not read; mind that a tensor indexed with `-1` silently reads
#   the last block).
#
# A Python loop over the sequences is fine (the vectorized and Triton versions are in `course_lib.paged`;
# do not call them).
#
# <details><summary>Hint 1: from blocks to a contiguous K</summary>
#
# For one sequence, gather the blocks its table uses, in the table's order. Token order is block first, then
# slot within the block: the two axes must sit side by side, block before slot, before you merge them into
# one token axis. Pitfall: merging axes that are not adjacent (the head axis sits between them in the pool)
# mixes heads and tokens without any error; and the merged axis is longer than the sequence, since the tail
# of its last block is stale.
# </details>
#
# <details><summary>Hint 2: GQA</summary>
#
# The `G = H / Hkv` query heads that read one KV head are consecutive. Group them under their KV head and
# let one batched product over the KV heads score every group at once, so that K and V are never repeated.
# Pitfall: taking every `Hkv`-th query head as a group (interleaved), which pairs head `h` with the wrong KV
# head and still gives the right shape.
# </details>

# %% id="c014" nbgrader={"grade": false, "grade_id": "paged_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def paged_attention(q, k_pool, v_pool, block_tables, context_lens):
    """One decode step through block tables: q [B, H, d], pools [N, Hkv, bs, d] -> [B, H, d]."""
    ### BEGIN SOLUTION
    if q.dim() != 3 or k_pool.dim() != 4 or k_pool.shape != v_pool.shape or k_pool.shape[3] != q.shape[2]:
        raise ValueError(f"q must be [B, H, d] and k_pool, v_pool the same [num_blocks, Hkv, block_size, d], got "
                         f"{tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    B, H, d = q.shape
    N, Hkv, bs, _ = k_pool.shape
    if H % Hkv:
        raise ValueError(f"query heads H={H} must be a multiple of KV heads Hkv={Hkv}")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or tuple(context_lens.shape) != (B,):
        raise ValueError(f"block_tables must be [B={B}, max_blocks] and context_lens [B={B}], got "
                         f"{tuple(block_tables.shape)}, {tuple(context_lens.shape)}")
    G, max_blocks = H // Hkv, block_tables.shape[1]
    out = torch.zeros_like(q)
    for b in range(B):
        n = int(context_lens[b])
        if not 0 <= n <= max_blocks * bs:
            raise ValueError(f"context_lens[{b}]={n} is outside [0, max_blocks * block_size = {max_blocks * bs}]")
        if n == 0:
            continue                                             # nothing to attend to: a zero row
        used = [int(x) for x in block_tables[b, :-(-n // bs)]]
        if min(used) < 0 or max(used) >= N:
            raise ValueError(f"block_tables[{b}] points outside the pool of {N} blocks: {used}")
        idx = torch.tensor(used)
        k = k_pool[idx].permute(1, 0, 2, 3).reshape(Hkv, -1, d)[:, :n]      # [Hkv, n, d], tokens in order
        v = v_pool[idx].permute(1, 0, 2, 3).reshape(Hkv, -1, d)[:, :n]
        s = q[b].reshape(Hkv, G, d) @ k.transpose(-1, -2) / math.sqrt(d)    # [Hkv, G, n]
        out[b] = (s.softmax(-1) @ v).reshape(H, d)
    return out
    ### END SOLUTION


# %% id="c015" nbgrader={"grade": true, "grade_id": "paged_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
def _paged_case(lengths, H, Hkv, d, bs, gen, extra_blocks=3):
    """Random contiguous K/V scattered into a shuffled pool, with stale values everywhere a sequence does
    not own (the rest of its last block, the free blocks) and -1 past each row's used table entries."""
    B = len(lengths)
    k, v = (torch.randn(B, Hkv, max(max(lengths), 1), d, generator=gen) for _ in range(2))
    need = sum(-(-n // bs) for n in lengths)
    k_pool, v_pool, tables, lens = contiguous_to_paged(k, v, lengths, bs, num_blocks=need + extra_blocks,
                                                       generator=gen)
    owned = torch.zeros(k_pool.shape[0], bs, dtype=torch.bool)
    tables = tables.long()
    for b, n in enumerate(lengths):
        nb = -(-n // bs)
        for i in range(nb):
            owned[tables[b, i], : min(bs, n - i * bs)] = True
        tables[b, nb:] = -1
    stale = ~owned[:, None, :, None].expand_as(k_pool)
    k_pool[stale] = 3 * torch.randn(int(stale.sum()), generator=gen)
    v_pool[stale] = 3 * torch.randn(int(stale.sum()), generator=gen)
    q = torch.randn(B, H, d, generator=gen)
    return q, k_pool, v_pool, tables, lens


def _paged_check(case, what):
    q, k_pool, v_pool, tables, lens = case
    got = paged_attention(q, k_pool, v_pool, tables, lens)
    check_shape(got, tuple(q.shape), what)
    bs = k_pool.shape[2]
    whole_blocks = (lens + bs - 1) // bs * bs                # the known mistake: the whole last block read
    wrong = paged_attention_reference(q, k_pool, v_pool, tables.clamp(min=0), whole_blocks)
    check_close(got, paged_attention_reference(q, k_pool, v_pool, tables, lens), what, rtol=1e-5, atol=1e-5,
                mistakes={MISTAKES["stale_tail"]: wrong})


_gen = torch.Generator().manual_seed(6)
_paged_check(_paged_case([6], 1, 1, 2, 4, _gen), "paged_attention: one sequence of 6 tokens in 2 blocks of 4")
_paged_check(_paged_case([9, 4, 1, 0, 12], 4, 2, 8, 4, _gen),
             "paged_attention: 5 sequences of 9, 4, 1, 0, 12 tokens, blocks of 4, 4 query heads over 2 KV heads")
_paged_check(_paged_case([5, 17], 6, 3, 4, 16, _gen), "paged_attention: blocks of 16, 6 query heads over 3 KV heads")
_case = _paged_case([9, 4], 4, 2, 8, 4, _gen)
check_raises(lambda: paged_attention(_case[0][:, :3], *_case[1:]), ValueError, "3 query heads over 2 KV heads")
check_raises(lambda: paged_attention(*_case[:4], torch.tensor([9, 13])), ValueError,
             "context_lens [9, 13] with tables of 3 blocks of 4 (13 > 12)")
_bad = _case[3].clone()
_bad[0, 1] = 99
check_raises(lambda: paged_attention(*_case[:3], _bad, _case[4]), ValueError, "a used table entry 99 outside the pool")
print("Part E: visible tests passed")

# %% [markdown] id="c016"
# ## Going further (not graded)
#
# * Your Part E gathers each sequence's blocks into a contiguous copy before attending;
#   `course_lib/paged/triton_paged.py` reads the blocks in place. For a decode step of 8 sequences of 1,000
#   tokens, 8 KV heads of dimension 128 in fp16 and blocks of 16, how many bytes of K/V does each move
#   through main memory?
# * With `course_lib.paged.BlockManager(num_blocks, 16, prefix_caching=True)`, two requests share a
#   100-token system prompt and then differ. How many blocks do they share, and what happens to the last 4
#   tokens of the prompt?

# %% [markdown] id="cw06p"
# ## Part F · Written analysis: where the rule of thumb goes wrong (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Answer in 100 to 200 words, about the
# table of "Your prediction against your block tables" (Part C; it is skipped while grading):
#
# 1. quote, for block sizes 16 and 256, your predicted waste, the measured one and the rule of thumb's;
# 2. explain which kind of request in the mix makes the rule of thumb wrong, and why the direction of its
#    error for that kind depends on the block size (compare the empty slots per sequence of that kind, not
#    the whole mix's percentages, which divide by different mean lengths); then explain why the pool's waste
#    is set mostly by another kind;
# 3. choose a block size for this mix and say what a smaller one would cost instead.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw06" nbgrader={"grade": true, "grade_id": "written_paged_waste", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of a reference run: the solution notebook on a 2-core CPU, torch 2.13; your
# numbers will differ: what matters is how you explain them.)*
#
# At block size 16 I predicted 1.41% of the pool empty, measured 1.47%, the rule of thumb said 1.16%; at 256,
# 16.20%, 16.26% and 16.58%. Prediction and measurement agree within the sampling noise of 400 requests (9.50
# against 9.59 empty slots per sequence at 16, 128.37 against 124.55 at 256); the rule of thumb underestimates
# the waste by a fifth at 16 and overestimates it a little at 256.
#
# The rule assumes a length is as likely to end anywhere in its last block. Templated requests of 129 to 136
# tokens do not: with blocks of 16 they all end just past the 128 boundary, owning 144 slots for 129 to 136
# tokens, 11.5 empty slots on average against the rule's 7.5; with blocks of 64 they own 192, 59.5 empty
# against 31.5. A narrow range's waste depends on where it falls in its last block, so the rule can miss
# either way: with blocks of 256 the same requests waste 123.5, a little under the rule's 127.5. The wide
# ranges (chat turns, documents) cover many block cycles and follow the rule.
#
# The pool's fraction is empty slots over allocated slots of the whole batch, a slot-weighted average: the 20%
# of documents (1,500 to 4,000 tokens) hold most of the allocated slots (at block 16, about 550 of the 670 an
# average request holds) and waste at most one block of their many, so at 16 the pool wastes about 1.4% while a
# templated request wastes 8% of its own slots; at 256 every kind wastes about half a block and the pool about
# a sixth.
#
# For this mix I would take 16: the waste is about 1.4% (1.47% measured), and going to 8 saves less than a point
# (0.57% measured) while it doubles the block tables, the bookkeeping per token and the number of small reads an
# attention kernel makes per sequence.

# %% [markdown] id="c017" tags=["answer-key"]
# ### Answer key
#
# * A sequence of 1,000 tokens owns ceil(1000 / 16) = 63 blocks = 1,008 slots; K and V take 2 x 8 heads x
#   1,008 x 128 x 2 bytes = 4.13 MB per sequence, 33.0 MB for the 8. The kernel reads exactly these
#   33.0 MB once (plus the queries and outputs, 8 x H heads x 128 x 2 bytes each, 64 KiB with 32 query
#   heads: negligible). The gather
#   reads the 33.0 MB from the pool, writes a contiguous copy (33.0 MB) and the attention reads that copy
#   again (33.0 MB): about 99 MB, three times the traffic, and a decode step is memory-bound, so it is about
#   three times slower at this size (plus the copy's allocation). That is why vLLM's PagedAttention is a
#   kernel that follows the block table itself.
# * 100 = 6 x 16 + 4: the 6 full blocks of the prompt are shared (prefix caching hashes full blocks only,
#   each hash chained to the previous block's, so equal prefixes map to the same physical blocks: tables
#   `[0, 1, 2, 3, 4, 5, 6]` and `[0, 1, 2, 3, 4, 5, 7]`). The 7th block holds the prompt's last 4 tokens
#   and then each request's own tokens: it is partial when first written and becomes different for the two,
#   so it is not cached and each request gets its own (the 4 tokens' K/V are computed twice). 6 of 7 blocks
#   shared saves 6 blocks of KV memory and the prefill of 96 tokens for the second request.
#
# #### Part C's prediction, the reasoning behind the solution
#
# A sequence of `n` tokens owns `ceil(n / bs)` blocks, so it leaves `ceil(n / bs) * bs - n` slots empty,
# which is `(-n) mod bs`: 0 when `n` is a multiple of `bs` (not `bs`: the off-by-one that `waste_full_block`
# names), else `bs - n mod bs`. As `n` runs over `bs` consecutive lengths, the residue takes every value once,
# so the waste takes every value 0 to `bs - 1` once: a cycle that adds up to `bs (bs - 1) / 2`. A range
# `lo..hi` of `c` lengths holds `c // bs` whole cycles plus `c mod bs` lengths left over, which are added one
# by one; divided by `c`, that is the kind's expected waste. Over the kinds, the expectation is linear: weight
# each kind's expected waste (and its mean length `(lo + hi) / 2`) by its probability. The rule of thumb
# `(bs - 1) / 2` is exact only when every range is a whole number of cycles.
#
# For the pool: a batch of `N` requests holds `N E[n]` tokens and `N E[w]` empty slots, so as `N` grows its
# waste fraction tends to `E[w] / (E[n] + E[w])`, a ratio of expectations. The mean of each sequence's own
# `w / (n + w)` weighs a 20-token chat turn like a 4,000-token document, and short sequences waste the largest
# share of their blocks, so it overstates the pool's waste.
#
# With the lab's mix (half templated requests of 129 to 136 tokens, 30% chat turns of 20 to 300, 20% documents
# of 1,500 to 4,000; mean length 664.25) and blocks of 16: the templated range is half a cycle whose lengths
# leave 15 down to 8 slots empty, 11.5 on average; the chat range of 281 lengths is 17 cycles plus 9 lengths
# (7.516); the documents' 2,501 lengths are 156 cycles plus 5 (7.489). Together 0.5 x 11.5 + 0.3 x 7.516 +
# 0.2 x 7.489 = 9.50 empty slots per sequence, not the rule of thumb's 7.5, and a pool waste of
# 9.50 / (664.25 + 9.50) = 1.41% (the rule of thumb says 1.12%; the mean of the per-sequence fractions says
# 5.95%). With blocks of 8 the templated range is exactly one cycle and the rule of thumb holds (3.5 slots);
# with blocks of 64, 45.5 slots against 31.5. Blocks of 1 waste nothing.
