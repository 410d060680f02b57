"""The continuous-batching engine (course_lib.serving.engine) against decoding each request alone.

Oracles: ``course_lib.generation.generate`` with a contiguous cache (plain cached decoding of one request),
and transformers' ``generate`` for the HF baseline. The engine runs on Module 06's PagedCache
(decode through ``paged_attention``: the Triton kernel on CUDA). Every test runs on each device of the
``device`` fixture (CUDA where there is one); on CUDA greedy sequences are compared with
``device_tools.assert_greedy_match`` (a first difference must be a float near-tie). Prompts, lengths and
seeds are fresh random each run (the seed is printed).
"""
import random
import time

import pytest
import torch

from device_tools import assert_greedy_match, needs_triton_gpu

from course_lib.generation import generate
from course_lib.kvcache import ContiguousCache
from course_lib.models import load
from course_lib.paged import attention as paged_attention_module
from course_lib.perf.metrics import Trace, summarize
from course_lib.serving import Engine, SamplingParams, compare_with_static, synthetic_workload
from course_lib.serving.baselines import hf_static_generate, static_batch_generate

# decode backends the engine can use on a CPU ("auto" is "torch" there, "triton" on CUDA)
CPU_BACKENDS = [b for b in ("reference", "torch") if b in getattr(paged_attention_module, "BACKENDS", ("reference",))]


@pytest.fixture(scope="module")
def model(device):
    torch.set_num_threads(1)
    m, _ = load("tiny", device=device)
    return m.eval()


@pytest.fixture
def rng():
    seed = time.time_ns() % 2**31
    print("seed", seed)
    return random.Random(seed)


def prompts_for(rng, lengths):
    return [[rng.randrange(1, 2048) for _ in range(n)] for n in lengths]


def alone(model, prompt, n, params=None, return_logits=False):
    """One request decoded by itself (a contiguous cache): greedy, or sampled with its own seeded generator
    on the model's device (as the engine's). return_logits: also the logits [n, V] behind each token."""
    kw = {}
    if params is not None and params.temperature != 0:
        kw = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                  generator=torch.Generator(device=model.device).manual_seed(params.seed))
    out = generate(model, prompt, n, cache="contiguous", return_logits=True, **kw)
    toks, logits = out.tokens.tolist(), out.logits
    return (toks, logits) if return_logits else toks


def assert_same_greedy(model, got, prompt, n, what=""):
    """The engine's greedy tokens == decoding the prompt alone (on CUDA: up to a float near-tie)."""
    want, want_logits = alone(model, prompt, n, return_logits=True)
    assert_greedy_match(got, want, want_logits, model.device, what=what)


def run_checked(eng):
    """Step to the end, checking the block bookkeeping after every step."""
    streamed = {}
    while eng.has_unfinished():
        for o in eng.step():
            streamed.setdefault(o.request_id, []).append(o.token)
        eng.manager.check_invariants()
        assert eng.manager.num_used_blocks <= eng.num_blocks
        assert len(eng.running) <= eng.max_batch
    assert eng.manager.num_used_blocks == 0          # every finished request gave its blocks back
    return streamed


