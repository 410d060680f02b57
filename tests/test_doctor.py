"""`course doctor`'s branches, each driven by monkeypatching what the machine reports: quick/full mode, Triton
on a supported GPU / a T4 / no GPU / not installed, bitsandbytes missing, smoke tests that fail. The whole
doctor on this machine runs in tests/test_packaging.py."""
import subprocess
import sys

import pytest

from course_lib import doctor, env


@pytest.mark.parametrize("forced, cuda, text", [
    ("", False, "quick (small sizes), because no CUDA GPU here"),
    ("", True, "full (real sizes), because a CUDA GPU is here"),
    ("1", True, "quick (small sizes), because COURSE_QUICK=1 is set"),
    ("0", False, "full (real sizes), because COURSE_QUICK=0 is set"),
])
def test_mode_row_says_quick_or_full_and_why(monkeypatch, forced, cuda, text):
    monkeypatch.setenv("COURSE_QUICK", forced)
    monkeypatch.setattr(env.torch.cuda, "is_available", lambda: cuda)
    name, ok, detail, required = doctor.mode_row()
    assert name == "notebook mode" and detail.startswith(text) and not required


def fake_gpu(monkeypatch, cc, triton=True):
    monkeypatch.setattr(env, "compute_capability", lambda: cc)
    monkeypatch.setattr(env, "has_package", lambda name: triton if name == "triton" else True)


SMOKE = {"version": "3.9.0", "max_err": 4.8e-7}


def test_triton_on_a_t4_is_unsupported_and_the_pytorch_paths_are_used(monkeypatch):
    fake_gpu(monkeypatch, (7, 5))
    plan = doctor.triton_plan()
    assert plan == ("cpu", True)                        # the smoke runs under the interpreter, not on the T4
    name, ok, detail, _ = doctor.triton_row(plan, SMOKE)
    assert not ok
    assert "does not support this GPU (compute capability 7.5; it needs 8.0 or newer)" in detail
    assert "PyTorch paths are used" in detail and "only under the interpreter" in detail
    assert "max error 4.8e-07" in detail


def test_triton_on_a_supported_gpu_runs_there(monkeypatch):
    fake_gpu(monkeypatch, (8, 0))
    plan = doctor.triton_plan()
    assert plan == ("cuda", False)
    name, ok, detail, _ = doctor.triton_row(plan, SMOKE)
    assert ok and "triton 3.9.0: the course's Triton kernels run on this GPU" in detail
    name, ok, detail, _ = doctor.triton_row(plan, RuntimeError("CUDA error: no kernel image\nsecond line"))
    assert not ok and "smoke test failed: RuntimeError: CUDA error: no kernel image" in detail
    assert "second line" not in detail


def test_triton_without_a_gpu_runs_only_under_the_interpreter(monkeypatch):
    fake_gpu(monkeypatch, None)
    plan = doctor.triton_plan()
    assert plan == ("cpu", True)
    _, ok, detail, _ = doctor.triton_row(plan, SMOKE)
    assert not ok and detail.startswith("triton 3.9.0 installed; no CUDA GPU: the course's Triton kernels run "
                                        "here only under the interpreter (for tests), the PyTorch paths are used")
    _, ok, detail, _ = doctor.triton_row(plan, RuntimeError("the smoke test did not finish in 60 s"))
    assert not ok and "interpreter smoke test failed: RuntimeError: the smoke test did not finish" in detail


def test_triton_not_installed(monkeypatch):
    fake_gpu(monkeypatch, (9, 0), triton=False)
    assert doctor.triton_plan() is None
    _, ok, detail, _ = doctor.triton_row(None, None)
    assert not ok and detail == "not installed (optional): the course uses its PyTorch paths"


def test_the_triton_smoke_subprocess_reports_its_cause_or_its_timeout():
    crashed = subprocess.Popen([sys.executable, "-c", "import sys; print('noise'); "
                                "sys.exit('ImportError: libcuda.so.1: cannot open shared object file')"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="^ImportError: libcuda.so.1: cannot open"):
        doctor.finish_triton_smoke(crashed)
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="did not finish in 0.5 s"):
        doctor.finish_triton_smoke(slow, timeout=0.5)
    assert slow.poll() is not None                      # killed, not left running


