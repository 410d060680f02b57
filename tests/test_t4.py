"""A Colab T4 (Turing, compute capability 7.5: fp16 yes, hardware bf16 no, Triton unsupported, flash-attn 2
no), simulated on this CPU: torch reports a CUDA GPU of that capability (``device_tools.simulated_gpu``)
and every decision the course takes on a GPU is asked what it would do there. Each must pick fp16 and the
PyTorch paths, say so once, and never ask the T4 for bf16 or a Triton kernel. An A100 (8.0) is asked the
same questions, so that the tests see the two answers differ.

What this cannot check without a T4: that the PyTorch paths and fp16 kernels actually run there (CUDA
kernels, cuBLAS, SDPA's memory-efficient backend), speed, and what Triton does at run time on sm_75. The
last is built ahead of time in tests/test_triton_targets.py; the first runs in the gpu-marked test below
wherever a GPU is.
"""
from __future__ import annotations

import importlib.util
import re
import types
import warnings
from pathlib import Path

import pytest
import torch
from device_tools import simulated_gpu

from course_lib import env
from course_lib.attention import backends
from course_lib.paged import BlockManager, PagedCache, contiguous_to_paged, paged_attention, paged_attention_reference
from course_lib.paged.attention import resolve_backend

ROOT = Path(__file__).resolve().parents[1]
T4, A100, P100 = ((7, 5), "Tesla T4"), ((8, 0), "NVIDIA A100-SXM4-40GB"), ((6, 0), "Tesla P100-PCIE-16GB")
HAS_TRITON = env.has_package("triton")


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch):
    """Each test sees the process as if no notice had been given yet."""
    monkeypatch.setattr(env, "_NOTICES", set())


