"""Module 09: workloads, the step-cost model, the serving simulator's policies and invariants, the widget."""
import math

import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_lib.paged.manager import blocks_needed  # noqa: E402
from course_lib.perf.workload import bursty_arrivals, load_trace, poisson_arrivals, save_trace  # noqa: E402
from course_lib.serving import (ChunkedPrefill, ContinuousBatching, Decision, Disaggregated,  # noqa: E402
                                DynamicBatching, Request, StaticBatching, StepCostModel, check_invariants,
                                fcfs_schedule, make_workload, max_blocks_used, simulate, sweep_load)
from course_lib.serving.simulator import SchedulingError  # noqa: E402
from course_lib.viz.serving import (ServingExplorer, ServingPlayground, plot_latency_cdf,  # noqa: E402
                                    plot_load_sweep, plot_timeline)

LINEAR = StepCostModel(fixed_s=0.01, per_token_s=1e-4, per_seq_s=2e-4, per_context_token_s=1e-6,
                       compute_s_per_token=0.0, overhead_s=0.0)


@pytest.fixture
def seed():
    s = int(np.random.SeedSequence().entropy % 2**32)
    print("seed", s)
    return s


# --- workloads ------------------------------------------------------------------------------------------
def test_arrivals_have_the_asked_rate_and_burstiness(seed):
    rng = np.random.default_rng(seed)
    gaps = np.diff(poisson_arrivals(20000, 5.0, rng), prepend=0)
    assert abs(gaps.mean() - 0.2) < 0.01 and abs(gaps.std() / gaps.mean() - 1) < 0.05
    gaps = np.diff(bursty_arrivals(20000, 5.0, cv=3.0, rng=rng), prepend=0)
    assert abs(gaps.mean() - 0.2) < 0.03 and gaps.std() / gaps.mean() > 2.4   # CV close to 3, far above Poisson's 1


def test_workload_is_seeded_clipped_and_round_trips(tmp_path, seed):
    a = make_workload(300, 4.0, arrival="bursty", seed=seed, max_context=512, prompt_median=400)
    assert a == make_workload(300, 4.0, arrival="bursty", seed=seed, max_context=512, prompt_median=400)
    assert a != make_workload(300, 4.0, arrival="bursty", seed=seed + 1, max_context=512, prompt_median=400)
    assert all(r.prompt_tokens + r.output_tokens <= 512 and r.output_tokens >= 2 for r in a)
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a)
    for name in ("t.jsonl", "t.csv"):
        assert load_trace(save_trace(a, tmp_path / name)) == a
    table = [(10, 5), (100, 50)]
    b = make_workload(50, 1.0, lengths_table=table, seed=seed)
    assert {(r.prompt_tokens, r.output_tokens) for r in b} <= set(table)


def test_bad_inputs_name_the_argument(tmp_path):
    for kw, name in (({"rate": -1.0}, "rate"), ({"rate": 0}, "rate"), ({"rate": 1.0, "arrival": "x"}, "arrival")):
        with pytest.raises(ValueError, match=name):
            make_workload(5, **kw)
    with pytest.raises(ValueError, match="cv"):
        bursty_arrivals(5, 1.0, cv=0)
    with pytest.raises(ValueError, match="output_tokens"):
        Request(0, 0.0, 5, 0)
    reqs = make_workload(5, 1.0, seed=0, max_context=256)
    for kw, name in (({"num_blocks": 0}, "num_blocks"), ({"block_size": 0}, "block_size")):
        with pytest.raises(ValueError, match=name):
            simulate(reqs, ContinuousBatching(), **kw)
    long = [Request(0, 0.0, 100, 30), Request(1, 0.1, 10, 5)]    # peak 129 tokens: 9 blocks of 16
    with pytest.raises(ValueError, match="num_blocks=8"):
        simulate(long, ContinuousBatching(), num_blocks=8)
    assert check_invariants(simulate(long, ContinuousBatching(), num_blocks=9)) == []   # exactly fits
    with pytest.raises(ValueError, match="path"):
        save_trace(reqs, tmp_path / "t.txt")
    with pytest.raises(ValueError, match="max_batch"):
        ContinuousBatching(max_batch=0)
    with pytest.raises(ValueError, match="transfer_s_per_token"):
        Disaggregated(transfer_s_per_token=-1.0)
    with pytest.raises(ValueError, match="block_size"):
        blocks_needed(3, 0)


