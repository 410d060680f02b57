"""Fast weight-only matmuls for decode: int8 and int4 weights, activations kept in bf16/fp32 (module 03).

Batch-1 decode is a GEMV: every weight is read once per token and used once, so its time is the bytes
of the weights over the memory bandwidth. Storing weights in int8 (int4) halves (quarters) those bytes
against bf16; a kernel that dequantizes *inside* the matmul, in registers, turns that into speed. The
reference path (dequantize the whole matrix to bf16, then matmul) reads the int8 weights *and* writes
and reads a bf16 copy: it is slower than bf16, which is why the fused kernels exist.

torch ships such kernels (the ones gpt-fast and torchao call):

    torch._weight_int8pack_mm(x [M, K], w int8 [N, K], scales [N])      y = x @ (w * scales[:, None]).T
        CPU and CUDA (and MPS); x float32/bf16/fp16, scales in x's dtype.
    torch._weight_int4pack_mm(x bf16 [M, K], packed, group_size, scales_and_zeros bf16 [K/g, N, 2])   CUDA
    torch._weight_int4pack_mm_for_cpu(x [M, K], packed, group_size, scales_and_zeros [K/g, N, 2])        CPU
        y = x @ W.T with W[n, k] = (q[n, k] - 8) * scale[k // g, n] + zero[k // g, n], q in 0..15;
        the packed layout is device-specific: ``_convert_weight_to_int4pack`` (CUDA; input uint8 [N, K/2],
        two codes per byte, even k in the high nibble) or ``_convert_weight_to_int4pack_for_cpu`` (input
        int32 [N, K]).

gpt-fast reports 1.48x (int8) and 1.88x (int4) tokens/s over bf16 on an A100 for Llama-2-7B: the target a
GPU run of ``bench/quant.py`` compares with. On a CPU the same kernels exist; the ratio there is measured
by the bench and shown in the notebook, not assumed.
"""
from __future__ import annotations

import torch
from torch import nn

from course_lib.env import half_dtype, real_bf16, sync

from .core import check_tensor

__all__ = ["int8_weight_only", "int4_weight_only", "dequantize_int8_weight", "dequantize_int4_weight",
           "pack_int4_for_device", "int8_weight_only_mm", "int4_weight_only_mm", "Int8WeightOnlyLinear",
           "Int4WeightOnlyLinear", "fast_kernels_available", "decode_gemv_benchmark", "GPT_FAST_A100"]

INT4_GROUP_SIZES = (32, 64, 128, 256)
# gpt-fast (pytorch-labs/gpt-fast README, Llama-2-7B, A100): tokens/s speed-up of weight-only quantization vs bf16
GPT_FAST_A100 = {"int8": 1.48, "int4": 1.88}