@pytest.mark.parametrize("backend", ["auto"] + CPU_BACKENDS)
@pytest.mark.parametrize("num_blocks,max_batch,max_prefill,expect_preempt", [
    (256, 16, 512, False),      # plenty of memory: no preemption
    (64, 16, 9, False),         # chunked prefill: 9 prompt tokens per step
    (12, 8, 64, True),          # so few blocks that running requests must be preempted and recomputed
])
def test_greedy_equals_alone(model, rng, num_blocks, max_batch, max_prefill, expect_preempt, backend):
    if expect_preempt:      # 6 requests growing to 4-6 blocks each in a pool of 12: someone must yield
        lengths, max_new_tokens = [rng.randrange(17, 24) for _ in range(6)], [rng.randrange(12, 20) for _ in range(6)]
    else:
        lengths, max_new_tokens = [70] + [rng.randrange(1, 50) for _ in range(5)], [rng.randrange(1,
                                                                                                  20) for _ in range(6)]
    prompts = prompts_for(rng, lengths)
    eng = Engine(model, num_blocks=num_blocks, block_size=8, max_batch=max_batch, max_prefill_tokens=max_prefill,
                 backend=backend)
    assert eng.backend == backend and eng.manager is eng.cache.manager       # one store, one set of block tables
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, max_new_tokens)]
    streamed = run_checked(eng)
    if expect_preempt:
        assert eng.num_preemptions > 0, "the small pool should have forced a preemption"
    else:
        assert eng.num_preemptions == 0
    for i, p, n in zip(ids, prompts, max_new_tokens):
        out = eng.output(i)
        assert out.finished and out.finish_reason == "length" and len(out.token_ids) == n
        assert_same_greedy(model, out.token_ids, p, n, what=f"request {i} (prompt {len(p)}, {n} tokens)")
        assert streamed[i] == out.token_ids                    # what step() streamed is the result
        assert out.start <= out.first_token_time <= out.finish_time
        assert 0 <= out.ttft <= out.e2e


def test_batched_forward_equals_contiguous(model, rng):
    """The engine's forwards through the paged store (ragged prefill rows right-padded in one forward,
    then one decode step for rows of different lengths) give each row's logits of a contiguous cache."""
    prompts = prompts_for(rng, [rng.randrange(2, 30) for _ in range(4)])
    eng = Engine(model, num_blocks=32, block_size=4, max_batch=8)
    for p in prompts:
        eng.add_request(p, SamplingParams(max_new_tokens=2))
    eng.scheduler._admit()
    reqs = list(eng.running)
    tol = dict(rtol=1e-4, atol=1e-4) if model.device.type == "cpu" else dict(rtol=1e-4, atol=1e-3)
    with torch.inference_mode():
        got = eng._forward(reqs, [len(p) for p in prompts], prompts)       # [B, V] last logits
        caches, want = [], []
        for p in prompts:
            caches.append(ContiguousCache())
            want.append(model(torch.tensor([p], device=model.device), cache=caches[-1])[0, -1])
        torch.testing.assert_close(got, torch.stack(want), **tol)
        assert [r.computed for r in reqs] == [len(p) for p in prompts] == [eng.cache.computed[r.id] for r in reqs]
        nxt = got.argmax(-1).tolist()
        eng.cache.append([r.id for r in reqs], nxt)                        # one decode step
        got = eng._forward(reqs, [1] * 4, [[t] for t in nxt])
        want = [model(torch.tensor([[t]], device=model.device), cache=c)[0, -1] for t, c in zip(nxt, caches)]
        torch.testing.assert_close(got, torch.stack(want), **tol)
    eng.manager.check_invariants()


def test_seeded_sampling_is_per_request(model, rng):
    p = prompts_for(rng, [12])[0]
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=50, top_p=0.95, seed=rng.randrange(2**31))
    # alone in the engine
    eng = Engine(model, num_blocks=64, block_size=8)
    solo = eng.generate([p], params)[0].token_ids
    # in a crowd of greedy and sampled requests, with preemption going on
    others = prompts_for(rng, [rng.randrange(1, 40) for _ in range(5)])
    eng = Engine(model, num_blocks=10, block_size=8, max_batch=6)
    other_params = [SamplingParams(max_new_tokens=rng.randrange(1, 20), temperature=rng.choice([0.0, 1.0]),
                                   seed=rng.randrange(2**31)) for _ in others]
    outs = eng.generate(others[:2] + [p] + others[2:], other_params[:2] + [params] + other_params[2:])
    assert outs[2].token_ids == solo
    # static batching draws from the request's own generator (on the model's device) too: same tokens
    stat = static_batch_generate(model, others[:2] + [p], other_params[:2] + [params], batch_size=3)
    assert stat[2].token_ids == solo
    # the same draws as plain cached decoding with a generator seeded the same way
    assert solo == alone(model, p, 12, params)
    # another seed gives another sequence (12 draws at temperature 0.9 over a 2048-token vocabulary)
    other = Engine(model, num_blocks=64).generate([p], SamplingParams(max_new_tokens=12, temperature=0.9, top_k=50,
                                                                      top_p=0.95, seed=params.seed + 1))[0]
    assert other.token_ids != solo


