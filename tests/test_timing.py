"""course_lib.perf.timing, the one measuring loop, checked with a fake clock and a recording sync (timings
themselves are noise): what is timed, what is not (warm-up, the `after` hook), where the device is
synchronized; and that every timing helper of the course (compile_tools, device_bench, speculative/measure,
serving/simulator, capstone, sparsity/nm) computes its result from perf.timing's measurements."""
import pytest
import torch

import course_lib.perf.timing as timing
from course_lib.models.config import as_config
from course_lib.models.llama import LlamaForCausalLM
from course_lib.perf.timing import Timing, benchmark, compare, interleave, timed_call


class FakeClock:
    """A clock that moves only when told (``advance``), recording every read in a shared log."""

    def __init__(self, log):
        self.t, self.log = 0.0, log

    def __call__(self):
        self.log.append("clock")
        return self.t

    def advance(self, dt):
        self.t += dt


@pytest.fixture
def clocked(monkeypatch):
    """(clock, log): perf.timing reads this clock for 'wall' and logs its device syncs in `log`."""
    log = []
    clock = FakeClock(log)
    monkeypatch.setitem(timing.CLOCKS, "wall", clock)
    monkeypatch.setattr(timing, "sync", lambda dev=None: log.append(f"sync {torch.device(dev).type}"))
    return clock, log


def test_benchmark_times_only_the_measured_calls_and_syncs_around_each(clocked):
    clock, log = clocked
    calls = []

    def fn():                          # the k-th call (from 1) takes k seconds on the fake clock
        calls.append(len(calls) + 1)
        clock.advance(len(calls))
        log.append("call")

    t = benchmark(fn, warmup=2, repeats=3, device="cpu")
    assert isinstance(t, Timing) and t.warmup == 2
    assert t.times == [3.0, 4.0, 5.0] and t.min == 3.0 and t.median == 4.0   # calls 1-2 were the warm-up
    # warm-up calls, one sync, then each timed call between a sync + clock read and a sync + clock read
    assert log == ["call", "call", "sync cpu"] + ["sync cpu", "clock", "call", "sync cpu", "clock"] * 3


def test_benchmark_inner_and_after(clocked):
    clock, log = clocked
    n = []

    def fn():
        n.append(1)
        clock.advance(2.0)

    t = benchmark(fn, warmup=1, repeats=2, inner=4, device="cpu")
    assert t.times == [2.0, 2.0] and len(n) == 1 + 2 * 4            # 4 back-to-back calls per sample
    log.clear()
    t = benchmark(fn, warmup=1, repeats=3, after=lambda: (clock.advance(100.0), log.append("after")))
    assert t.times == [2.0, 2.0, 2.0]                              # the after hook is not timed
    assert log == ["after"] + ["clock", "clock", "after"] * 3       # ... but runs after every call, warm-up too
    with pytest.raises(ValueError, match="inner"):
        benchmark(fn, inner=2, after=lambda: None)
    with pytest.raises(ValueError, match="inner"):
        benchmark(fn, inner=0)
    with pytest.raises(TypeError, match="after"):
        benchmark(fn, after=3)
    with pytest.raises(ValueError, match="min_time"):
        benchmark(fn, min_time=-1)


def test_interleave_rotates_and_crops_after_each_candidate(clocked):
    clock, log = clocked
    fns = {n: (lambda n=n: (clock.advance(" AB".index(n)), log.append(n))) for n in "AB"}
    out = interleave(fns, warmup=1, repeats=3, after={"A": lambda: log.append("a")})
    assert out["A"].times == [1.0] * 3 and out["B"].times == [2.0] * 3
    assert [e for e in log if e != "clock"] == ["A", "a", "B"] + ["A", "a", "B", "B", "A", "a", "A", "a", "B"]
    assert len(interleave({"only": lambda: None}, repeats=2)["only"].times) == 2   # one candidate is fine here
    with pytest.raises(ValueError, match="not candidates"):
        interleave(fns, after={"C": lambda: None})
    with pytest.raises(TypeError, match="after"):
        interleave(fns, after={"A": 1})
    with pytest.raises(TypeError, match="non-empty"):
        interleave({})
    cmp = compare(fns, warmup=0, repeats=2)
    assert cmp.ratio("B", "A") == 2.0 and cmp.rounds == 2


def test_timed_call_returns_the_result_and_its_synchronized_seconds(clocked):
    clock, log = clocked
    out, s = timed_call(lambda: (clock.advance(0.5), "done")[1], device="cpu")
    assert (out, s) == ("done", 0.5) and log == ["sync cpu", "clock", "sync cpu", "clock"]
    log.clear()
    assert timed_call(lambda: 1) == (1, 0.0) and "sync cpu" not in log     # no device: nothing to wait for
    with pytest.raises(TypeError, match="callable"):
        timed_call(3)
    with pytest.raises(ValueError, match="clock"):
        timed_call(lambda: 1, clock="sundial")