# --- the cost model -------------------------------------------------------------------------------------
def test_step_cost_model_formula_and_roofline():
    c = StepCostModel(fixed_s=1.0, per_token_s=0.1, per_seq_s=0.01, per_context_token_s=0.001,
                      compute_s_per_token=0.5, overhead_s=2.0)
    assert c.step_time(0, 0, 0) == 0
    assert c.step_time(0, 3, 100) == pytest.approx(2.0 + max(1.0 + 0.3 + 0.03 + 0.1, 1.5))
    assert c.step_time(10, 0, 10) == pytest.approx(2.0 + 5.0)       # compute-bound: the max picks FLOPs
    from course_lib.perf import get_gpu, min_decode_latency
    r = StepCostModel.from_roofline("A100-80GB", "llama-2-7b", overhead_s=0.0)
    assert r.fixed_s == pytest.approx(min_decode_latency("llama-2-7b", "A100-80GB"))   # read all weights once
    assert r.per_context_token_s * get_gpu("A100-80GB").bandwidth == pytest.approx(2 * 32 * 4096 * 2)   # KV bytes/token
    assert r.decode_time(1, 0) == pytest.approx(r.fixed_s + r.per_context_token_s)
    assert r.prefill_time(4096) == pytest.approx(4096 * 2 * 6.74e9 / 312e12, rel=0.01)    # compute-bound prefill
    with pytest.raises(ValueError, match="fixed_s"):
        StepCostModel(fixed_s=-1.0)


def test_calibrate_local_fits_nonnegative_costs():
    import torch

    from course_lib.models import load
    torch.manual_seed(0)
    model, _ = load("tiny")
    c = StepCostModel.calibrate_local(model, batch_sizes=(1, 4), context_lengths=(16, 64), prefill_lengths=(16, 64),
                                      repeats=1)
    assert len(c.samples) == 2 + 4 and "calibrated" in c.source
    coefs = [c.fixed_s, c.per_token_s, c.per_seq_s, c.per_context_token_s]
    assert all(math.isfinite(x) and x >= 0 for x in coefs) and sum(coefs) > 0
    measured = np.array([s[3] for s in c.samples])
    pred = np.array([c.prefill_time(C) if k == "prefill" else c.decode_time(B, C) for k, B, C, _ in c.samples])
    # a least-squares fit: no worse than predicting the mean for every sample
    assert ((pred - measured) ** 2).sum() <= ((measured - measured.mean()) ** 2).sum() + 1e-12


# --- exact small cases ----------------------------------------------------------------------------------
def test_one_request_times_are_exact():
    r = [Request(0, 0.5, 40, 4)]
    res = simulate(r, ContinuousBatching(), cost=LINEAR, num_blocks=10, block_size=16)
    want, t = [], 0.5 + LINEAR.step_time(40, 0, 40)
    want.append(t)
    for k in range(1, 4):              # decode with 40 + k - 1 tokens in the cache, reading 40 + k
        t += LINEAR.step_time(0, 1, 40 + k)
        want.append(t)
    rec = res.record(0)
    assert rec.times == pytest.approx(want) and rec.finish == pytest.approx(want[-1])
    assert [s[0] for s in res.segments[0]] == ["prefill", "decode"]
    assert rec.rid == 0 and rec.start == 0.5 and rec.prompt_tokens == 40 and rec.finish_reason == "length"
    assert max_blocks_used(res) == blocks_needed(40 + 3, 16) == 3
    # disaggregated: the same plus the KV transfer of 40 tokens before the first decode step
    d = simulate(r, Disaggregated(transfer_s_per_token=0.01), cost=LINEAR, num_blocks=10)
    assert d.record(0).ttft == pytest.approx(rec.ttft)
    assert d.record(0).times[1] - d.record(0).times[0] == pytest.approx(0.4 + LINEAR.step_time(0, 1, 41))


