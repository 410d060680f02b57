"""`course bench` runs the benchmark scripts and writes their JSON with the device named."""
import json

from course_lib import bench


def test_bench_lists_scripts_and_rejects_unknown_names(capsys):
    assert "generation" in bench.scripts()
    assert bench.main(["no-such-bench"]) == 2
    assert "available" in capsys.readouterr().err


def test_generation_bench_runs_and_names_the_device(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_BENCH_RESULTS", str(tmp_path))
    assert bench.main(["generation"]) == 0
    data = json.loads((tmp_path / "generation-cpu.json").read_text())
    assert data["device"] and data["rows"][0]["model"] == "tiny"
    ratio = data["rows"][2]
    assert 0 < ratio["tpot_p50_ms"] < 1, "the draft should decode faster than the target"
