"""Compile the course's Triton kernels ahead of time for GPUs this machine does not have (CPU only, no CUDA).

``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` runs Triton's whole pipeline (TTIR,
TTGIR, LLVM IR, PTX, and ptxas to a cubin) for compute capability ``cc`` without a GPU. What we read back:

* ``ttir``: Triton's target-independent IR, with every tensor type spelled out (``tensor<64x128xbf16>``): a
  kernel launched in fp16 or fp32 that mentions bf16 anywhere would ask a T4 for bf16.
* ``ptx``: ``.target sm_XX``; tensor-core instructions (``mma.sync`` on sm_80/sm_90, Triton's choice at
  these tile sizes; ``wgmma`` would also match "mma"); ``cp.async`` (Ampere's asynchronous copies: the
  software pipeliner staged the loop's loads).

Each kernel is described once in ``KERNELS`` (its signature and one representative set of constexprs per
dtype, the tile sizes of its first GPU autotune config); ``compiled(kernel, cc, dtype)`` builds it, once per
process (``functools.lru_cache``), so several checks of one build pay for one compile.

The dtypes are the course's own choice for a GPU of that compute capability: ``launch_dtypes`` asks
``course_lib.env.half_dtype`` with the capability simulated (``simulated_gpu``), so a change in the library's
rule changes what is compiled and checked here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from device_tools import simulated_gpu

TARGETS = (75, 80, 90)                    # a T4 (Turing), an A100 (Ampere), an H100 (Hopper)
TORCH_TO_TRITON = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Kernel:
    """How to compile one @triton.jit kernel: ``module``/``attr`` locate it (an autotuned kernel's ``.fn``
    is taken), ``args`` names its runtime arguments with a type ("*T" is a pointer to the launch dtype,
    "T" a scalar of it), ``constexprs(dtype)`` its compile-time arguments for that launch dtype (a name
    such as "fp16"), ``options`` num_warps/num_stages; ``dots``/``loops`` whether it does a ``tl.dot`` /
    a loop over K/V tiles (then tensor cores / cp.async are expected on sm_80+)."""
    module: str
    attr: str
    args: tuple
    constexprs: object
    options: dict = field(default_factory=dict)
    dots: bool = False
    loops: bool = False
    launched_in: tuple = ("half", "fp16")   # "half": the course's 16-bit type for that GPU (bench/, the
                                            # speed table of Module 07); fp16: Module 07's checks on a GPU

    def fn(self):
        """The kernel's JITFunction (an autotuned kernel is an Autotuner around it)."""
        import importlib

        from triton.runtime.jit import JITFunction
        obj = getattr(importlib.import_module(self.module), self.attr)
        while not isinstance(obj, JITFunction):
            obj = obj.fn
        return obj

    def signature(self, dtype: str) -> dict:
        return {name: typ.replace("T", dtype) if typ in ("*T", "T") else typ for name, typ in self.args}


def _ptr_and_strides(args):
    """Indices the JIT specializes as divisible by 16 in the real launches: pointers and strides."""
    return {(i,): [["tt.divisibility", 16]] for i, (name, typ) in enumerate(args)
            if typ.startswith("*") or name.startswith("s_")}


def _dot_precision(dtype):
    return "ieee" if dtype == "fp32" else None       # fp32 dots in IEEE fp32, never tf32 (as the launchers)