def test_repetition_penalty_is_the_generate_loops(model, rng):
    """Each request's own penalty over its own tokens (prompt and output), greedy or sampled, in a crowd with
    preemption going on, and in the static baseline: the tokens generate(repetition_penalty=) gives alone."""
    prompts = prompts_for(rng, [rng.randrange(2, 30) for _ in range(5)])
    params = [SamplingParams(max_new_tokens=rng.randrange(8, 20), temperature=t, top_k=k,
                             repetition_penalty=r, seed=rng.randrange(2**31))
              for t, k, r in [(0.0, None, 1.3), (0.0, None, 1.0), (0.9, 50, 1.5), (0.0, None, 0.8), (1.0, None, 2.0)]]
    want = []
    for p, sp in zip(prompts, params):
        kw = {} if sp.temperature == 0 else dict(temperature=sp.temperature, top_k=sp.top_k,
                                                   generator=torch.Generator(device=model.device).manual_seed(sp.seed))
        want.append(generate(model, p, sp.max_new_tokens, cache="contiguous", repetition_penalty=sp.repetition_penalty,
                             **kw).tokens.tolist())
    plain = [generate(model, p, sp.max_new_tokens, cache="contiguous").tokens.tolist() for p, sp in zip(prompts,
                                                                                                        params)]
    assert any(w != q for w, q, sp in zip(want, plain, params) if sp.greedy and sp.repetition_penalty != 1), \
        "the penalties should change some greedy continuation, or this test could not see them ignored"
    eng = Engine(model, num_blocks=9, block_size=8, max_batch=5)
    assert [t.token_ids for t in eng.generate(prompts, params)] == want
    assert [t.token_ids for t in static_batch_generate(model, prompts, params, batch_size=5)] == want
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0)


def test_stop_tokens_and_streaming(model, rng):
    p = prompts_for(rng, [20])[0]
    ref = alone(model, p, 10)                  # the engine stops where its own tokens say (compared below)
    stop = ref[3]
    first = ref.index(stop)
    got = []
    eng = Engine(model, num_blocks=32, block_size=8)
    rid = eng.add_request(p, SamplingParams(max_new_tokens=10, stop_token_ids=[stop]), callback=got.append)
    run_checked(eng)
    out = eng.output(rid)
    assert out.token_ids == ref[:first + 1] and out.finish_reason == "stop"
    assert [o.token for o in got] == out.token_ids and got[-1].finished and not any(o.finished for o in got[:-1])
    eng = Engine(model, num_blocks=32, block_size=8)
    toks = [o.token for o in eng.stream([p], SamplingParams(max_new_tokens=5))]
    assert toks == ref[:5]


