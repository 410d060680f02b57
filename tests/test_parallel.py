"""course_lib.parallel: tensor/pipeline parallelism on torch.distributed (gloo, CPU processes).

Each launch starts Python and torch in fresh processes (seconds on a loaded 2-core machine), so the
multi-process checks are few and each runs many things: the TP=2 fixture runs the course's sharding, the
DTensor API, the linear pair and the pipeline in one process group.
"""
from __future__ import annotations

import _thread
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_lib.kvcache import ContiguousCache
from course_lib.models.config import LlamaConfig, as_config
from course_lib.models.llama import LlamaForCausalLM
from course_lib.parallel import (ColumnParallelLinear, ModelSpec, RankFailed, RowParallelLinear, allreduce_time,
                                 bubble_formula, bubble_fraction, check_tp_degree, failing_worker, gpipe_schedule,
                                 gpt3_parameters, launch, linear_pair_check, notes_example, per_gpu_memory,
                                 pipeline_run, ring_allreduce_bytes, sequence, shard_fused_qkv, shard_model,
                                 shard_range, split_layers, time_model, tp_check, tp_comm_per_token, tp_degrees)
from course_lib.parallel.checks import attention_reference, kv_group_mistake, run_on_ranks
from course_lib.parallel.cost import layer_parameters
from course_lib.parallel.layers import ShardedAttention

layers_mod = sys.modules["course_lib.parallel.layers"]
ROOT = Path(__file__).resolve().parents[1]
# 8 query heads, 4 KV heads (GQA), 2 layers: divisible by TP = 1, 2, 4
SMALL = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=4, max_position_embeddings=64)
TINY = ModelSpec("tiny")


# --- in one process ---------------------------------------------------------------------------------------
def test_shard_range_and_degrees():
    assert [shard_range(12, r, 3) for r in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 12)]
    with pytest.raises(ValueError, match="must divide"):
        shard_range(10, 0, 4)
    with pytest.raises(ValueError, match="rank"):
        shard_range(8, 2, 2)
    tiny = as_config("tiny")                          # 4 query heads, 2 KV heads
    assert tp_degrees(tiny) == [p for p in (1, 2) if tiny.intermediate_size % p == 0]
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        check_tp_degree(tiny, 4)
    assert 4 in tp_degrees(SMALL)


def test_fused_qkv_is_split_before_sharding():
    H, K, Dh, D, p = 8, 4, 4, 16, 4
    wq, wk, wv = torch.randn(H * Dh, D), torch.randn(K * Dh, D), torch.randn(K * Dh, D)
    fused = torch.cat([wq, wk, wv])
    for r in range(p):
        got = shard_fused_qkv(fused, H, K, Dh, r, p)
        want = torch.cat([wq.chunk(p)[r], wk.chunk(p)[r], wv.chunk(p)[r]])
        assert torch.equal(got, want)
        if r == 0:
            assert not torch.equal(got, fused.chunk(p)[0])   # the naive split: rank 0 would get Q rows only


def test_column_and_row_shards_reassemble_the_layer():
    torch.manual_seed(0)
    lin = torch.nn.Linear(12, 8)
    x = torch.randn(3, 5, 12)
    p = 4
    cols = [ColumnParallelLinear.from_linear(lin, r, p) for r in range(p)]
    assert torch.allclose(torch.cat([c(x) for c in cols], -1), lin(x), atol=1e-6)
    rows = [RowParallelLinear.from_linear(lin, r, p) for r in range(p)]
    partial = sum(torch.nn.functional.linear(x[..., shard_range(12, r, p)], rows[r].weight) for r in range(p))
    assert torch.allclose(partial + lin.bias, lin(x), atol=1e-5)          # the bias once, after the sum
    one = RowParallelLinear.from_linear(lin, 0, 1)
    assert torch.allclose(one(x), lin(x), atol=1e-6)



@torch.no_grad()
def test_lab_attention_reference_is_the_course_tp_attention(monkeypatch):
    """Lab 11's unsharded block (`attention_reference`) is the course model's attention without RoPE, and the sum
    of `ShardedAttention`'s partial outputs over the ranks (its all-reduce played here); the `kv_group` mistake
    differs from it."""
    cfg = LlamaConfig(vocab_size=32, hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=2, max_position_embeddings=16)
    torch.manual_seed(3)
    attn = LlamaForCausalLM(cfg).model.layers[0].self_attn.eval()
    x = torch.randn(2, 5, 24)
    cos, sin = torch.ones(2, 5, 2), torch.zeros(2, 5, 2)              # RoPE at angle 0: no rotation
    bo = torch.randn(24)
    w = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight)
    want = attention_reference(x, *w, bo, 8, 4)
    assert torch.allclose(attn(x, cos, sin) + bo, want, atol=1e-5)
    monkeypatch.setattr(layers_mod, "all_reduce_sum", lambda y, world_size, group=None: y)   # each rank's partial
    for p in (1, 2, 4):
        partials = sum(ShardedAttention(attn, r, p)(x, cos, sin) for r in range(p))
        assert torch.allclose(partials + bo, want, atol=1e-5), p
    assert kv_group_mistake(x, *w, bo, 8, 4, 2) is not None                   # 4 local heads read 4 KV heads...
    assert not torch.allclose(kv_group_mistake(x, *w, bo, 8, 4, 2), want, atol=1e-3)  # ...of the wrong groups
    assert kv_group_mistake(x, *w, bo, 8, 4, 4) is None                          # 2 local heads, 4 KV heads