def notices(fn, *args, **kwargs):
    """(fn's result, the CourseNotice messages it gave)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    return out, [str(w.message) for w in caught if issubclass(w.category, env.CourseNotice)]


def test_env_on_a_t4_picks_fp16_and_not_triton():
    with simulated_gpu(*T4):
        assert env.device().type == "cuda"
        assert env.real_bf16() is False
        assert env.half_dtype() == env.half_dtype("cuda") == torch.float16
        assert env.triton_gpu_supported() is False and env.triton_gpu_supported((7, 5)) is False
        assert "7.5" in env.triton_unsupported_reason()
        assert env.flash_attn_usable() is False
        caps = env.capabilities()
        assert (caps.device, caps.compute_capability, caps.real_bf16, caps.fp16) == ("cuda", "7.5", False, True)
    with simulated_gpu(*A100):
        assert env.real_bf16() is True and env.half_dtype("cuda") == torch.bfloat16
        assert env.triton_gpu_supported() is HAS_TRITON
    assert env.half_dtype("cpu") == torch.bfloat16           # no GPU at all: the CPU's own 16-bit type


def test_auto_takes_the_pytorch_path_on_a_t4_and_says_so_once():
    with simulated_gpu(*T4):
        used, said = notices(env.use_triton, "cuda", "auto")
        assert used is False and len(said) == 1
        assert "Tesla T4" in said[0] and "7.5" in said[0] and "PyTorch paths" in said[0] and "\n" not in said[0]
        for backend in ("auto", "torch", "reference"):              # every later decision: silent
            chosen, again = notices(resolve_backend, backend, torch.device("cuda"))
            assert chosen == ("torch" if backend == "auto" else backend) and again == []
    chosen, said = notices(resolve_backend, "auto", "cpu")
    assert chosen == "torch" and said == []                           # a CPU: no notice, it is the usual case


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_auto_takes_triton_on_an_a100():
    with simulated_gpu(*A100):
        assert notices(resolve_backend, "auto", "cuda") == ("triton", [])


def test_explicit_triton_on_a_t4_warns_and_below_sm_70_refuses(monkeypatch):
    if not HAS_TRITON:
        with pytest.raises(ValueError, match="backend='triton'.*triton package"):
            resolve_backend("triton", "cuda")
        return
    with simulated_gpu(*T4):
        chosen, said = notices(resolve_backend, "triton", "cuda")
        assert chosen == "triton" and len(said) == 1
        assert "backend='triton'" in said[0] and "7.5" in said[0] and "reference" in said[0]
        assert notices(resolve_backend, "triton", "cuda") == ("triton", [])          # once
    with simulated_gpu(*P100), pytest.raises(ValueError, match=r"backend='triton'.*P100.*6\.0"):
        resolve_backend("triton", "cuda")
    with pytest.raises(ValueError, match="backend='triton'.*runs on CUDA GPUs only"):
        resolve_backend("triton", "meta")
    monkeypatch.setattr(env, "has_package", lambda name: name != "triton")
    with simulated_gpu(*A100), pytest.raises(ValueError, match="backend='triton'.*triton package"):
        resolve_backend("triton", "cuda")


def test_explicit_triton_on_a_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(2, 4, 8)
    k = torch.randn(2, 2, 9, 8)
    kp, vp, tables, lens = contiguous_to_paged(k, k.clone(), [9, 4], 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="backend='triton'.*CUDA tensors.*TRITON_INTERPRET=1"):
        paged_attention(q, kp, vp, tables, lens, backend="triton")
    with pytest.raises(ValueError, match="backend='triton'"):
        PagedCache(BlockManager(8, 4), _pool_on("cpu"), backend="triton").decode_backend
    torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens),              # auto: the torch path
                               paged_attention_reference(q, kp, vp, tables, lens), rtol=1e-5, atol=1e-5)


def test_paged_attention_decides_through_resolve_backend(monkeypatch):
    """paged_attention takes its path from resolve_backend (so from env.use_triton) for q's device, and
    nothing else: on a T4 that answers "torch"."""
    from course_lib.paged import attention as paged_module
    asked = []

    def spy(backend, device):
        asked.append((backend, torch.device(device)))
        return "torch"

    monkeypatch.setattr(paged_module, "resolve_backend", spy)
    q, k = torch.randn(2, 4, 8), torch.randn(2, 2, 9, 8)
    kp, vp, tables, lens = contiguous_to_paged(k, k.clone(), [9, 4], 4, generator=torch.Generator().manual_seed(1))
    for backend in ("auto", "triton"):
        torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens, backend=backend),
                                   paged_attention_reference(q, kp, vp, tables, lens), rtol=1e-5, atol=1e-5)
    assert asked == [("auto", torch.device("cpu")), ("triton", torch.device("cpu"))]


def _pool_on(device):
    """A stand-in for a KVPool whose memory lives on ``device`` (the cache's decision reads only that)."""
    return types.SimpleNamespace(block_size=4, num_blocks=8, device=torch.device(device))


def test_paged_cache_and_engine_decode_with_torch_on_a_t4():
    with simulated_gpu(*T4):
        cache = PagedCache(BlockManager(8, 4), _pool_on("cuda"))
        backend, said = notices(lambda: cache.decode_backend)
        assert backend == "torch" and len(said) == 1
    with simulated_gpu(*A100):
        assert PagedCache(BlockManager(8, 4), _pool_on("cuda")).decode_backend == ("triton" if HAS_TRITON else "torch")
    from course_lib.models import load
    from course_lib.serving import Engine
    model, _ = load("tiny", device="cpu", verbose=False)
    eng = Engine(model, num_blocks=8, block_size=4)
    assert eng.backend == "auto" and eng.decode_backend == "torch"


def test_attention_backends_report_on_a_t4(monkeypatch):
    """What Module 07 prints about attention kernels on a T4: no flash backend, flash-attn refused even
    when installed, SDPA for Hugging Face models, and the Triton kernels' PyTorch paths."""
    installed = lambda name: True  # noqa: E731  (flash-attn and triton "installed")
    monkeypatch.setattr(env, "has_package", installed)
    monkeypatch.setattr(backends, "has_package", installed)
    with simulated_gpu(*T4):
        assert "7.5" in backends.flash_backend_reason(env.compute_capability(), torch.float16)
        usable, line = backends.flash_attn_status()
        assert not usable and "sm_75" in line and "sm_80" in line
        assert backends.hf_attn_implementation() == "sdpa"
        ok, line = backends.triton_status()
        assert not ok and "7.5" in line and "PyTorch paths" in line and "interpreter" in line
    with simulated_gpu(*A100):
        assert backends.triton_status()[0] is True and backends.flash_backend_reason((8, 0)) is None


def _bench_common():
    spec = importlib.util.spec_from_file_location("bench_common_t4", ROOT / "bench" / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benches_choose_fp16_and_no_triton_on_a_t4():
    common = _bench_common()
    with simulated_gpu(*T4):
        assert common.default_dtype() == "fp16"
        assert "7.5" in common.triton_skip_reason("tests/test_paged_attention.py")
    with simulated_gpu(*A100):
        assert common.default_dtype() == "bf16"
        assert (common.triton_skip_reason("x") is None) is HAS_TRITON
    assert common.default_dtype() == "fp32"
    assert "interpreter" in common.triton_skip_reason("tests/test_paged_attention.py") or not HAS_TRITON


def test_the_int4_kernel_is_not_tried_in_bf16_on_a_t4():
    from course_lib.quant.fast import int4_activation_dtypes
    with simulated_gpu(*T4):
        assert int4_activation_dtypes("cuda") == ()
    with simulated_gpu(*A100):
        assert int4_activation_dtypes("cuda") == (torch.bfloat16,)
    assert int4_activation_dtypes("cpu") == (torch.bfloat16, torch.float32)


LAUNCHERS = re.compile(r"\b(flash_attention_triton|flash_decode_triton|paged_attention_triton|"
                       r"combine_splits_triton)\(")
DECISIONS = re.compile(r"\b(triton_gpu_supported|triton_skip_reason|use_triton|resolve_backend)\b")


def _code_units():
    """(where, code) for every notebook cell and every other Python file that may launch a kernel; comment
    lines and ``def`` lines dropped, text inside strings (the interpreter scripts) kept out by a crude rule:
    a subprocess script never launches on the GPU, so lines of a triple-quoted block are dropped."""
    files = sorted(ROOT.glob("notebooks/*.py")) + sorted(ROOT.glob("solutions/*.py")) + \
        sorted(ROOT.glob("bench/*.py")) + sorted((ROOT / "course_lib").rglob("*.py"))
    for path in files:
        text = re.sub(r'("""|\'\'\')(.*?)\1', "", path.read_text(), flags=re.S)
        cells = re.split(r"^# %%.*$", text, flags=re.M) if path.parts[-2] in ("notebooks", "solutions") else [text]
        for i, cell in enumerate(cells):
            code = "\n".join(ln for ln in cell.splitlines() if not ln.lstrip().startswith(("#", "def ")))
            yield f"{path.relative_to(ROOT)}" + (f" cell {i}" if len(cells) > 1 else ""), code


def test_every_native_triton_launch_asks_the_one_decision():
    """A notebook cell, bench script or library file that launches a course Triton kernel must consult the
    decision (env.triton_gpu_supported / use_triton, or what is built on them): a guard such as
    ``torch.cuda.is_available() and has_package("triton")`` would send a T4 to Triton."""
    launching = [(where, code) for where, code in _code_units() if LAUNCHERS.search(code)]
    assert len(launching) >= 6, [w for w, _ in launching]   # notebooks 06/07, both benches, the library
    bad = [where for where, code in launching if not DECISIONS.search(code)]
    assert not bad, f"launch a Triton kernel without course_lib.env's decision: {bad}"


@pytest.mark.gpu
def test_decisions_on_this_gpu():
    """On a real GPU (a T4 included): the dtype and the decode path follow its compute capability, and the
    auto path runs there and matches the reference."""
    cc = torch.cuda.get_device_capability()
    assert env.half_dtype("cuda") == (torch.bfloat16 if cc >= (8, 0) else torch.float16)
    assert resolve_backend("auto", "cuda") == ("triton" if env.triton_gpu_supported() else "torch")
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 2, 40, 64, generator=g), torch.randn(3, 2, 40, 64, generator=g)
    q = torch.randn(3, 8, 64, generator=g)
    kp, vp, tables, lens = contiguous_to_paged(k, v, [40, 17, 3], 16, generator=g)
    dt = env.half_dtype("cuda")
    args = [t.cuda() for t in (q.to(dt), kp.to(dt), vp.to(dt), tables, lens)]
    want = paged_attention_reference(*[t.float() if t.is_floating_point() else t for t in args])
    torch.testing.assert_close(paged_attention(*args).float(), want, rtol=2e-2, atol=2e-2)
