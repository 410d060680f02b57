"""`course bench` runs the benchmark scripts and writes their JSON with the device named."""
import json

from course_lib import bench


def test_bench_lists_scripts_and_rejects_unknown_names(capsys):
    assert "generation" in bench.scripts()
    assert bench.main(["no-such-bench"]) == 2
    assert "available" in capsys.readouterr().err


def _bench_device_slug() -> str:
    """The device name bench/_common.py gives the result files on this machine (cpu, cuda)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_common", bench.BENCH_DIR / "_common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    return common.device_slug()


def test_generation_bench_runs_and_names_the_device(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_BENCH_RESULTS", str(tmp_path))
    assert bench.main(["generation"]) == 0
    written = sorted(p.name for p in tmp_path.glob("generation-*.json"))
    assert written == [f"generation-{_bench_device_slug()}.json"], written   # named by the device it ran on
    data = json.loads((tmp_path / written[0]).read_text())
    assert data["device"] and data["rows"][0]["model"] == "tiny"
    ratio = data["rows"][2]
    assert 0 < ratio["tpot_p50_ms"] < 1, "the draft should decode faster than the target"


def test_decode_bench_runs_on_cpu_and_reports_the_roofline(tmp_path):
    """bench/decode.py in its CPU size (compiled rows skipped: a minute of C++ compiling each)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(__import__("os").environ, COURSE_BENCH_RESULTS=str(tmp_path), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, str(root / "bench" / "decode.py"), "--no-compile"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(next(tmp_path.glob("decode-*.json")).read_text())
    names = [r["implementation"] for r in data["rows"]]
    assert names[:2] == ["course eager, ContiguousCache", "course eager, StaticCache"]
    assert any(n.startswith("transformers") for n in names)
    assert data["device"] and data["roofline_ms"] > 0 and data["bandwidth"]
    assert all(r["ms/token"] > 0 for r in data["rows"])


def test_paged_attention_bench_runs_and_reports_bandwidth(tmp_path):
    """bench/paged_attention.py at a small size: every row timed and checked against the reference; on CPU
    the Triton rows are skipped with the reason recorded (on CUDA they run, split and not)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, COURSE_BENCH_RESULTS=str(tmp_path), OMP_NUM_THREADS="1")
    args = ["--batch", "2", "--heads", "8", "--kv-heads", "2", "--head-dim", "64", "--tokens", "200",
            "--dtype", "fp32", "--repeats", "3", "--splits", "1", "2"]
    res = subprocess.run([sys.executable, str(root / "bench" / "paged_attention.py"), *args], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(next(tmp_path.glob("paged_attention-*.json")).read_text())
    names = [r["backend"] for r in data["rows"]]
    assert data["device"] and data["bytes_per_call"] == 2 * 2 * 2 * 200 * 64 * 4 + 2 * 2 * 8 * 64 * 4
    assert names[-3:-1] == ["torch", "reference"] and names[-1].startswith("sdpa-contiguous")
    if "triton" in data["skipped"]:
        assert "triton" not in names
    else:
        assert [r["num_splits"].split()[0] for r in data["rows"] if r["backend"] == "triton"] == ["1", "2"]
    for r in data["rows"]:
        assert r["time_us"] > 0 and r["GB/s"] > 0 and float(r["max_err"]) < 1e-4


def test_quant_bench_runs_and_measures_ratios_in_one_run(tmp_path):
    """bench/quant.py --quick: every row timed in the same run, the speed-ups computed against its bf16 row."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, COURSE_BENCH_RESULTS=str(tmp_path), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, str(root / "bench" / "quant.py"), "--quick", "--repeats", "3",
                          "--reference"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(next(tmp_path.glob("quant-*.json")).read_text())
    rows = {r["weights"]: r for r in data["rows"]}
    assert data["device"] and data["hidden"] == 512 and data["gpt_fast_a100"] == {"int8": 1.48, "int4": 1.88}
    assert rows["bf16"]["speed-up vs 16-bit"] == 1.0   # the CPU baseline is bf16 (fp16 on a T4)
    assert all(r["ms/layer"] > 0 for r in rows.values())
    mb = {k.split()[0]: r["MB/layer"] for k, r in rows.items()}
    assert mb["int8"] < 0.52 * mb["bf16"] and mb.get("int4", 0) < 0.3 * mb["bf16"]   # the bytes the kernels read
    assert "gpt-fast" in res.stdout


def test_lab07_kernel_bench_times_the_answer_key_or_says_why_not(tmp_path):
    """bench/lab07_kernel.py (make gpu-check): the kernel of Lab 07 Part E's answer cell against SDPA on a
    GPU; without one it exits 0 and says why (the interpreter grades the kernel, its times mean nothing)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import torch
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, COURSE_BENCH_RESULTS=str(tmp_path), OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    res = subprocess.run([sys.executable, str(root / "bench" / "lab07_kernel.py"), "--seq", "256", "--repeats", "3"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    if not torch.cuda.is_available():
        assert "skipped: no CUDA GPU" in res.stdout and not list(tmp_path.glob("*.json")), res.stdout
        return
    if "skipped:" in res.stdout:                # a GPU below compute capability 7.0, or no triton package
        assert not list(tmp_path.glob("*.json")), res.stdout
        return
    data = json.loads((tmp_path / "lab07_kernel-cuda.json").read_text())
    assert [r["impl"] for r in data["rows"]] == ["lab07 kernel", "sdpa"] and all(r["time_ms"] > 0 for r in data["rows"])
