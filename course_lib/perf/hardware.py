"""What the hardware can do: a table of datacenter GPUs, and the bytes each number format takes.

Every throughput here is **dense** (no 2:4 structured sparsity): NVIDIA's datasheets print the sparse
figure, twice the dense one, with an asterisk; we halve it. Units: memory bandwidth in GB/s (1e9 bytes
per second), throughput in TFLOP/s (1e12 per second; TOPS for int8), memory in GB (1e9 bytes) as the
datasheets print it.

    from course_lib.perf import GPUS, get_gpu
    a100 = get_gpu("A100-80GB")
    a100.peak_flops("fp16") / a100.bandwidth     # ridge point, FLOP per byte (about 153)

Sources (datasheet names; the numbers below cite them line by line):
  [T4]   NVIDIA T4 Tensor Core GPU datasheet (PB-09256-001),
         https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf
  [L4]   NVIDIA L4 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet
         and the NVIDIA Ada GPU architecture whitepaper (dense tensor rates of the L4)
  [A100] NVIDIA A100 Tensor Core GPU datasheet,
         https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
  [H100] NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
         and the NVIDIA H100 Tensor Core GPU architecture whitepaper (dense: 989.4 TFLOPS fp16/bf16)
  [H200] NVIDIA H200 Tensor Core GPU datasheet / product page, https://www.nvidia.com/en-us/data-center/h200/
  [B200] NVIDIA HGX B200 specifications (per-GPU table; tensor rates printed with sparsity),
         https://www.nvidia.com/en-us/data-center/hgx/ , and the DGX B200 datasheet
         https://www.nvidia.com/en-us/data-center/dgx-b200/ (8 GPUs: 1,440 GB HBM3e, 64 TB/s)
         (the B200 figures were read from a copy of NVIDIA's HGX B200 table, not on nvidia.com itself)
  [MI300X] AMD ROCm documentation, "AMD Instinct MI300 series microarchitecture", table "Peak-performance
         capabilities of the MI300X" (dense: FLOPS/clock/CU x 304 CUs x clock; 5.3 TB/s),
         https://rocm.docs.amd.com/en/docs-6.2.2/conceptual/gpu-arch/mi300.html , and "AMD GPU specifications"
         (MI300X: CDNA3, gfx942, 192 GB, 304 CUs, 64 KB LDS per CU),
         https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html
  [CUDA] CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" (maximum shared
         memory per SM: 64 KB on 7.5, 164 KB on 8.0, 100 KB on 8.9, 228 KB on 9.0),
         https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#features-and-technical-specifications
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field

import torch

from course_lib.perf.tables import format_table
from course_lib.validate import number

# --- number formats --------------------------------------------------------------------------------
# Canonical names and the bytes one element takes in memory.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "tf32": 4,  # tf32 is a tensor-core compute mode on fp32 data: 4 bytes in memory
    "fp16": 2, "bf16": 2,
    "fp8": 1, "int8": 1,
    "fp6": 0.75,           # E2M3 / E3M2 elements (a block format's shared scales add to it)
    "fp4": 0.5,            # E2M1 elements; MXFP4 and NVFP4 add a scale per 32 / 16 (course_lib.quant.mx)
    "int4": 0.5,           # two values per byte (weights only; no table GPU has int4 rates listed here)
}
_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "single": "fp32", "torch.float32": "fp32",
    "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8",
    "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "torch.int8": "int8",
    "e2m1": "fp4", "fp4_e2m1": "fp4", "float4_e2m1fn": "fp4", "e2m3": "fp6", "e3m2": "fp6",
}


def canonical_dtype(dtype, argument: str = "dtype") -> str:
    """'fp16' for 'fp16', 'float16', 'half' or torch.float16; ValueError naming `argument` otherwise."""
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype)
    if not isinstance(dtype, str):
        raise ValueError(f"{argument} must be a dtype name such as 'fp16' (one of {sorted(DTYPE_BYTES)}) "
                         f"or a torch.dtype, got {dtype!r}")
    key = dtype.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ValueError(f"{argument}={dtype!r} is not a known dtype; expected one of {sorted(DTYPE_BYTES)} "
                         f"(or an alias such as 'float16', 'bfloat16', torch.float16)")
    return key


def bytes_per_element(dtype, argument: str = "dtype") -> float:
    """Bytes one element takes: a dtype name ('fp16' -> 2, 'int4' -> 0.5), a torch.dtype, or a positive
    number of bytes given directly (returned as is)."""
    if isinstance(dtype, bool):
        raise ValueError(f"{argument} must be a dtype name or a positive number of bytes, got {dtype!r}")
    if isinstance(dtype, numbers.Real):
        if not dtype > 0:
            raise ValueError(f"{argument} (bytes per element) must be positive, got {dtype!r}")
        return dtype
    return DTYPE_BYTES[canonical_dtype(dtype, argument)]


# --- devices --------------------------------------------------------------------------------------
@dataclass
class DeviceSpec:
    """One device's memory bandwidth and dense peak throughput per number format.

    `peak_tflops` maps a canonical dtype ('fp32', 'tf32', 'fp16', 'bf16', 'fp8', 'fp6', 'fp4', 'int8') to dense
    TFLOP/s (TOPS for int8); a dtype that is missing has no fast path on this device (bf16 on a T4).
    The GPU table and a measured local device (`measure_device`) are both DeviceSpecs.
    """
    name: str
    bandwidth_gbs: float                       # memory bandwidth, GB/s (1e9 B/s)
    peak_tflops: dict = field(default_factory=dict)
    memory_gb: float | None = None             # device memory, GB as on the datasheet
    memory_type: str = ""
    architecture: str = ""
    compute_capability: str | None = None      # CUDA only; None on a non-NVIDIA device (MI300X)
    sms: int | None = None                     # streaming multiprocessors (AMD: compute units)
    smem_per_sm_kb: int | None = None          # maximum shared memory per SM, KB (AMD: LDS per CU)
    source: str = ""                           # where the numbers come from
    measured: bool = False                     # True for a measurement of this machine

    def __post_init__(self):
        number(self.bandwidth_gbs, f"DeviceSpec {self.name!r}: bandwidth_gbs", 0, low_open=True, finite=False)
        peaks = {}
        for k, v in dict(self.peak_tflops).items():
            peaks[canonical_dtype(k, "peak_tflops key")] = number(v, f"DeviceSpec {self.name!r}: peak_tflops[{k!r}]",
                                                                  0, low_open=True, finite=False)
        if not peaks:
            raise ValueError(f"DeviceSpec {self.name!r}: peak_tflops must give at least one dtype")
        self.peak_tflops = peaks

    # bytes/s and FLOP/s, the units the roofline works in
    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes per second."""
        return self.bandwidth_gbs * 1e9

    def supports(self, dtype) -> bool:
        return canonical_dtype(dtype) in self.peak_tflops

    def peak_flops(self, dtype="fp16") -> float:
        """Dense peak in FLOP/s (int8: operations/s) for `dtype`; ValueError if the device has no rate for it."""
        key = canonical_dtype(dtype)
        if key not in self.peak_tflops:
            what = "was not measured on" if self.measured else "has no hardware support listed for"
            raise ValueError(f"dtype={dtype!r}: {self.name} {what} {key}; available: {sorted(self.peak_tflops)}")
        return self.peak_tflops[key] * 1e12

    def ridge_point(self, dtype="fp16") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline bends: peak / bandwidth."""
        return self.peak_flops(dtype) / self.bandwidth

    # the columns the course talks about
    @property
    def fp16_tflops(self) -> float | None:
        return self.peak_tflops.get("fp16")

    @property
    def bf16_tflops(self) -> float | None:
        return self.peak_tflops.get("bf16")

    @property
    def int8_tops(self) -> float | None:
        return self.peak_tflops.get("int8")

    @property
    def fp8_tflops(self) -> float | None:
        return self.peak_tflops.get("fp8")

    @property
    def fp8(self) -> bool:
        """FP8 tensor cores (Ada, Hopper, Blackwell, CDNA 3): True on L4, H100, H200, B200, MI300X."""
        return "fp8" in self.peak_tflops

    @property
    def default_dtype(self) -> str:
        """fp16 when the device has a rate for it, else the first one it has (fp32 on a measured CPU)."""
        return "fp16" if "fp16" in self.peak_tflops else next(iter(self.peak_tflops))


def _gpu(name, arch, cc, mem_gb, mem_type, bw, fp32, tf32, fp16, bf16, fp8, int8, sms, smem, src,
         fp6=None, fp4=None):
    peaks = {"fp32": fp32, "tf32": tf32, "fp16": fp16, "bf16": bf16, "fp8": fp8, "int8": int8, "fp6": fp6, "fp4": fp4}
    return DeviceSpec(name=name, bandwidth_gbs=bw, peak_tflops={k: v for k, v in peaks.items() if v},
                      memory_gb=mem_gb, memory_type=mem_type, architecture=arch, compute_capability=cc,
                      sms=sms, smem_per_sm_kb=smem, source=src)


# Dense rates. fp32 is the non-tensor (CUDA core) rate; tf32/fp16/bf16/fp8/int8 are tensor-core rates.
GPUS: dict[str, DeviceSpec] = {g.name: g for g in [
    # [T4] 320 GB/s GDDR6, 16 GB; FP32 8.1 TFLOPS; mixed-precision FP16/FP32 65 TFLOPS; INT8 130 TOPS.
    # Turing has no sparsity, so these are dense; no bf16, tf32 or fp8. 40 SMs. [CUDA] sm_75: 64 KB.
    _gpu("T4", "Turing", "7.5", 16, "GDDR6", 320, fp32=8.1, tf32=None, fp16=65, bf16=None, fp8=None,
         int8=130, sms=40, smem=64, src="NVIDIA T4 Tensor Core GPU datasheet"),
    # [L4] 300 GB/s GDDR6, 24 GB; FP32 30.3; TF32 120*, FP16/BF16 242*, FP8 485*, INT8 485* (* = with
    # sparsity) -> dense 60 / 121 / 242.5 / 242.5. 58 SMs. [CUDA] sm_89: 100 KB.
    _gpu("L4", "Ada Lovelace", "8.9", 24, "GDDR6", 300, fp32=30.3, tf32=60, fp16=121, bf16=121, fp8=242.5,
         int8=242.5, sms=58, smem=100, src="NVIDIA L4 Tensor Core GPU datasheet; Ada architecture whitepaper"),
    # [A100] SXM4 40 GB HBM2: 1,555 GB/s; FP32 19.5; TF32 156; FP16/BF16 312; INT8 624 (dense; the
    # sparse figures are 312/624/1248). No fp8. 108 SMs. [CUDA] sm_80: 164 KB.
    _gpu("A100-40GB", "Ampere", "8.0", 40, "HBM2", 1555, fp32=19.5, tf32=156, fp16=312, bf16=312, fp8=None,
         int8=624, sms=108, smem=164, src="NVIDIA A100 Tensor Core GPU datasheet (SXM4 40 GB)"),
    # [A100] SXM4 80 GB HBM2e: 2,039 GB/s (the PCIe card: 1,935 GB/s); same compute as the 40 GB part.
    _gpu("A100-80GB", "Ampere", "8.0", 80, "HBM2e", 2039, fp32=19.5, tf32=156, fp16=312, bf16=312, fp8=None,
         int8=624, sms=108, smem=164, src="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB)"),
    # [H100] SXM5 80 GB HBM3: 3.35 TB/s; FP32 67; TF32 989*, FP16/BF16 1,979*, FP8 3,958*, INT8 3,958*
    # (* sparse) -> dense 494.7 / 989.4 / 1978.9 / 1978.9 (whitepaper). 132 SMs. [CUDA] sm_90: 228 KB.
    _gpu("H100-SXM", "Hopper", "9.0", 80, "HBM3", 3350, fp32=67, tf32=494.7, fp16=989.4, bf16=989.4,
         fp8=1978.9, int8=1978.9, sms=132, smem=228,
         src="NVIDIA H100 Tensor Core GPU datasheet (SXM5); H100 architecture whitepaper"),
    # [H200] SXM 141 GB HBM3e: 4.8 TB/s; the same GH100 compute as the H100 SXM (datasheet: FP16/BF16
    # 1,979*, FP8/INT8 3,958* TFLOPS/TOPS with sparsity). 132 SMs. [CUDA] sm_90: 228 KB.
    _gpu("H200", "Hopper", "9.0", 141, "HBM3e", 4800, fp32=67, tf32=494.7, fp16=989.4, bf16=989.4,
         fp8=1978.9, int8=1978.9, sms=132, smem=228, src="NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    # [B200] HGX B200, per GPU: 180 GB HBM3e, 7.7 TB/s (the DGX B200's 64 TB/s over 8 GPUs would be 8);
    # FP32 75 TFLOPS; TF32 2.2*, FP16/BF16 4.5*, FP8/FP6 9*, INT8 9* POPS, FP4 18* PFLOPS (* sparse) ->
    # dense 1100 / 2250 / 4500 / 4500, FP6 4500, FP4 9000. The SM count and the sm_100 shared memory per SM
    # are not on the datasheet: None.
    _gpu("B200", "Blackwell", "10.0", 180, "HBM3e", 7700, fp32=75, tf32=1100, fp16=2250, bf16=2250,
         fp8=4500, int8=4500, fp6=4500, fp4=9000, sms=None, smem=None,
         src="NVIDIA HGX B200 / DGX B200 datasheet (SXM, 1,000 W)"),
    # [MI300X] 192 GB HBM3, 5.3 TB/s; vector FP32 163.4, TF32 653.7, matrix FP16/BF16 1,307.4, FP8 2,614.9,
    # INT8 2,614.9 TOPS (dense). Not a CUDA device: no compute capability (ROCm, gfx942). 304 CUs, 64 KB LDS
    # (the CU's shared memory) per CU.
    _gpu("MI300X", "CDNA 3", None, 192, "HBM3", 5300, fp32=163.4, tf32=653.7, fp16=1307.4, bf16=1307.4,
         fp8=2614.9, int8=2614.9, sms=304, smem=64,
         src="AMD ROCm documentation: MI300 series microarchitecture; AMD GPU specifications"),
]}


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.lower()).removeprefix("nvidia").removeprefix("tesla")


_ALIASES = {_norm(k): k for k in GPUS}
_ALIASES.update({"a100": "A100-80GB", "a10040": "A100-40GB", "a10080": "A100-80GB",
                 "a100sxm": "A100-80GB", "a100sxm480gb": "A100-80GB", "a100sxm440gb": "A100-40GB",
                 "h100": "H100-SXM", "h100sxm5": "H100-SXM", "h100sxm580gb": "H100-SXM", "h100sxm80gb": "H100-SXM",
                 "h200sxm": "H200", "h200sxm141gb": "H200", "t416gb": "T4", "l424gb": "L4",
                 "b200sxm": "B200", "b200sxm180gb": "B200", "amdmi300x": "MI300X", "amdinstinctmi300x": "MI300X",
                 # as torch.cuda.get_device_name() spells them
                 "h10080gbhbm3": "H100-SXM", "h200141gbhbm3e": "H200",
                 "a100pcie40gb": "A100-40GB", "a100pcie80gb": "A100-80GB"})


def gpu_names() -> list[str]:
    return list(GPUS)


def get_gpu(name) -> DeviceSpec:
    """The table entry for `name` (case, spaces and dashes ignored: 'a100 80gb', 'H100', 'h100-sxm').
    A DeviceSpec passes through unchanged. Unknown names raise ValueError listing the known ones."""
    if isinstance(name, DeviceSpec):
        return name
    if not isinstance(name, str):
        raise ValueError(f"gpu must be a GPU name (one of {gpu_names()}) or a DeviceSpec, got {name!r}")
    key = _ALIASES.get(_norm(name))
    if key is None:
        raise ValueError(f"gpu={name!r} is not in the hardware table; known GPUs: {gpu_names()} "
                         f"(or pass a DeviceSpec, e.g. from measure_device())")
    return GPUS[key]


def hardware_table(devices=None, fmt: str = "markdown") -> str:
    """The table as text: 'markdown' (default), 'html' or 'text'."""
    devs = [get_gpu(d) for d in (devices if devices is not None else GPUS.values())]
    head = ["GPU", "arch (sm)", "memory", "bandwidth GB/s", "fp32", "fp16", "bf16", "fp8", "fp4", "int8 TOPS",
            "smem/SM KB", "ridge fp16 FLOP/B"]

    def f(x):
        return "-" if x is None else f"{x:g}"

    rows = []
    for d in devs:
        ridge = f"{d.ridge_point(d.default_dtype):.0f}" + ("" if d.default_dtype == "fp16" else f" ({d.default_dtype})")
        mem = "-" if d.memory_gb is None else f"{d.memory_gb:g} GB {d.memory_type}".strip()
        rows.append([d.name, f"{d.architecture} ({d.compute_capability or '-'})", mem, f"{d.bandwidth_gbs:,.0f}",
                     f(d.peak_tflops.get("fp32")), f(d.fp16_tflops), f(d.bf16_tflops), f(d.fp8_tflops),
                     f(d.peak_tflops.get("fp4")),
                     f(d.int8_tops), f(d.smem_per_sm_kb), ridge])
    return format_table(head, rows, fmt,
                        note="TFLOP/s dense (no sparsity); fp32 = CUDA cores, others = tensor cores "
                             "(MI300X: vector units / matrix cores; its SMs = CUs, smem = LDS per CU)")


__all__ = ["DTYPE_BYTES", "canonical_dtype", "bytes_per_element", "DeviceSpec", "GPUS", "gpu_names",
           "get_gpu", "hardware_table"]
