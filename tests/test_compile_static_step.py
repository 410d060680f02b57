"""course_lib.compile_tools' static decode step, its export as plain data, the graph interpreter and the
profiler trace reader (Lab 12 Parts A and B's references). No inductor compile: export traces with dynamo
only, so the file runs in seconds on a CPU."""
import pytest
import torch
from torch.profiler import profile

from course_grading import wire
from course_lib.compile_tools import (count_compiles, export_step, graph_report, read_trace, run_exported,
                                      static_caches, static_decode_step, trace_events)
from course_lib.kvcache import StaticCache
from course_lib.models import LlamaForCausalLM, as_config


@pytest.fixture(scope="module")
def small():
    g = torch.Generator().manual_seed(5)
    with torch.random.fork_rng(devices=[]):
        m = LlamaForCausalLM(as_config(dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                            max_position_embeddings=64))).eval().requires_grad_(False)
    for p in m.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return m


def int_position_step(model, tok, pos, k_cache, v_cache):
    """The known wrong answer: the position read on the host to slice the written slots."""
    p = int(pos)
    logits, k, v = static_decode_step(model, tok, pos, k_cache, v_cache)
    return logits + 0 * k[:, :, :, : p + 1].sum(), k, v


def test_static_step_equals_the_model_at_every_position_whatever_the_unwritten_slots_hold(small):
    prompts = torch.randint(0, 96, (3, 9), generator=torch.Generator().manual_seed(1))
    want = small(prompts)
    k, v = static_caches(small, 3, 12, fill=1e3)                       # garbage in every slot
    for p in range(9):
        logits, k, v = static_decode_step(small, prompts[:, p:p + 1], torch.tensor(p), k, v)
        torch.testing.assert_close(logits, want[:, p], rtol=1e-5, atol=1e-5)
    # the slots after the last one written still hold what they held
    assert (k[:, :, :, 9:] == 1e3).all() and (v[:, :, :, 9:] == 1e3).all()
    # the same K/V as the course's StaticCache holds for these prompts
    cache = StaticCache.for_model(small, 3, 12)
    small(prompts, cache=cache)
    torch.testing.assert_close(k[0, :, :, :9], cache.k[0][:, :, :9], rtol=1e-5, atol=1e-5)


def test_unmasked_step_is_wrong_when_unwritten_slots_hold_garbage(small):
    tok = torch.tensor([[3], [4]])
    k, v = static_caches(small, 2, 8, fill=5.0)
    good, _, _ = static_decode_step(small, tok, torch.tensor(0), k, v)
    bad, _, _ = static_decode_step(small, tok, torch.tensor(0), k, v, masked=False)
    assert (good - bad).abs().max() > 1e-3


def test_static_step_refuses_bad_input(small):
    k, v = static_caches(small, 2, 8)
    for tok, pos, kc, what in [(torch.tensor([3, 4]), torch.tensor(0), k, "tok"),
                               (torch.tensor([[3], [4]]), 0, k, "pos"), (torch.tensor([[3], [4]]),
                                                                         torch.tensor([0]), k, "pos"),
                               (torch.tensor([[3], [4]]), torch.tensor(0), k[:1], "k_cache")]:
        with pytest.raises(ValueError, match=what):
            static_decode_step(small, tok, pos, kc, v)
    with pytest.raises(ValueError, match="batch"):
        static_caches(small, 0, 8)


def test_static_step_compiles_once_and_the_int_position_once_per_position(small):
    k, v = static_caches(small, 1, 8)
    calls = [(small, torch.tensor([[1]]), torch.tensor(p), k, v) for p in range(4)]
    assert count_compiles(static_decode_step, calls, dynamic=False) == 1
    assert count_compiles(int_position_step, calls, dynamic=False) == 4


def test_exported_graph_is_plain_data_that_runs_elsewhere_at_every_position(small):
    graph = export_step(static_decode_step, small, batch=2, max_len=10)
    report = graph_report(graph)
    assert report["static"] and report["ops"] > 50 and not report["data_dependent"], report
    graph = wire.decode(wire.encode(graph))                          # what the kernel sends the grader
    prompts = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(2))
    want = small(prompts)
    k, v = static_caches(small, 2, 10, fill=-7.0)
    for p in range(7):
        logits, k, v = run_exported(graph, small, prompts[:, p:p + 1], torch.tensor(p), k, v)
        torch.testing.assert_close(logits, want[:, p], rtol=1e-5, atol=1e-5)


def test_graph_report_sees_the_host_read_position(small):
    report = graph_report(export_step(int_position_step, small, batch=2, max_len=10))
    assert not report["static"] and report["data_dependent"] and report["symbolic"], report


