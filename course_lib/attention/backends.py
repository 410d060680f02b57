"""Which attention kernels this machine has: PyTorch's SDPA backends and the flash-attn package.

``F.scaled_dot_product_attention`` is a dispatcher over several kernels ("backends"):

* ``math``: the composite reference (scores materialized), runs everywhere;
* ``flash``: FlashAttention-2 (on CUDA: compute capability >= 8.0, fp16/bf16; on CPU: PyTorch's own
  tiled CPU kernel under the same name);
* ``efficient``: xFormers' memory-efficient kernel (CUDA; also older GPUs and fp32);
* ``cudnn``: cuDNN's fused attention (recent CUDA GPUs, Hopper first).

``sdpa_backend_report`` runs one call under ``torch.nn.attention.sdpa_kernel`` for each backend and
records whether it ran and, if not, PyTorch's reason; ``sdpa_default_backend`` asks the dispatcher which
one it picks by default. ``flash_backend_reason`` says, from the compute capability alone, why a GPU
such as a T4 (sm_75, Turing) gets no flash backend. ``flash_attn_status`` reports the separate flash-attn
package in one line, ``triton_status`` where the course's own Triton kernels run, and
``hf_attn_implementation`` the ``attn_implementation=`` a Hugging Face model can ask for here.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from course_lib.env import (compute_capability, flash_attn_usable, has_package, triton_interpreting,
                            triton_unsupported_reason)

BACKEND_NAMES = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "cudnn": "CUDNN_ATTENTION"}


def _enum(name: str):
    from torch.nn.attention import SDPBackend
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {sorted(BACKEND_NAMES)}, got {name!r}")
    return getattr(SDPBackend, BACKEND_NAMES[name], None)


def flash_backend_reason(capability: tuple[int, int] | None, dtype=torch.float16) -> str | None:
    """Why PyTorch's CUDA flash backend cannot run on a GPU of this compute capability and dtype, or None
    if it can. ``capability`` None means no CUDA GPU (on CPU, PyTorch's flash backend is a CPU kernel)."""
    if capability is None:
        return None
    if tuple(capability) < (8, 0):
        return (f"compute capability {capability[0]}.{capability[1]} < 8.0: PyTorch's flash backend is "
                "FlashAttention-2, built for Ampere (sm_80) and newer; it uses Ampere's asynchronous "
                "global-to-shared copies and bf16 tensor cores, which a Turing T4 (sm_75) does not have "
                "(the memory-efficient backend runs there instead)")
    if dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype}: the CUDA flash backend takes fp16 or bf16 only"
    return None


def sdpa_default_backend(q, k, v, causal: bool = False) -> str:
    """The backend SDPA dispatches this call to by default ('math', 'flash', 'efficient', 'cudnn')."""
    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is None:
        return "unknown (this torch has no _fused_sdp_choice)"
    from torch.nn.attention import SDPBackend
    picked = SDPBackend(choice(q, k, v, is_causal=causal))
    return next((short for short, long in BACKEND_NAMES.items() if long == picked.name), picked.name.lower())


def run_backend(name: str, q, k, v, causal: bool = False, enable_gqa: bool = False):
    """SDPA forced onto one backend; raises RuntimeError when that backend cannot take this call."""
    from torch.nn.attention import sdpa_kernel
    backend = _enum(name)
    if backend is None:
        raise RuntimeError(f"this torch has no {BACKEND_NAMES[name]} backend")
    kw = {"enable_gqa": True} if enable_gqa else {}
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)


def sdpa_backend_report(q, k, v, causal: bool = False) -> list[dict]:
    """For each backend: {'backend', 'ok', 'reason'} for this call (q, k, v as SDPA takes them,
    [B, H, T, Dh] each). 'reason' is PyTorch's first warning line when a backend refuses."""
    rows = []
    for name in BACKEND_NAMES:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                run_backend(name, q, k, v, causal)
                ok, reason = True, ""
            except RuntimeError as e:
                ok = False
                msgs = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
                reason = msgs[0] if msgs else str(e).strip().splitlines()[0]
        if not ok and name == "flash" and q.is_cuda:
            reason = flash_backend_reason(compute_capability(), q.dtype) or reason
        if not ok and not q.is_cuda and name in ("efficient", "cudnn"):
            reason = f"a CUDA-only kernel: not available on {q.device.type}"
        rows.append({"backend": name, "ok": ok, "reason": reason})
    return rows


def flash_attn_status() -> tuple[bool, str]:
    """(usable, one line) for the flash-attn package: installed? an Ampere-or-newer GPU?"""
    if not has_package("flash_attn"):
        return False, ("flash-attn: not installed (optional: `pip install flash-attn` on a CUDA machine with an "
                       "Ampere or newer GPU); using PyTorch SDPA")
    cc = compute_capability()
    if cc is None:
        return False, "flash-attn: installed, but there is no CUDA GPU; using PyTorch SDPA"
    if not flash_attn_usable():
        return False, (f"flash-attn: installed, but this GPU is sm_{cc[0]}{cc[1]} and flash-attn 2 needs sm_80 "
                       "(Ampere) or newer; using PyTorch SDPA")
    import flash_attn
    return True, f"flash-attn {getattr(flash_attn, '__version__', '?')}: usable on sm_{cc[0]}{cc[1]}"


def triton_status() -> tuple[bool, str]:
    """(usable, one line) for the course's Triton kernels (FlashAttention, flash-decoding, paged attention)
    on this machine's GPU: the decision of ``course_lib.env.triton_gpu_supported``, in words."""
    reason = triton_unsupported_reason()
    if reason is None:
        cc = compute_capability()
        return True, f"Triton kernels: run natively on sm_{cc[0]}{cc[1]} (backend='auto' picks them)"
    if not has_package("triton"):
        return False, f"Triton kernels: {reason}; the PyTorch paths run"
    if compute_capability() is None:
        where = ("this process runs them in Triton's interpreter (TRITON_INTERPRET=1)" if triton_interpreting()
                 else "a CPU runs them only in Triton's interpreter (TRITON_INTERPRET=1, a separate process)")
        return False, f"Triton kernels: no CUDA GPU; {where}; backend='auto' takes the PyTorch paths"
    return False, (f"Triton kernels: {reason}; backend='auto' takes the PyTorch paths here, and the kernels "
                   "can still be read and run in Triton's interpreter on a CPU")


def hf_attn_implementation() -> str:
    """What to pass as ``attn_implementation=`` to transformers here: 'flash_attention_2' or 'sdpa'."""
    return "flash_attention_2" if flash_attn_status()[0] else "sdpa"


__all__ = ["BACKEND_NAMES", "flash_backend_reason", "sdpa_default_backend", "run_backend", "sdpa_backend_report",
           "flash_attn_status", "triton_status", "hf_attn_implementation"]