_I32 = "i32"
KERNELS = {
    "flash forward": Kernel(
        "course_lib.attention.triton_flash", "_flash_fwd_kernel",
        (("Q", "*T"), ("K", "*T"), ("V", "*T"), ("O", "*T"), ("LSE", "*fp32"), ("qk_scale", "fp32"),
         ("T", _I32), ("S", _I32), ("n_ctx_bucket", _I32))
        + tuple((s, _I32) for s in ("s_qb", "s_qh", "s_qt", "s_kb", "s_kh", "s_ks", "s_vb", "s_vh", "s_vs",
                                    "s_ob", "s_oh", "s_ot")),
        lambda dt: dict(H=32, GROUP=4, HEAD_DIM=64, BLOCK_D=64, CAUSAL=True, STORE_LSE=True, STATIC_TOKENS=0,
                        DOT_PRECISION=_dot_precision(dt), UPCAST_DOT=False, BLOCK_M=64, BLOCK_N=32),
        dict(num_warps=4, num_stages=2), dots=True, loops=True),
    "flash-decoding": Kernel(
        "course_lib.attention.triton_flash", "_flash_decode_kernel",
        (("Q", "*T"), ("K", "*T"), ("V", "*T"), ("LENS", "*i32"), ("OUT", "*T"), ("M_PART", "*fp32"),
         ("L_PART", "*fp32"), ("ACC_PART", "*fp32"), ("qk_scale", "fp32"), ("S", _I32))
        + tuple((s, _I32) for s in ("s_qb", "s_qh", "s_kb", "s_kh", "s_ks", "s_vb", "s_vh", "s_vs", "s_ob", "s_oh")),
        lambda dt: dict(GROUP=8, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, NUM_SPLITS=4, HAS_LENS=True,
                        STATIC_TOKENS=0, DOT_PRECISION=_dot_precision(dt), UPCAST_DOT=False, TILE_N=64),
        dict(num_warps=4, num_stages=2), dots=True, loops=True),
    # the paged kernel runs in fp32 too: the course model is fp32 by default and the serving engine's
    # decode goes through it; fp32 exercises split-KV, a head dim that is not a power of two and an odd
    # block size, the half type the unsplit path at the usual shape
    "paged decode": Kernel(
        "course_lib.paged.triton_paged", "_paged_decode_kernel",
        (("Q", "*T"), ("KP", "*T"), ("VP", "*T"), ("TBL", "*i32"), ("LENS", "*i32"), ("OUT", "*T"),
         ("M_PART", "*fp32"), ("L_PART", "*fp32"), ("ACC_PART", "*fp32"), ("qk_scale", "fp32"),
         ("max_blocks", _I32))
        + tuple((s, _I32) for s in ("s_qb", "s_qh", "s_kn", "s_kh", "s_ks", "s_vn", "s_vh", "s_vs", "s_tb",
                                    "s_ob", "s_oh")),
        lambda dt: dict(GROUP=4, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_SIZE=16, NUM_SPLITS=1,
                        STATIC_TOKENS=0, DOT_PRECISION=None, UPCAST_DOT=False, TILE_N=64) if dt != "fp32" else
        dict(GROUP=8, BLOCK_G=16, HEAD_DIM=80, BLOCK_D=128, BLOCK_SIZE=5, NUM_SPLITS=4, STATIC_TOKENS=0,
             DOT_PRECISION="ieee", UPCAST_DOT=False, TILE_N=32),
        dict(num_warps=4, num_stages=3), dots=True, loops=True, launched_in=("half", "fp32")),
    "split combine": Kernel(
        "course_lib.attention.triton_splitkv", "combine_splits_kernel",
        (("M_PART", "*fp32"), ("L_PART", "*fp32"), ("ACC_PART", "*fp32"), ("OUT", "*T"), ("s_ob", _I32),
         ("s_oh", _I32)),
        lambda dt: dict(NUM_SPLITS=5, BLOCK_S=8, HEAD_DIM=80, BLOCK_D=128),
        dict(num_warps=4), launched_in=("half", "fp16", "fp32")),
    # FlashAttention's backward (training: the 16-bit types only), at the launcher's GPU default tiles
    "flash backward dK dV": Kernel(
        "course_lib.attention.triton_flash_backward", "_bwd_dkdv_kernel",
        (("Q", "*T"), ("K", "*T"), ("V", "*T"), ("DO", "*T"), ("LSE", "*fp32"), ("DELTA", "*fp32"), ("DK", "*T"),
         ("DV", "*T"), ("scale", "fp32"), ("qk_scale", "fp32"), ("T", _I32), ("S", _I32)),
        lambda dt: dict(GROUP=4, HEAD_DIM=64, BLOCK_D=64, CAUSAL=True, STATIC_ROWS=0,
                        DOT_PRECISION=_dot_precision(dt), UPCAST_DOT=False, BLOCK_M=64, BLOCK_N=64),
        dict(num_warps=4, num_stages=2), dots=True, loops=True),
    "flash backward dQ": Kernel(
        "course_lib.attention.triton_flash_backward", "_bwd_dq_kernel",
        (("Q", "*T"), ("K", "*T"), ("V", "*T"), ("DO", "*T"), ("LSE", "*fp32"), ("DELTA", "*fp32"), ("DQ", "*T"),
         ("scale", "fp32"), ("qk_scale", "fp32"), ("T", _I32), ("S", _I32)),
        lambda dt: dict(H=32, GROUP=4, HEAD_DIM=64, BLOCK_D=64, CAUSAL=True, STATIC_TOKENS=0,
                        DOT_PRECISION=_dot_precision(dt), UPCAST_DOT=False, BLOCK_M=64, BLOCK_N=64),
        dict(num_warps=4, num_stages=2), dots=True, loops=True),
}

# @triton.jit functions that are not launched themselves but inlined into a kernel of KERNELS: compiling
# that kernel compiles them (tests/test_triton_targets.py checks that every @triton.jit of the course is
# in KERNELS or here)
INLINED = {
    "_rows_mask": "flash forward",
    "_fwd_tiles": "flash forward",
    "_contiguous_tile": "flash-decoding",
    "_paged_tile": "paged decode",
    "online_softmax_tile": "paged decode",      # shared: flash forward (in _fwd_tiles), flash-decoding, paged decode
    "store_split": "flash-decoding",            # shared: flash-decoding and paged decode
    "_dkdv_tiles": "flash backward dK dV",
    "_bwd_dot": "flash backward dQ",            # shared: both backward kernels (dK dV through _dkdv_tiles)
}


def launch_dtypes(kernel: str, cc: int) -> tuple[str, ...]:
    """The dtypes (Triton names) the course launches ``kernel`` with on a GPU of compute capability ``cc``
    (e.g. 75): its "half" type is ``course_lib.env.half_dtype`` on that GPU, simulated."""
    from course_lib import env
    with simulated_gpu(divmod(cc, 10)):
        half = TORCH_TO_TRITON[env.half_dtype("cuda")]
    return tuple(dict.fromkeys(half if d == "half" else d for d in KERNELS[kernel].launched_in))


@functools.lru_cache(maxsize=None)
def compiled(kernel: str, cc: int, dtype: str):
    """``kernel`` compiled for compute capability ``cc`` with launch dtype ``dtype``, once per process."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    spec = KERNELS[kernel]
    const = spec.constexprs(dtype)
    signature = dict(spec.signature(dtype), **{k: "constexpr" for k in const})
    src = ASTSource(fn=spec.fn(), signature=signature, constexprs=const, attrs=_ptr_and_strides(spec.args))
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=dict(spec.options))