def test_static_batch_is_padded_and_waits_for_a_full_batch():
    reqs = [Request(0, 0.0, 10, 2), Request(1, 0.3, 30, 5), Request(2, 5.0, 8, 3)]
    res = simulate(reqs, StaticBatching(max_batch=2, timeout_s=1.0), cost=LINEAR, num_blocks=100)
    t0 = 0.3 + LINEAR.step_time(2 * 30, 0, 2 * 30)            # the batch starts when the 2nd request comes
    assert res.record(0).times[0] == pytest.approx(t0) == res.record(1).times[0]
    end = t0 + sum(LINEAR.step_time(0, 2, 2 * (30 + k)) for k in range(1, 5))    # padded to 5 tokens
    assert res.record(1).finish == pytest.approx(end)
    last = res.segments[0][-1]                         # done after 2 tokens, its row padded to the end
    assert last[0] == "padding" and last[1] == pytest.approx(res.record(0).finish) and last[2] == pytest.approx(end)
    assert res.record(2).times[0] == pytest.approx(6.0 + LINEAR.step_time(8, 0, 8))   # alone: timeout 1 s
    s = res.summary()
    computed = 2 * 30 + 2 * 4 + 8 + 2
    useful = 40 + (2 + 5 - 2) + 8 + 2
    assert s["padding_waste"] == pytest.approx(1 - useful / computed)
    dyn = simulate(reqs, DynamicBatching(max_batch=2), cost=LINEAR, num_blocks=100)
    assert dyn.record(0).times[0] == pytest.approx(LINEAR.step_time(10, 0, 10))     # no waiting


# --- invariants on random workloads ------------------------------------------------------------------
POLICIES = [StaticBatching(8, 0.5), DynamicBatching(8), ContinuousBatching(32), ChunkedPrefill(32, 128),
            Disaggregated(1, 2, 1e-5, max_batch=32, prefill_token_budget=512),
            Disaggregated(2, 1, 1e-5, max_batch=16, prefill_token_budget=None, name="disaggregated-2p")]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_invariants_hold_for_every_policy(policy, seed):
    reqs = make_workload(60, 30.0, arrival="bursty", seed=seed, max_context=512, prompt_median=120)
    res = simulate(reqs, policy, num_blocks=96, block_size=16)
    assert check_invariants(res, reqs) == []
    assert sorted(r.rid for r in res.records) == sorted(r.rid for r in reqs)
    if policy.name in ("continuous", "chunked"):
        assert max_blocks_used(res) <= 96
    again = simulate(reqs, policy, num_blocks=96, block_size=16)
    assert [r.times for r in again.records] == [r.times for r in res.records]   # deterministic


def test_preemption_when_blocks_are_scarce_and_all_complete(seed):
    reqs = make_workload(60, 50.0, seed=seed, max_context=1024, prompt_median=200, output_median=200)
    scarce = simulate(reqs, ContinuousBatching(64), num_blocks=80)
    plenty = simulate(reqs, ContinuousBatching(64), num_blocks=20000)
    assert len(scarce.preemptions) > 0 and len(plenty.preemptions) == 0
    assert check_invariants(scarce, reqs) == [] and max_blocks_used(scarce) <= 80
    resumed = [a for a in scarce.admissions if a[3] == "resume"]
    assert len(resumed) == len(scarce.preemptions)           # every preempted request came back
    assert sum(r.preemptions for r in scarce.records) == len(scarce.preemptions)
    assert scarce.summary()["throughput_tok_s"] < plenty.summary()["throughput_tok_s"]


