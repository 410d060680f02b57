"""Checks for lab 11: a student's column/row-parallel MLP run in a real 2-process gloo group.

A function defined in a notebook cell cannot be imported by a spawned process, so the check sends its
*source* (``inspect.getsource``) and each rank compiles it (``launch_source``); helper functions the
student's code calls are passed in ``helpers`` and sent along.
"""
from __future__ import annotations

import inspect
import textwrap

import torch
import torch.nn.functional as F

from .launch import launch_source

_DRIVER = '''
def __course_check__(x, w1, b1, w2, b2):
    return {name}(x, w1, b1, w2, b2, dist.get_rank(), dist.get_world_size())
'''


def _source(fn) -> str:
    if not callable(fn):
        raise TypeError(f"expected a function, got {type(fn).__name__}")
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise TypeError(f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({e}): define it with def "
                        f"in a notebook cell or a file") from None


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
    """Each rank's output of ``fn(x, w1, b1, w2, b2, rank, world_size)`` in a ``world_size``-process gloo group."""
    source = "\n\n".join([_source(h) for h in helpers] + [_source(fn), _DRIVER.format(name=fn.__name__)])
    return launch_source(source, "__course_check__", world_size, (x, w1, b1, w2, b2), backend="gloo",
                         timeout=timeout, deadline=timeout + 150)


def check_parallel_mlp(fn, d: int = 8, f: int = 12, batch: int = 2, world_size: int = 2, seed: int = 0,
                       helpers=(), atol: float = 1e-4) -> None:
    """AssertionError with a hint unless every rank's output equals the unsharded MLP."""
    x, w1, b1, w2, b2 = random_mlp(d, f, batch, seed)
    ref = mlp_reference(x, w1, b1, w2, b2)
    outs = run_parallel_mlp(fn, x, w1, b1, w2, b2, world_size=world_size, helpers=helpers)
    for r, y in enumerate(outs):
        if not isinstance(y, torch.Tensor) or y.shape != ref.shape:
            raise AssertionError(f"rank {r} returned {getattr(y, 'shape', type(y).__name__)}; expected a tensor "
                                 f"of shape {tuple(ref.shape)} (the whole output, on every rank)")
        if torch.allclose(y, ref, atol=atol, rtol=1e-4):
            continue
        hint = ""
        if torch.allclose(y, ref + (world_size - 1) * b2, atol=atol, rtol=1e-4):
            hint = (f": it is off by exactly ({world_size} - 1) * b2: the bias was added on every rank before "
                    f"the all-reduce, which sums it {world_size} times; add b2 once, after the sum")
        elif torch.allclose(sum(o - b2 for o in outs) + b2, ref, atol=atol * world_size, rtol=1e-4):
            hint = ": the ranks' outputs sum to the answer: the all-reduce (sum over ranks) is missing"
        raise AssertionError(f"rank {r} of {world_size}: max |difference| from the unsharded MLP is "
                             f"{(y - ref).abs().max().item():.3g}{hint}")
