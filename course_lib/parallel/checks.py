"""Checks for lab 11: a student's tensor-parallel function run in a real gloo process group.

A function defined in a notebook cell cannot be imported by a spawned process, so the check sends its
*source* (``inspect.getsource``) and each rank compiles it (``launch_source``); helper functions the
student's code calls are passed in ``helpers`` and sent along.

``run_on_ranks`` is the one harness: it runs several calls of the function, one after the other, in one
process group (one start-up for all of them), and records on each rank the ``torch.distributed`` calls
each one made (``all_reduce`` and the shape of its tensor, or any other collective or point-to-point call),
so that a check can say "exactly one all-reduce of the output". A call that raises on a rank comes back as
the exception's text; the ranks go on with the next call. ``run_parallel_mlp`` (exercise 3) is one call
of it. The references the checks compare with, computed in the caller's process: ``mlp_reference`` (the
unsharded MLP) and ``attention_reference`` (the unsharded causal GQA attention block, on
``course_lib.attention.reference_attention``).
"""
from __future__ import annotations

import inspect
import textwrap

import torch
import torch.nn.functional as F

from course_lib.attention import reference_attention
from course_lib.validate import integer

from .launch import RankFailed, launch_source

# What each rank runs around the student's function: torch.distributed's communication functions are
# wrapped (in the module, so `dist.all_reduce` and `from torch.distributed import all_reduce` inside the
# function both go through the wrapper) for the length of one call, and every call is logged.
_DRIVER = '''
import traceback as __course_traceback__

__COURSE_COMM__ = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce",
                   "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "all_to_all",
                   "all_to_all_single", "gather", "scatter", "send", "recv", "isend", "irecv", "barrier")


def __course_call__(fn, args, count):
    import torch.distributed.distributed_c10d as c10d
    log, saved, depth = [], [], [0]

    def wrap(name, f):
        def logged(*a, **kw):
            if not depth[0]:                     # the student's call, not one torch makes inside another
                t = next((x for x in (*a, *kw.values()) if isinstance(x, torch.Tensor)), None)
                log.append([name, None if t is None else list(t.shape)])
            depth[0] += 1
            try:
                return f(*a, **kw)
            finally:
                depth[0] -= 1
        return logged

    if count:
        for mod in (dist, c10d):
            for name in __COURSE_COMM__:
                if hasattr(mod, name):
                    saved.append((mod, name, getattr(mod, name)))
        for mod, name, f in saved:
            setattr(mod, name, wrap(name, f))
    try:
        out = fn(*args, dist.get_rank(), dist.get_world_size())
    except Exception as e:  # noqa: BLE001 - reported as data; the ranks go on with the next call
        return {{"raised": f"{{type(e).__name__}}: {{e}}"[:2000],
                 "traceback": __course_traceback__.format_exc()[-4000:], "collectives": log}}
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)
    return {{"output": out, "collectives": log}}


def __course_check__(calls, count):
    return [__course_call__({name}, args, count) for args in calls]
'''


def _source(fn) -> str:
    if not callable(fn):
        raise TypeError(f"expected a function, got {type(fn).__name__}")
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise TypeError(f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({e}): define it with def "
                        f"in a notebook cell or a file") from None


def run_on_ranks(fn, calls, world_size: int = 2, helpers=(), count_collectives: bool = True,
                 timeout: float = 20.0) -> list:
    """Run ``fn(*args, rank, world_size)`` for each ``args`` of ``calls``, in order, on every rank of one
    ``world_size``-process gloo group. Returns, per rank, a list with one dict per call: ``{"output": what fn
    returned, "collectives": [[name, shape], ...]}`` (each ``torch.distributed`` call it made, with the shape
    of its first tensor argument, or None) or, when it raised, ``{"raised": "Type: message", "traceback": ...,
    "collectives": [...]}``."""
    world_size = integer(world_size, "world_size", low=1)
    calls = [tuple(args) for args in calls]
    source = "\n\n".join([_source(h) for h in helpers] + [_source(fn), _DRIVER.format(name=fn.__name__)])
    return launch_source(source, "__course_check__", world_size, (calls, bool(count_collectives)), backend="gloo",
                         timeout=timeout, deadline=timeout * max(1, len(calls)) + 150)