# --- preemption by swap (KV offload to host memory) and the transfer latency -----------------------------
def test_swap_time_is_accounted_exactly_on_a_hand_built_case():
    # A (7 + 3) and B (4 + 3), blocks of 4, a pool of 3: both prefill at once (2 + 1 blocks); at the next
    # step B cannot grow to a 2nd block and is the newest, so it is preempted with 4 tokens of KV; it resumes
    # when A is done (3 blocks free). Swap: out and back in, S = latency + 4 * per-token seconds each way,
    # each added to the step that issues it; recompute: B's resume is a prefill of 4 + 1 tokens instead.
    reqs = [Request(0, 0.0, 7, 3), Request(1, 0.0, 4, 3)]
    lat, per_tok = 0.003, 0.002
    S = lat + 4 * per_tok
    st = LINEAR.step_time
    t1 = st(11, 0, 11)
    t2 = t1 + st(0, 1, 8) + S                    # A decodes while B's blocks go out
    t3 = t2 + st(0, 1, 9)                        # A's last token; B does not fit yet
    sw = simulate(reqs, ContinuousBatching(8), cost=LINEAR, num_blocks=3, block_size=4, preemption="swap",
                  host_blocks=1, swap_s_per_token=per_tok, swap_latency_s=lat)
    assert sw.record(0).times == pytest.approx([t1, t2, t3])
    t4 = t3 + st(0, 1, 5) + S                    # B's KV comes back and it decodes in the same step
    assert sw.record(1).times == pytest.approx([t1, t4, t4 + st(0, 1, 6)])
    assert [(a[1], a[3], a[4]) for a in sw.swaps] == [(1, "out", 4), (1, "in", 4)]
    assert [a[5] for a in sw.swaps] == pytest.approx([S, S])
    assert sw.swaps[0][0] == pytest.approx(t1) and sw.swaps[1][0] == pytest.approx(t3)
    assert len(sw.preemptions) == 1 and check_invariants(sw, reqs) == []
    rc = simulate(reqs, ContinuousBatching(8), cost=LINEAR, num_blocks=3, block_size=4)
    assert rc.swaps == [] and rc.record(0).times == pytest.approx([t1, t2 - S, t3 - S])
    t4r = t3 - S + st(5, 0, 5)                   # prompt + the generated token prefilled again
    assert rc.record(1).times == pytest.approx([t1, t4r, t4r + st(0, 1, 6)])
    # the same with preemption="recompute" given explicitly: the default's results, unchanged
    again = simulate(reqs, ContinuousBatching(8), cost=LINEAR, num_blocks=3, block_size=4, preemption="recompute")
    assert [r.times for r in again.records] == [r.times for r in rc.records]