def int8_weight_only(w: torch.Tensor):
    """w [N, K] -> (q int8 [N, K], scales float32 [N]): symmetric per-output-channel absmax, codes -127..127."""
    check_tensor(w, "w")
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [out, in], got shape {tuple(w.shape)}")
    w = w.to(torch.float32)
    amax = w.abs().amax(dim=1)                              # [N]
    scales = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def dequantize_int8_weight(q: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (q.to(torch.float32) * scales.to(torch.float32)[:, None]).to(dtype)


def int4_weight_only(w: torch.Tensor, group_size: int = 128):
    """w [N, K] -> (q uint8 [N, K] in 0..15, scales_and_zeros float32 [K/g, N, 2]) in torch's int4pack
    convention W = (q - 8) * scale + zero: asymmetric min/max per group of ``group_size`` along K."""
    check_tensor(w, "w")
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [out, in], got shape {tuple(w.shape)}")
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {INT4_GROUP_SIZES} (what the int4 kernels take), got {group_size}")
    N, K = w.shape
    if K % group_size:
        raise ValueError(f"w's in-dimension {K} must be a multiple of group_size={group_size}")
    wg = w.to(torch.float32).reshape(N, K // group_size, group_size)        # [N, G, g]
    lo, hi = wg.amin(dim=-1, keepdim=True), wg.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-6)                                 # [N, G, 1]
    q = torch.round((wg - lo) / scale).clamp(0, 15)
    # so that (q - 8) * scale + zero = q * scale + lo
    zero = lo + 8 * scale
    sz = torch.stack([scale[..., 0].t(), zero[..., 0].t()], dim=-1).contiguous()   # [G, N, 2]
    return q.reshape(N, K).to(torch.uint8), sz


def dequantize_int4_weight(q: torch.Tensor, sz: torch.Tensor, group_size: int, dtype=torch.float32):
    N, K = q.shape
    scale = sz[..., 0].t().to(torch.float32)[..., None]     # [N, G, 1]
    zero = sz[..., 1].t().to(torch.float32)[..., None]
    w = (q.reshape(N, K // group_size, group_size).to(torch.float32) - 8) * scale + zero
    return w.reshape(N, K).to(dtype)


def pack_int4_for_device(q: torch.Tensor, device, inner_k_tiles: int = 8) -> torch.Tensor:
    """Codes [N, K] (0..15) -> the layout the int4 kernel of ``device`` reads."""
    device = torch.device(device)
    q = q.to(device)
    if device.type == "cpu":
        return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), inner_k_tiles)
    two = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)     # [N, K/2], even k high
    return torch._convert_weight_to_int4pack(two, inner_k_tiles)


GEMV_MAX_ROWS = 16   # rows (tokens) up to which "auto" uses the fused int8 kernel (decode, small batches)


def int8_weight_only_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, backend: str = "auto"):
    """x [..., K] @ dequant(q, scales).T -> [..., N] in x's dtype."""
    if backend not in ("auto", "torch", "reference"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'reference', got {backend!r}")
    x2 = x.reshape(-1, x.shape[-1])
    # "auto" sends a prefill (more than GEMV_MAX_ROWS rows) through dequantize + dense matmul: the packed
    # kernel is written for decode's matrix-vector products, and a dense GEMM amortizes the dequantization
    if backend == "reference" or (backend == "auto" and (x2.shape[0] > GEMV_MAX_ROWS
                                                         or not fast_kernels_available(x.device)["int8"])):
        y = x2 @ dequantize_int8_weight(q, scales, x.dtype).t()
    else:
        y = torch._weight_int8pack_mm(x2.contiguous(), q, scales.to(x.dtype))
    return y.reshape(*x.shape[:-1], q.shape[0])


def int4_weight_only_mm(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, group_size: int) -> torch.Tensor:
    """The fused kernel: x [..., K] with packed int4 weights of ``pack_int4_for_device(q, x.device)``."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    if x.device.type == "cpu":
        y = torch._weight_int4pack_mm_for_cpu(x2, packed, group_size, sz.to(x.dtype))
    else:
        y = torch._weight_int4pack_mm(x2, packed, group_size, sz.to(x.dtype))
    return y.reshape(*x.shape[:-1], y.shape[-1])


_AVAILABLE: dict = {}


def int4_activation_dtypes(device_type: str) -> tuple:
    """The activation dtypes to try torch's int4 kernel with on this device type, in order. The CUDA kernel
    (tinygemm) is bf16 tensor-core code for compute capability >= 8.0: on an older GPU (a T4) nothing is
    tried, so a T4 is never asked for bf16 here, and int4 takes the reference path."""
    if device_type == "cpu":
        return (torch.bfloat16, torch.float32)
    if device_type == "cuda" and not real_bf16():
        return ()
    return (torch.bfloat16,)


def fast_kernels_available(device=None) -> dict:
    """{"int8": bool, "int4": bool, "int4_dtype": the activation dtype the int4 kernel takes here}: tried once
    per device type on a tiny problem (these are private torch ops; their support varies by build)."""
    device = torch.device("cpu" if device is None else device)
    key = device.type
    if key not in _AVAILABLE:
        out = {"int8": False, "int4": False, "int4_dtype": None}
        w = torch.randn(16, 256, device=device)
        try:
            q, s = int8_weight_only(w)
            torch._weight_int8pack_mm(torch.randn(1, 256, device=device), q, s)
            out["int8"] = True
        except (RuntimeError, NotImplementedError, AttributeError):
            pass
        q4, sz = int4_weight_only(w, 32)
        for dt in int4_activation_dtypes(key):
            try:
                int4_weight_only_mm(torch.randn(1, 256, device=device, dtype=dt), pack_int4_for_device(q4, device),
                                    sz.to(device), 32)
                out["int4"], out["int4_dtype"] = True, dt
                break
            except (RuntimeError, NotImplementedError, AttributeError):
                pass
        _AVAILABLE[key] = out
    return _AVAILABLE[key]


class Int8WeightOnlyLinear(nn.Module):
    """int8 weight [N, K] + one scale per output channel; activations stay in their dtype."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 backend: str = "auto"):
        super().__init__()
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.backend = backend
        self.register_buffer("weight", q)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, backend: str = "auto") -> "Int8WeightOnlyLinear":
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        q, s = int8_weight_only(linear.weight.detach())
        b = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, s.to(linear.weight.dtype), b, backend)

    def forward(self, x):
        y = int8_weight_only_mm(x, self.weight, self.scales, self.backend)
        return y if self.bias is None else y + self.bias.to(y.dtype)


