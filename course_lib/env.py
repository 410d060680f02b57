"""What this machine can do: device, real bf16, compute capability, optional packages, Colab, offline.

Everything here is cheap and safe to call at import time of a notebook: no network, no CUDA context
unless CUDA is there.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from dataclasses import asdict, dataclass

import torch

from course_lib.validate import one_of


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


def half_dtype(dev: torch.device | str | None = None) -> torch.dtype:
    """The 16-bit float type that runs in hardware on ``dev`` (default: ``device()``): bf16 on a CUDA GPU
    of compute capability >= 8.0 and on a CPU, fp16 on an older GPU (a T4: there bf16 is emulated, slow and
    a source of surprises) and on MPS. Every place the course picks a half precision for CUDA asks this."""
    dev = torch.device(dev) if dev is not None else device()
    if dev.type == "cuda":
        return torch.bfloat16 if real_bf16() else torch.float16
    return torch.float16 if dev.type == "mps" else torch.bfloat16


# Triton's README lists NVIDIA GPUs of compute capability 8.0 and newer (Ampere on); its maintainers decline
# fixes for older ones. A Turing T4 (sm_75) compiles the course's kernels, without the tensor-core
# instructions (tests/test_triton_targets.py builds each for sm_75), but nothing guarantees they run
# correctly there.
TRITON_MIN_CAPABILITY = (8, 0)
# Below this no Triton kernel is launched at all, even when asked for: PyTorch's own torch.compile refuses
# to generate Triton code for such GPUs (``GPUTooOldForTriton``, "Triton only supports devices of CUDA
# Capability >= 7.0"), so nothing exercises that path (a Pascal P100, sm_60).
TRITON_FLOOR_CAPABILITY = (7, 0)


def triton_unsupported_reason(capability: tuple[int, int] | None = None) -> str | None:
    """None when the course may launch its Triton kernels on this CUDA GPU (or the one of ``capability``),
    else why not, in a few words (no triton package, no CUDA GPU, compute capability below 8.0)."""
    if not has_package("triton"):
        return "the triton package is not installed"
    cc = capability if capability is not None else compute_capability()
    if cc is None:
        return "there is no CUDA GPU (on a CPU a Triton kernel runs only under TRITON_INTERPRET=1)"
    if tuple(cc) < TRITON_MIN_CAPABILITY:
        return (f"compute capability {cc[0]}.{cc[1]} < {TRITON_MIN_CAPABILITY[0]}.{TRITON_MIN_CAPABILITY[1]}: "
                "Triton supports Ampere (sm_80) and newer")
    return None


def triton_gpu_supported(capability: tuple[int, int] | None = None) -> bool:
    """True when the triton package is installed and Triton supports this CUDA GPU (compute capability >=
    8.0; pass ``capability`` to ask about another GPU, e.g. (7, 5) for a T4). False without a CUDA GPU:
    on a CPU a Triton kernel runs only under its interpreter (``TRITON_INTERPRET=1``), for testing."""
    return triton_unsupported_reason(capability) is None


def triton_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, which must be set before
    triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


class CourseNotice(UserWarning):
    """A one-line notice that the course took another path than the fastest one (given once per process)."""


_NOTICES: set = set()


def notice_once(key, message: str, stacklevel: int = 3):
    """Warn ``message`` (a ``CourseNotice``) the first time ``key`` is seen in this process, never again."""
    if key in _NOTICES:
        return
    _NOTICES.add(key)
    warnings.warn(message, CourseNotice, stacklevel=stacklevel)


def use_triton(device, backend: str = "auto", what: str = "the Triton kernel",
               asked_by: str = "backend='triton'") -> bool:
    """Whether to launch ``what`` (a course Triton kernel) on tensors of ``device``, for a ``backend`` argument
    of "auto" or "triton"; False means: take the PyTorch path. The one place the course decides it.
    ``asked_by`` names, in messages, what asked for the kernel explicitly (an argument, or a function that
    is the kernel, such as ``flash_attention_triton``).

    "auto": Triton on a CUDA GPU Triton supports (``triton_gpu_supported``), PyTorch elsewhere. On a CUDA
    GPU Triton does not support (a T4, compute capability 7.5) it says so once per process, naming the
    compute capability and the path taken; on a CPU it is silent (the interpreter is for tests).

    "triton": the caller asked for the kernel by name. A ValueError (naming ``asked_by``) where it cannot
    run: no triton package; CPU tensors without the interpreter; a GPU below compute capability 7.0; any
    other device. On a GPU of compute capability 7.0 to 7.x (a T4) it runs, with a one-time warning:
    refusing would leave a T4 student no way to watch the kernel run on their own GPU, the kernels do build
    for sm_75 (only without tensor cores), and PyTorch itself generates Triton kernels for these GPUs
    (torch.compile), so the compiler path is well trodden even though Triton's maintainers do not support
    it; the warning says to check the result against the PyTorch reference.
    """
    one_of(backend, "backend", ("auto", "triton"))
    dev = torch.device(device)
    if backend == "auto":
        if dev.type != "cuda":
            return False
        reason = triton_unsupported_reason()
        if reason is None:
            return True
        cc = compute_capability()
        notice_once(("auto", None if cc is None else tuple(cc)),
                    f"[course_lib] {_gpu_label(cc)}: {reason}, so the course's Triton kernels (paged attention, "
                    "FlashAttention, flash-decoding) take their PyTorch paths here")
        return False
    if not has_package("triton"):
        raise ValueError(f"{asked_by}: {what} needs the triton package (pip install triton), which is not "
                         "installed")
    if dev.type == "cpu":
        if triton_interpreting():
            return True
        raise ValueError(f"{asked_by}: {what} needs CUDA tensors (got {dev}), or TRITON_INTERPRET=1 set "
                         "before triton is imported to run it on a CPU in Triton's interpreter")
    if dev.type != "cuda":
        raise ValueError(f"{asked_by}: {what} runs on CUDA GPUs only, got tensors on {dev}")
    cc = compute_capability()
    if cc is not None and tuple(cc) < TRITON_FLOOR_CAPABILITY:
        raise ValueError(f"{asked_by}: the course launches no Triton kernel on {_gpu_label(cc)}: below compute "
                         f"capability {TRITON_FLOOR_CAPABILITY[0]}.{TRITON_FLOOR_CAPABILITY[1]} even PyTorch's "
                         "torch.compile refuses to generate Triton code")
    if cc is not None and tuple(cc) < TRITON_MIN_CAPABILITY:
        notice_once(("triton", tuple(cc)), f"[course_lib] {asked_by} on {_gpu_label(cc)}: Triton supports compute "
                    "capability >= 8.0 only; the kernel builds here, without tensor cores, but is unsupported: "
                    "check its output against the PyTorch reference")
    return True


def _gpu_label(cc) -> str:
    try:
        name = torch.cuda.get_device_name()
    except (RuntimeError, AssertionError):      # a GPU simulated by the tests on a CPU-only torch
        name = "this GPU"
    return f"{name} (compute capability {cc[0]}.{cc[1]})" if cc is not None else name


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
