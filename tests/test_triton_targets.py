"""Every Triton kernel of the course, compiled ahead of time on this CPU for a T4 (sm_75), an A100 (sm_80)
and an H100 (sm_90), in each dtype the course launches it with on that GPU (``triton_aot.launch_dtypes``:
fp16 on sm_75, bf16 only from sm_80). What each build must show:

* every target: it builds (PTX for that target and a cubin from ptxas); a launch in fp16 or fp32 asks for
  no bf16 anywhere in the kernel (Triton's IR);
* sm_80 and sm_90: tensor-core mma where the kernel does a ``tl.dot`` in 16 bits, none in fp32 (the course
  asks for IEEE fp32 dots, not tf32), and the K/V loads of its loops staged with cp.async;
* sm_75: no tensor-core instructions, which is what README and ``course_lib.env`` tell a T4 student (Triton
  supports compute capability >= 8.0; the kernels still build there). If a Triton release starts using
  them on sm_75, this fails and that text needs updating.
"""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from triton_aot import INLINED, KERNELS, TARGETS, compiled, launch_dtypes

ROOT = Path(__file__).resolve().parents[1]
CASES = [(k, cc, dt) for k in KERNELS for cc in TARGETS for dt in launch_dtypes(k, cc)]


def _jit_functions_in_course_lib() -> dict[str, str]:
    """{function name: file} for every function decorated with @triton.jit under course_lib/."""
    found = {}
    for path in sorted((ROOT / "course_lib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(ast.unparse(d).startswith("triton.jit")
                                                         for d in node.decorator_list):
                found[node.name] = str(path.relative_to(ROOT))
    return found


def test_every_triton_kernel_of_the_course_is_compiled_here():
    """A new @triton.jit in course_lib must be added to triton_aot.KERNELS (or INLINED, naming a kernel of
    KERNELS that calls it), so that it gets its ahead-of-time builds."""
    found = _jit_functions_in_course_lib()
    assert len(found) >= 10, found                      # 6 kernels and 4 inlined helpers today
    covered = {spec.attr for spec in KERNELS.values()} | set(INLINED)
    assert set(found) == covered, (f"not compiled by tests/test_triton_targets.py: {sorted(set(found) - covered)}; "
                                   f"listed but gone: {sorted(covered - set(found))}")


def test_inlined_helpers_are_called_by_their_kernel():
    pytest.importorskip("triton")
    _skip_if_interpreting()
    for helper, kernel in INLINED.items():
        assert re.search(rf"\b{helper}\(", inspect.getsource(KERNELS[kernel].fn().fn)), \
            f"{helper} is not called by {kernel}: compiling that kernel does not compile it"


def test_the_course_asks_no_bf16_of_a_t4():
    """The dtypes compiled below are the library's choice (course_lib.env.half_dtype on a simulated GPU)."""
    for kernel in KERNELS:
        assert "bf16" not in launch_dtypes(kernel, 75), kernel
        assert "fp16" in launch_dtypes(kernel, 75), kernel
        for cc in (80, 90):
            assert "bf16" in launch_dtypes(kernel, cc), (kernel, cc)
    assert len(CASES) == 34


def _skip_if_interpreting():
    from course_lib.env import triton_interpreting
    if triton_interpreting():
        pytest.skip("TRITON_INTERPRET is set in this process: @triton.jit makes interpreted functions")


@pytest.mark.slow
@pytest.mark.parametrize("kernel,cc,dtype", CASES, ids=[f"{k.replace(' ', '_')}-sm_{cc}-{dt}" for k, cc, dt in CASES])
def test_kernel_compiles_for_the_target(kernel, cc, dtype):
    pytest.importorskip("triton")
    _skip_if_interpreting()
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as e:
        pytest.skip(f"this triton has no ahead-of-time compile API: {e}")
    spec = KERNELS[kernel]
    build = compiled(kernel, cc, dtype)
    ptx, ttir = build.asm["ptx"], build.asm["ttir"]
    assert re.search(rf"^\.target sm_{cc}a?\b", ptx, re.M), f"PTX not for sm_{cc}"
    assert len(build.asm["cubin"]) > 0, "ptxas produced no cubin"
    if dtype != "bf16":
        assert "bf16" not in ttir, f"a {dtype} launch of {kernel} asks for bf16"
    if cc < 80:
        assert "mma" not in ptx, (f"Triton now uses tensor cores for {kernel} on sm_{cc}: update README's T4 "
                                  "paragraph and the comment on course_lib.env.TRITON_MIN_CAPABILITY")
        return
    if spec.dots:
        if dtype == "fp32":
            assert "mma" not in ptx, f"{kernel}: fp32 dots on tensor cores (tf32), not IEEE fp32"
        else:
            assert "mma" in ptx, f"{kernel}: {dtype} dots not on tensor cores on sm_{cc}"
    if spec.loops:
        assert "cp.async" in ptx, f"{kernel}: K/V loads not pipelined on sm_{cc}"


def _lab07_answer() -> dict:
    """Lab 07 Part E's answer cell (solutions/lab07.ipynb), run as bench/lab07_kernel.py runs it."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("lab07_kernel_bench", ROOT / "bench" / "lab07_kernel.py")
    bench = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, str(ROOT / "bench"))          # its `from _common import ...`
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return bench.load_answer()


@pytest.mark.slow
@pytest.mark.parametrize("cc", [75, 80])
def test_lab07_answer_kernel_builds_for_a_t4_and_an_a100(cc):
    """What Lab 07 Part E tells a T4 student: the answer key's kernel compiles for sm_75 in fp16 (the lab's
    16-bit type) with no bf16 and no tensor cores, and for sm_80 on tensor cores."""
    pytest.importorskip("triton")
    _skip_if_interpreting()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    const = dict(H=16, GROUP=4, D=64, CAUSAL=True, PRECISION=None, BLOCK_M=64, BLOCK_N=64)  # the bench's launch
    sig = {name: "*fp16" for name in ("Q", "K", "V", "O")}
    sig.update({"T": "i32", "S": "i32", "scale": "fp32", "s_qb": "i32", "s_qh": "i32", "s_kb": "i32", "s_kh": "i32"},
               **{k: "constexpr" for k in const})
    build = triton.compile(ASTSource(fn=_lab07_answer()["_flash_fwd"], signature=sig, constexprs=const),
                           target=GPUTarget("cuda", cc, 32), options=dict(num_warps=4, num_stages=2))
    ptx = build.asm["ptx"]
    assert re.search(rf"^\.target sm_{cc}a?\b", ptx, re.M) and len(build.asm["cubin"]) > 0
    assert "bf16" not in build.asm["ttir"], "an fp16 launch of the lab's kernel asks for bf16"
    if cc < 80:
        assert "mma" not in ptx, "Triton now uses tensor cores on sm_75: update Lab 07 Part E's T4 paragraph"
    else:
        assert "mma" in ptx, "the lab's fp16 dots are not on tensor cores on sm_80"


@pytest.mark.slow
@pytest.mark.parametrize("cc", [75, 80])
def test_lab07_backward_answer_kernels_build_for_a_t4_and_an_a100(cc):
    """Lab 07 Part F's answer kernels (fp32 only, the lab's contract) compile for sm_75 and sm_80, where a
    student's GPU runs them: no bf16, and IEEE fp32 dots (no tensor cores)."""
    pytest.importorskip("triton")
    _skip_if_interpreting()
    import linecache
    import math

    import torch
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from course_grading.build import answer_sources, read_notebook
    src = answer_sources(read_notebook(ROOT / "solutions" / "lab07.ipynb"))["flash_backward_answer"]
    name = "<lab07 flash_backward_answer>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)    # @triton.jit reads the source here
    ns = {"math": math, "torch": torch, "triton": triton, "tl": tl, "__name__": "lab07_backward_answer"}
    exec(compile(src, name, "exec"), ns)
    const = dict(H=16, GROUP=4, D=64, CAUSAL=True, BLOCK_M=32, BLOCK_N=32)
    for kernel, pointers in (("_bwd_dkdv", ("Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV")),
                             ("_bwd_dq", ("Q", "K", "V", "DO", "LSE", "DELTA", "DQ"))):
        sig = {p: "*fp32" for p in pointers}
        sig.update({"T": "i32", "S": "i32", "scale": "fp32"}, **{k: "constexpr" for k in const})
        build = triton.compile(ASTSource(fn=ns[kernel], signature=sig, constexprs=const),
                               target=GPUTarget("cuda", cc, 32), options=dict(num_warps=4, num_stages=2))
        ptx = build.asm["ptx"]
        assert re.search(rf"^\.target sm_{cc}a?\b", ptx, re.M) and len(build.asm["cubin"]) > 0, kernel
        assert "bf16" not in build.asm["ttir"], f"{kernel}: an fp32 launch asks for bf16"
        assert "mma" not in ptx, f"{kernel}: fp32 dots on tensor cores (tf32), not IEEE fp32"
