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
