# %% [markdown] id="c002"
# # Lab 06 · Paged KV memory
#
# In this lab you write the memory manager at the heart of PagedAttention (Module 06):
#
# * **Part A (3 points): a block allocator.** A free list and reference counts.
# * **Part B (4 points): block tables.** Sequences get blocks exactly when they need them and give them
#   back when they finish.
# * **Part C (3 points): fork with copy-on-write.** Parallel samples share their prompt's blocks.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell with fixed examples. When grading, **hidden tests** also run
#   long random sequences of operations on your code and on the course's reference implementation and
#   compare them after every step, so follow the specification exactly (including the order of the free
#   list).
# * Plain Python only. The exceptions `OutOfBlocks` and `PagingError` are imported for you; do not import
#   anything else from `course_lib.paged`: the hidden tests check that the code is your own.
# * Everything runs on a CPU in seconds. Total: 10 points.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import random
import time

from course_lib.checks import check_equal, check_raises
from course_lib.paged import OutOfBlocks, PagingError   # OutOfBlocks(needed, free); PagingError(message)
from course_lib.paged import BlockAllocator as CourseAllocator   # the course's allocator, for the tests


def _own_work(cls, name):
    """The grader's check that `cls` is the student's own class, not course_lib's."""
    if getattr(cls, "__module__", None) != "__main__":
        raise AssertionError(f"{name} must be defined in this notebook (it comes from {cls.__module__})")
    for klass in cls.__mro__:
        if klass.__module__.startswith("course_lib.paged"):
            raise AssertionError(f"{name} must not inherit from {klass.__module__}.{klass.__name__}")
        for f in vars(klass).values():
            f = getattr(f, "fget", f)
            for ref in getattr(getattr(f, "__code__", None), "co_names", ()):
                val = f.__globals__.get(ref)
                if isinstance(val, type) and issubclass(val, BaseException):
                    continue                      # raising the provided exceptions is fine
                mod = getattr(val, "__module__", None) or getattr(val, "__name__", "")
                if isinstance(mod, str) and mod.startswith("course_lib.paged"):
                    raise AssertionError(f"{name} uses {ref} from {mod}: write it yourself")


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
# is not an integer in range ("unknown block"); `free` of a block that is already free ("double free");
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
### BEGIN HIDDEN TESTS
from course_lib.paged import BlockAllocator as _RefA

_own_work(BlockAllocator, "BlockAllocator")
_seed = time.time_ns() % 2**32
_rng = random.Random(_seed)


def _same_error(fn_mine, fn_ref, what):
    try:
        r = fn_ref()
    except (OutOfBlocks, PagingError) as e:
        check_raises(fn_mine, type(e), what)
        return None
    return check_equal(fn_mine(), r, what) or r


for _trial in range(40):
    _n = _rng.randint(1, 8)
    _mine, _ref = BlockAllocator(_n), _RefA(_n)
    for _step in range(60):
        _op = _rng.choice(["allocate", "allocate", "free", "free", "incref", "bad"])
        _b = _rng.randrange(-1, _n + 1) if _op == "bad" else _rng.randrange(_n)
        _what = f"{_op}({'' if _op == 'allocate' else _b}) at step {_step} on {_n} blocks (seed {_seed})"
        if _op == "allocate":
            _same_error(_mine.allocate, _ref.allocate, _what)
        elif _op in ("free", "bad"):
            _same_error(lambda: _mine.free(_b), lambda: _ref.free(_b), _what)
        else:
            _same_error(lambda: _mine.incref(_b), lambda: _ref.incref(_b), _what)
        check_equal(list(_mine.refcount), list(_ref.refcount), "refcount after " + _what)
        check_equal(_mine.num_free, _ref.num_free, "num_free after " + _what)
### END HIDDEN TESTS

# %% [markdown] id="c007"
# ## Part B · Block tables (4 points)
#
# A sequence of `n` tokens stores its K/V in `ceil(n / block_size)` blocks; its **block table** lists
# them in order (logical block i -> physical block). Implement `BlockManager(allocator, block_size)`:
#
# * `add_sequence(seq_id, num_tokens)`: a new sequence with a prompt of `num_tokens >= 1` tokens gets
#   `ceil(num_tokens / block_size)` blocks, allocated in order. If fewer blocks are free, raise
#   `OutOfBlocks(needed, free)` **without allocating anything**.
# * `append_token(seq_id)`: one more token. A new block is allocated exactly when the token has nowhere
#   to go: when the current length is a multiple of `block_size`. If no block is free, raise
#   `OutOfBlocks(1, 0)` and change nothing (a scheduler will preempt a sequence and retry).
# * `free(seq_id)`: the sequence is finished; free its blocks **from the last to the first** (so that its
#   tail is recycled first) and forget it.
# * `block_table(seq_id)` (a list, in logical order) and `num_tokens(seq_id)`.
#
# Raise `PagingError` for an unknown `seq_id`, an `add_sequence` with an existing `seq_id`, a
# `num_tokens` that is not an integer >= 1, and a `block_size` that is not a positive integer. Use only
# the allocator's `allocate`, `free`, `incref`, `num_free` and `refcount` (the tests give you the
# course's allocator, so this part does not depend on Part A).

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
check_equal(m.block_table("a"), [0, 1, 2], "block_table('a') after the 9th token: a new block, not earlier")
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
### BEGIN HIDDEN TESTS
from course_lib.paged import BlockManager as _RefM