# --------------------------------------------------------------------------------------------------
# Every timing helper of the course measures through perf.timing
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def tick(monkeypatch):
    """A wall clock that moves 7 s between any two reads: a sample taken by perf.timing is exactly 7 s, which
    no real clock would give, so a helper returning 7 s (or a sum of them) took perf.timing's measurements."""
    reads = []

    def clock():
        reads.append(1)
        return 7.0 * len(reads)
    monkeypatch.setitem(timing.CLOCKS, "wall", clock)
    return reads


def _model(layers=1, seed=0):
    torch.manual_seed(seed)
    cfg = as_config(dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64))
    return LlamaForCausalLM(cfg).eval()


def test_compile_tools_and_device_bench_time_through_perf_timing(tick):
    from course_lib.compile_tools import time_decode_steps
    from course_lib.device_bench import op_overhead, time_decode_step, time_forward
    assert time_decode_steps(_model(), modes=("eager",), steps=3, max_len=32) == {"eager": 7.0}
    assert time_decode_step(_model(), context=8, warmup=1, repeats=3).times == [7.0] * 3
    assert time_forward(_model(), seq_len=8, warmup=1, repeats=2).times == [7.0] * 2
    assert op_overhead("cpu", ops=10, repeats=3) == pytest.approx(0.7)     # one sample of 10 adds: 7 s


def test_speculative_measure_times_through_perf_timing(tick):
    from course_lib.speculative.measure import measure, measure_prompt_lookup, step_times
    target, draft = _model(2, seed=0), _model(1, seed=1)
    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 7])
    times = step_times({"target": target, "draft": draft}, prompt, {"target": [1, 3], "draft": [1]}, repeats=3)
    assert times == {("target", 1): 7.0, ("target", 3): 7.0, ("draft", 1): 7.0}
    prompts = [prompt, torch.tensor([9, 10, 11])]
    rows = measure(target, draft, prompts, draft_lengths=(2,), max_new_tokens=5, repeats=2)
    # every run takes 7 s: 2 prompts x 7 s per round for 10 tokens, steps of 7 s, paired ratio 1
    assert rows[0]["plain_ms_per_token"] == pytest.approx(1e3 * 14 / 10) and rows[0]["speedup_measured"] == 1.0
    assert rows[0]["target_step_ms"] == 7e3 and rows[0]["c"] == 1.0
    rows = measure_prompt_lookup(target, prompts, draft_lengths=(2,), max_new_tokens=5, repeats=2)
    assert rows[0]["spec_ms_per_token"] == pytest.approx(1e3 * 7 / 10) and rows[0]["speedup_measured"] == 1.0
    from course_lib.speculative import PromptLookupDraft, compare_drafts
    rows = compare_drafts(target, {"model": (draft, 2), "lookup": (PromptLookupDraft(), 3)}, prompts,
                          max_new_tokens=5, repeats=2)
    assert [r["name"] for r in rows] == ["model", "lookup"] and [r["g"] for r in rows] == [2, 3]
    for r in rows:                       # one timed call per path and round runs both prompts: 7 s for 10 tokens
        assert r["spec_ms_per_token"] == pytest.approx(1e3 * 7 / 10) and r["speedup_measured"] == 1.0
        assert len(r["depth_acceptance"]) == r["g"] and r["tokens_per_pass"] >= 1
    with pytest.raises(ValueError, match="pair"):
        compare_drafts(target, {"model": draft}, prompts)
    with pytest.raises(ValueError, match="non-empty dict"):
        compare_drafts(target, {}, prompts)


def test_simulator_calibration_times_through_perf_timing(tick):
    from course_lib.serving.simulator import StepCostModel
    c = StepCostModel.calibrate_local(_model(), batch_sizes=(1, 2), context_lengths=(8,), prefill_lengths=(8, 16),
                                      repeats=3)
    assert [s[3] for s in c.samples] == [7.0] * 4


def test_capstone_times_through_perf_timing(tick):
    from course_lib.capstone import run_capstone
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    steps = run_capstone(_model(), None, prompts, 3, steps=("no cache", "KV cache", "continuous batching"),
                         progress=False)
    assert [s.seconds for s in steps] == [14.0, 14.0, 7.0]      # one timed generate per prompt; one engine run


@pytest.mark.gpu
def test_cuda_only_helpers_time_through_perf_timing(monkeypatch):
    """launch_overhead and semi_structured_speed use CUDA events, not the clock: fake the timer itself."""
    from course_lib.compile_tools import launch_overhead
    from course_lib.sparsity.nm import semi_structured_speed
    real = timing._timer

    def fake_timer(device, clock="wall", inner=1):
        dev, timed = real(device, clock, inner)
        return dev, lambda fn: (timed(fn)[0], 0.007)
    monkeypatch.setattr(timing, "_timer", fake_timer)
    assert launch_overhead("cuda", n=10) == 0.007
    r = semi_structured_speed(rows=256, cols=256, tokens=256, repeats=2)
    if r is not None:                                  # None on a GPU without sparse tensor cores
        assert r["dense_ms"] == r["sparse_ms"] == 7.0