@pytest.mark.parametrize("policy", [ContinuousBatching(64), ChunkedPrefill(64, 128)], ids=lambda p: p.name)
def test_swap_conserves_tokens_and_blocks(policy, seed):
    reqs = make_workload(60, 50.0, seed=seed, max_context=1024, prompt_median=200, output_median=200)
    res = simulate(reqs, policy, num_blocks=80, preemption="swap", host_blocks=40, swap_s_per_token=1e-6)
    assert check_invariants(res, reqs) == [] and max_blocks_used(res) <= 80 and len(res.preemptions) > 0
    outs = [a for a in res.swaps if a[3] == "out"]
    assert outs, "a scarce pool with a host pool must swap"
    for rid in {a[1] for a in res.swaps}:       # out, in, out, in ...: each copy back carries what went out
        seq = [a for a in res.swaps if a[1] == rid]
        assert [a[3] for a in seq] == ["out", "in"] * (len(seq) // 2) and len(seq) % 2 == 0
        assert all(o[4] == i[4] > 0 for o, i in zip(seq[::2], seq[1::2]))
        assert all(a[5] == pytest.approx(1e-6 * a[4]) for a in seq)
    # a preemption is a swap or (host pool full) a recompute; every one resumes
    assert len(outs) <= len(res.preemptions) == len([a for a in res.admissions if a[3] == "resume"])
    assert sum(r.preemptions for r in res.records) == len(res.preemptions)
    # a host pool too small for most victims (8 blocks = 128 tokens): those are recomputed instead
    small = simulate(reqs, policy, num_blocks=80, preemption="swap", host_blocks=8, swap_s_per_token=1e-6)
    assert check_invariants(small, reqs) == []
    assert len([a for a in small.swaps if a[3] == "out"]) < len(small.preemptions)
    assert all(a[4] <= 8 * 16 for a in small.swaps)
    again = simulate(reqs, policy, num_blocks=80, preemption="swap", host_blocks=40, swap_s_per_token=1e-6)
    assert [r.times for r in again.records] == [r.times for r in res.records]


def test_swap_and_transfer_arguments_are_checked():
    reqs = [Request(0, 0.0, 7, 3), Request(1, 0.0, 4, 3)]
    for kw, name in (({"preemption": "offload"}, "preemption"), ({"preemption": "swap"}, "host_blocks"),
                     ({"preemption": "swap", "host_blocks": 0}, "host_blocks"),
                     ({"preemption": "swap", "host_blocks": 4, "swap_s_per_token": -1.0}, "swap_s_per_token"),
                     ({"preemption": "swap", "host_blocks": 4, "swap_latency_s": -1.0}, "swap_latency_s"),
                     ({"host_blocks": -1}, "host_blocks")):
        with pytest.raises(ValueError, match=name):
            simulate(reqs, ContinuousBatching(8), cost=LINEAR, num_blocks=3, block_size=4, **kw)
    with pytest.raises(ValueError, match="transfer_latency_s"):
        Disaggregated(transfer_latency_s=-1.0)
    # the link's latency is paid once per transfer, between a request's first and second token
    r = [Request(0, 0.5, 40, 4)]
    a = simulate(r, Disaggregated(transfer_s_per_token=0.01), cost=LINEAR, num_blocks=10)
    b = simulate(r, Disaggregated(transfer_s_per_token=0.01, transfer_latency_s=0.25), cost=LINEAR, num_blocks=10)
    assert b.record(0).times == pytest.approx([a.record(0).times[0]] + [t + 0.25 for t in a.record(0).times[1:]])


def test_continuous_beats_static_at_high_load(seed):
    reqs = make_workload(120, 40.0, seed=seed, max_context=1024)
    st = simulate(reqs, StaticBatching(16, 0.5), num_blocks=4000).summary()
    co = simulate(reqs, ContinuousBatching(16), num_blocks=4000).summary()
    assert co["throughput_tok_s"] > 1.3 * st["throughput_tok_s"]
    assert co["e2e_p50"] < st["e2e_p50"] and st["padding_waste"] > 0.3 and co["padding_waste"] == 0


def test_chunked_prefill_lowers_p99_tpot_on_long_prompts(seed):
    reqs = make_workload(80, 4.0, seed=seed, prompt_median=1500, prompt_sigma=0.6, output_median=64,
                         output_sigma=0.5, max_context=4096)
    plain = simulate(reqs, ContinuousBatching(64), num_blocks=4000).summary()
    chunk = simulate(reqs, ChunkedPrefill(64, 256), num_blocks=4000).summary()
    assert chunk["tpot_p99"] < plain["tpot_p99"]
    assert chunk["throughput_tok_s"] == pytest.approx(plain["throughput_tok_s"], rel=0.05)


def test_fcfs_reference_scheduler_and_a_bad_one():
    from course_lib.serving import SeqView
    run = [SeqView(0, 0.0, 1, 17), SeqView(1, 0.1, 1, 16), SeqView(2, 0.2, 2, 33)]   # 0 and 2 need one more block
    d = fcfs_schedule([SeqView(3, 0.3, 0, 10)], run, 1, 16, 8)
    assert d.preempt == [2] and d.admit == []                     # 0 grows, 2 (newest) cannot: preempted
    d = fcfs_schedule([SeqView(3, 0.3, 0, 10), SeqView(4, 0.4, 0, 40)], run[:2], 3, 16, 8)
    assert d == Decision(preempt=[], admit=[3])                   # 0 takes one block, 3 one, 4 needs 3: stop

    def greedy(waiting, running, free_blocks, block_size, max_batch):
        return Decision(admit=[w.rid for w in waiting][:max_batch - len(running)])   # ignores the blocks

    reqs = make_workload(30, 50.0, seed=1, max_context=512)
    with pytest.raises(SchedulingError, match="over-subscribed"):
        simulate(reqs, ContinuousBatching(32, scheduler=greedy), num_blocks=40)
    res = simulate(reqs, ContinuousBatching(32, scheduler=greedy), num_blocks=40, strict=False)
    assert any("over-subscribed" in v for v in check_invariants(res, reqs))

    def idle(waiting, running, free_blocks, block_size, max_batch):
        return Decision()
    with pytest.raises(SchedulingError, match="deadlock"):
        simulate(reqs, ContinuousBatching(32, scheduler=idle), num_blocks=40)


def test_sweep_and_plots():
    rows = sweep_load(lambda rate: make_workload(30, rate, seed=0, max_context=512),
                      {"static": StaticBatching(8, 0.5), "continuous": ContinuousBatching(8)}, [5.0, 20.0],
                      num_blocks=400, ttft_slo=1.0, tpot_slo=0.05)
    assert len(rows) == 4 and {"goodput_req_s", "slo_attainment", "label", "rate"} <= set(rows[0])
    assert all(r["goodput_req_s"] <= r["requests_per_s"] + 1e-12 for r in rows)
    reqs = make_workload(20, 5.0, seed=0, max_context=512)
    res = {p.name: simulate(reqs, p, num_blocks=400) for p in POLICIES[:3]}
    ax = plot_timeline(res["continuous"], max_requests=10)
    assert len(ax.patches) >= 10 and "continuous" in ax.get_title()
    assert len(plot_latency_cdf(res, "ttft").lines) >= 3
    with pytest.raises(ValueError, match="metric"):
        plot_latency_cdf(res, "nope")
    axes = plot_load_sweep(rows)
    assert len(axes[0].lines) == 2
    import matplotlib.pyplot as plt
    plt.close("all")


# --- the widget ------------------------------------------------------------------------------------------
def test_widget_uses_core_widgets_and_sliders_drive_the_state():
    v = ServingExplorer(plot=False, num_requests=30, rate=5.0, num_blocks=400)
    assert type(v.policy) is W.Dropdown and type(v.rate) is W.FloatSlider and type(v.num_blocks) is W.IntSlider
    assert type(v.out) is W.Output and type(v.metrics) is W.HTML and type(v.ui) is W.VBox
    assert "continuous" in v.metrics.value and "throughput" in v.metrics.value
    v.policy.value = "static"
    assert v.state.policy == "static" and v.state.result.policy == "static" and "static:" in v.metrics.value
    before = v.state.metrics["throughput_tok_s"]
    v.rate.value = 30.0                                   # more load: static's throughput goes up (fuller batches)
    assert v.state.rate == 30.0 and v.state.metrics["throughput_tok_s"] > before
    v.policy.value = "continuous"
    v.num_blocks.value = 64                                # scarce KV: preemptions show up
    assert v.state.num_blocks == 64 and v.state.metrics["preemptions"] > 0
    assert f"preemptions {v.state.metrics['preemptions']}" in v.metrics.value
    assert check_invariants(v.state.result, v.state.requests) == []


def test_widget_draws_and_reports_unservable_budgets():
    v = ServingExplorer(plot=True, num_requests=15, rate=5.0, num_blocks=400)
    assert v.figure is not None and len(v.figure.axes[0].patches) > 0
    p = ServingPlayground(num_requests=15, num_blocks=400)
    p.set(num_blocks=2)                                   # every request needs more than 2 blocks
    assert p.result is None and "num_blocks=2" in p.metrics_text
    with pytest.raises(ValueError, match="policy"):
        p.set(policy="nope")
