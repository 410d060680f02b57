"""Module 07: FlashAttention's backward. The tiled PyTorch backward == torch.autograd through
``reference_attention`` (causal and not, GQA, lengths not tile multiples, T < S, half precision); the
Triton backward (``triton_flash_backward``) == the same, under the interpreter on CPU."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from course_lib.attention import reference_attention, tiled_attention, tiled_attention_backward

ROOT = Path(__file__).resolve().parents[1]


def qkv_do(B, H, K, T, S, Dh, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, do = torch.randn(B, H, T, Dh, generator=g), torch.randn(B, H, T, Dh, generator=g)
    k, v = torch.randn(B, K, S, Dh, generator=g), torch.randn(B, K, S, Dh, generator=g)
    return tuple(x.to(device, dtype) for x in (q, k, v, do))


def autograd_grads(q, k, v, do, causal, scale=None):
    """dq, dk, dv of sum(reference_attention(q, k, v) * do), by torch.autograd, in fp32."""
    q, k, v = (x.detach().float().requires_grad_() for x in (q, k, v))
    out = reference_attention(q, k, v, causal=causal, scale=scale)
    return torch.autograd.grad(out, (q, k, v), do.float())


BACKWARD_CASES = [  # (B, H, K, T, S, Dh), block_q, block_k
    ((1, 2, 2, 1, 1, 8), 4, 4),             # one token
    ((2, 4, 4, 37, 37, 16), 16, 16),        # MHA, not tile multiples
    ((2, 8, 2, 29, 29, 32), 8, 16),         # GQA 4, block_q < block_k
    ((1, 6, 1, 5, 70, 24), 4, 16),          # MQA, T < S (a cache offset), odd head dim
    ((2, 4, 2, 23, 40, 16), 16, 8),         # GQA 2, T < S, block_q > block_k
    ((3, 4, 2, 64, 64, 16), 32, 32),        # exact tile multiples
    ((1, 2, 1, 13, 13, 8), 64, 64),         # one tile larger than the sequence
]


@pytest.mark.parametrize("shape,bq,bk", BACKWARD_CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_backward_equals_autograd_through_the_reference(shape, bq, bk, causal):
    q, k, v, do = qkv_do(*shape, seed=sum(shape) + bq)
    out, lse = tiled_attention(q, k, v, causal=causal, return_lse=True)
    got = tiled_attention_backward(q, k, v, out, lse, do, causal=causal, block_q=bq, block_k=bk)
    want = autograd_grads(q, k, v, do, causal)
    for name, g, w, x in zip("qkv", got, want, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype, name
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"d{name}: {m}")  # noqa: B023


def test_tiled_backward_scale_half_precision_and_device(device):
    q, k, v, do = qkv_do(2, 4, 2, 19, 27, 16, seed=5, dtype=torch.bfloat16, device=device)
    out, lse = tiled_attention(q, k, v, causal=True, scale=0.3, return_lse=True)
    got = tiled_attention_backward(q, k, v, out, lse, do, causal=True, scale=0.3, block_q=8, block_k=8)
    want = autograd_grads(q, k, v, do, True, scale=0.3)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16 and g.device.type == device.type
        torch.testing.assert_close(g.float(), w, rtol=5e-2, atol=5e-2)


def test_tiled_backward_bad_arguments_raise():
    q, k, v, do = qkv_do(1, 4, 2, 4, 6, 8, seed=11)
    out, lse = tiled_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        tiled_attention_backward(q, k, v, out, lse[..., :3], do)
    with pytest.raises(ValueError, match="dout"):
        tiled_attention_backward(q, k, v, out, lse, do[:, :2])
    with pytest.raises(TypeError, match="out"):
        tiled_attention_backward(q, k, v, out.numpy(), lse, do)
    with pytest.raises(ValueError, match="block_k"):
        tiled_attention_backward(q, k, v, out, lse, do, block_k=0)
    with pytest.raises(ValueError, match="causal"):
        tiled_attention_backward(q[:, :, :1].expand(1, 4, 8, 8), k, v, out[:, :, :1].expand(1, 4, 8, 8),
                                 lse[:, :, :1].expand(1, 4, 8), do[:, :, :1].expand(1, 4, 8, 8), causal=True)


# --- the Triton backward under the interpreter (a fresh process: TRITON_INTERPRET before triton) ---------
TRITON_SCRIPT = textwrap.dedent("""
    import sys, torch, triton
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from test_flash_backward import qkv_do, autograd_grads
    from course_lib.attention import triton_online_softmax
    from course_lib.attention.triton_flash import flash_attention_triton
    from course_lib.attention.triton_flash_backward import flash_attention_autograd, flash_attention_backward_triton

    TOL = {{torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}}
    CASES = [((1, 2, 2, 37, 37, 16), torch.float32, {{}}),                  # MHA, not tile multiples
             ((1, 4, 2, 21, 21, 24), torch.float32, dict(block_m=32)),       # GQA 2, odd head dim, BLOCK_M > BLOCK_N
             ((2, 3, 1, 7, 40, 16), torch.float32, dict(block_n=32)),        # MQA, T < S (a cache offset)
             ((1, 2, 1, 33, 33, 32), torch.float16, {{}}),                   # GQA 2 in fp16
             ((1, 2, 2, 20, 20, 16), torch.bfloat16, {{}})]                  # bf16

    def check_backward():
        for i, (shape, dtype, kw) in enumerate(CASES):
            q, k, v, do = qkv_do(*shape, seed=40 + i, dtype=dtype)
            for causal in (False, True):
                want = autograd_grads(q, k, v, do, causal)
                out, lse = flash_attention_triton(q, k, v, causal=causal, return_lse=True)
                got = flash_attention_backward_triton(q, k, v, out, lse, do, causal=causal, **kw)
                for name, g, w, x in zip("qkv", got, want, (q, k, v)):
                    assert g.dtype == x.dtype and g.shape == x.shape, name
                    torch.testing.assert_close(g.float(), w, rtol=TOL[dtype], atol=TOL[dtype],
                                               msg=lambda m: f"{{shape}} {{dtype}} causal={{causal}} d{{name}}: {{m}}")
        # the autograd function: loss.backward() through the Triton forward and backward
        q, k, v, do = qkv_do(1, 4, 2, 19, 19, 16, seed=50)
        want = autograd_grads(q, k, v, do, True, scale=0.2)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = flash_attention_autograd(*leaves, causal=True, scale=0.2)
        (out * do).sum().backward()
        for x, w in zip(leaves, want):
            torch.testing.assert_close(x.grad, w, rtol=2e-4, atol=2e-4)

    check_backward()          # the interpreter's loops: host-known bounds, every mask
    q, k, v, do = qkv_do(1, 2, 2, 4, 4, 16, seed=13)
    try:
        flash_attention_backward_triton(q, k, v, q, q[..., 0], do, block_m=24)
        raise AssertionError("block_m=24 accepted")
    except ValueError as e:
        assert "block_m" in str(e)
    # the compiled path's loops (runtime bounds, the causal skipping), where the interpreter allows them
    triton_online_softmax.STATIC_LOOP_IN_INTERPRETER = False
    try:
        check_backward()
        print("RUNTIME_LOOP_OK")
    except Exception as e:
        if "0-dimensional" not in str(e):
            raise
        print("RUNTIME_LOOP_UNSUPPORTED", triton.__version__)
    print("TRITON_BACKWARD_OK")
