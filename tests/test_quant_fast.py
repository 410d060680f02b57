"""Fast weight-only int8 / int4 matmuls (torch's _weight_int8pack_mm / _weight_int4pack_mm) against the
dequantize-then-matmul reference, on fresh random inputs, on every device present."""
import pytest
import torch

from course_lib.quant.fast import (Int4WeightOnlyLinear, Int8WeightOnlyLinear, dequantize_int4_weight,
                                   dequantize_int8_weight, fast_kernels_available, int4_weight_only,
                                   int4_weight_only_mm, int8_weight_only, int8_weight_only_mm, pack_int4_for_device)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_int8_codes_and_round_trip():
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(0))
    w[5] = 0
    q, s = int8_weight_only(w)
    assert q.dtype == torch.int8 and s.shape == (48,) and int(q.abs().max()) == 127
    err = (dequantize_int8_weight(q, s) - w).abs()
    assert bool((err <= s[:, None] / 2 + 1e-7).all()) and dequantize_int8_weight(q, s)[5].abs().sum() == 0


def test_int4_codes_and_round_trip():
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(1)) + 0.5
    q, sz = int4_weight_only(w, 64)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and sz.shape == (4, 32, 2)
    wh = dequantize_int4_weight(q, sz, 64)
    step = sz[..., 0].t().repeat_interleave(64, dim=1)       # [N, K] the step of each weight's group
    assert bool(((wh - w).abs() <= step / 2 + 1e-5).all())
    # each group's min and max are codes 0 and 15: reproduced up to float rounding
    g = w.reshape(32, 4, 64)
    assert torch.allclose(wh.reshape(32, 4, 64).amin(-1), g.amin(-1), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_kernel_matches_reference(device, dtype):
    if not fast_kernels_available(device)["int8"]:
        pytest.skip(f"torch._weight_int8pack_mm does not run on {device.type} here")
    g = torch.Generator(device=device).manual_seed(2)
    for M, N, K in [(1, 96, 128), (3, 64, 256)]:
        w = torch.randn(N, K, device=device, generator=g)
        x = torch.randn(M, K, device=device, generator=g).to(dtype)
        q, s = int8_weight_only(w)
        fast = int8_weight_only_mm(x, q, s, backend="torch")
        ref = int8_weight_only_mm(x.float(), q, s, backend="reference")
        assert fast.dtype == dtype and fast.shape == (M, N)
        assert _rel(fast, ref) < (1e-5 if dtype == torch.float32 else 2e-2)
    # "auto": the fused kernel for decode-sized inputs, dequantize + dense matmul for a prefill; both equal
    from course_lib.quant.fast import GEMV_MAX_ROWS
    for M in (1, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 4 * GEMV_MAX_ROWS):
        x = torch.randn(2, M, K, device=device, generator=g).to(dtype)
        auto = int8_weight_only_mm(x, q, s)
        ref = int8_weight_only_mm(x.float(), q, s, backend="reference")
        assert auto.shape == (2, M, N) and _rel(auto, ref) < (1e-5 if dtype == torch.float32 else 2e-2), M


def test_int4_kernel_matches_reference(device):
    avail = fast_kernels_available(device)
    if not avail["int4"]:
        pytest.skip(f"torch's int4 weight-only kernel does not run on {device.type} here")
    dtype = avail["int4_dtype"]
    g = torch.Generator(device=device).manual_seed(3)
    for M, N, K, gs in [(1, 64, 256, 32), (2, 128, 512, 128), (1, 32, 256, 256)]:
        w = torch.randn(N, K, device=device, generator=g)
        x = torch.randn(M, K, device=device, generator=g)
        q, sz = int4_weight_only(w, gs)
        fast = int4_weight_only_mm(x.to(dtype), pack_int4_for_device(q, device), sz, gs)
        ref = x @ dequantize_int4_weight(q, sz, gs).t()
        assert fast.shape == (M, N)
        assert _rel(fast, ref) < (1e-5 if dtype == torch.float32 else 2e-2), (M, N, K, gs)


@pytest.mark.parametrize("cls", [Int8WeightOnlyLinear, Int4WeightOnlyLinear])
def test_linears_fast_equals_reference_and_bytes(cls):
    lin = torch.nn.Linear(256, 64)
    x = torch.randn(2, 3, 256)
    fast, ref = cls.from_linear(lin, backend="auto"), cls.from_linear(lin, backend="reference")
    assert fast(x).shape == (2, 3, 64) and _rel(fast(x), ref(x)) < 1e-5
    assert _rel(ref(x), lin(x).detach()) < (0.02 if cls is Int8WeightOnlyLinear else 0.15)
    nbytes = ref.weight.numel() * ref.weight.element_size()
    assert nbytes == 256 * 64 // (1 if cls is Int8WeightOnlyLinear else 2)


def test_fast_bad_input():
    with pytest.raises(ValueError, match="group_size"):
        int4_weight_only(torch.randn(8, 96), 48)
    with pytest.raises(ValueError, match="multiple of group_size"):
        int4_weight_only(torch.randn(8, 96), 64)
    with pytest.raises(ValueError, match="2-D"):
        int8_weight_only(torch.randn(8))
    with pytest.raises(ValueError, match="backend"):
        int8_weight_only_mm(torch.randn(1, 8), *int8_weight_only(torch.randn(4, 8)), backend="triton")
    with pytest.raises(TypeError):
        Int8WeightOnlyLinear.from_linear(torch.nn.Conv1d(2, 2, 1))
