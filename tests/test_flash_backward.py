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