def test_bad_requests_rejected_while_serving(model, rng):
    prompts = prompts_for(rng, [rng.randrange(1, 30) for _ in range(4)])
    max_new_tokens = [rng.randrange(8, 20) for _ in prompts]
    eng = Engine(model, num_blocks=40, block_size=8, max_batch=4)
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, max_new_tokens)]
    for _ in range(4):
        eng.step()
    with pytest.raises(TypeError, match="temprature"):
        eng.add_request(prompts[0], SamplingParams(temprature=0.5))
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_new_tokens"):
            eng.add_request(prompts[0], SamplingParams(max_new_tokens=bad))
    with pytest.raises(ValueError, match="empty"):
        eng.add_request([], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="vocabulary"):
        eng.add_request([5, 2048, 7], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="vocabulary"):
        eng.add_request([-1], SamplingParams(max_new_tokens=4))
    with pytest.raises(TypeError, match="integer"):
        eng.add_request([1.5, 2.0], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="context"):
        eng.add_request([1] * 500, SamplingParams(max_new_tokens=20))
    with pytest.raises(ValueError, match="KV blocks"):
        eng.add_request([1] * 300, SamplingParams(max_new_tokens=30))    # 329 slots > 40 blocks x 8
    with pytest.raises(TypeError, match="SamplingParams"):
        eng.add_request([1, 2], {"max_new_tokens": 3})
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    assert len(eng.requests) == 4                              # nothing was added by the bad calls
    run_checked(eng)
    for i, p, n in zip(ids, prompts, max_new_tokens):
        assert_same_greedy(model, eng.output(i).token_ids, p, n, what=f"request {i}")


