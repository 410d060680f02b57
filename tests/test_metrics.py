"""course_lib.perf.metrics and course_lib.perf.memory: percentiles against numpy, latency metrics from
timestamps (fixed examples and random traces), bad input, cost, and memory arithmetic; and the repetition
measures of course_lib.perf.quality (repeated n-gram share, distinct-n) against a brute-force count."""
import math

import numpy as np
import pytest
import torch

from course_lib.perf.memory import (MemoryMeasurement, autograd_saved_bytes, bits_per_param, format_bytes,
                                    model_weight_bytes, parameter_bytes, peak_memory)
from course_lib.perf.metrics import (RequestMetrics, TokenEvent, Trace, cost_per_million_tokens,
                                     decode_tokens_per_second, e2e_latency, format_summary, goodput,
                                     inter_token_latencies, makespan, percentile, percentiles, queue_traces,
                                     request_metrics, summarize, tokens_per_second, tpot, ttft)
from course_lib.perf.quality import distinct_ngrams, repeated_ngram_share
from course_lib.perf.timing import Timing, benchmark


# --------------------------------------------------------------------------------------------------
# percentile
# --------------------------------------------------------------------------------------------------
def test_percentile_equals_numpy_default_bit_for_bit():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(1, 40))
        v = rng.normal(size=n) * float(rng.choice([1e-4, 1.0, 1e5]))
        q = float(rng.choice([0, 1, 25, 50, 90, 99, 99.9, 100])) if rng.random() < 0.3 else float(rng.uniform(0, 100))
        assert percentile(list(v), q) == float(np.percentile(v, q)), (list(v), q)


def test_percentile_fixed_examples():
    v = [15, 20, 35, 40, 50]
    assert percentile(v, 0) == 15 and percentile(v, 100) == 50 and percentile(v, 50) == 35
    assert percentile(v, 40) == 29.0  # rank 1.6: 20 + 0.6 * 15
    assert percentile([3.0], 99) == 3.0
    assert percentile(np.array([4, 1, 3, 2]), 50) == 2.5  # unsorted input, numpy arrays
    assert percentile((x for x in [1, 2, 3]), 50) == 2  # any iterable
    assert percentile(v, np.int64(50)) == percentile(v, np.float32(50)) == 35  # numpy scalars as q
    assert percentiles(v) == {50: 35, 90: float(np.percentile(v, 90)), 99: float(np.percentile(v, 99))}


@pytest.mark.parametrize("values,q,exc", [([], 50, ValueError), ([1, 2], -1, ValueError),
                                          ([1, 2], 100.5, ValueError), ([1, 2], float("nan"), ValueError),
                                          ([1, float("nan")], 50, ValueError), ("abc", 50, TypeError),
                                          (5, 50, TypeError)])
def test_percentile_bad_input(values, q, exc):
    with pytest.raises(exc):
        percentile(values, q)


def test_timing_quantile_uses_percentile():
    t = Timing([0.4, 0.1, 0.3, 0.2])
    assert t.quantile(0.5) == 0.25 and math.isclose(t.iqr, float(np.subtract(*np.percentile(t.times, [75, 25]))))
    assert "median" in repr(benchmark(lambda: None, warmup=1, repeats=5))


# --------------------------------------------------------------------------------------------------
# one request
# --------------------------------------------------------------------------------------------------
def test_request_metrics_fixed_example():
    start, times = 10.0, [10.5, 10.6, 10.75, 10.8, 11.0]
    assert math.isclose(ttft(start, times), 0.5)
    assert math.isclose(tpot(times), 0.5 / 4)  # (t_last - t_first) / (n - 1), not / n
    assert np.allclose(inter_token_latencies(times), [0.1, 0.15, 0.05, 0.2])
    assert math.isclose(e2e_latency(start, times), 1.0)
    assert math.isclose(tokens_per_second(start, times), 5.0)
    assert math.isclose(decode_tokens_per_second(times), 8.0)
    m = request_metrics(start, times)
    assert isinstance(m, RequestMetrics)
    assert math.isclose(m.e2e, m.ttft + (m.n_tokens - 1) * m.tpot)