""")


@pytest.mark.slow
def test_triton_backward_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    script = TRITON_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "TRITON_BACKWARD_OK" in res.stdout, res.stdout + res.stderr
    if "RUNTIME_LOOP_UNSUPPORTED" in res.stdout:
        import triton
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
        assert version < (3, 9), "only old interpreters may refuse a tensor loop bound"


def test_triton_backward_needs_cuda_or_the_interpreter():
    pytest.importorskip("triton")
    from course_lib.attention import triton_flash_backward
    if triton_flash_backward.interpreting():
        pytest.skip("TRITON_INTERPRET is set in this process")
    q, k, v, do = qkv_do(1, 2, 2, 4, 4, 16, seed=13)
    out, lse = tiled_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="CUDA"):
        triton_flash_backward.flash_attention_backward_triton(q, k, v, out, lse, do)


# --- the Triton backward compiled, on a CUDA GPU (`make gpu-check`) ---------------------------------------
GPU_CASES = [((2, 8, 2, 300, 300, 64), torch.float32, {}),        # GQA 4, lengths not tile multiples
             ((1, 4, 1, 77, 513, 128), torch.float32, {}),        # MQA, T < S, the largest head dim
             ((2, 8, 8, 256, 256, 64), torch.float16, {}),        # MHA in fp16, the GPU's tiles
             ((1, 6, 2, 129, 129, 24), torch.bfloat16, dict(block_m=32, block_n=16)),   # odd head dim, bf16
             ((1, 2, 1, 1, 65, 32), torch.float16, dict(block_m=16, block_n=16))]       # one query (decode)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype,kw", GPU_CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_triton_backward_compiled_on_cuda(shape, dtype, kw, causal):
    pytest.importorskip("triton")
    from course_lib.attention.triton_flash import flash_attention_triton
    from course_lib.attention.triton_flash_backward import flash_attention_backward_triton
    from course_lib.env import TRITON_FLOOR_CAPABILITY, compute_capability
    if not torch.cuda.is_available() or tuple(compute_capability()) < TRITON_FLOOR_CAPABILITY:
        pytest.skip("needs a CUDA GPU Triton compiles for")
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    q, k, v, do = qkv_do(*shape, seed=sum(shape), dtype=dtype, device="cuda")
    want = autograd_grads(q, k, v, do, causal)
    # fixed tiles: the forward's autotuner compiles every config first (over 3 minutes on an H100, 2026-11-28)
    out, lse = flash_attention_triton(q, k, v, causal=causal, return_lse=True, block_m=32, block_n=32)
    got = flash_attention_backward_triton(q, k, v, out, lse, do, causal=causal, **kw)
    tol = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    for name, g, w, x in zip("qkv", got, want, (q, k, v)):
        assert g.dtype == x.dtype and g.shape == x.shape and g.is_cuda, name
        torch.testing.assert_close(g.float(), w, rtol=tol, atol=tol, msg=lambda m: f"d{name}: {m}")  # noqa: B023


@pytest.mark.gpu
def test_triton_autograd_function_on_cuda():
    pytest.importorskip("triton")
    from course_lib.attention.triton_flash_backward import flash_attention_autograd
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v, do = qkv_do(2, 8, 2, 200, 200, 64, seed=3, device="cuda")
    want = autograd_grads(q, k, v, do, True, scale=0.1)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    (flash_attention_autograd(*leaves, causal=True, scale=0.1) * do).sum().backward()
    for x, w in zip(leaves, want):
        torch.testing.assert_close(x.grad, w, rtol=2e-4, atol=2e-4)