def test_engine_arguments(model):
    for kw in ({"num_blocks": 0}, {"block_size": 0}, {"max_batch": 0}, {"max_prefill_tokens": 0},
               {"watermark": 1.5}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            Engine(model, **kw)


def test_static_batching_equals_alone(model, rng):
    prompts = prompts_for(rng, [rng.randrange(1, 40) for _ in range(5)])
    max_new_tokens = [rng.randrange(1, 16) for _ in prompts]
    outs = static_batch_generate(model, prompts, [SamplingParams(max_new_tokens=n) for n in max_new_tokens],
                                 batch_size=3)
    assert all(isinstance(o, Trace) and o.finished for o in outs)
    for o, p, n in zip(outs, prompts, max_new_tokens):
        assert_same_greedy(model, o.token_ids, p, n, what="static batching")
        assert o.start <= o.first_token_time <= o.finish_time


def test_hf_static_equals_alone(model, rng):
    pytest.importorskip("transformers")
    prompts = prompts_for(rng, [rng.randrange(1, 30) for _ in range(3)])
    max_new_tokens = [rng.randrange(1, 10) for _ in prompts]
    outs = hf_static_generate(prompts, [SamplingParams(max_new_tokens=n) for n in max_new_tokens], batch_size=3,
                              device=model.device)
    for o, p, n in zip(outs, prompts, max_new_tokens):
        assert_same_greedy(model, o.token_ids, p, n, what="transformers generate")


@pytest.mark.parametrize("replay", [False, True])
def test_compare_with_static_rows(model, replay):
    wl = synthetic_workload(8, seed=time.time_ns() % 1000, rate=200.0 if replay else None,
                            prompt_range=(4, 24), output_range=(2, 12), output_median=5)
    if replay:      # explicit (arrival_s, prompt_ids, max_new_tokens) tuples are accepted as well
        wl = [(r.arrival_s, list(range(1, r.prompt_tokens + 1)), r.output_tokens) for r in wl]
    rows = compare_with_static(model, wl, batch_size=4, replay=replay, max_batch=8)   # asserts equal outputs
    assert [r["system"].split()[0] for r in rows] == ["engine", "static"]
    for r in rows:
        assert r["tokens"] == sum(w[2] if isinstance(w, tuple) else w.output_tokens for w in wl)
        assert r["tokens_per_s"] > 0
        assert 0 < r["p50_latency_s"] <= r["p90_latency_s"] and r["mode"] == ("replay" if replay else "offline")


def test_engine_outputs_are_traces_that_summarize_takes(model, rng):
    """The engine returns the course's one request record (a perf.metrics.Trace), as the simulator does:
    token ids and times, finish, finish reason, preemptions; it is the very record the engine and its
    scheduler updated (no copy that could drift); summarize reads a list of outputs."""
    prompts = prompts_for(rng, [rng.randrange(2, 20) for _ in range(5)])
    eng = Engine(model, num_blocks=12, block_size=4, max_batch=5)
    outs = eng.generate(prompts, [SamplingParams(max_new_tokens=n) for n in (1, 3, 9, 9, 9)])
    for rid, (o, p) in enumerate(zip(outs, prompts)):
        tr = eng.requests[rid].trace                  # what the engine and its scheduler updated
        assert isinstance(o, Trace) and o is tr and eng.output(rid) is tr
        assert tr.prompt_tokens == len(p) and tr.rid == rid
        assert tr.token_ids == eng.requests[rid].generated and tr.finished and tr.finish == tr.times[-1]
    assert outs[0].tpot is None and outs[1].tpot is not None    # a one-token answer has no TPOT
    assert sum(o.preemptions for o in outs) == eng.num_preemptions
    s = summarize(outs, qs=(50,))
    assert s["requests"] == 5 and s["output_tokens"] == 1 + 3 + 27
    assert s["makespan_s"] == max(o.finish for o in outs) - min(o.start for o in outs)


def test_everything_lives_on_the_model_device(model, rng):
    """Generators, pools and every forward's plan (positions, slot mapping, block tables, lengths) are on
    the model's device (the H100 failure: CPU index tensors and CPU generators next to CUDA tensors)."""
    eng = Engine(model, num_blocks=32, block_size=8)
    rid = eng.add_request(prompts_for(rng, [9])[0], SamplingParams(max_new_tokens=3, temperature=1.0))
    eng.add_request(prompts_for(rng, [4])[0], SamplingParams(max_new_tokens=4))
    assert eng.requests[rid].generator.device.type == model.device.type
    assert all(t.device.type == model.device.type for t in eng.cache.pool.k + eng.cache.pool.v)
    seen = set()
    write = eng.cache._write

    def spy(k, v, layer, plan):
        seen.update(t.device.type for t in (k, plan.pos, plan.blk, plan.off, plan.tables, plan.lens))
        return write(k, v, layer, plan)

    eng.cache._write = spy
    while eng.has_unfinished():
        eng.step()
    assert seen == {model.device.type}
    assert len(eng.output(rid).token_ids) == 3


@pytest.mark.gpu
@needs_triton_gpu
def test_engine_decodes_with_the_triton_kernel_on_cuda(model, rng, monkeypatch):
    pytest.importorskip("triton")
    if model.device.type != "cuda":
        pytest.skip("the CUDA run of this test")
    from course_lib.paged import triton_paged
    calls = []
    real = triton_paged.paged_attention_triton

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(triton_paged, "paged_attention_triton", spy)
    prompts = prompts_for(rng, [rng.randrange(3, 40) for _ in range(5)])
    outs = Engine(model, num_blocks=64, block_size=16, max_batch=8).generate(prompts, SamplingParams(max_new_tokens=6))
    assert calls, "decode steps should go through the Triton paged-attention kernel"
    assert len(calls) % model.config.num_hidden_layers == 0
    for o, p in zip(outs, prompts):
        assert_same_greedy(model, o.token_ids, p, 6, what="engine on CUDA")


ENGINE_TRITON_SCRIPT = """
import sys, torch
sys.path.insert(0, {root!r})
torch.set_num_threads(1)
from course_lib.generation import generate
from course_lib.models import load
from course_lib.serving import Engine, SamplingParams
model, _ = load("tiny", device="cpu", verbose=False)
g = torch.Generator(device="cpu").manual_seed(0)
prompts = [torch.randint(1, 2048, (n,), generator=g, device="cpu").tolist() for n in (5, 19, 11)]
outs = Engine(model, num_blocks=32, block_size=8, max_batch=4, backend="triton").generate(
    prompts, SamplingParams(max_new_tokens=4))
for o, p in zip(outs, prompts):
    want = generate(model, p, 4, cache="contiguous").tokens.tolist()
    assert o.token_ids == want, (o.token_ids, want)
print("ENGINE_TRITON_INTERPRET_OK")
"""


@pytest.mark.slow
def test_engine_with_the_triton_kernel_under_the_interpreter():
    """The engine's decode through the Triton kernel, on CPU tensors (TRITON_INTERPRET=1 must be set
    before triton is imported, so it runs in a fresh process): what runs natively on CUDA."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    pytest.importorskip("triton")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", ENGINE_TRITON_SCRIPT.format(root=root)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert "ENGINE_TRITON_INTERPRET_OK" in res.stdout, res.stdout + res.stderr


# --- the engine driven by the simulator's policy hook (Lab 09's) -------------------------------------------
def _run_with(model, prompts, policy=None, **kw):
    eng = Engine(model, num_blocks=14, block_size=4, max_batch=4, policy=policy, **kw)
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=12)) for p in prompts]
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        eng.manager.check_invariants()
    return [eng.output(i).token_ids for i in ids], steps, eng.num_preemptions


def test_the_engine_runs_the_policy_the_simulator_runs(model, rng):
    """The default rule is fcfs_schedule (with the watermark): passing it explicitly changes nothing; a policy of
    one's own (here: at most one admission per step) drives the real engine, greedy outputs unchanged."""
    from functools import partial

    from course_lib.serving import Decision, fcfs_schedule
    prompts = prompts_for(rng, [rng.randrange(6, 20) for _ in range(6)])
    default = _run_with(model, prompts)
    assert default[2] > 0, "the small pool should force a preemption"
    explicit = _run_with(model, prompts, partial(fcfs_schedule, watermark=0), watermark=0.0)
    assert explicit == _run_with(model, prompts, None, watermark=0.0)

    def one_at_a_time(waiting, running, free_blocks, block_size, max_batch):
        d = fcfs_schedule(waiting, running, free_blocks, block_size, max_batch)
        return Decision(preempt=d.preempt, admit=d.admit[:1])

    slow = _run_with(model, prompts, one_at_a_time)
    for i, (p, got) in enumerate(zip(prompts, slow[0])):
        assert_same_greedy(model, got, p, 12, what=f"request {i} under one_at_a_time")
    assert slow[1] >= default[1]


def test_a_policy_that_breaks_a_rule_is_named(model, rng):
    from course_lib.serving import Decision
    from course_lib.serving.scheduler import PolicyError
    prompts = prompts_for(rng, [8, 9, 10])
    rules = {"overtakes": lambda w, r, f, b, m: Decision(admit=[v.rid for v in w][1:2]),
             "not running": lambda w, r, f, b, m: Decision(preempt=[99]),
             "Decision": lambda w, r, f, b, m: [v.rid for v in w],
             "max_batch": lambda w, r, f, b, m: Decision(admit=[v.rid for v in w])}
    for match, policy in rules.items():
        eng = Engine(model, num_blocks=64, block_size=4, max_batch=2, policy=policy)
        for p in prompts:
            eng.add_request(p, SamplingParams(max_new_tokens=2))
        with pytest.raises(PolicyError, match={"overtakes": "first come", "not running": "not running",
                                               "Decision": "Decision", "max_batch": "max_batch"}[match]):
            eng.step()
    with pytest.raises(TypeError, match="policy"):
        Engine(model, num_blocks=8, block_size=4, policy="fcfs")


def test_fcfs_watermark_keeps_blocks_free_next_to_others():
    from course_lib.serving import SeqView, fcfs_schedule
    waiting = [SeqView(1, 0.0, 0, 8), SeqView(2, 0.0, 0, 8)]                 # 2 blocks of 4 each
    assert fcfs_schedule(waiting, [], 4, 4, 8).admit == [1, 2]
    assert fcfs_schedule(waiting, [], 4, 4, 8, watermark=1).admit == [1]    # the second would leave 0 free
    assert fcfs_schedule(waiting, [], 2, 4, 8, watermark=5).admit == [1]    # alone, it only has to fit