def test_run_on_ranks_counts_the_collectives_and_goes_on_after_a_raise():
    out = run_on_ranks(_ranks_demo, [(torch.ones(2, 3),), (torch.ones(1),), (torch.ones(4),)], 2)
    for rank, calls in enumerate(out):
        first, second, third = calls
        assert torch.equal(first["output"], torch.full((2, 3), 2.0))
        assert first["collectives"] == [["all_reduce", [2, 3]], ["all_gather", [2, 3]], ["barrier", None]]
        assert second["raised"] == "ValueError: num_kv_heads=1" and "_ranks_demo" in second["traceback"]
        assert torch.equal(third["output"], torch.full((4,), 2.0))


def _ranks_demo(x, rank, world_size):
    """For run_on_ranks (sent as source): a collective of each kind, and a ValueError for a 1-element x."""
    if x.numel() == 1:
        raise ValueError("num_kv_heads=1")
    y = x.clone()
    dist.all_reduce(y)
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x)
    dist.barrier()
    return y

@torch.no_grad()
def test_shard_model_world_one_is_the_model_with_a_cache():
    torch.manual_seed(1)
    model = LlamaForCausalLM(SMALL).eval()
    tp = shard_model(model, 1)
    ids = torch.randint(0, SMALL.vocab_size, (2, 6))
    assert torch.allclose(tp(ids), model(ids), atol=1e-5)
    c1, c2 = ContiguousCache(), ContiguousCache()
    model(ids, cache=c1), tp(ids, cache=c2)
    nxt = torch.randint(0, SMALL.vocab_size, (2, 1))
    assert torch.allclose(tp(nxt, cache=c2), model(nxt, cache=c1), atol=1e-5)
    with pytest.raises(RuntimeError, match="process group"):
        shard_model(model, 2)                        # no group here
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        shard_model(torch.nn.Linear(2, 2), 1)


def test_cost_model():
    assert ring_allreduce_bytes(1000, 1) == 0 and ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 8) == pytest.approx(1750)
    assert allreduce_time(1e6, 8, "nvlink4") < allreduce_time(1e6, 8, "pcie4") < allreduce_time(1e6, 8, "ethernet-10g")
    c = tp_comm_per_token(SMALL, 4, bpe=2)
    assert c["allreduces"] == 2 * SMALL.num_hidden_layers and c["message_bytes"] == SMALL.hidden_size * 2
    # one GPU holds every parameter (the config's own count is the oracle)
    m1 = per_gpu_memory(SMALL, bpe=2)
    assert m1["weights"] == SMALL.num_parameters() * 2
    lp = layer_parameters(SMALL)
    m4 = per_gpu_memory(SMALL, tp=4, context=10, batch=2, bpe=2)
    assert m1["weights"] - m4["weights"] == SMALL.num_hidden_layers * (lp["attention"] + lp["mlp"]) * 3 / 4 * 2
    assert per_gpu_memory(SMALL, context=10, batch=2)["kv"] == 4 * m4["kv"] == SMALL.kv_cache_bytes(10, 2, 2)
    assert per_gpu_memory(SMALL, pp=2)["layers_per_stage"] == 1
    with pytest.raises(ValueError, match="tp=3"):
        per_gpu_memory(SMALL, tp=3)
    assert time_model(1.0, 4, 10, 0.01, parallel_cores=2) == pytest.approx(0.5 + 0.1)
    assert time_model(1.0, 1, 10, 0.01) == 1.0


def test_notes_175b_on_16_gpus_in_bytes():
    n = gpt3_parameters()
    assert abs(n - 175e9) / 175e9 < 0.01
    ex = notes_example(gpus=16, bpe=2)
    assert 10.5e9 < ex["params_per_gpu"] < 11.5e9                # the notes' "~11B each" (parameters)
    assert ex["weight_bytes_per_gpu"] == pytest.approx(2 * ex["params_per_gpu"])   # ~22 GB in fp16
    assert ex["allreduces_per_token"] == 192
    assert ex["comm_s_per_token"]["nvlink4"] < ex["comm_s_per_token"]["ethernet-100g"]