def mlp_reference(x, w1, b1, w2, b2):
    """The unsharded two-layer MLP: relu(x w1^T + b1) w2^T + b2."""
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def random_mlp(d: int, f: int, batch: int, seed: int):
    """x [batch, 3, d], w1 [f, d], b1 [f], w2 [d, f], b2 [d] from a seed (CPU, float32)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(batch, 3, d, generator=g, device="cpu"), torch.randn(f, d, generator=g, device="cpu"),
            torch.randn(f, generator=g, device="cpu"), torch.randn(d, f, generator=g, device="cpu"),
            torch.randn(d, generator=g, device="cpu"))


def run_parallel_mlp(fn, x, w1, b1, w2, b2, world_size: int = 2, helpers=(), timeout: float = 20.0) -> list:
    """Each rank's output of ``fn(x, w1, b1, w2, b2, rank, world_size)`` in a ``world_size``-process gloo group
    (``run_on_ranks`` with one call; a rank that raised: ``RankFailed`` with its traceback)."""
    out = run_on_ranks(fn, [(x, w1, b1, w2, b2)], world_size, helpers, count_collectives=False, timeout=timeout)
    for r, (res,) in enumerate(out):
        if "raised" in res:
            raise RankFailed(r, res["traceback"])
    return [res["output"] for (res,) in out]


def attention_reference(x, wq, wk, wv, wo, bo, num_heads: int, num_kv_heads: int):
    """The unsharded causal grouped-query attention block, x [B, T, D] -> [B, T, D]: q = x wq^T [B, T, H*Dh]
    (head h is the rows h*Dh..(h+1)*Dh of wq [H*Dh, D]), k and v likewise with the K heads of wk, wv
    [K*Dh, D]; query head h reads KV head h // (H/K); causal softmax(q k^T / sqrt(Dh)) v
    (``reference_attention``); the heads concatenated, then ``@ wo^T + bo`` (wo [D, H*Dh], bo [D])."""
    H, K = integer(num_heads, "num_heads", low=1), integer(num_kv_heads, "num_kv_heads", low=1)
    B, T, _ = x.shape
    Dh = wq.shape[0] // H

    def heads(w, n):
        return F.linear(x, w).view(B, T, n, Dh).transpose(1, 2)             # [B, n, T, Dh]

    out = reference_attention(heads(wq, H), heads(wk, K), heads(wv, K), causal=True)   # [B, H, T, Dh]
    return F.linear(out.transpose(1, 2).reshape(B, T, H * Dh), wo, bo)       # [B, T, D]


def random_attention(batch: int, seq: int, d: int, num_heads: int, num_kv_heads: int, head_dim: int, seed: int):
    """x [batch, seq, d], wq [H*Dh, d], wk and wv [K*Dh, d], wo [d, H*Dh], bo [d] from a seed (CPU, float32;
    the weights scaled by 1/sqrt(fan-in), so the scores are neither flat nor one-hot)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    H, K, Dh = num_heads, num_kv_heads, head_dim

    def w(out, inp):
        return torch.randn(out, inp, generator=g, device="cpu") / inp ** 0.5

    return (torch.randn(batch, seq, d, generator=g, device="cpu"), w(H * Dh, d), w(K * Dh, d), w(K * Dh, d),
            w(d, H * Dh), torch.randn(d, generator=g, device="cpu"))


def kv_group_mistake(x, wq, wk, wv, wo, bo, num_heads: int, num_kv_heads: int, world_size: int):
    """What a known mistake gives (lab 11's ``MISTAKES["kv_group"]``): the query heads split over the
    ranks, every rank keeping all K KV heads and pairing its local query head j with KV head
    j // (H/p / K), as if its heads were the model's first ones. None where that code cannot run
    (H/p not a multiple of K)."""
    H, K, p = num_heads, num_kv_heads, world_size
    local = H // p
    if H % p or local % K:
        return None
    Dh, D = wq.shape[0] // H, wk.shape[1]
    read = [(h % local) // (local // K) for h in range(H)]          # the KV head each query head reads
    wk_m = wk.view(K, Dh, D)[read].reshape(H * Dh, D)
    wv_m = wv.view(K, Dh, D)[read].reshape(H * Dh, D)
    return attention_reference(x, wq, wk_m, wv_m, wo, bo, H, H)