class Int4WeightOnlyLinear(nn.Module):
    """int4 weight (groups of ``group_size`` along K, asymmetric) in the layout of the device it was built
    for; ``backend`` "auto" uses torch's fused kernel where it runs, else dequantize + matmul."""

    def __init__(self, q: torch.Tensor, sz: torch.Tensor, group_size: int, bias=None, backend: str = "auto"):
        super().__init__()
        if backend not in ("auto", "torch", "reference"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'reference', got {backend!r}")
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.group_size, self.backend = group_size, backend
        fast = backend != "reference" and fast_kernels_available(q.device)["int4"]
        if backend == "torch" and not fast:
            raise RuntimeError(f"torch's int4 weight-only kernel does not run on {q.device.type} here")
        self.fast = fast
        # the fused path keeps only the packed weights; the reference keeps two codes per byte
        packed = pack_int4_for_device(q, q.device) if fast else (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        self.register_buffer("weight", packed)
        self.register_buffer("scales_and_zeros", sz)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, backend: str = "auto") -> "Int4WeightOnlyLinear":
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        q, sz = int4_weight_only(linear.weight.detach(), group_size)
        b = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, sz, group_size, b, backend)

    def forward(self, x):
        if self.fast:
            y = int4_weight_only_mm(x, self.weight, self.scales_and_zeros, self.group_size)
        else:
            q = torch.stack([self.weight >> 4, self.weight & 0xF], dim=-1).reshape(self.out_features, -1)
            w = dequantize_int4_weight(q, self.scales_and_zeros, self.group_size, x.dtype)
            y = x @ w.t()
        return y if self.bias is None else y + self.bias.to(y.dtype)


def _layer_shapes(hidden: int, intermediate: int) -> list[tuple[int, int]]:
    """[N, K] of one Llama layer's linears with as many KV heads as heads (SmolLM2-1.7B): q, k, v, o, gate, up, down."""
    return [(hidden, hidden)] * 4 + [(intermediate, hidden)] * 2 + [(hidden, intermediate)]


