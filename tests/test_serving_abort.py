"""Engine.abort_request (what the server calls when a client disconnects), against decoding alone.

Oracle: ``course_lib.generation.generate`` with a contiguous cache (each request decoded by itself, greedy):
the requests that were not aborted must produce exactly those tokens, as if the aborted one had never been
there. The block bookkeeping is checked with the BlockManager's own invariant check. Prompts are fresh
random each run (the seed is printed).
"""
import random
import time

import pytest
import torch

from course_lib.generation import generate
from course_lib.models import load
from course_lib.paged import PagingError
from course_lib.serving import Engine, SamplingParams


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    m, _ = load("tiny", device="cpu")
    return m.eval()


@pytest.fixture
def rng():
    seed = time.time_ns() % 2**31
    print("seed", seed)
    return random.Random(seed)


def alone(model, prompt, n):
    with torch.inference_mode():
        return generate(model, prompt, n, cache="contiguous").tokens.tolist()


def assert_forgotten(eng, rid):
    """Out of the engine, the scheduler and the KV cache."""
    assert rid not in eng.requests
    assert all(r.id != rid for r in list(eng.running) + list(eng.waiting))
    assert rid not in eng.cache.computed
    with pytest.raises(PagingError):
        eng.manager.block_table(rid)
    eng.manager.check_invariants()


def test_abort_a_running_request_frees_its_blocks_and_the_others_run_on(model, rng):
    eng = Engine(model, num_blocks=64, block_size=16, max_batch=4)
    prompts = [[rng.randrange(1, 2048) for _ in range(n)] for n in (5, 21, 9)]
    n = 24
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n)) for p in prompts]
    seen = []
    eng.requests[ids[1]].callback = seen.append
    for _ in range(5):
        eng.step()
    victim = ids[1]
    made = len(eng.requests[victim].generated)
    assert 0 < made < n and len(seen) == made
    held = len(eng.manager.block_table(victim))
    used = eng.manager.num_used_blocks
    record = eng.output(victim)                                  # a caller holding the record while it runs
    out = eng.abort_request(victim)
    assert out.finish_reason == "abort" and out.finished and len(out.token_ids) == made
    assert out is record and record.finish_reason == "abort"     # one record: the holder sees the abort too
    assert eng.manager.num_used_blocks == used - held            # its blocks are back in the pool now
    assert_forgotten(eng, victim)
    assert eng.abort_request(victim) is None                     # twice: nothing more to do
    assert eng.abort_request(10_000) is None                     # unknown
    with pytest.raises(TypeError, match="request_id"):
        eng.abort_request("1")
    while eng.has_unfinished():
        eng.step()
    assert len(seen) == made, "the aborted request's callback was called after the abort"
    for rid, p in zip(ids, prompts):
        if rid != victim:
            assert eng.output(rid).token_ids == alone(model, p, n)
    assert eng.abort_request(ids[0]) is None                     # finished: an abort is a no-op
    assert [o.rid for o in eng.pop_finished()] == [ids[0], ids[2]]
    assert eng.manager.num_used_blocks == 0 and eng.stats()["aborted"] == 1


def test_abort_a_waiting_request(model, rng):
    """max_batch=1: the second request waits (no blocks yet); aborting it frees nothing and it never runs."""
    eng = Engine(model, num_blocks=32, block_size=16, max_batch=1)
    p0, p1 = ([rng.randrange(1, 2048) for _ in range(7)] for _ in range(2))
    a = eng.add_request(p0, SamplingParams(max_new_tokens=6))
    b = eng.add_request(p1, SamplingParams(max_new_tokens=6))
    eng.step()
    assert [r.id for r in eng.waiting] == [b]
    used = eng.manager.num_used_blocks
    out = eng.abort_request(b)
    assert out.finish_reason == "abort" and out.token_ids == []
    assert eng.manager.num_used_blocks == used
    assert_forgotten(eng, b)
    while eng.has_unfinished():
        eng.step()
    assert eng.output(a).token_ids == alone(model, p0, 6)
    assert eng.manager.num_used_blocks == 0