def test_random_traces_against_numpy():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(2, 60))
        start = float(rng.uniform(0, 1e4))
        times = start + rng.exponential(0.3) + np.cumsum(rng.exponential(0.02, size=n)) - rng.exponential(0.02)
        times = np.maximum(times, start)
        tr = Trace(start, [TokenEvent(i, 0, float(t), start) for i, t in enumerate(times)], prompt_tokens=3)
        assert math.isclose(tr.ttft, times[0] - start, rel_tol=1e-12, abs_tol=1e-12)
        assert math.isclose(tr.tpot, float(np.mean(np.diff(times))), rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(tr.e2e, times[-1] - start, rel_tol=1e-12)
        assert math.isclose(tr.tokens_per_second, n / (times[-1] - start), rel_tol=1e-12)
        assert np.allclose(tr.inter_token_latencies, np.diff(times))


def test_single_token_request_has_no_tpot():
    with pytest.raises(ValueError, match="TPOT"):
        tpot([1.0])
    m = request_metrics(0.0, [0.2])
    assert m.tpot is None and m.n_tokens == 1 and math.isclose(m.tokens_per_second, 5.0)


@pytest.mark.parametrize("fn", [lambda: ttft(0.0, []), lambda: tpot([]), lambda: e2e_latency(0.0, []),
                                lambda: tokens_per_second(0.0, []), lambda: inter_token_latencies([]),
                                lambda: request_metrics(Trace(0.0)), lambda: summarize([])])
def test_empty_trace_raises(fn):
    with pytest.raises(ValueError, match="empty"):
        fn()


@pytest.mark.parametrize("fn", [lambda: ttft(0.0, [0.3, 0.2]), lambda: tpot([1.0, 2.0, 1.5]),
                                lambda: e2e_latency(0.0, [0.5, 0.4]), lambda: inter_token_latencies([2, 1])])
def test_non_monotonic_timestamps_raise(fn):
    with pytest.raises(ValueError, match="non-decreasing"):
        fn()


def test_negative_and_zero_durations_raise():
    with pytest.raises(ValueError, match="negative duration"):
        ttft(5.0, [4.0, 6.0])
    with pytest.raises(ValueError, match="positive duration"):
        tokens_per_second(1.0, [1.0, 1.0])
    with pytest.raises(ValueError, match="NaN"):
        tpot([0.0, float("nan")])
    with pytest.raises(TypeError, match="start"):
        ttft(None, [1.0])


# --------------------------------------------------------------------------------------------------
# many requests
# --------------------------------------------------------------------------------------------------
def test_summarize_percentiles_over_requests():
    rng = np.random.default_rng(2)
    traces = []
    for i in range(30):
        n = 1 if i % 10 == 0 else int(rng.integers(2, 20))
        start = float(i)
        times = start + 0.1 + np.cumsum(rng.exponential(0.01, size=n))
        traces.append(Trace(start, [TokenEvent(j, 0, float(t), start) for j, t in enumerate(times)]))
    s = summarize(traces)
    assert s["requests"] == 30
    ms = [request_metrics(t) for t in traces]
    for key in ("ttft", "e2e", "tokens_per_second"):
        vals = [getattr(m, key) for m in ms]
        assert [s[f"{key}_p{q}"] for q in (50, 90, 99)] == [float(np.percentile(vals, q)) for q in (50, 90, 99)]
    tp = [m.tpot for m in ms if m.tpot is not None]
    assert len(tp) == 27 and [s[f"tpot_p{q}"] for q in (50, 90, 99)] == [float(np.percentile(tp, q))
                                                                         for q in (50, 90, 99)]
    assert s["ttft_p50"] <= s["ttft_p90"] <= s["ttft_p99"]
    # throughput: output tokens over the makespan (first arrival to last finish)
    span = max(t.times[-1] for t in traces) - 0.0
    assert math.isclose(s["makespan_s"], span) and s["output_tokens"] == sum(m.n_tokens for m in ms)
    assert math.isclose(s["throughput_tok_s"], s["output_tokens"] / span)
    assert math.isclose(s["requests_per_s"], 30 / span)
    # (start, times) pairs work too, and single-token-only batches have no TPOT row
    s2 = summarize([(0.0, [0.1]), (1.0, [1.3])], qs=(50,))
    assert s2["tpot_p50"] is None and math.isclose(s2["ttft_p50"], 0.2)
    table = format_summary(s)
    assert "TTFT (ms)" in table and "p99" in table and "n/a" in format_summary(s2)


def test_one_token_answer_has_no_tpot_everywhere():
    """The one definition: a one-token answer has TPOT None (not 0.0) in a Trace, in request_metrics and in
    summarize (left out of the TPOT percentiles), and meets any TPOT limit in goodput."""
    one = Trace(0.0, rid=0)
    one.add_token(0.25, 7)
    one.end(0.25)
    assert one.tpot is None and request_metrics(one).tpot is None and one.n_tokens == 1
    two = Trace(0.5, rid=1)
    two.add_token(0.75)
    two.add_token(1.75)
    assert two.tpot == 1.0 and two.token_ids == [None, None] and two.finish_time == 1.75 and not two.finished
    s = summarize([one, two], qs=(50,), ttft_slo=0.3, tpot_slo=0.5)
    assert s["tpot_p50"] == 1.0                      # only the two-token request has a TPOT
    assert s["slo_attainment"] == 0.5                # the one-token request meets TPOT <= 0.5 s, the other not
    assert math.isclose(s["goodput_req_s"], 1 / 1.75) and math.isclose(goodput([one, two], 0.3, 0.5), 1 / 1.75)
    assert math.isclose(makespan([one, two]), 1.75)
    assert "goodput" in format_summary(s)


def test_summarize_rejects_bad_records_and_slos():
    with pytest.raises(TypeError, match="records"):
        summarize([object()])
    with pytest.raises(ValueError, match="empty trace"):
        summarize([Trace(0.0)])
    with pytest.raises(ValueError, match="both"):
        summarize([(0.0, [0.1])], ttft_slo=1.0)
    with pytest.raises(ValueError, match="tpot_slo"):
        goodput([(0.0, [0.1])], 1.0, 0)


def test_finish_after_the_last_token_counts_in_e2e():
    tr = Trace(1.0)
    tr.add_token(1.5, 3)
    tr.end(2.0, "stop")
    assert tr.e2e == 1.0 and tr.finish_reason == "stop" and tr.tokens_per_second == 1.0
    bad = Trace(1.0)
    bad.add_token(1.5)
    bad.end(1.2)                                     # before its last token: a broken clock
    with pytest.raises(ValueError, match="non-decreasing"):
        bad.e2e


# --------------------------------------------------------------------------------------------------
# one server, one request at a time: the request model's traces
# --------------------------------------------------------------------------------------------------
def test_queue_traces_fixed_example():
    # two requests at 0 (the second waits for the first's last token), a third after the server fell idle
    tr = queue_traces([(0.0, 0.25, 3), (0.0, 0.25, 2), (2.0, 0.1, 1)], tpot=0.05)
    assert [len(t) for t in tr] == [3, 2, 1] and [t.start for t in tr] == [0.0, 0.0, 2.0]
    assert tr[0].times == pytest.approx([0.25, 0.30, 0.35])
    assert tr[1].times == pytest.approx([0.60, 0.65])                  # taken at 0.35, its prefill after that
    assert (tr[1].ttft, tr[1].e2e) == pytest.approx((0.60, 0.65))
    assert (tr[2].ttft, tr[2].e2e) == pytest.approx((0.1, 0.1))         # nobody ahead: its own prefill
    assert makespan(tr) == pytest.approx(2.1)
    assert summarize(tr)["ttft_p50"] == pytest.approx(0.25)


def _event_driven(requests, tpot):
    """An oracle of another shape: a clock that jumps from event to event (an arrival joins the queue, the idle
    server takes the queue's head, a token comes out), returning each request's (ttft, e2e)."""
    queue, out, clock, i, busy_until, running, done = [], {}, 0.0, 0, None, None, 0
    while done < len(requests):
        next_arrival = requests[i][0] if i < len(requests) else math.inf
        if running is None and queue:
            k = queue.pop(0)
            a, first_s, n = requests[k]
            running, busy_until = k, clock + first_s + (n - 1) * tpot
            out[k] = (clock + first_s - a, None)
        elif running is not None and busy_until <= next_arrival:
            clock = busy_until
            out[running] = (out[running][0], clock - requests[running][0])
            running, done = None, done + 1
        else:
            clock = max(clock, next_arrival)
            queue.append(i)
            i += 1
    return [out[k] for k in range(len(requests))]


def test_queue_traces_against_an_event_driven_server():
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        arrivals = np.sort(rng.choice([0.0, 0.5, 1.0], n) * rng.exponential(1.0, n).cumsum())
        reqs = [(float(a), float(rng.uniform(0, 0.4)), int(rng.integers(1, 30))) for a in arrivals]
        tp = float(rng.choice([0.0, rng.uniform(0, 0.05)]))
        got = [x for t in queue_traces(reqs, tp) for x in (t.ttft, t.e2e)]
        assert got == pytest.approx([x for pair in _event_driven(reqs, tp) for x in pair], rel=1e-9, abs=1e-12)
        for t, (_, first_s, m) in zip(queue_traces(reqs, tp), reqs):
            assert t.ttft >= first_s - 1e-12                              # a wait is never negative
            assert t.e2e - t.ttft == pytest.approx((m - 1) * tp, abs=1e-9)  # decoding is the request's own


def test_queue_traces_limits():
    # far apart: every request is served alone, its metrics the one-request model's
    alone = queue_traces([(10.0 * k, 0.2, 5) for k in range(4)], 0.01)
    assert all(t.ttft == pytest.approx(0.2) and t.e2e == pytest.approx(0.24) for t in alone)
    # together: the order of service moves the waits, not the last finish
    reqs = [(0.0, 0.1 * k + 0.05, 3 + 2 * k) for k in range(5)]
    assert makespan(queue_traces(reqs, 0.02)) == pytest.approx(makespan(queue_traces(reqs[::-1], 0.02)))


@pytest.mark.parametrize("requests,tp,match", [
    ([], 0.01, "empty"), ([(0.0, 0.1, 0)], 0.01, "n_tokens"), ([(0.0, 0.1, 2.0)], 0.01, "n_tokens"),
    ([(0.0, 0.1, True)], 0.01, "n_tokens"), ([(0.0, -0.1, 2)], 0.01, "ttft_s"), ([(-1.0, 0.1, 2)], 0.01, "arrival"),
    ([(1.0, 0.1, 2), (0.5, 0.1, 2)], 0.01, "order of arrival"), ([(0.0, 0.1, 2)], -0.01, "tpot"),
    ([(0.0, 0.1)], 0.01, "triple")])
def test_queue_traces_bad_input(requests, tp, match):
    with pytest.raises(ValueError, match=match):
        queue_traces(requests, tp)


# --------------------------------------------------------------------------------------------------
# cost
# --------------------------------------------------------------------------------------------------
def test_cost_per_million_tokens():
    assert math.isclose(cost_per_million_tokens(3.6, 1000), 1.0)  # $3.60/h, 1000 tok/s -> $1 per 1M
    assert math.isclose(cost_per_million_tokens(2.0, 50), 2.0 / (50 * 3600) * 1e6)
    assert cost_per_million_tokens(0, 10) == 0
    # ten times the throughput at the same price is ten times cheaper
    assert math.isclose(cost_per_million_tokens(2.0, 500) * 10, cost_per_million_tokens(2.0, 50))


@pytest.mark.parametrize("price,tps,match", [(-1, 10, "price_per_hour"), (1, 0, "tokens_per_second"),
                                             (1, -5, "tokens_per_second"), (float("nan"), 1, "price"),
                                             (1, float("inf"), "tokens_per_second")])
def test_cost_bad_input(price, tps, match):
    with pytest.raises(ValueError, match=match):
        cost_per_million_tokens(price, tps)


# --------------------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------------------
def test_parameter_bytes_by_dtype():
    n = 7e9
    assert parameter_bytes(n, "fp32") == 28e9  # the seed's "28 GB" is FP32 ...
    assert parameter_bytes(n, "fp16") == 14e9  # ... FP16 is 14 GB
    assert parameter_bytes(n, "bf16") == parameter_bytes(n, torch.bfloat16) == 14e9
    assert parameter_bytes(n, "int8") == 7e9 and parameter_bytes(n, "fp8") == 7e9
    assert parameter_bytes(n, "int4") == 3.5e9
    assert parameter_bytes(3, "int4") == 2  # two 4-bit values per byte, rounded up
    assert parameter_bytes(10, torch.float32) == 40 and bits_per_param("float16") == 16


@pytest.mark.parametrize("dtype,exc", [("int3", ValueError), (torch.int64, ValueError), (16, TypeError)])
def test_parameter_bytes_bad_dtype(dtype, exc):
    with pytest.raises(exc, match="dtype"):
        parameter_bytes(10, dtype)


def test_parameter_bytes_bad_count():
    with pytest.raises(ValueError, match="num_params"):
        parameter_bytes(-1, "fp16")


def test_model_weight_bytes_counts_tied_weights_once():
    from course_lib.models import load
    model, _ = load("tiny", device="cpu", verbose=False)
    n = model.config.num_parameters()
    assert model_weight_bytes(model) == 4 * n
    naive = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert model.config.tie_word_embeddings and naive > model_weight_bytes(model)
    assert model_weight_bytes(model.half()) == 2 * n
    with pytest.raises(TypeError, match="model"):
        model_weight_bytes("tiny")


def test_autograd_saved_bytes():
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(8, 64)
    _, saved = autograd_saved_bytes(lambda: torch.relu(lin(x)))
    assert saved == 2 * 8 * 64 * 4  # linear saves its input, relu its output; the weight is not counted
    with torch.no_grad():
        assert autograd_saved_bytes(lambda: torch.relu(lin(x)))[1] == 0
    with torch.inference_mode():
        assert autograd_saved_bytes(lambda: torch.relu(lin(x)))[1] == 0


def test_peak_memory_on_cpu_sees_kept_and_transient_allocations():
    out, m = peak_memory(lambda: torch.ones(16 * 2**20), device="cpu")  # 64 MiB, touched and kept
    assert isinstance(m, MemoryMeasurement) and out.numel() == 16 * 2**20
    if m.method == "unavailable":
        pytest.skip("process RSS cannot be read on this platform")
    assert m.method in ("rss_peak", "rss_delta") and m.peak_bytes >= 48 * 2**20
    del out

    def transient():  # 512 MiB touched then freed: only the high-water mark can see it
        x = torch.ones(128 * 2**20)
        return float(x[-1])

    _, m = peak_memory(transient, device="cpu")
    assert m.method == "rss_peak" and "approximate" in m.note, m
    assert m.peak_bytes >= 400 * 2**20, m
    _, m = peak_memory(lambda: None, device="cpu")  # below the earlier peak: a lower bound only
    assert m.method == "rss_delta" and "lower bound" in m.note and m.peak_bytes >= 0


@pytest.mark.gpu
def test_peak_memory_on_cuda_is_exact():
    out, m = peak_memory(lambda: torch.ones(2**20, device="cuda"), device="cuda")
    assert m.method == "cuda_max_allocated" and m.peak_bytes >= 4 * 2**20


def test_format_bytes():
    assert format_bytes(512) == "512 B" and format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB" and format_bytes(None) == "n/a"


# --------------------------------------------------------------------------------------------------
# repetition of generated text: repeated n-gram share, distinct-n
# --------------------------------------------------------------------------------------------------
def test_repeated_ngram_share_fixed_examples():
    assert repeated_ngram_share([1, 2, 3, 4, 5, 6, 7]) == 0.0                 # nothing repeats
    assert repeated_ngram_share([7] * 10) == 6 / 7                           # a loop: all windows but the first
    # "a b c d a b c d a b": windows abcd bcda cdab dabc abcd bcda cdab -> the last 3 repeat
    assert repeated_ngram_share([1, 2, 3, 4, 1, 2, 3, 4, 1, 2]) == 3 / 7
    assert repeated_ngram_share([1, 2, 1, 2, 1], n=2) == 2 / 4
    assert repeated_ngram_share([1, 2, 3]) == 0.0 and repeated_ngram_share([]) == 0.0   # no window: 0
    assert repeated_ngram_share(torch.tensor([5, 5, 5, 5, 5])) == 1 / 2                # a 1-D tensor
    assert distinct_ngrams([3, 3, 4, 3]) == 2 / 4 and distinct_ngrams([1, 2, 1, 2, 1], n=2) == 2 / 4
    assert distinct_ngrams([]) == 1.0 and distinct_ngrams([1, 2], n=3) == 1.0


def test_repetition_measures_against_a_brute_force_count():
    """Random token lists (small vocabularies, so repeats happen): the share of windows equal to an earlier
    window, counted pair by pair; distinct-n = 1 - that share whenever there is a window."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        toks = rng.integers(0, int(rng.integers(1, 6)), size=int(rng.integers(0, 40))).tolist()
        for n in (1, 2, 3, 4):
            grams = [tuple(toks[k:k + n]) for k in range(len(toks) - n + 1)]
            repeats = sum(any(grams[j] == grams[k] for j in range(k)) for k in range(len(grams)))
            want = repeats / len(grams) if grams else 0.0
            assert repeated_ngram_share(toks, n) == pytest.approx(want, abs=1e-12), (toks, n)
            if grams:
                assert distinct_ngrams(toks, n) == pytest.approx(1 - want, abs=1e-12), (toks, n)


@pytest.mark.parametrize("call,match", [
    (lambda: repeated_ngram_share([1, 2, 3], n=0), "n must be a positive integer, got 0"),
    (lambda: repeated_ngram_share([1, 2, 3], n=2.0), "n must be a positive integer"),
    (lambda: distinct_ngrams([1, 2], n=True), "n must be a positive integer"),
    (lambda: repeated_ngram_share("abcd"), "tokens must be a list of int token ids"),
    (lambda: repeated_ngram_share([1, 2.5, 3]), "tokens must be a list of int token ids"),
    (lambda: distinct_ngrams(torch.zeros(2, 3, dtype=torch.long)), "tokens must be a 1-D integer tensor"),
    (lambda: distinct_ngrams(torch.zeros(4)), "tokens must be a 1-D integer tensor"),
])
def test_repetition_measures_refuse_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