_own_work(BlockManager, "BlockManager")
_seed = time.time_ns() % 2**32
_rng = random.Random(_seed)
for _trial in range(40):
    _n, _bs = _rng.randint(1, 12), _rng.randint(1, 5)
    _mine, _ref = BlockManager(CourseAllocator(_n), _bs), _RefM(_n, _bs)
    _ids = []
    for _step in range(80):
        _op = _rng.choice(["add", "append", "append", "append", "free"])
        if _op == "add":
            _sid, _len = f"s{_step}", _rng.randint(1, 3 * _bs + 1)
            _what = f"add_sequence({_sid!r}, {_len}) on {_n} blocks of {_bs} (step {_step}, seed {_seed})"
            try:
                _ref.add_sequence(_sid, [0] * _len)
                _mine.add_sequence(_sid, _len)
                _ids.append(_sid)
            except OutOfBlocks:
                check_raises(lambda: _mine.add_sequence(_sid, _len), OutOfBlocks, _what)
        elif _ids:
            _sid = _rng.choice(_ids)
            _what = f"{_op}({_sid!r}) on {_n} blocks of {_bs} (step {_step}, seed {_seed})"
            if _op == "append":
                try:
                    _ref.append(_sid, 0)
                    _mine.append_token(_sid)
                except OutOfBlocks:
                    check_raises(lambda: _mine.append_token(_sid), OutOfBlocks, _what)
            else:
                _ref.free(_sid)
                _mine.free(_sid)
                _ids.remove(_sid)
                check_raises(lambda: _mine.free(_sid), PagingError, "free again after " + _what)
        else:
            continue
        for _s in _ids:
            check_equal(_mine.block_table(_s), _ref.block_table(_s), f"block_table({_s!r}) after {_what}")
            check_equal(_mine.num_tokens(_s), _ref.num_tokens(_s), f"num_tokens({_s!r}) after {_what}")
        check_equal(_mine.allocator.num_free, _ref.num_free_blocks, f"free blocks after {_what}")
### END HIDDEN TESTS

# %% [markdown] id="c010"
# ## Part C · Fork with copy-on-write (3 points)
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
print("Part C: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.paged import BlockManager as _RefM

_own_work(CowBlockManager, "CowBlockManager")
_seed = time.time_ns() % 2**32
_rng = random.Random(_seed)
for _trial in range(40):
    _n, _bs = _rng.randint(2, 14), _rng.randint(1, 5)
    _mine, _ref = CowBlockManager(CourseAllocator(_n), _bs), _RefM(_n, _bs)
    _ids = []
    for _step in range(80):
        _op = _rng.choice(["add", "fork", "fork", "append", "append", "append", "free"])
        if _op == "add":
            _sid, _len = f"s{_step}", _rng.randint(1, 2 * _bs + 1)
            _what = f"add_sequence({_sid!r}, {_len}) (step {_step}, seed {_seed})"
            try:
                _ref.add_sequence(_sid, [0] * _len)
                _mine.add_sequence(_sid, _len)
                _ids.append(_sid)
            except OutOfBlocks:
                continue
        elif not _ids:
            continue
        elif _op == "fork":
            _par, _sid = _rng.choice(_ids), f"s{_step}"
            _what = f"fork({_par!r}, {_sid!r}) (step {_step}, seed {_seed})"
            _ref.fork(_par, _sid)
            _mine.fork(_par, _sid)
            _ids.append(_sid)
        elif _op == "append":
            _sid = _rng.choice(_ids)
            _what = f"append_token({_sid!r}) on {_n} blocks of {_bs} (step {_step}, seed {_seed})"
            try:
                _want = _ref.append(_sid, 0)
            except OutOfBlocks:
                check_raises(lambda: _mine.append_token(_sid), OutOfBlocks, _what)
            else:
                check_equal(_mine.append_token(_sid), _want, "copies returned by " + _what)
        else:
            _sid = _rng.choice(_ids)
            _what = f"free({_sid!r}) (step {_step}, seed {_seed})"
            _ref.free(_sid)
            _mine.free(_sid)
            _ids.remove(_sid)
        for _s in _ids:
            check_equal(_mine.block_table(_s), _ref.block_table(_s), f"block_table({_s!r}) after {_what}")
        check_equal(list(_mine.allocator.refcount), list(_ref.allocator.refcount), f"refcounts after {_what}")
### END HIDDEN TESTS
