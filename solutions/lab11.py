# %% [markdown] id="c002"
# # Lab 11 — A tensor-parallel MLP on `torch.distributed`
#
# In this lab you split a two-layer MLP over two processes the way Megatron-LM does (module 11): the first
# layer **column-parallel**, the second **row-parallel**, one **all-reduce** between them, and run it in a
# real 2-process gloo group on your CPU.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it: the visible tests check fixed examples and tell you what was expected.
#   When the lab is graded, more tests run on random shapes, so write the general code.
# * Conventions: a linear layer computes `y = x @ W.T + b` with `W` of shape `[out, in]` (as
#   `torch.nn.Linear` and `F.linear`). Rank `r` of `p` owns the `r`-th of `p` equal, contiguous slices.
#
# 3 exercises: 2 + 2 + 4 = 8 points.

# %% id="c003"
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.checks import check_close, check_equal, check_raises

torch.set_num_threads(1)


# %% [markdown] id="c004"
# ## Exercise 1 — The shards (2 points)
#
# * `shard_column(weight, bias, rank, world_size)`: the column-parallel shard of a layer: the rows
#   `rank*out/p : (rank+1)*out/p` of `weight` ([out, in]) and the same slice of `bias` ([out]). Returns
#   `(weight_shard, bias_shard)`.
# * `shard_row(weight, rank, world_size)`: the row-parallel shard: the columns `rank*in/p : (rank+1)*in/p`
#   of `weight`.
#
# Both raise `ValueError` when `world_size` does not divide the dimension being split.

# %% id="c005" nbgrader={"grade": false, "grade_id": "shards", "locked": false, "schema_version": 3, "solution": true, "task": false}
def shard_column(weight, bias, rank, world_size):
    """Rows rank of world_size of weight [out, in], and that slice of bias [out]."""
    ### BEGIN SOLUTION
    out = weight.shape[0]
    if out % world_size:
        raise ValueError(f"world_size={world_size} must divide out_features={out}")
    s = out // world_size
    return weight[rank * s:(rank + 1) * s], bias[rank * s:(rank + 1) * s]
    ### END SOLUTION


def shard_row(weight, rank, world_size):
    """Columns rank of world_size of weight [out, in]."""
    ### BEGIN SOLUTION
    n = weight.shape[1]
    if n % world_size:
        raise ValueError(f"world_size={world_size} must divide in_features={n}")
    s = n // world_size
    return weight[:, rank * s:(rank + 1) * s]
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "shards_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
_w = torch.arange(24.0).reshape(4, 6)
_b = torch.tensor([10.0, 11.0, 12.0, 13.0])
_ws, _bs = shard_column(_w, _b, 1, 2)
check_equal(_ws, _w[2:4], "shard_column(W [4, 6], b, rank=1, world_size=2): the weight rows 2..3")
check_equal(_bs, _b[2:4], "shard_column(W, b, rank=1, world_size=2): the bias slice 2..3")
check_equal(shard_row(_w, 0, 3), _w[:, 0:2], "shard_row(W [4, 6], rank=0, world_size=3): the columns 0..1")
# the shards put back together are the layer
_x = torch.randn(5, 6)
check_close(torch.cat([F.linear(_x, *shard_column(_w, _b, r, 2)) for r in range(2)], -1), F.linear(_x, _w, _b),
            "column shards: their outputs concatenated = the layer's output")
check_close(sum(F.linear(_x[:, 2 * r:2 * r + 2], shard_row(_w, r, 3)) for r in range(3)), F.linear(_x, _w),
            "row shards: their partial outputs summed = the layer's output (without bias)", atol=1e-4)