def test_bitsandbytes_missing(monkeypatch):
    monkeypatch.setattr(env, "has_package", lambda name: name != "bitsandbytes")
    rows = doctor.bnb_rows()
    assert [(r[0], r[1], r[3]) for r in rows] == [("bitsandbytes", False, False)]
    assert "not installed" in rows[0][2]
    assert "Not here: bitsandbytes" in doctor.summary(rows)


def test_the_bitsandbytes_smokes_on_this_cpu():
    """Real smokes: the 64-row NF4 linear takes the path bitsandbytes' kernel allows here, the 688-row one
    the dequantize path (routed); both close to the float linear."""
    pytest.importorskip("bitsandbytes")
    from course_lib.quant_eval import bnb_packed_cpu_kernel
    rows = {r[0]: r for r in doctor.bnb_rows()}
    assert rows["bitsandbytes int8"][1] and "relative error" in rows["bitsandbytes int8"][2]
    nf4 = rows["bitsandbytes nf4"]
    assert nf4[1], nf4
    assert f"64x256 takes the {'packed' if bnb_packed_cpu_kernel() else 'dequantize'} path" in nf4[2]
    assert "688x256 takes the dequantize path" in nf4[2]


def test_a_failing_smoke_is_a_row_never_a_traceback_nor_a_failed_doctor(monkeypatch, capsys):
    """Both bitsandbytes smokes and the Triton smoke fail: three "--" rows with their one-line causes, exit 0,
    and the final sentence lists them as not working here."""
    pytest.importorskip("bitsandbytes")

    def planted(*a, **k):
        raise ValueError("planted failure\nwith a second line")
    monkeypatch.setattr(doctor, "bnb_int8_smoke", planted)
    monkeypatch.setattr(doctor, "bnb_nf4_smoke", planted)
    monkeypatch.setattr(env, "has_package", lambda name: True)
    monkeypatch.setattr(doctor, "triton_plan", lambda: ("cpu", True))
    monkeypatch.setattr(doctor, "start_triton_smoke", lambda device, interpret: subprocess.Popen(
        [sys.executable, "-c", "raise RuntimeError('planted triton failure')"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True))
    monkeypatch.setattr(doctor, "model_rows", lambda: [("model tiny", True, "stub", True)])
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out and "second line" not in out
    for name in ("bitsandbytes int8", "bitsandbytes nf4"):
        line = next(ln for ln in out.splitlines() if f" {name} " in ln)
        assert line.split()[0] == "--" and "smoke test failed: ValueError: planted failure" in line
    line = next(ln for ln in out.splitlines() if ln.split()[1:2] == ["triton"])
    assert line.split()[0] == "--" and "RuntimeError: planted triton failure" in line
    last = out.strip().splitlines()[-1]
    assert last.startswith("The course can run here") and "Optional paths working here: none." in last
    assert "Not here: flash-attn, triton, bitsandbytes int8, bitsandbytes nf4 (" in last


def test_a_broken_required_row_fails_the_doctor(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "triton_plan", lambda: None)
    monkeypatch.setattr(doctor, "bnb_rows", lambda: [])
    monkeypatch.setattr(doctor, "model_rows", lambda: [("model tiny", False, "OSError: no such file", True)])
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL model tiny" in " ".join(out.split()) and "The install is broken: model tiny." in out


def test_the_cpu_bf16_note_follows_torchs_probe(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert "this CPU has AVX512-BF16 instructions" in doctor.cpu_bf16_note()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert "no AVX512-BF16: bf16 runs emulated" in doctor.cpu_bf16_note()
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    assert "unknown" in doctor.cpu_bf16_note()


def test_a_smoke_subprocess_that_cannot_start_is_a_row(monkeypatch):
    def no_subprocess(device, interpret):
        raise PermissionError("[Errno 1] Operation not permitted: fork")
    monkeypatch.setattr(doctor, "triton_plan", lambda: ("cpu", True))
    monkeypatch.setattr(doctor, "start_triton_smoke", no_subprocess)
    monkeypatch.setattr(doctor, "bnb_rows", lambda: [])
    monkeypatch.setattr(doctor, "model_rows", lambda: [("model tiny", True, "stub", True)])
    row = next(r for r in doctor.checks() if r[0] == "triton")
    assert not row[1] and "smoke test failed: PermissionError: [Errno 1] Operation not permitted" in row[2]