def test_run_exported_refuses_what_is_not_an_aten_op(small):
    graph = export_step(static_decode_step, small, batch=1, max_len=4)
    k, v = static_caches(small, 1, 4)
    args = (small, torch.tensor([[1]]), torch.tensor(0), k, v)
    for target in ("builtins.exec", "os.system", "aten.mm", "aten..default", "torch.ops.aten.mm.default"):
        bad = dict(graph, nodes=[dict(graph["nodes"][0], target=target)] + graph["nodes"][1:])
        with pytest.raises(ValueError, match="aten ops"):
            run_exported(bad, *args)
    # aten ops that read memory a tensor does not own, or reach outside tensors, and sizes past the limit
    for target, a in [("aten.as_strided.default", [{"node": graph["inputs"][0]["name"]}, [4], [1], 10 ** 9]),
                      ("aten.empty.memory_format", [[4, 4]]), ("aten.from_file.default", ["/etc/passwd"]),
                      ("aten._unsafe_index.Tensor", [{"node": graph["inputs"][0]["name"]}, []])]:
        bad = dict(graph, nodes=[{"name": "x", "target": target, "args": a, "kwargs": {}}] + graph["nodes"])
        with pytest.raises(ValueError, match="refuses"):
            run_exported(bad, *args)
    for target, a in [("aten.zeros.default", [[2 ** 14, 2 ** 14]]), ("aten.arange.default", [10 ** 12])]:
        bad = dict(graph, nodes=[{"name": "x", "target": target, "args": a, "kwargs": {}}] + graph["nodes"])
        with pytest.raises(ValueError, match="limit"):
            run_exported(bad, *args)
    bad = dict(graph, nodes=[{"name": "x", "target": "operator.mul", "args": [[0], 10 ** 12], "kwargs": {}}])
    with pytest.raises(ValueError, match="numbers and tensors"):
        run_exported(bad, *args)
    with pytest.raises(ValueError, match="course-graph-1"):
        run_exported({"nodes": []}, *args)
    unknown = dict(graph, inputs=[dict(graph["inputs"][0], target="model.not_a_weight")] + graph["inputs"][1:])
    with pytest.raises(ValueError, match="not the model's"):
        run_exported(unknown, *args)


def test_trace_events_and_read_trace_on_a_real_trace(small):
    with profile() as prof:
        with torch.inference_mode():
            small(torch.tensor([[1, 2, 3]]))
    events = trace_events(prof)
    ids = {e["id"] for e in events}
    seen = set()
    for e in events:                                              # plain data, parents first
        assert set(e) == {"id", "name", "parent", "device", "self_us", "total_us"}
        assert e["parent"] is None or (e["parent"] in ids and e["parent"] in seen)
        seen.add(e["id"])
    r = read_trace(events, tokens=3)
    # one forward: 7 linears per layer + the head are top-level ops; nested aten ops are not counted
    linears = sum(e["name"] == "aten::linear" for e in events)
    assert linears == 7 * 2 + 1
    nested = sum(e["name"].startswith("aten::") for e in events)
    assert linears / 3 <= r["ops_per_token"] < nested / 3
    assert r["kernels_per_token"] == 0 and r["top_op"].startswith("aten::") and 0 < r["top_share"] <= 1


def test_read_trace_by_hand():
    ev = [{"id": 0, "name": "## step ##", "parent": None, "device": "cpu", "self_us": 5.0, "total_us": 40.0},
          {"id": 1, "name": "aten::linear", "parent": 0, "device": "cpu", "self_us": 2.0, "total_us": 30.0},
          {"id": 2, "name": "aten::addmm", "parent": 1, "device": "cpu", "self_us": 28.0, "total_us": 28.0},
          {"id": 3, "name": "aten::add", "parent": 0, "device": "cpu", "self_us": 3.0, "total_us": 3.0},
          {"id": 4, "name": "aten::add", "parent": None, "device": "cpu", "self_us": 4.0, "total_us": 4.0},
          {"id": 5, "name": "gemm_kernel", "parent": None, "device": "cuda", "self_us": 9.0, "total_us": 9.0}]
    r = read_trace(ev, tokens=2)
    assert r == {"ops_per_token": 1.5, "kernels_per_token": 0.5, "top_op": "aten::addmm", "top_share": 28 / 37}
    assert read_trace([], 1) == {"ops_per_token": 0.0, "kernels_per_token": 0.0, "top_op": None, "top_share": 0.0}
    for bad, tokens in [(ev, 0), (ev[1:], 1), ([dict(ev[0], self_us=-1.0)], 1), ("events", 1), (ev + [ev[0]], 1)]:
        with pytest.raises(ValueError):
            read_trace(bad, tokens)
