"""Property tests (hypothesis): random operation sequences on the allocator and the block manager keep
every invariant: refcount == number of tables using a block, free list == blocks with refcount 0, counts
never negative, a shared block always has the same preceding tokens in every sequence using it
(chained hashes + verification), each table holds exactly ceil(len / block_size) blocks whose recorded tokens are the
sequence's tokens (so copy-on-write and prefix caching never mix up contents), and failed operations
(OutOfBlocks, PagingError) change nothing."""
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule  # noqa: E402

from course_lib.paged import BlockAllocator, BlockManager, OutOfBlocks, PagingError  # noqa: E402

SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class AllocatorMachine(RuleBasedStateMachine):
    """The allocator against a dict of expected reference counts."""

    def __init__(self):
        super().__init__()
        self.a = BlockAllocator(6)
        self.refs = {}

    @rule()
    def allocate(self):
        if len(self.refs) == 6:
            with pytest.raises(OutOfBlocks):
                self.a.allocate()
        else:
            b = self.a.allocate()
            assert b not in self.refs, f"block {b} handed out twice"
            self.refs[b] = 1

    @rule(data=st.data())
    def incref(self, data):
        if self.refs:
            b = data.draw(st.sampled_from(sorted(self.refs)))
            self.a.incref(b)
            self.refs[b] += 1

    @rule(data=st.data())
    def free(self, data):
        if self.refs:
            b = data.draw(st.sampled_from(sorted(self.refs)))
            self.a.free(b)
            self.refs[b] -= 1
            if self.refs[b] == 0:
                del self.refs[b]

    @rule(b=st.integers(-2, 8))
    def free_unowned(self, b):
        if b not in self.refs:
            with pytest.raises(PagingError):
                self.a.free(b)

    @invariant()
    def consistent(self):
        for b in range(6):
            assert self.a.refcount[b] == self.refs.get(b, 0) >= 0
        assert set(self.a.free_blocks()) == set(range(6)) - set(self.refs)
        assert self.a.num_free + len(self.refs) == 6


TestAllocator = AllocatorMachine.TestCase
TestAllocator.settings = SETTINGS

TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=9)   # tiny vocabulary: prefixes repeat


class ManagerMachine(RuleBasedStateMachine):
    """The block manager against a plain dict of each sequence's tokens."""
    seqs = Bundle("seqs")

    @initialize(block_size=st.integers(1, 4), num_blocks=st.integers(1, 14), prefix=st.booleans(),
                weak_hash=st.booleans())
    def setup(self, block_size, num_blocks, prefix, weak_hash):
        hash_fn = (lambda prev, toks: sum(toks) % 3) if weak_hash else None   # forces collisions
        self.m = BlockManager(num_blocks, block_size, prefix_caching=prefix, hash_fn=hash_fn)
        self.model = {}
        self.next_id = 0
        self.provenance = {}   # (block, generation) -> tokens before the block: the context its KV saw

    def _snapshot(self):
        return (self.m.num_free_blocks, {s: (self.m.tokens(s), self.m.block_table(s)) for s in self.model},
                list(self.m.allocator.refcount))

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    @rule(target=seqs, tokens=TOKENS, shared=st.booleans(), data=st.data())
    def add(self, tokens, shared, data):
        if shared and self.model:                       # reuse another sequence's start: prefix hits
            other = data.draw(st.sampled_from(sorted(self.model)))
            tokens = self.model[other][:data.draw(st.integers(1, len(self.model[other])))] + tokens
        sid = self._new_id()
        before = self._snapshot()
        try:
            cached = self.m.add_sequence(sid, tokens)
        except OutOfBlocks:
            assert self._snapshot() == before
            return hypothesis.stateful.multiple()
        assert 0 <= cached < len(tokens) and cached % self.m.block_size == 0
        self.model[sid] = list(tokens)
        return sid

    @rule(sid=seqs, token=st.integers(0, 2))
    def append(self, sid, token):
        if sid not in self.model:
            with pytest.raises(PagingError):
                self.m.append(sid, token)
            return
        before = self._snapshot()
        need = self.m.blocks_needed(sid, 1)
        try:
            copies = self.m.append(sid, token)
        except OutOfBlocks:
            assert need > self.m.num_free_blocks and self._snapshot() == before
            return
        assert len(copies) <= 1
        assert before[0] - self.m.num_free_blocks == need    # blocks_needed predicted it
        self.model[sid].append(token)

    @rule(sid=seqs, tokens=TOKENS)
    def append_many(self, sid, tokens):
        if sid not in self.model:
            return
        before = self._snapshot()
        try:
            self.m.append_tokens(sid, tokens)
        except OutOfBlocks:
            assert self._snapshot() == before
            return
        self.model[sid] += tokens

    @rule(target=seqs, sid=seqs)
    def fork(self, sid):
        if sid not in self.model:
            return hypothesis.stateful.multiple()
        child = self._new_id()
        used = self.m.num_used_blocks
        self.m.fork(sid, child)
        assert self.m.num_used_blocks == used               # forking allocates nothing
        self.model[child] = list(self.model[sid])
        return child

    @rule(sid=consumes(seqs))
    def free(self, sid):
        if sid in self.model:
            self.m.free(sid)
            del self.model[sid]
        with pytest.raises(PagingError):
            self.m.free(sid)                                # double free / unknown

    @rule(n=st.integers(-3, -1))
    def negative_lengths(self, n):
        if self.model:
            with pytest.raises(PagingError):
                self.m.blocks_needed(next(iter(self.model)), n)

    @invariant()
    def consistent(self):
        if not hasattr(self, "m"):
            return
        self.m.check_invariants()
        assert set(self.m.seqs) == set(self.model)
        bs = self.m.block_size
        for sid, toks in self.model.items():
            assert self.m.tokens(sid) == toks
            # A physical block's KV depends on every token before it: all sequences that use one
            # (same allocation generation, through fork or a prefix-cache hit) must agree on that context.
            for i, b in enumerate(self.m.block_table(sid)):
                key, before = (b, self.m.generation[b]), tuple(toks[:i * bs])
                assert self.provenance.setdefault(key, before) == before, \
                    f"block {b} reused under another prefix: {self.provenance[key]} vs {before}"
        assert all(r >= 0 for r in self.m.allocator.refcount)


TestManager = ManagerMachine.TestCase
TestManager.settings = SETTINGS