def test_pipeline_schedule_and_bubble():
    for p, m in [(1, 3), (2, 4), (4, 8), (4, 1), (8, 32)]:
        sch = gpipe_schedule(p, m)
        assert len(sch) == p * m
        assert bubble_fraction(sch, p) == pytest.approx(bubble_formula(p, m))
    assert bubble_fraction(gpipe_schedule(2, 4, [1.0, 3.0]), 2) > bubble_formula(2, 4)   # unbalanced: worse
    assert [list(r) for r in split_layers(5, 2)] == [[0, 1, 2], [3, 4]]
    with pytest.raises(ValueError, match="p must"):
        split_layers(2, 3)


def _local_worker():
    return 1


def test_launch_refuses_what_spawn_cannot_import():
    with pytest.raises(ValueError, match="importable module"):
        launch(lambda: 1, 2)
    with pytest.raises(ValueError, match="world_size"):
        launch(failing_worker, 0)
    with pytest.raises(ValueError, match="backend"):
        launch(failing_worker, 2, backend="mpi")


STDIN_SCRIPT = """
import sys
from multiprocessing import forkserver
from course_lib.parallel import failing_worker, launch
try:
    launch(failing_worker, 2, kwargs=dict(bad_rank=-1, hang_rank=None), timeout=30)
except RuntimeError as e:
    print("REFUSED:", e)
    print("fork server started:", forkserver._forkserver._forkserver_pid is not None)
    sys.exit(3)
print("NOT REFUSED")
"""


