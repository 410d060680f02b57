"""Lab 06's judge: the allocator and block tables driven by op scripts, paged attention on drawn pools.

Parts A, B and D are stateful: each trial is one script of operations sent to the kernel at once; the script's
results (every value, every exception's class) come back and are compared step by step with the course's
reference run on the same script here. Part B's manager and Part D's copy-on-write manager get the course's
allocator as a stand-in (`Trial.remote`): the allocator lives in the grader, so Part B is judged on the
reference allocator, not on the student's Part A, and its code never enters the kernel. Part D is judged on
its sharing structure: block numbers are compared up to a renaming (`canonical`), so an order of allocation
that Part B chose (e.g. its free order, which Part B is charged for) is not charged again. Part C's prediction
(the expected empty slots and the pool's waste fraction for a mix of length ranges) is judged on an edge grid and
drawn mixes against an enumeration of every length here, not the cycle argument of the solution.
"""

import torch

from course_grading.judging import Get, Judge, Let, call, ref
from course_lib.checks import check_close, check_equal
from course_lib.paged import BlockAllocator as RefAllocator
from course_lib.paged import BlockManager as RefManager
from course_lib.paged import OutOfBlocks, PagingError, contiguous_to_paged, paged_attention_reference

judge = Judge(references={
    "allocator_tests": ["course_lib.paged.allocator.BlockAllocator"],
    "blocks_tests": ["course_lib.paged.manager.BlockManager"],
    "cow_tests": ["course_lib.paged.manager.BlockManager"],
    "paged_tests": ["course_lib.paged.attention.paged_attention_reference",
                    "course_lib.paged.attention.paged_attention",
                    "course_lib.paged.attention.paged_attention_torch"],
})

ALLOCATOR_API = (["num_free", "refcount"], ["allocate", "free", "incref"])


def outcome_text(o) -> str:
    """What one op gave, as compared: its value, or the class of its exception."""
    if o.raised is not None:
        kind = "OutOfBlocks" if o.raised.is_a("OutOfBlocks") else "PagingError" if o.raised.is_a("PagingError") \
            else o.raised.type
        return f"raises {kind}"
    if o.error is not None:
        return f"(could not be read: {o.error})"
    return repr(o.value)


def expected_text(fn) -> tuple[str, object]:
    try:
        v = fn()
    except OutOfBlocks:
        return "raises OutOfBlocks", None
    except PagingError:
        return "raises PagingError", None
    return repr(v), v


def as_list(v):
    return list(v) if isinstance(v, (list, tuple)) or hasattr(v, "tolist") else v


# ---------------------------------------------------------------------------------------------------
# Part A

@judge.part("allocator_tests", groups={"scripts": 3, "errors": 1})
def allocator(t):
    for trial in range(30):
        n = t.rng.randint(1, 8)
        steps = []
        for _ in range(50):
            op = t.rng.choice(["allocate", "allocate", "free", "free", "incref", "bad"])
            steps.append((op, t.rng.randrange(-1, n + 1) if op == "bad" else t.rng.randrange(n)))
        ops = [call("BlockAllocator", n, store="a", send=False)]
        for op, b in steps:
            method = "incref" if op == "incref" else "free"
            ops.append(call("$a.allocate") if op == "allocate" else call(f"$a.{method}", b))
            ops += [Get("$a.refcount"), Get("$a.num_free")]
        with t.case(f"script {trial + 1}: 50 operations on BlockAllocator({n})", group="scripts"):
            got = t.run(ops)
            got[0].get()
            ra = RefAllocator(n)
            for k, (op, b) in enumerate(steps):
                what = (f"{op if op != 'bad' else 'free'}({'' if op == 'allocate' else b}) "
                        f"at step {k} of BlockAllocator({n})")
                fn = {"allocate": ra.allocate, "incref": lambda: ra.incref(b)}.get(op, lambda: ra.free(b))
                want, _ = expected_text(fn)
                o, rc, nf = got[1 + 3 * k: 4 + 3 * k]
                t.expect(outcome_text(o) == want, f"{what}: expected {want}, got {outcome_text(o)}")
                check_equal(as_list(rc.get()), list(ra.refcount), f"refcount after {what}")
                check_equal(nf.get(), ra.num_free, f"num_free after {what}")
    errors = [("BlockAllocator(0)", [call("BlockAllocator", 0)], "PagingError"),
              ("BlockAllocator(-2)", [call("BlockAllocator", -2)], "PagingError"),
              ("BlockAllocator(2.5)", [call("BlockAllocator", 2.5)], "PagingError"),
              ("allocate() with no free block", [call("BlockAllocator", 1, store="e", send=False),
                                                 call("$e.allocate"), call("$e.allocate")], "OutOfBlocks"),
              ("double free", [call("BlockAllocator", 2, store="e", send=False), call("$e.allocate"),
                               call("$e.free", 0), call("$e.free", 0)], "PagingError"),
              ("free of a block never allocated", [call("BlockAllocator", 3, store="e", send=False),
                                                   call("$e.free", 1)], "PagingError")]
    for b in (-1, 3, 1.0, True, "0"):
        errors.append((f"free({b!r}) on 3 blocks (unknown block)", [call("BlockAllocator", 3, store="e", send=False),
                                                                     call("$e.allocate"), call("$e.free", b)],
                                                                     "PagingError"))
    errors.append(("incref of a free block", [call("BlockAllocator", 3, store="e", send=False), call("$e.incref", 2)],
                   "PagingError"))
    for what, ops, exc in errors:
        with t.case(what, group="errors"):
            t.raises(t.run(ops)[-1], exc, what=what)


