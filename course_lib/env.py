"""What this machine can do: device, real bf16, compute capability, optional packages, Colab, offline.

Everything here is cheap and safe to call at import time of a notebook: no network, no CUDA context
unless CUDA is there.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import asdict, dataclass

import torch


def device(prefer: str | None = None) -> torch.device:
    """The best available device ('cuda' > 'mps' > 'cpu'), or `prefer` if given and available."""
    if prefer is not None:
        d = torch.device(prefer)
        if d.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={prefer!r} was asked for but CUDA is not available here")
        return d
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def in_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def offline() -> bool:
    """True when hub downloads must not be tried (COURSE_OFFLINE=1 or HF_HUB_OFFLINE=1)."""
    return any(os.environ.get(v, "0") not in ("", "0", "false", "False")
               for v in ("COURSE_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def quick() -> bool:
    """Notebooks' sizes: quick (small, each notebook about a minute on a 2-core CPU) or full (real sizes).

    COURSE_QUICK=1 forces quick and COURSE_QUICK=0 full; unset, a machine without a CUDA GPU runs quick
    and one with a GPU runs full."""
    value = os.environ.get("COURSE_QUICK", "").strip()
    if value == "":
        return not torch.cuda.is_available()
    return value not in ("0", "false", "False", "no")


def has_package(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def compute_capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def real_bf16() -> bool:
    """bf16 in hardware, not emulated. A T4 (sm_75) answers False even though
    ``torch.cuda.is_bf16_supported()`` says True there through emulation. CPUs compute bf16 (slowly)."""
    if torch.cuda.is_available():
        cc = compute_capability()
        return cc is not None and cc >= (8, 0)
    return False


def flash_attn_usable() -> bool:
    """flash-attn 2 is installed and the GPU is Ampere or newer (it refuses older ones)."""
    cc = compute_capability()
    return has_package("flash_attn") and cc is not None and cc >= (8, 0)


# Triton's README lists NVIDIA GPUs of compute capability 8.0 and newer (Ampere on); its maintainers decline
# fixes for older ones. A Turing T4 (sm_75) may compile a kernel, without the tensor-core instructions, but
# nothing guarantees it runs correctly there.
TRITON_MIN_CAPABILITY = (8, 0)


def triton_gpu_supported(capability: tuple[int, int] | None = None) -> bool:
    """True when the triton package is installed and Triton supports this CUDA GPU (compute capability >=
    8.0; pass ``capability`` to ask about another GPU, e.g. (7, 5) for a T4). False without a CUDA GPU:
    on a CPU a Triton kernel runs only under its interpreter (``TRITON_INTERPRET=1``), for testing."""
    cc = capability if capability is not None else compute_capability()
    return cc is not None and tuple(cc) >= TRITON_MIN_CAPABILITY and has_package("triton")


@dataclass
class Capabilities:
    python: str
    torch: str
    device: str
    device_name: str
    compute_capability: str | None
    real_bf16: bool
    fp16: bool
    flash_attn: bool
    triton: bool
    bitsandbytes: bool
    colab: bool
    offline: bool

    def as_dict(self):
        return asdict(self)


def capabilities() -> Capabilities:
    dev = device()
    if dev.type == "cuda":
        name = torch.cuda.get_device_name()
        cc = "%d.%d" % compute_capability()
    else:
        import platform
        name, cc = (platform.processor() or platform.machine() or "cpu"), None
    return Capabilities(
        python=sys.version.split()[0], torch=torch.__version__, device=dev.type, device_name=name,
        compute_capability=cc, real_bf16=real_bf16(), fp16=dev.type == "cuda",
        flash_attn=flash_attn_usable(), triton=has_package("triton"),
        bitsandbytes=has_package("bitsandbytes"), colab=in_colab(), offline=offline())


def sync(dev: torch.device | str | None = None):
    """Wait for queued device work (a no-op on CPU). Timing without it measures the launch, not the work."""
    dev = torch.device(dev) if dev is not None else device()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()