def test_launch_from_a_script_on_standard_input_is_refused_up_front(tmp_path):
    """``python - < script.py``: the ranks cannot re-import a main module whose file is ``<stdin>`` (they
    died with "exited ... without reporting"); launch says why and what to do before starting anything.
    The same check lets a script run from its file through."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-"], input=STDIN_SCRIPT, capture_output=True, text=True, timeout=170,
                       env=env, cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    assert "REFUSED: launch cannot start processes here: this script was read from standard input" in r.stdout
    assert "re-imports the main module from its file" in r.stdout
    assert "python script.py" in r.stdout and "notebook" in r.stdout
    assert "fork server started: False" in r.stdout, r.stdout
    script = tmp_path / "script.py"
    script.write_text("from course_lib.parallel.launch import _check_main_module_is_a_file\n"
                      "_check_main_module_is_a_file()\nprint('FILE OK')\n")
    r = subprocess.run([sys.executable, "script.py"], capture_output=True, text=True, timeout=170, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0 and "FILE OK" in r.stdout, r.stderr[-3000:]


# --- in process groups -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tp2():
    steps = [(tp_check, (TINY,), dict(batch=3, prompt_len=6, new_tokens=4, dtensor=True)),
             (linear_pair_check, (8, 12, 6), {}),
             (pipeline_run, (ModelSpec(config=SMALL, seed=2), 4), dict(batch=4, seq=6, stage_sleep_s=0.05))]
    t = time.perf_counter()
    out = launch(sequence, 2, args=(steps,), timeout=30)
    print(f"TP=2 launch: {time.perf_counter() - t:.1f} s")
    return out


def test_tp2_equals_single_process_tiny(tp2):
    for rank, (res, _, _) in enumerate(tp2):
        for tag in ("ours", "dtensor"):                       # ours and torch.distributed.tensor.parallel
            r = res[tag]
            assert r["forward_max_abs_diff"] < 1e-4, (rank, tag, r)
            assert r["decode_max_abs_diff"] < 1e-4, (rank, tag, r)
            assert r["tokens_equal"] and r["same_on_all_ranks"], (rank, tag, r)
        assert res["ours"]["local_kv_heads"] == 1             # tiny has 2 KV heads: one per rank
        assert res["ours"]["params_per_rank"] == res["dtensor"]["params_per_rank"] < res["params_full"]


def test_linear_pair_and_the_bias_added_on_every_rank(tp2):
    res = tp2[0][1]
    assert res["max_abs_diff"] < 1e-4 and res["mlp_max_abs_diff"] < 1e-4
    assert res["bias_every_rank_error"] < 1e-4 < res["bias_every_rank_off_by"]   # off by exactly (p-1) * bias


def test_pipeline_logits_and_bubble(tp2):
    res = tp2[0][2]
    assert res["max_abs_diff"] < 1e-4
    assert len(res["timeline"]) == 2 * 4 and res["formula"] == pytest.approx(1 / 5)
    # 50 ms of "kernel" per stage and micro-batch; the sends and this machine's load only add idle time
    assert res["formula"] - 0.05 < res["bubble"] < res["formula"] + 0.25, res["bubble"]


def test_tp4_gqa_batch_and_cached_decode():
    out = launch(tp_check, 4, args=(ModelSpec(config=SMALL, seed=5),),
                 kwargs=dict(batch=2, prompt_len=5, new_tokens=4), timeout=30)
    for res in out:
        r = res["ours"]
        assert r["forward_max_abs_diff"] < 1e-4 and r["decode_max_abs_diff"] < 1e-4, r
        assert r["tokens_equal"] and r["same_on_all_ranks"] and r["local_kv_heads"] == 1


def _alive_children():
    return [p for p in multiprocessing.active_children() if p.is_alive()]


def test_a_failing_rank_is_named_and_the_others_killed():
    t = time.perf_counter()
    with pytest.raises(RankFailed) as e:
        launch(failing_worker, 2, kwargs=dict(bad_rank=1, hang_rank=None), timeout=60)
    assert e.value.rank == 1 and "rank 1 was told to fail" in str(e.value)
    assert time.perf_counter() - t < 55                      # not the 60 s collective timeout
    assert not _alive_children()


def test_a_rank_stuck_in_a_collective_times_out():
    with pytest.raises(RankFailed) as e:
        launch(failing_worker, 2, kwargs=dict(bad_rank=-1, hang_rank=0), timeout=3)
    assert e.value.rank == 0 and "Timed out" in str(e.value)
    assert not _alive_children()


def _forkserver_children():
    """Processes the fork server forked that are still running (ranks are its children, not ours)."""
    import psutil
    from multiprocessing import forkserver
    pid = forkserver._forkserver._forkserver_pid
    if pid is None:
        return []
    end = time.monotonic() + 10            # a killed rank is reaped by the server a moment later
    while True:
        alive = [c for c in psutil.Process(pid).children() if c.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)


def test_keyboard_interrupt_kills_the_ranks():
    """Interrupted while it waits for the ranks (both started: on a loaded machine starting them can take
    longer than any fixed delay), launch raises KeyboardInterrupt at once, not after the 60 s collective
    timeout, and no rank is left running."""
    fired = []

    def interrupt_when_running():
        end = time.monotonic() + 120
        while len(_alive_children()) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)                      # inside the collective or the sleep by now, or still importing
        fired.append(time.monotonic())
        _thread.interrupt_main()

    timer = threading.Thread(target=interrupt_when_running, daemon=True)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        launch(failing_worker, 2, kwargs=dict(bad_rank=-1, hang_rank=0), timeout=60)
    assert fired and time.monotonic() - fired[0] < 30, "ended by the collective timeout, not the interrupt"
    assert not _alive_children() and not _forkserver_children()


def test_an_interrupt_while_starting_the_ranks_leaves_none_behind(monkeypatch):
    """The interrupt lands inside Process.start, after the fork server forked rank 0 and before its pid
    came back (where a busy machine's slow start puts a fixed-delay interrupt): it is held until every
    rank is started, then raised, and the ranks are stopped. Without holding it, rank 0 was left running,
    unknown to launch, and printed a FileNotFoundError traceback when the result queue was gone."""
    from multiprocessing import forkserver
    real = forkserver.read_signed
    calls = []

    def read_signed(fd):
        calls.append(fd)
        if len(calls) == 1:
            _thread.interrupt_main()        # raised at the next line of Python: inside read_signed
        return real(fd)

    launch(failing_worker, 2, kwargs=dict(bad_rank=-1, hang_rank=None), timeout=30)   # the server is up
    monkeypatch.setattr(forkserver, "read_signed", read_signed)
    with pytest.raises(KeyboardInterrupt):
        launch(failing_worker, 2, kwargs=dict(bad_rank=-1, hang_rank=0), timeout=60)
    assert len(calls) >= 2, "the interrupt was raised before rank 1 was started"
    assert not _alive_children() and not _forkserver_children()


@pytest.mark.slow
def test_the_same_worker_under_torchrun():
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

    def run():
        return subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(__import__(
            "course_lib.parallel.launch", fromlist=["free_port"]).free_port()), "-m", "course_lib.parallel.launch",
                               "course_lib.parallel.workers:torchrun_demo", "--timeout", "30"],
                              capture_output=True, text=True, timeout=170, env=env)

    r = run()
    if r.returncode != 0 and "exitcode: -6" in r.stderr:
        # a rank aborted inside gloo (SIGABRT; seen once in CI, 2026-11-23, cause not captured): run once more,
        # keeping the first failure's output visible
        import warnings
        warnings.warn(f"torchrun: a rank aborted (SIGABRT); retrying once. Its stderr began:\n{r.stderr[:3000]}")
        r = run()
    assert r.returncode == 0, r.stderr[:3000] + "\n...\n" + r.stderr[-2000:]
    assert "rank 0 result: {'world_size': 2, 'allreduce_sum': 3.0" in r.stdout, r.stdout