# ---------------------------------------------------------------------------------------------------
# Part B and D: a model of the contract with the known mistakes planted, for the misconceptions

class Planted:
    """The lab's BlockManager contract with a planted mistake (`late`: a block one token late;
    `forward_free`: blocks given back first to last), on an allocator of the course's."""

    def __init__(self, num_blocks, block_size, late=False, forward_free=False):
        self.allocator, self.bs = RefAllocator(num_blocks), block_size
        self.late, self.forward_free = late, forward_free
        self.tables, self.lengths = {}, {}

    def add_sequence(self, sid, n):
        need = -(-n // self.bs)
        if need > self.allocator.num_free:
            raise OutOfBlocks(need, self.allocator.num_free)
        self.tables[sid] = [self.allocator.allocate() for _ in range(need)]
        self.lengths[sid] = n

    def append(self, sid):
        n, table = self.lengths[sid], self.tables[sid]
        full = n > self.bs * len(table) if self.late else n % self.bs == 0
        if full:
            if self.allocator.num_free == 0:
                raise OutOfBlocks(1, 0)
            table.append(self.allocator.allocate())
        self.lengths[sid] = n + 1

    def free(self, sid):
        for b in (self.tables[sid] if self.forward_free else reversed(self.tables[sid])):
            self.allocator.free(b)
        del self.tables[sid], self.lengths[sid]


def manager_script(t, n, bs, steps_count, allow_free=True):
    """[(op, sid, length)] of one random trial on n blocks of bs."""
    steps, ids, k = [], [], 0
    for step in range(steps_count):
        op = t.rng.choice(["add", "append", "append", "append"] + (["free"] if allow_free else []))
        if op == "add" or not ids:
            sid = f"s{k}"
            k += 1
            steps.append(("add", sid, t.rng.randint(1, 3 * bs + 1)))
            ids.append(sid)
        elif op == "append":
            steps.append(("append", t.rng.choice(ids), None))
        else:
            sid = t.rng.choice(ids)
            steps.append(("free", sid, None))
            ids.remove(sid)
    return steps


def play(target, steps):
    """Run the steps on a reference-shaped manager (`RefManager` or `Planted`): per step, the outcome text and the
    tables and lengths after it (a sequence whose add failed is not live)."""
    out, live = [], []
    for op, sid, n in steps:
        try:
            if op == "add":
                if isinstance(target, RefManager):
                    target.add_sequence(sid, [0] * n)
                else:
                    target.add_sequence(sid, n)
                live.append(sid)
            elif op == "append":
                if sid not in live:
                    out.append(("skip", {}, {}))
                    continue
                target.append(sid, 0) if isinstance(target, RefManager) else target.append(sid)
            else:
                if sid not in live:
                    out.append(("skip", {}, {}))
                    continue
                target.free(sid)
                live.remove(sid)
            what = "None"
        except OutOfBlocks:
            what = "raises OutOfBlocks"
        tables = {s: (target.block_table(s) if isinstance(target,
                                                          RefManager) else list(target.tables[s])) for s in live}
        lengths = {s: (target.num_tokens(s) if isinstance(target, RefManager) else target.lengths[s]) for s in live}
        out.append((what, tables, lengths))
    return out


def student_ops(steps, plan, cls):
    """The kernel's script: the manager, then each step and, after it, every live table and length."""
    ops, index = [], []
    for (op, sid, n), (_, tables, _) in zip(steps, plan):
        if op == "add":
            ops.append(call("$m.add_sequence", sid, n))
        elif op == "append":
            ops.append(call("$m.append_token", sid))
        else:
            ops.append(call("$m.free", sid))
        reads = []
        for s in tables:
            reads.append(s)
            ops += [call("$m.block_table", s), call("$m.num_tokens", s)]
        index.append(reads)
    return ops, index


@judge.part("blocks_tests", groups={"scripts": 3, "errors": 1})
def blocks(t):
    for trial in range(16):
        n, bs = t.rng.randint(1, 12), t.rng.randint(1, 5)
        steps = manager_script(t, n, bs, 40)
        steps = [s for s, p in zip(steps, play(RefManager(n, bs), steps)) if p[0] != "skip"]
        plan = play(RefManager(n, bs), steps)
        late, forward = play(Planted(n, bs, late=True), steps), play(Planted(n, bs, forward_free=True), steps)
        body, index = student_ops(steps, plan, "BlockManager")
        ops = [Let("alloc", t.remote("alloc", RefAllocator(n), *ALLOCATOR_API)),
               call("BlockManager", ref("alloc"), bs, store="m", send=False)] + body + [Get("$alloc.num_free")]
        with t.case(f"script {trial + 1}: {len(steps)} operations on {n} blocks of {bs} tokens", group="scripts"):
            got = t.run(ops)
            got[1].get()
            pos = 2
            for k, ((op, sid, length), p) in enumerate(zip(steps, plan)):
                what = (f"add_sequence({sid!r}, {length})" if op == "add" else
                        f"{'append_token' if op == 'append' else 'free'}({sid!r})") + \
                    f" at step {k} on {n} blocks of {bs}"
                o = got[pos]
                pos += 1
                if p[0] == "raises OutOfBlocks":
                    t.raises(o, "OutOfBlocks", what=what)
                else:
                    t.expect(o.ok, f"{what}: expected it to succeed, got {outcome_text(o)}")
                for s in index[k]:
                    table, length = got[pos].get(), got[pos + 1].get()
                    pos += 2
                    mistakes = {}
                    for key, other in (("late_block", late[k]), ("free_order", forward[k])):
                        if other[1].get(s) is not None and other[1][s] != p[1][s]:
                            mistakes[t.mistake(key)] = other[1][s]
                    check_equal(as_list(table), p[1][s], f"block_table({s!r}) after {what}", mistakes=mistakes)
                    check_equal(length, p[2][s], f"num_tokens({s!r}) after {what}")
            held = sum(len(v) for v in plan[-1][1].values()) if plan else 0
            check_equal(got[pos].get(), n - held, "free blocks at the end of the script (every finished sequence's "
                                                  "blocks given back)")
    errors = [("add_sequence of an existing id", [call("$m.add_sequence", "a", 2), call("$m.add_sequence", "a", 2)],
               "PagingError"),
              ("add_sequence with 0 tokens", [call("$m.add_sequence", "a", 0)], "PagingError"),
              ("add_sequence with 2.5 tokens", [call("$m.add_sequence", "a", 2.5)], "PagingError"),
              ("append_token of an unknown sequence", [call("$m.append_token", "zz")], "PagingError"),
              ("free of an unknown sequence", [call("$m.free", "zz")], "PagingError"),
              ("free twice", [call("$m.add_sequence", "a", 2), call("$m.free", "a"), call("$m.free", "a")],
               "PagingError"),
              ("block_table of an unknown sequence", [call("$m.block_table", "zz")], "PagingError"),
              ("add_sequence needing more blocks than are free", [call("$m.add_sequence", "a", 9)], "OutOfBlocks")]
    for what, body, exc in errors:
        with t.case(what, group="errors"):
            ops = [Let("alloc", t.remote("alloc", RefAllocator(2), *ALLOCATOR_API)),
                   call("BlockManager", ref("alloc"), 4, store="m", send=False)] + body
            t.raises(t.run(ops)[-1], exc, what=what)
    for bs in (0, -1, 1.5):
        with t.case(f"BlockManager(allocator, block_size={bs})", group="errors"):
            t.raises(t.run([Let("alloc", t.remote("alloc", RefAllocator(2), *ALLOCATOR_API)),
                            call("BlockManager", ref("alloc"), bs)])[-1], "PagingError",
                     what=f"BlockManager(allocator, block_size={bs})")
    # all or nothing: a failed add_sequence or append_token changes nothing
    with t.case("a failed add_sequence and append_token change nothing", group="errors"):
        alloc = RefAllocator(3)
        got = t.run([Let("alloc", t.remote("alloc", alloc, *ALLOCATOR_API)),
                     call("BlockManager", ref("alloc"), 2, store="m", send=False),
                     call("$m.add_sequence", "a", 4), call("$m.add_sequence", "b", 4), Get("$alloc.num_free"),
                     call("$m.add_sequence", "c", 2), call("$m.append_token", "c"), call("$m.append_token", "c"),
                     Get("$alloc.num_free"), call("$m.num_tokens", "c"), call("$m.block_table", "c")])
        t.raises(got[3], "OutOfBlocks", what="add_sequence('b', 4) with 1 free block of 2")
        check_equal(got[4].get(), 1, "free blocks after the failed add_sequence")
        t.raises(got[7], "OutOfBlocks", what="append_token('c') past the last free block")
        check_equal((got[8].get(), got[9].get(), as_list(got[10].get())), (0, 2, [2]),
                    "(free blocks, num_tokens('c'), block_table('c')) after the failed append_token")


def waste_slots(n: int, bs: int) -> int:
    """The empty slots of a sequence of n tokens: its ceil(n / bs) blocks hold ceil(n / bs) * bs slots."""
    return -(-n // bs) * bs - n


def waste_full_block(n: int, bs: int) -> int:
    """The planted off-by-one: a length that fills its last block counted with a whole empty block."""
    return bs - n % bs


def mix_by_enumeration(mix, bs, waste=waste_slots):
    """Every length of every kind, one by one (no cycle argument, unlike the solution): (E[empty slots],
    E[tokens], E[empty / allocated] (the mean of each sequence's own fraction, a planted mistake))."""
    empty = tokens = ratio = 0.0
    for w, lo, hi in mix:
        wastes = [(n, waste(n, bs)) for n in range(lo, hi + 1)]
        empty += w * sum(x for _, x in wastes) / len(wastes)
        tokens += w * sum(n for n, _ in wastes) / len(wastes)
        ratio += w * sum(x / (n + x) for n, x in wastes) / len(wastes)
    return empty, tokens, ratio


def draw_mix(t, bs):
    """1 to 3 kinds of requests, each a range of lengths: a single length, a range narrower than a block (a
    templated request), or a wide one (chat turns, documents); weights that add up to 1."""
    kinds = []
    for _ in range(t.rng.randint(1, 3)):
        lo = t.rng.choice([t.rng.randint(1, 300), t.rng.randint(1, 4000), t.rng.randint(1, 40) * bs])
        hi = lo + t.rng.choice([0, t.rng.randint(1, bs), t.rng.randint(1, 3000)])
        kinds.append([t.rng.randint(1, 9), lo, hi])
    total = sum(k[0] for k in kinds)
    return [(w / total, lo, hi) for w, lo, hi in kinds]


@judge.part("predict_waste_tests")
def predict_waste(t):
    grid = [([(1.0, 1, 100)], 1), ([(0.7, 5, 9), (0.3, 1000, 1003)], 1), ([(1.0, 1, 1)], 1),   # blocks of 1
            ([(1.0, 64, 64)], 16), ([(1.0, 65, 65)], 16), ([(1.0, 63, 63)], 16), ([(1.0, 7, 7)], 7),
            ([(0.5, 32, 32), (0.5, 256, 256)], 16),                                # multiples of the block only
            ([(1.0, 1, 128)], 16), ([(1.0, 17, 20)], 16), ([(1.0, 1, 3)], 256),    # whole cycles; narrow; tiny
            ([(0.8, 20, 300), (0.2, 1500, 4000)], 16), ([(0.5, 129, 136), (0.5, 20, 300)], 16),
            ([(0.5, 129, 136), (0.3, 20, 300), (0.2, 1500, 4000)], 64)]
    for _ in range(26):
        bs = t.rng.choice([1, 2, 3, 4, 8, 16, 32, 64, 128, 256])
        grid.append((draw_mix(t, bs), bs))
    items = []
    for mix, bs in grid:
        empty, tokens, ratio = mix_by_enumeration(mix, bs)
        off, _, _ = mix_by_enumeration(mix, bs, waste_full_block)
        thumb = (bs - 1) / 2
        what = f"predict_paged_waste({[tuple(round(x, 4) for x in k) for k in mix]}, {bs})"

        def check(got, what=what, empty=empty, tokens=tokens, ratio=ratio, off=off, thumb=thumb):
            t.expect(isinstance(got, (list, tuple)) and len(got) == 2,
                     f"{what}: expected a pair (empty_slots, waste_fraction), got {got!r}")
            check_close(got[0], empty, f"{what}: expected empty slots per sequence", rtol=1e-6, atol=1e-9,
                        mistakes={t.mistake("waste_uniform_tail"): thumb, t.mistake("waste_full_block"): off})
            check_close(got[1], empty / (tokens + empty), f"{what}: waste fraction of the pool", rtol=1e-6, atol=1e-12,
                        mistakes={t.mistake("waste_mean_of_ratios"): ratio})
        items.append((what, "main", call("predict_paged_waste", [tuple(k) for k in mix], bs), check))
    t.batch(items)


# ---------------------------------------------------------------------------------------------------
# Part D

def canonical(tables: dict, order: list) -> tuple[list, dict]:
    """The tables with the physical blocks renamed 0, 1, 2, ... in order of first appearance (sequences in
    `order`): two managers that share blocks alike give the same canonical tables whatever numbers their
    allocations took. Also the renaming."""
    names: dict = {}
    out = []
    for s in order:
        row = []
        for b in tables[s]:
            names.setdefault(b, len(names))
            row.append(names[b])
        out.append(row)
    return out, names


@judge.part("cow_tests", groups={"scripts": 3, "errors": 1})
def cow(t):
    for trial in range(14):
        n, bs = t.rng.randint(24, 40), t.rng.randint(1, 5)
        rm = RefManager(n, bs)
        steps, live, k = [], [], 0
        for _ in range(40):
            op = t.rng.choice(["add", "fork", "fork", "append", "append", "append", "free"])
            if op == "add" or not live:
                sid, length = f"s{k}", t.rng.randint(1, 2 * bs + 1)
                k += 1
                if rm.num_free_blocks < -(-length // bs) + 2:
                    continue
                rm.add_sequence(sid, [0] * length)
                steps.append(("add", sid, length))
                live.append(sid)
            elif op == "fork":
                par, sid = t.rng.choice(live), f"s{k}"
                k += 1
                rm.fork(par, sid)
                steps.append(("fork", par, sid))
                live.append(sid)
            elif op == "append":
                sid = t.rng.choice(live)
                if rm.num_free_blocks < 2:
                    continue
                steps.append(("append", sid, rm.append(sid, 0)))
            else:
                sid = t.rng.choice(live)
                rm.free(sid)
                live.remove(sid)
                steps.append(("free", sid, None))
        # the expected state after each step, from the reference replayed
        rm, live, expect = RefManager(n, bs), [], []
        for op, a, b in steps:
            if op == "add":
                rm.add_sequence(a, [0] * b)
                live.append(a)
                copies = None
            elif op == "fork":
                rm.fork(a, b)
                live.append(b)
                copies = None
            elif op == "append":
                copies = rm.append(a, 0)
            else:
                rm.free(a)
                live.remove(a)
                copies = None
            tables = {s: rm.block_table(s) for s in live}
            canon, names = canonical(tables, live)
            refs = sorted((names[blk], rm.refcount(blk)) for blk in names)
            expect.append((list(live), canon, refs, rm.num_free_blocks,
                           [(names.get(o), names.get(nw)) for o, nw in (copies or [])] if copies is not None else None))
        alloc = RefAllocator(n)
        ops = [Let("alloc", t.remote("alloc", alloc, *ALLOCATOR_API)),
               call("CowBlockManager", ref("alloc"), bs, store="m", send=False)]
        index = []
        for (op, a, b), (live_after, *_rest) in zip(steps, expect):
            start = len(ops)
            if op == "add":
                ops.append(call("$m.add_sequence", a, b))
            elif op == "fork":
                ops.append(call("$m.fork", a, b))
            elif op == "append":
                ops.append(call("$m.append_token", a))
            else:
                ops.append(call("$m.free", a))
            for s in live_after:
                ops.append(call("$m.block_table", s))
            ops += [Get("$alloc.refcount"), Get("$alloc.num_free")]
            index.append(start)
        with t.case(f"script {trial + 1}: {len(steps)} adds, forks, appends and frees on {n} blocks of {bs}",
                    group="scripts"):
            got = t.run(ops)
            got[1].get()
            for k, ((op, a, b), (live_after, canon, refs, free, copies)) in enumerate(zip(steps, expect)):
                what = (f"fork({a!r}, {b!r})" if op == "fork" else f"add_sequence({a!r}, {b})" if op == "add"
                        else f"{'append_token' if op == 'append' else 'free'}({a!r})") + f" at step {k}"
                i = index[k]
                result = got[i].get()
                tables = {s: as_list(got[i + 1 + j].get()) for j, s in enumerate(live_after)}
                refcount, nfree = as_list(got[i + 1 + len(live_after)].get()), got[i + 2 + len(live_after)].get()
                mine, names = canonical(tables, live_after)
                t.expect(mine == canon, f"{what}: the tables share blocks differently than they should (blocks renamed "
                                        f"in order of first use: expected {canon}, got {mine})")
                check_equal(sorted((names[blk], refcount[blk]) for blk in names), refs,
                            f"reference counts of the blocks in use after {what} (renamed as above)")
                check_equal(nfree, free, f"free blocks after {what}")
                if copies is not None:
                    t.expect(isinstance(result, (list, tuple)), f"{what}: expected the list of copies, got {result!r}")
                    got_copies = [(None, names.get(nw)) for _, nw in result]   # the old block is gone from the tables
                    check_equal(got_copies, [(None, nw) for _, nw in copies], f"copies returned by {what}")
    for what, body, exc in [("fork of an unknown parent", [call("$m.fork", "nope", "x")], "PagingError"),
                            ("fork into an existing child", [call("$m.add_sequence", "p", 3),
                                                             call("$m.add_sequence", "c", 1),
                                                             call("$m.fork", "p", "c")], "PagingError"),
                            ("copy-on-write with no free block", [call("$m.add_sequence", "p", 3), call("$m.fork",
                                                                                                        "p", "c"),
                                                                  call("$m.add_sequence", "q", 8),
                                                                  call("$m.append_token", "c")], "OutOfBlocks")]:
        with t.case(what, group="errors"):
            t.raises(t.run([Let("alloc", t.remote("alloc", RefAllocator(3), *ALLOCATOR_API)),
                            call("CowBlockManager", ref("alloc"), 4, store="m", send=False)] + body)[-1], exc,
                            what=what)
    with t.case("a failed copy-on-write changes nothing", group="errors"):
        got = t.run([Let("alloc", t.remote("alloc", RefAllocator(2), *ALLOCATOR_API)),
                     call("CowBlockManager", ref("alloc"), 4, store="m", send=False),
                     call("$m.add_sequence", "p", 3), call("$m.fork", "p", "c"), call("$m.add_sequence", "q", 2),
                     call("$m.append_token", "c"), call("$m.block_table", "c"), call("$m.num_tokens", "c"),
                     Get("$alloc.refcount")])
        t.raises(got[5], "OutOfBlocks", what="append_token('c') with the partial block shared and no free block")
        check_equal((as_list(got[6].get()), got[7].get(), as_list(got[8].get())), ([0], 3, [2, 1]),
                    "(block_table('c'), num_tokens('c'), refcounts) after the failed copy-on-write")


# ---------------------------------------------------------------------------------------------------
# Part E

def paged_case(t, lengths, H, Hkv, d, bs, extra_blocks=3):
    """Random K/V scattered into a shuffled pool, stale values where no sequence owns a slot, -1 past each row's
    used table entries (the lab's visible `_paged_case`, drawn here)."""
    g = t.torch_generator()
    B = len(lengths)
    k, v = (torch.randn(B, Hkv, max(max(lengths), 1), d, generator=g) for _ in range(2))
    need = sum(-(-n // bs) for n in lengths)
    k_pool, v_pool, tables, lens = contiguous_to_paged(k, v, lengths, bs, num_blocks=need + extra_blocks, generator=g)
    owned = torch.zeros(k_pool.shape[0], bs, dtype=torch.bool)
    tables = tables.long()
    for b, n in enumerate(lengths):
        nb = -(-n // bs)
        for i in range(nb):
            owned[tables[b, i], : min(bs, n - i * bs)] = True
        tables[b, nb:] = -1
    stale = ~owned[:, None, :, None].expand_as(k_pool)
    k_pool[stale] = 3 * torch.randn(int(stale.sum()), generator=g)
    v_pool[stale] = 3 * torch.randn(int(stale.sum()), generator=g)
    return torch.randn(B, H, d, generator=g), k_pool, v_pool, tables, lens


def gqa_modulo(q, k_pool, v_pool, tables, lens):
    """The planted mistake: query head h reads KV head h % Hkv (not h // G). The reference computes head j
    against KV head j // G; putting query head h at j(h) = (h % Hkv) * G + h // Hkv gives it KV head h % Hkv."""
    H, Hkv = q.shape[1], k_pool.shape[1]
    G = H // Hkv
    j = torch.tensor([(h % Hkv) * G + h // Hkv for h in range(H)])
    moved = torch.empty_like(q)
    moved[:, j] = q
    return paged_attention_reference(moved, k_pool, v_pool, tables.clamp(min=0), lens)[:, j]


@judge.part("paged_tests", groups={"values": 3, "errors": 1})
def paged(t):
    shapes = [([6], 1, 1, 2, 4), ([0, 1, 4, 5], 4, 2, 8, 4), ([16, 17], 6, 3, 4, 16), ([3], 2, 2, 1, 1),
              ([8, 0], 8, 2, 16, 8)]
    for _ in range(12):
        bs, Hkv, G, d = t.rng.randint(1, 8), t.rng.randint(1, 3), t.rng.randint(1, 3), t.rng.randint(1, 16)
        lens = [t.rng.choice([0, bs, 2 * bs, t.rng.randint(1, 40)]) for _ in range(t.rng.randint(1, 4))]
        shapes.append((lens, Hkv * G, Hkv, d, bs))
    for lens, H, Hkv, d, bs in shapes:
        q, kp, vp, tables, cl = paged_case(t, lens, H, Hkv, d, bs, extra_blocks=t.rng.randint(0, 6))
        whole = (cl + bs - 1) // bs * bs
        mistakes = {t.mistake("stale_tail"): paged_attention_reference(q, kp, vp, tables.clamp(min=0), whole)}
        if H != Hkv and Hkv > 1:
            mistakes[t.mistake("gqa_modulo")] = gqa_modulo(q, kp, vp, tables, cl)
        what = f"paged_attention: lengths {lens}, block_size {bs}, {H} query heads over {Hkv} KV heads, d={d}"
        with t.case(what, group="values"):
            got = t.call("paged_attention", q, kp, vp, tables, cl)
            t.expect(getattr(got, "shape", None) == q.shape, f"{what}: expected shape {tuple(q.shape)}, got "
                                                                f"{tuple(getattr(got, 'shape', ()))}")
            check_close(got, paged_attention_reference(q, kp, vp, tables, cl), what, rtol=1e-5, atol=1e-5,
                        mistakes=mistakes)
    q, kp, vp, tables, cl = paged_case(t, [9, 4], 4, 2, 8, 4)
    bad_entry = tables.clone()
    bad_entry[0, 1] = kp.shape[0] + 3
    minus_one = tables.clone()
    minus_one[0, 2] = -1
    errors = [("3 query heads over 2 KV heads", (q[:, :3], kp, vp, tables, cl)),
              ("q of 2 dimensions", (q[:, 0], kp, vp, tables, cl)),
              ("k_pool and v_pool of different shapes", (q, kp, vp[:, :, :2], tables, cl)),
              ("a head dim other than q's", (q[..., :4], kp, vp, tables, cl)),
              ("block_tables with 1 row for 2 sequences", (q, kp, vp, tables[:1], cl)),
              ("context_lens of 3 entries for 2 sequences", (q, kp, vp, tables, torch.tensor([9, 4, 1]))),
              ("context_lens [9, 13] with tables of 3 blocks of 4", (q, kp, vp, tables, torch.tensor([9, 13]))),
              ("a negative context length", (q, kp, vp, tables, torch.tensor([-1, 4]))),
              ("a used table entry outside the pool", (q, kp, vp, bad_entry, cl)),
              ("a used table entry of -1", (q, kp, vp, minus_one, cl))]
    for what, args in errors:
        with t.case(what, group="errors"):
            t.raises(t.outcome("paged_attention", *args), "ValueError", what=f"paged_attention with {what}")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("a new block one token late; and the predicted waste counts a whole empty block for a length that fills "
         "its blocks",
         {"blocks_answer": solution_with("lab06", "blocks_answer", {
             "        if self.lengths[seq_id] % self.block_size == 0:":
             "        if self.lengths[seq_id] > self.block_size * len(self.tables[seq_id]):"}),
          "predict_waste": solution_with("lab06", "predict_waste", {
              "block_size * (block_size - 1) // 2": "block_size * (block_size + 1) // 2",
              "sum(-n % block_size for n": "sum(block_size - n % block_size for n"})},
         ["late_block", "waste_full_block"]),
        ("the predicted waste applies the rule of thumb, (block_size - 1) / 2 slots, whatever the lengths",
         {"predict_waste": solution_with("lab06", "predict_waste", {
             "        empty += weight * (cycles * per_cycle + "
             "sum(-n % block_size for n in range(lo, lo + rest))) / count":
             "        empty += weight * (block_size - 1) / 2"})},
         ["waste_uniform_tail"]),
        ("the predicted waste fraction is the mean of each sequence's own fraction",
         {"predict_waste": "def predict_paged_waste(mix, block_size):\n"
                           "    empty = fraction = 0.0\n"
                           "    for weight, lo, hi in mix:\n"
                           "        wastes = [(n, -n % block_size) for n in range(lo, hi + 1)]\n"
                           "        empty += weight * sum(w for _, w in wastes) / len(wastes)\n"
                           "        fraction += weight * sum(w / (n + w) for n, w in wastes) / len(wastes)\n"
                           "    return empty, fraction\n"},
         ["waste_mean_of_ratios"]),
        ("free gives the blocks back first to last (Part B); copy-on-write unchanged, so Part D is not charged again",
         {"blocks_answer": solution_with("lab06", "blocks_answer", {
             "        for b in reversed(self.tables[seq_id]):": "        for b in self.tables[seq_id]:"})},
         ["free_order"]),
        ("paged attention reads the whole last block (slots past the length not masked)",
         {"paged_answer": solution_with("lab06", "paged_answer", {
             ".reshape(Hkv, -1, d)[:, :n]      # [Hkv, n, d], tokens in order": ".reshape(Hkv, -1, d)",
             "        v = v_pool[idx].permute(1, 0, 2, 3).reshape(Hkv, -1, d)[:, :n]":
             "        v = v_pool[idx].permute(1, 0, 2, 3).reshape(Hkv, -1, d)"})},
         ["stale_tail"]),
        ("query head h reads KV head h % Hkv (grouped-query heads interleaved instead of grouped)",
         {"paged_answer": solution_with("lab06", "paged_answer", {
             "        s = q[b].reshape(Hkv, G, d) @ k.transpose(-1, -2) / math.sqrt(d)    # [Hkv, G, n]\n"
             "        out[b] = (s.softmax(-1) @ v).reshape(H, d)":
             "        s = q[b].reshape(G, Hkv, d).transpose(0, 1) @ k.transpose(-1, -2) / math.sqrt(d)\n"
             "        out[b] = (s.softmax(-1) @ v).transpose(0, 1).reshape(H, d)"})},
         ["gqa_modulo"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_paged_waste": {"points": 2, "rubric": [
        (1, "quotes their own predicted, measured and rule-of-thumb waste at two block sizes, and attributes "
            "the rule's error to the narrow templated range, whose waste depends on where 129-136 falls in its "
            "last block (an underestimate at 16 and 64, about right or over at 256)"),
        (1, "explains the pool fraction as a slot-weighted average dominated by the long documents, and picks"
            " a block size with the cost of going smaller (bigger block tables, more bookkeeping, smaller "
            "reads)"),
    ]},
}