check_raises(lambda: shard_column(_w, _b, 0, 3), ValueError, "shard_column with world_size=3 for 4 outputs")
check_raises(lambda: shard_row(_w, 0, 4), ValueError, "shard_row with world_size=4 for 6 inputs")
print("shards: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.parallel.layers import shard_range as _range

_g = torch.Generator().manual_seed(time.time_ns() % 2 ** 31)
for _ in range(5):
    _p = int(torch.randint(1, 5, (1,), generator=_g))
    _out, _in = _p * int(torch.randint(1, 5, (1,), generator=_g)), _p * int(torch.randint(1, 5, (1,), generator=_g))
    _w, _b = torch.randn(_out, _in, generator=_g), torch.randn(_out, generator=_g)
    for _r in range(_p):
        _ws, _bs = shard_column(_w, _b, _r, _p)
        check_equal(_ws, _w[_range(_out, _r, _p)], f"shard_column, weight [{_out}, {_in}], rank {_r} of {_p}")
        check_equal(_bs, _b[_range(_out, _r, _p)], f"shard_column, bias [{_out}], rank {_r} of {_p}")
        check_equal(shard_row(_w, _r, _p), _w[:, _range(_in, _r, _p)], f"shard_row, [{_out}, {_in}], rank {_r} of {_p}")
check_raises(lambda: shard_row(torch.randn(3, 7), 0, 2), ValueError, "shard_row, 7 inputs over 2 ranks")
### END HIDDEN TESTS

# %% [markdown] id="c007"
# ## Exercise 2 — What the all-reduce costs (2 points)
#
# A ring all-reduce of `nbytes` bytes over `p` ranks has every rank send `2 (p - 1) / p * nbytes` bytes
# (a reduce-scatter, then an all-gather, `p - 1` steps each). In a Megatron transformer each layer
# all-reduces its `[tokens, hidden]` activations **twice** (after attention and after the MLP).
#
# * `ring_allreduce_bytes(nbytes, p)`: bytes each rank sends (0 for one rank).
# * `tp_bytes_per_token(hidden, layers, p, bytes_per_element=2)`: bytes each rank sends to generate one
#   token (one token's activations per all-reduce).

# %% id="c008" nbgrader={"grade": false, "grade_id": "cost", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ring_allreduce_bytes(nbytes, p):
    """Bytes each rank sends in a ring all-reduce of nbytes over p ranks."""
    ### BEGIN SOLUTION
    return 2 * (p - 1) / p * nbytes
    ### END SOLUTION


def tp_bytes_per_token(hidden, layers, p, bytes_per_element=2):
    """Bytes each rank sends per generated token under tensor parallelism p."""
    ### BEGIN SOLUTION
    return 2 * layers * ring_allreduce_bytes(hidden * bytes_per_element, p)
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "cost_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_close(ring_allreduce_bytes(1000, 1), 0.0, "ring_allreduce_bytes(1000, p=1): one rank sends nothing")
check_close(ring_allreduce_bytes(1000, 2), 1000.0, "ring_allreduce_bytes(1000, p=2)")
check_close(ring_allreduce_bytes(1000, 8), 1750.0, "ring_allreduce_bytes(1000, p=8)")
# Llama-2-70B: hidden 8192, 80 layers, bf16, TP=8
check_close(tp_bytes_per_token(8192, 80, 8), 2 * 80 * 1.75 * 8192 * 2, "tp_bytes_per_token(8192, 80, p=8)")
print("cost: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.models.config import LlamaConfig as _Cfg
from course_lib.parallel import cost as _cost

for _ in range(5):
    _p = int(torch.randint(1, 17, (1,)))
    _n = float(torch.randint(1, 10 ** 6, (1,)))
    check_close(ring_allreduce_bytes(_n, _p), _cost.ring_allreduce_bytes(_n, _p), f"ring_allreduce_bytes({_n}, {_p})")
    _L, _heads = int(torch.randint(1, 100, (1,))), 8
    _D = _heads * 2 * int(torch.randint(1, 64, (1,)))
    _bpe = [1, 2, 4][int(torch.randint(0, 3, (1,)))]
    _ref = _cost.tp_comm_per_token(_Cfg(hidden_size=_D, num_hidden_layers=_L, num_attention_heads=_heads), _p,
                                   bpe=_bpe)["sent_bytes"]
    check_close(tp_bytes_per_token(_D, _L, _p, _bpe), _ref, f"tp_bytes_per_token({_D}, {_L}, {_p}, {_bpe})")
### END HIDDEN TESTS

# %% [markdown] id="c010"
# ## Exercise 3 — The column/row-parallel MLP with its all-reduce (4 points)
#
# Write `parallel_mlp(x, w1, b1, w2, b2, rank, world_size)`. It runs **in each process** of a process
# group and must return, on every rank, the output of the whole MLP
#
#     y = relu(x @ w1.T + b1) @ w2.T + b2        x [..., d], w1 [f, d], b1 [f], w2 [d, f], b2 [d]
#
# while using only this rank's shards: the column shard of `(w1, b1)`, then `relu`, then the row shard of
# `w2` for a partial result, summed over the ranks with `dist.all_reduce(tensor)` (in place; the default
# op is a sum), and the bias `b2` **once**. (Every rank is given the whole weights here, to keep the
# test simple; in a real model each rank would load only its shards.)
#
# How it is checked: a function defined in a notebook cannot be imported by a new process, so
# `check_parallel_mlp` sends the *source* of your function (and of the helpers you list) to two fresh
# processes, which form a gloo group over 127.0.0.1 and run it with `torch`, `F` and `dist` imported.
# So use only those and the helpers from exercise 1. Each check starts two Python processes: it takes a
# few seconds (the first one longer).

# %% id="c011" nbgrader={"grade": false, "grade_id": "parallel_mlp", "locked": false, "schema_version": 3, "solution": true, "task": false}
def parallel_mlp(x, w1, b1, w2, b2, rank, world_size):
    """This rank's part of relu(x w1^T + b1) w2^T + b2, all-reduced: the whole output on every rank."""
    ### BEGIN SOLUTION
    w1_r, b1_r = shard_column(w1, b1, rank, world_size)
    h = F.relu(F.linear(x, w1_r, b1_r))              # [..., f/p]: this rank's hidden slice
    y = F.linear(h, shard_row(w2, rank, world_size))  # [..., d]: a partial sum
    dist.all_reduce(y)                                # the sum over the ranks, on every rank
    return y + b2                                     # the bias once, after the sum
    ### END SOLUTION


# %% id="c012" nbgrader={"grade": true, "grade_id": "parallel_mlp_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
from course_lib.parallel.checks import check_parallel_mlp

check_parallel_mlp(parallel_mlp, d=4, f=6, batch=2, world_size=2, seed=0, helpers=[shard_column, shard_row])
print("parallel_mlp: visible test passed (2 processes, gloo)")
### BEGIN HIDDEN TESTS
_g = torch.Generator().manual_seed(time.time_ns() % 2 ** 31)
_d = int(torch.randint(2, 12, (1,), generator=_g))
_f = 2 * int(torch.randint(1, 10, (1,), generator=_g))
check_parallel_mlp(parallel_mlp, d=_d, f=_f, batch=int(torch.randint(1, 4, (1,), generator=_g)), world_size=2,
                   seed=int(torch.randint(0, 2 ** 31, (1,), generator=_g)), helpers=[shard_column, shard_row])
### END HIDDEN TESTS

# %% [markdown] id="c013"
# ## Going further (not graded)
#
# * Notebook 11 shards the course's whole Llama this way (`course_lib.parallel.shard_model`): attention by
#   heads, with grouped-query KV heads divided too; compare its logits with the single-process model.
# * Try `check_parallel_mlp(parallel_mlp, world_size=4, f=8, helpers=[shard_column, shard_row])`: four
#   processes on your machine.
