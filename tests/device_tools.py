"""Per-device tolerances and a greedy-sequence comparison that knows about near-ties (used with the
``device`` fixture of tests/conftest.py).

Why tolerances differ by device: the same float32 model computes the same mathematics on a CPU and a GPU,
but not the same roundings. CPU kernels (MKL/oneDNN, the SDPA math path) and CUDA kernels (cuBLAS,
memory-efficient / flash attention) sum in different orders, pick different algorithms by shape and
memory layout, and CUDA may use fused multiply-adds where the CPU does not. Each op's result then differs
in the last bits, about 1e-6 relative in float32; through a 6-layer model the logits (size ~10) differ by
~1e-5..1e-4. (TF32 would make it ~1e-3: the suite keeps it off, see conftest.py.)

Why greedy token sequences need care on a GPU: greedy decoding takes an argmax. Where the top two
logits are closer than the rounding differences, the two implementations can legitimately pick
different tokens, and the sequences diverge from there on. On the CPU the course model and the
reference are compared exactly (they do agree there, bit for bit in the tokens); on CUDA
``assert_greedy_match`` requires identical tokens up to the first difference, and at that difference a
near-tie: the reference's margin between the two tokens within the logits tolerance, and the logits of
both sides equal within that tolerance up to there. After a legitimate divergence the continuations are
not comparable, so the comparison stops.
"""
from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

from course_lib.env import triton_gpu_supported, triton_unsupported_reason

# The course launches its Triton kernels only on a GPU Triton supports (compute capability >= 8.0); on a
# T4 "auto" takes the PyTorch paths (tests/test_t4.py). GPU tests of the kernels themselves take this mark.
needs_triton_gpu = pytest.mark.skipif(not triton_gpu_supported(),
                                      reason="the course's Triton kernels do not run here: "
                                             f"{triton_unsupported_reason()}")

# (device type, dtype) -> tolerances for comparing logits / activations of the same float model computed
# two ways. float32 on CPU: reductions in another order only. float32 on CUDA: other kernels too.
# Half precisions: 8 (bf16) or 11 (fp16) mantissa bits.
TOLERANCES = {
    ("cpu", torch.float32): dict(rtol=1e-4, atol=1e-4),
    ("cuda", torch.float32): dict(rtol=1e-4, atol=1e-3),
    ("cpu", torch.bfloat16): dict(rtol=2e-2, atol=5e-2),
    ("cuda", torch.bfloat16): dict(rtol=2e-2, atol=5e-2),
    ("cpu", torch.float16): dict(rtol=2e-3, atol=1e-2),
    ("cuda", torch.float16): dict(rtol=2e-3, atol=1e-2),
}


@contextlib.contextmanager
def simulated_gpu(capability: tuple[int, int], name: str = "Simulated GPU"):
    """Within the block torch, and so ``course_lib.env``, reports one CUDA GPU of this compute capability
    (``name`` its device name), e.g. ``simulated_gpu((7, 5), "Tesla T4")``. Nothing can run on it: only the
    decisions the course reads from the capability can be checked this way, on a CPU-only machine."""
    with mock.patch.object(torch.cuda, "is_available", lambda: True), \
            mock.patch.object(torch.cuda, "device_count", lambda: 1), \
            mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: tuple(capability)), \
            mock.patch.object(torch.cuda, "get_device_name", lambda device=None: name):
        yield


def tolerance(device, dtype: torch.dtype = torch.float32) -> dict:
    """{"rtol": ..., "atol": ...} for ``torch.testing.assert_close`` on this device and dtype."""
    kind = torch.device(device).type
    return dict(TOLERANCES[(kind, dtype)])


def tol_for(device, cpu: dict, dtype: torch.dtype = torch.float32) -> dict:
    """The tolerance a test states for the CPU, unchanged there; elsewhere at least the device's own."""
    if torch.device(device).type == "cpu":
        return dict(cpu)
    dev = tolerance(device, dtype)
    return {k: max(cpu[k], dev[k]) for k in ("rtol", "atol")}


def assert_greedy_match(got, want, want_logits: torch.Tensor, device, got_logits: torch.Tensor | None = None,
                        dtype: torch.dtype = torch.float32, what: str = "", cpu_tol: dict | None = None):
    """Greedy tokens `got` against the reference `want` (1-D sequences of new tokens).

    want_logits [N, V]: the reference's logits that chose want[i] at step i; got_logits, if given, the
    same for `got`. On the CPU the sequences must be equal (and the logits, if given, within `cpu_tol`).
    On CUDA they must be equal up to a first difference (if any) that is a near-tie (see the module
    docstring), the logits within the device's tolerance up to there.
    """
    got, want = [int(t) for t in got], [int(t) for t in want]
    tol = tol_for(device, cpu_tol or tolerance("cpu", dtype), dtype)
    if torch.device(device).type == "cpu":
        assert got == want, f"{what}: {got} != {want}"
        if got_logits is not None:
            torch.testing.assert_close(got_logits, want_logits, **tol)
        return
    n = min(len(got), len(want))
    first = next((i for i in range(n) if got[i] != want[i]), None)
    if got_logits is not None:
        upto = n if first is None else first + 1
        torch.testing.assert_close(got_logits[:upto].float().cpu(), want_logits[:upto].float().cpu(), **tol,
                                   msg=lambda m: f"{what}: logits differ beyond the {device} tolerance: {m}")
    if first is None:
        assert len(got) == len(want), f"{what}: same tokens but lengths {len(got)} and {len(want)}"
        return
    row = want_logits[first].float()
    a, b = float(row[want[first]]), float(row[got[first]])
    margin = abs(a - b)
    allowed = 2 * (tol["atol"] + tol["rtol"] * max(abs(a), abs(b)))   # each side within tol of the truth
    assert margin <= allowed, (f"{what}: tokens differ at step {first} ({got[first]} vs {want[first]}) where "
                               f"the reference's margin {margin:.2e} is no near-tie (allowed {allowed:.2e}); "
                               f"got {got}, want {want}")