def decode_gemv_benchmark(hidden: int = 2048, intermediate: int = 8192, repeats: int = 7, group_size: int = 128,
                          device=None, inner: int | None = None, seed: int = 0,
                          reference: bool = False) -> list[dict]:
    """Time one decoder layer's batch-1 GEMVs (x [1, hidden] through the 7 weight matrices) per weight format.

    Rows: the 16-bit float baseline (``env.half_dtype``: bf16 on a CPU and on GPUs of compute capability
    >= 8.0, fp16 on a T4, which has no bf16 in hardware; fp32 too on a CPU), int8 and int4 weight-only
    through torch's fused kernels (16-bit activations, where they run), and with ``reference`` int8
    dequantize-then-matmul (the unfused path: seconds per layer on a CPU at the 1.7B shape). Each row's
    "speed-up vs 16-bit" is against the baseline row, named by its dtype ("bf16" or "fp16").
    The rows are timed in turns (repeat 1 of every row, then repeat 2, ...), so a load change on a shared
    machine hits them alike; each row's time is its median, in ms per layer, with its weight bytes.
    """
    import time

    device = torch.device("cpu" if device is None else device)
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    inner = inner or (20 if device.type == "cuda" else 1)
    g = torch.Generator(device=device).manual_seed(seed)
    ws = [torch.randn(n, k, device=device, generator=g) * k ** -0.5 for n, k in _layer_shapes(hidden, intermediate)]
    avail = fast_kernels_available(device)
    half = half_dtype(device)                                # bf16, or fp16 where bf16 is not in hardware (a T4)
    base_name = "bf16" if half == torch.bfloat16 else "fp16"
    x32 = torch.randn(1, hidden, device=device, generator=g)
    xi = torch.randn(1, intermediate, device=device, generator=g)

    def make(fn_of_w, x_dtype):
        ops = [fn_of_w(w) for w in ws]
        xs = (x32.to(x_dtype), xi.to(x_dtype))

        def run():
            for (op, nbytes), w in zip(ops, ws):
                op(xs[1] if w.shape[1] == intermediate else xs[0])
        return run, sum(nb for _, nb in ops)

    def dense(dtype):
        def f(w):
            wd = w.to(dtype)
            return (lambda x: x @ wd.t()), wd.numel() * wd.element_size()
        return f

    def int8_fused(w):
        q, s = int8_weight_only(w)
        s = s.to(half)
        return (lambda x: torch._weight_int8pack_mm(x, q, s)), q.numel() + s.numel() * 2

    def int8_ref(w):
        q, s = int8_weight_only(w)
        return (lambda x: x @ dequantize_int8_weight(q, s, half).t()), q.numel() + s.numel() * 2

    def int4_fused(w):
        q, sz = int4_weight_only(w, group_size)
        p, sz = pack_int4_for_device(q, device), sz.to(avail["int4_dtype"] or half)
        return (lambda x: int4_weight_only_mm(x, p, sz, group_size)), q.numel() // 2 + sz.numel() * 2

    runs = {base_name: make(dense(half), half)}
    if device.type == "cpu":
        runs["fp32"] = make(dense(torch.float32), torch.float32)
    if avail["int8"]:
        runs["int8 weight-only (torch._weight_int8pack_mm)"] = make(int8_fused, half)
    if avail["int4"]:
        runs[f"int4 weight-only g{group_size} (torch int4pack mm)"] = make(int4_fused, avail["int4_dtype"])
    if reference:
        runs["int8 dequantize + matmul (reference)"] = make(int8_ref, half)

    times = {name: [] for name in runs}
    with torch.no_grad():
        for run, _ in runs.values():                      # warm-up
            run()
        for _ in range(repeats):
            for name, (run, _) in runs.items():
                sync(device)
                t0 = time.perf_counter()
                for _ in range(inner):
                    run()
                sync(device)
                times[name].append((time.perf_counter() - t0) / inner)
    base = sorted(times[base_name])[repeats // 2]
    rows = []
    for name, (_, nbytes) in runs.items():
        t = sorted(times[name])[repeats // 2]
        rows.append({"weights": name, "ms/layer": round(1e3 * t, 4), "MB/layer": round(nbytes / 1e6, 2),
                     "GB/s": round(nbytes / t / 1e9, 1), "speed-up vs 16-bit": round(base / t, 2)})
    return rows
