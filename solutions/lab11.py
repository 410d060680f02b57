# %% [markdown] id="c002"
# # Lab 11 — A tensor-parallel MLP and attention on `torch.distributed`
#
# In this lab you split a transformer block's two halves over several processes the way Megatron-LM does
# [@shoeybi2019megatron] (module 11), and run them in real gloo process groups on your CPU. First a two-layer
# MLP: the first layer **column-parallel**, the second **row-parallel**, one **all-reduce** between them. Then
# grouped-query attention: the query, key and value projections column-parallel **by heads**, with each group
# of query heads on the rank of its KV head, the output projection row-parallel, and again one all-reduce. You
# design both from their contracts (each must equal the unsharded block on every rank, with exactly the
# communication it needs), and you predict a pipeline's bubble before two ranks measure it.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it: the visible tests check fixed examples and tell you what was expected.
#   When the lab is graded, the grader calls your functions on inputs of its own (drawn for you, of random
#   shapes, and an edge grid: one rank (for the shards and the bubble; Exercises 3 and 4 run on 2 and 4
#   ranks), one row, column or head per rank, the sizes a world size does not divide)
#   and compares the results with `course_lib.parallel`, so write the general code. Do not import that
#   reference: the grader flags an answer that does, and while it grades, the reference is not in the library.
# * Conventions: a linear layer computes `y = x @ W.T + b` with `W` of shape `[out, in]` (as
#   `torch.nn.Linear` and `F.linear`). Rank `r` of `p` owns the `r`-th of `p` equal, contiguous slices.
#
# 6 exercises: 2 + 2 + 4 (contract) + 4 (contract) + 2 (prediction) + 2 (written, graded by your instructor)
# = 16 points.

# %% id="c003"
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.checks import check_close, check_equal, check_raises
from course_lib.models.config import LlamaConfig
from course_lib.parallel import (ModelSpec, bubble_fraction, gpipe_schedule, launch, pipeline_run, sequence,
                                 split_layers)
from course_lib.parallel.checks import (attention_reference, kv_group_mistake, mlp_reference, random_attention,
                                       random_mlp, run_on_ranks)
from course_lib.perf.claims import timing_claim

torch.set_num_threads(1)

# Known misconceptions: a test that recognises one names it (public text, pointing to notebook 11)
MISTAKES = {
    "bias_every_rank": "the row-parallel layer's bias (the MLP's b2, the attention's output bias bo) is added on "
                       "every rank before the all-reduce, which sums it world_size times: add it once, after the "
                       "sum; see notebook 11, section '1 · Two ways to split a linear layer'",
    "no_allreduce": "each rank returns its partial sum: the row-parallel layer's outputs must be summed over the "
                    "ranks (dist.all_reduce) before they are the layer's output; see notebook 11, section "
                    "'1 · Two ways to split a linear layer'",
    "mlp_gathered_hidden": "the hidden activations were gathered (all_gather) and the whole second layer run on "
                           "every rank: the right values, but the [..., f / p] slices leave their ranks and every "
                           "rank repeats the whole second matmul. The row-parallel second layer needs only this "
                           "rank's slice: its partial sums, added by one all-reduce of [..., d], are the output; "
                           "see notebook 11, section '1 · Two ways to split a linear layer'",
    "kv_group": "the query heads were split over the ranks without their KV heads: rank r's j-th query head is the "
                "model's head r*H/p + j and reads KV head (r*H/p + j) // (H/K), its group's; keeping every KV head "
                "on every rank and pairing by the local index j reads another group's keys and values. Split Q, K "
                "and V by heads together (rank r: query heads r*H/p.., KV heads r*K/p..): each group then stays on "
                "one rank; see notebook 11, section '3 · Sharding the course's Llama'",
    "allreduce_per_head": "one all-reduce per head: each head's share of the output projection summed over the "
                          "ranks on its own gives the right output, but costs H/p all-reduces of [B, T, D] per block "
                          "where one does: add this rank's heads' shares on the rank first (the row-parallel output "
                          "projection over its concatenated heads is one matmul), then all-reduce once; see notebook "
                          "11, section '1 · Two ways to split a linear layer'",
    "bubble_balanced": "the bubble of balanced stages, (p - 1) / (m + p - 1), applied to stages that are not: when "
                       "the layers do not split evenly (or the last stage also runs the LM head), the slowest stage "
                       "sets the pace of every micro-batch after the first and the others wait for it; see notebook "
                       "11, section '6 · Pipeline parallelism and its bubble'",
    "bubble_slowest_fill": "the whole run taken at the slowest stage's pace, (m + p - 1) stage-times of the slowest "
                           "stage: the first micro-batch crosses each stage at that stage's own speed; only the "
                           "steady state after it is paced by the slowest; see notebook 11, section '6 · Pipeline "
                           "parallelism and its bubble'",
    "bubble_idle_over_busy": "idle rank-time over busy rank-time: the bubble is the idle share of ALL the rank-time "
                             "of the run, 1 - busy / (p * makespan); see notebook 11, section '6 · Pipeline "
                             "parallelism and its bubble'",
}


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
#
# Keep each function self-contained (no helper of your own outside them): Exercises 3 and 4 send the *source*
# of these two functions to other processes, and nothing else of your notebook goes with it.

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

# %% [markdown] id="c007"
# ## Exercise 2 — What the all-reduce costs (2 points)
#
# A ring all-reduce of `nbytes` bytes over `p` ranks has every rank send `2 (p - 1) / p * nbytes` bytes
# (a reduce-scatter, then an all-gather, `p - 1` steps each; bandwidth-optimal [@patarasuk2009bandwidth]). In a Megatron transformer each layer
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

# %% [markdown] id="c010"
# ## Exercise 3 — The column/row-parallel MLP with its all-reduce (4 points, contract)
#
# Design `parallel_mlp(x, w1, b1, w2, b2, rank, world_size)`, the Megatron MLP as it runs **in each
# process** of a process group.
#
# **Contract.**
#
# * *inputs*: `x` `[..., d]`, `w1` `[f, d]`, `b1` `[f]`, `w2` `[d, f]`, `b2` `[d]` (every rank is given the
#   whole weights here, to keep the test simple; in a real model each rank would load only its shards),
#   `rank` and `world_size` of the default process group;
# * *output*: on **every** rank, the whole MLP's output `y = relu(x @ w1.T + b1) @ w2.T + b2`, `[..., d]`,
#   equal to the unsharded MLP within float32 rounding (`atol=1e-4`);
# * *shards*: the computation uses only this rank's shards from exercise 1: the column shard of
#   `(w1, b1)` (`f / p` hidden units) and the row shard of `w2`; the hidden activations `[..., f / p]` never
#   leave the rank;
# * *communication*: exactly one collective per call, `dist.all_reduce(tensor)` (in place; the default op
#   is a sum) of one `[..., d]` tensor, the bytes exercise 2 counts;
# * *errors*: the shard functions' `ValueError` when `world_size` does not divide `f`.
#
# How it is checked: a function defined in a notebook cannot be imported by a new process, so
# `run_on_ranks` sends the *source* of your function (and of the helpers you list) to two fresh
# processes, which form a gloo group over 127.0.0.1 and run it with `torch`, `F` and `dist` imported; each
# rank returns its output and the `torch.distributed` calls it made.
# So use only those and the helpers from exercise 1. Each check starts two Python processes: it takes a
# few seconds (the first one longer).
#
# <details><summary>Hint 1: why column then row needs only one all-reduce</summary>
#
# The column shard of the first layer gives this rank a *slice of the hidden units*, and `relu` acts on each
# unit alone, so it applies to the slice. The row shard of the second layer reads exactly that slice of the
# hidden units: each rank gets a *partial sum* of the output, and the ranks' partial sums add up to it.
#
# </details>
#
# <details><summary>Hint 2: what each rank holds, and when</summary>
#
# The first layer's shard gives this rank some hidden units whole, so the nonlinearity applies to them
# right away, with no communication. The second layer's shard then gives every rank a full-width output that
# is only a **partial sum**: nothing is right until the ranks have added their partials. Pitfall: anything
# added per rank before that sum (a bias, say) is added `world_size` times.
#
# </details>

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
def check_mlp_on_ranks(d, f, batch, seed, world_size=2):
    """Your parallel_mlp on world_size gloo ranks against the unsharded MLP, each rank's collectives counted,
    naming a known mistake."""
    x, w1, b1, w2, b2 = random_mlp(d, f, batch, seed)
    ref = mlp_reference(x, w1, b1, w2, b2)
    ranks = run_on_ranks(parallel_mlp, [(x, w1, b1, w2, b2)], world_size, helpers=[shard_column, shard_row])
    what = f"parallel_mlp (d={d}, f={f}, batch={batch}, seed {seed}) on {world_size} ranks"
    for r, (res,) in enumerate(ranks):
        if "raised" in res:
            raise AssertionError(f"{what}: rank {r} raised {res['raised']}\n{res['traceback']}")
        w1_r, b1_r = w1.chunk(world_size)[r], b1.chunk(world_size)[r]
        h = F.relu(F.linear(x, w1_r, b1_r))
        partial = F.linear(h, w2.chunk(world_size, dim=1)[r])
        check_close(res["output"], ref, f"{what}: rank {r}'s output vs the unsharded MLP", rtol=1e-4, atol=1e-4,
                    mistakes={MISTAKES["bias_every_rank"]: ref + (world_size - 1) * b2,
                              MISTAKES["no_allreduce"]: partial + b2})
        check_equal(res["collectives"], [["all_reduce", list(ref.shape)]],
                    f"{what}: rank {r}'s torch.distributed calls ([name, shape of the tensor])",
                    mistakes={MISTAKES["mlp_gathered_hidden"]: [["all_gather", list(h.shape)]]})


check_mlp_on_ranks(d=4, f=6, batch=2, seed=0)
print("parallel_mlp: visible test passed (2 processes, gloo)")

# %% [markdown] id="c020"
# ## Exercise 4 — Tensor-parallel attention: GQA heads over the ranks, one all-reduce (4 points, contract)
#
# Design `parallel_attention(x, wq, wk, wv, wo, bo, num_heads, num_kv_heads, rank, world_size)`, Megatron's
# attention block as it runs **in each process** of a process group: the query, key and value projections
# column-parallel by heads, attention over this rank's heads, the output projection row-parallel, one
# all-reduce. With grouped-query attention (module 05) the `H` query heads share `K` KV heads, `H / K` query
# heads per KV head, and a query head can only be computed on a rank that holds its KV head.
#
# **Contract.**
#
# * *inputs*: `x` `[B, T, D]` (float32); `wq` `[H*Dh, D]` and `wk`, `wv` `[K*Dh, D]`, where query head `h` is the
#   rows `h*Dh : (h+1)*Dh` of `wq` and KV head `g` the same rows of `wk` and `wv`; `wo` `[D, H*Dh]`, `bo` `[D]`;
#   `num_heads` `H` and `num_kv_heads` `K`; `rank` and `world_size` `p` of the default process group. As in
#   exercise 3, every rank is given the whole weights.
# * *the block*: causal grouped-query attention without positional encoding: query head `h` reads KV head
#   `h // (H/K)`, token `t` attends to tokens `0..t` with `softmax(q k^T / sqrt(Dh))`, the `H` heads' outputs
#   are concatenated in head order, `[B, T, H*Dh]`, then `@ wo.T + bo`. `attention_reference` (imported
#   above) is this block in one process.
# * *output*: on **every** rank, the whole block's output `[B, T, D]`, equal to the unsharded block within
#   float32 rounding (`atol=1e-4`).
# * *shards*: rank `r` computes only its `H/p` query heads `r*H/p ...` and the `K/p` KV heads `r*K/p ...`
#   (its rows of `wq`, `wk` and `wv`) and multiplies by only the columns of `wo` that read its heads; the
#   heads' activations never leave the rank.
# * *communication*: exactly one collective per call, one `dist.all_reduce` of one `[B, T, D]` tensor. The
#   checks record every `torch.distributed` call each rank makes.
# * *errors*: a `ValueError` whose message names `num_kv_heads`, raised before any communication, when
#   `num_kv_heads` does not divide `num_heads`, or `world_size` does not divide `num_kv_heads`, which includes
#   more ranks than KV heads (multi-query attention at `p = 2`). Like the course's `shard_model`
#   (notebook 11, section 3), refuse; do not replicate KV heads.
#
# How it is checked: `run_on_ranks` sends the source of your function, with `shard_column` and `shard_row`,
# to `p` fresh processes that form one gloo group and run it on several shapes in turn (one start-up for
# all of them); each call's output and the collectives it made come back from every rank. The grader draws
# its own shapes (batch, tokens, hidden size, query heads, KV heads, head dimension) on 2 and on 4 ranks,
# with an edge grid (one token, one head per rank, one KV head per rank, `D` different from `H*Dh`), and
# calls your function outside any process group for the errors. As in exercise 3 the ranks have `torch`,
# `F`, `dist`, `nn` and `math` and your two shard helpers: define anything else inside the function.
#
# <details><summary>Hint 1: which heads go to which rank</summary>
#
# Cut the query heads and the KV heads each into `p` contiguous runs. Both lists are in group order (the
# `H/K` query heads of KV head 0 first), so rank `r`'s query heads are exactly the queries of its own KV
# heads, and within the rank the group size is still `H/K`. In the weights a run of heads is a run of rows of
# `wq` (or `wk`, `wv`): a column shard; the columns of `wo` that read those heads are a row shard. Pitfall:
# an even split of `wk`'s rows does not tell you that the *heads* split evenly: with 3 KV heads of 4 rows,
# 2 ranks get 6 rows each, half a head too many or too few. Check the head counts.
#
# </details>
#
# <details><summary>Hint 2: where the single all-reduce goes</summary>
#
# After attention each rank holds its heads' outputs, its slice of the concatenated `[B, T, H*Dh]`. That slice
# times its columns of `wo` is this rank's partial sum of the block's output; the ranks' partial sums add up
# to it. The sum over this rank's own heads happens inside that one matmul, so the only sum that crosses
# ranks is one `[B, T, D]` tensor. Pitfalls: a collective per head (the same numbers, `H/p` times the
# messages), and `bo` added before the sum (counted `p` times).
#
# </details>
#
# <details><summary>Hint 3: the attention on the rank</summary>
#
# On the rank it is ordinary causal grouped-query attention with `H/p` query heads and `K/p` KV heads:
# `F.scaled_dot_product_attention` with `is_causal=True` does it once each KV head is repeated for the query
# heads of its group (next to each other, as the query heads are). Pitfall: the scale is `1/sqrt(Dh)`, with
# `Dh` the head dimension, not the hidden size `D`.
#
# </details>

# %% id="c021" nbgrader={"grade": false, "grade_id": "parallel_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def parallel_attention(x, wq, wk, wv, wo, bo, num_heads, num_kv_heads, rank, world_size):
    """This rank's heads of causal GQA attention, all-reduced: the whole [B, T, D] output on every rank."""
    ### BEGIN SOLUTION
    H, K, p = num_heads, num_kv_heads, world_size
    if K < 1 or H % K:
        raise ValueError(f"num_kv_heads={K} must divide num_heads={H}")
    if K % p:
        raise ValueError(f"world_size={p} must divide num_kv_heads={K}: each rank needs the KV heads of its "
                         f"query heads (KV heads are not replicated)")
    B, T, _ = x.shape
    Dh = wq.shape[0] // H
    h, k = H // p, K // p                                     # this rank's query heads and KV heads
    q_rows = slice(rank * h * Dh, (rank + 1) * h * Dh)        # query heads r*H/p ..: column-parallel by heads
    kv_rows = slice(rank * k * Dh, (rank + 1) * k * Dh)       # KV heads r*K/p ..: the groups of those queries
    q = F.linear(x, wq[q_rows]).view(B, T, h, Dh).transpose(1, 2)      # [B, H/p, T, Dh]
    kk = F.linear(x, wk[kv_rows]).view(B, T, k, Dh).transpose(1, 2)    # [B, K/p, T, Dh]
    vv = F.linear(x, wv[kv_rows]).view(B, T, k, Dh).transpose(1, 2)    # [B, K/p, T, Dh]
    kk, vv = kk.repeat_interleave(h // k, dim=1), vv.repeat_interleave(h // k, dim=1)   # each query head its KV head
    o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)     # [B, H/p, T, Dh]
    o = o.transpose(1, 2).reshape(B, T, h * Dh)                        # this rank's heads, concatenated
    y = F.linear(o, shard_row(wo, rank, world_size))                   # [B, T, D]: a partial sum, no bias
    dist.all_reduce(y)                                                 # the one all-reduce of the block
    return y + bo                                                      # the bias once, after the sum
    ### END SOLUTION


# %% id="c022" nbgrader={"grade": true, "grade_id": "parallel_attention_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
def check_attention_on_ranks(shapes, world_size=2):
    """Your parallel_attention on world_size gloo ranks, one call per shape (batch, tokens, D, heads, KV heads,
    head dim, seed), against the unsharded block; each rank's collectives counted; known mistakes named."""
    calls = [random_attention(b, t, d, nh, nkv, hd, seed) + (nh, nkv) for b, t, d, nh, nkv, hd, seed in shapes]
    ranks = run_on_ranks(parallel_attention, calls, world_size, helpers=[shard_column, shard_row])
    for i, args in enumerate(calls):
        x, bo, nh, nkv = args[0], args[5], args[6], args[7]
        ref = attention_reference(*args)
        what = (f"parallel_attention (x {list(x.shape)}, {nh} heads, {nkv} KV heads, head dim "
                f"{args[1].shape[0] // nh}) on {world_size} ranks")
        one = [["all_reduce", list(ref.shape)]]
        for r in range(world_size):
            res = ranks[r][i]
            if "raised" in res:
                raise AssertionError(f"{what}: rank {r} raised {res['raised']}\n{res['traceback']}")
            check_close(res["output"], ref, f"{what}: rank {r}'s output vs the unsharded block", rtol=1e-4, atol=1e-4,
                        mistakes={MISTAKES["bias_every_rank"]: ref + (world_size - 1) * bo,
                                  MISTAKES["kv_group"]: kv_group_mistake(*args, world_size)})
            check_equal(res["collectives"], one, f"{what}: rank {r}'s torch.distributed calls ([name, shape])",
                        mistakes={MISTAKES["allreduce_per_head"]: one * (nh // world_size)})


check_attention_on_ranks([(2, 5, 8, 4, 2, 3, 0), (1, 3, 6, 8, 2, 2, 1)])
_mqa = random_attention(1, 2, 4, 4, 1, 2, 0)    # multi-query attention: 4 query heads, one KV head, 2 ranks
try:
    parallel_attention(*_mqa, 4, 1, 0, 2)
    raise AssertionError("parallel_attention with 1 KV head on 2 ranks: expected a ValueError, nothing was raised")
except ValueError as e:
    check_equal("num_kv_heads" in str(e), True, f"parallel_attention with 1 KV head on 2 ranks: the ValueError "
                f"names num_kv_heads (got {e!r})")
print("parallel_attention: visible tests passed (2 processes, gloo)")

# %% [markdown] id="c014"
# ## Exercise 5 — Predict the bubble of an uneven pipeline (2 points)
#
# Notebook 11 measures the bubble of a pipeline whose stages take equal time, `(p - 1) / (m + p - 1)`. Real
# splits are rarely equal: a model's layers do not always divide by `p`, and the last stage also runs the
# LM head. Predict the bubble of such a pipeline:
#
# * the model has `num_layers` identical decoder layers, cut into `p` contiguous stages as evenly as possible
#   (the first `num_layers mod p` stages get one layer more: `course_lib.parallel.split_layers`' rule);
# * one layer takes one time unit per micro-batch; the last stage also runs the LM head, which takes
#   `head_cost` time units (a number >= 0, not necessarily whole) per micro-batch;
# * GPipe's forward schedule: stage `s` runs micro-batch `i` once it has finished `i - 1` and stage `s - 1`
#   has handed over `i`; the hand-over is free; the batch is `m` micro-batches.
#
# Write `predict_bubble(num_layers, p, m, head_cost=0.0)`: the **bubble**, the share of the run's rank-time
# that the ranks spend idle (`1 - busy / (p * makespan)`), as a float. Raise `ValueError` if `num_layers`,
# `p` or `m` is not an integer >= 1 (a `bool` or a float is refused), if `p > num_layers` (a stage needs a layer), or if `head_cost` is not a
# number >= 0. The grader draws its own models, pipelines and head costs and compares with the timeline it
# builds.
#
# The visible tests check the units and what must hold whatever the formula; the cell after them puts your
# prediction beside the course's timeline and two real ranks.
#
# <details><summary>Hint 1: the makespan</summary>
#
# Follow micro-batch 0 and then the last one on a timeline of uneven stages. The first crosses every stage
# at that stage's own speed; after it, micro-batches leave the pipeline at the pace of one stage only. Which
# one? Pitfall: taking the whole run, fill included, at that slowest pace.
# </details>
#
# <details><summary>Hint 2: busy and idle</summary>
#
# The busy rank-time does not depend on the schedule: every micro-batch goes through every layer (and the
# head) once. The bubble is idle over *all* the rank-time; the notebook's formula is the special case of
# equal stages, and it understates the bubble of unequal ones.
# </details>

# %% id="c015" nbgrader={"grade": false, "grade_id": "predict_bubble", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_bubble(num_layers, p, m, head_cost=0.0):
    ### BEGIN SOLUTION
    for name, v in (("num_layers", num_layers), ("p", p), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if p > num_layers:
        raise ValueError(f"p must be <= num_layers = {num_layers} (a stage needs a layer), got {p}")
    if isinstance(head_cost, bool) or not isinstance(head_cost, (int, float)) or not head_cost >= 0:
        raise ValueError(f"head_cost must be a number >= 0, got {head_cost!r}")
    q, r = divmod(num_layers, p)
    times = [q + (1 if s < r else 0) for s in range(p)]
    times[-1] += head_cost
    makespan = sum(times) + (m - 1) * max(times)     # micro-batch 0 crosses every stage; the rest at the slowest's pace
    return 1.0 - m * sum(times) / (p * makespan)     # busy: every micro-batch through every stage once
    ### END SOLUTION


# %% id="c016" nbgrader={"grade": true, "grade_id": "predict_bubble_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def _bubble(L, p, m, head=0.0):
    got = predict_bubble(L, p, m, head)
    what = f"predict_bubble(num_layers={L}, p={p}, m={m}, head_cost={head})"
    check_equal(isinstance(got, float) and 0 <= got < 1, True,
                f"{what} = {got!r}: the bubble is a share of rank-time, a float in [0, 1)")
    return got


check_close(_bubble(7, 1, 5, 0.5), 0.0, "predict_bubble(7, p=1, m=5, head_cost=0.5): one stage never waits")
for _L, _p, _hd in ((8, 4, 0.0), (10, 4, 0.0), (9, 3, 1.5), (6, 6, 0.25)):
    _ms = [_bubble(_L, _p, _m, _hd) for _m in (1, 2, 4, 16, 256)]
    check_equal(all(x > y for x, y in zip(_ms, _ms[1:])), True, f"more micro-batches shrink the bubble "
                f"(num_layers={_L}, p={_p}, head_cost={_hd}): {[round(x, 4) for x in _ms]} for m = 1, 2, 4, 16, 256")
    check_equal(all(x >= (_p - 1) / (_m + _p - 1) - 1e-12 for x, _m in zip(_ms, (1, 2, 4, 16, 256))), True,
                f"num_layers={_L}, p={_p}, head_cost={_hd}: stages that are not equal can only idle more than "
                f"equal ones, (p - 1) / (m + p - 1)")
for _bad in ((8, 0, 4), (8, 4, 0), (8.0, 4, 4), (8, 2.0, 4), (3, 4, 2), (8, 4, 4, -1.0)):
    check_raises(lambda: predict_bubble(*_bad), ValueError, f"predict_bubble{_bad}")
print("predict_bubble: visible tests passed")

# %% [markdown] id="c017"
# Now measure. First the course's GPipe timeline (`gpipe_schedule`) with the stage times your pipelines have
# (the layers split by `split_layers`, the head on the last stage). Then two real gloo ranks run the two
# layers of a small Llama as two stages (`pipeline_run`, notebook 11 section 6), each stage also waiting
# 20 ms per micro-batch to stand for GPU kernel time: equal stages, so the prediction is
# `predict_bubble(2, 2, m)`; the measured bubble includes the transfers and this machine's load (a timing:
# shown, not asserted).

# %% id="c018"
try:
    if os.environ.get("NBGRADER_EXECUTION"):  # a measurement, not a test: the grader skips it (and its timeline)
        raise NotImplementedError
    for _L, _p, _m, _hd in ((8, 4, 8, 0.0), (10, 4, 8, 0.0), (10, 4, 8, 1.5), (32, 3, 16, 2.0), (32, 3, 64, 2.0)):
        _times = [len(_r) for _r in split_layers(_L, _p)]
        _times[-1] += _hd
        print(f"{_L} layers, p={_p}, m={_m}, head {_hd}: stage times {_times}, predicted "
              f"{predict_bubble(_L, _p, _m, _hd):.3f}, timeline {bubble_fraction(gpipe_schedule(_p, _m, _times), _p):.3f}"
              f", equal stages' formula {(_p - 1) / (_m + _p - 1):.3f}")
    _cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    _steps = [(pipeline_run, (ModelSpec(config=_cfg, seed=3), _m), dict(batch=4, seq=8, stage_sleep_s=0.02))
              for _m in (1, 4)]
    _pipe = launch(sequence, 2, args=(_steps,))[0]
    for _r in _pipe:
        print(f"2 gloo ranks, m={_r['m']}: predicted {predict_bubble(2, 2, _r['m']):.3f}, timeline "
              f"{bubble_fraction(gpipe_schedule(2, _r['m'], [1.0, 1.0]), 2):.3f}, measured {_r['bubble']:.3f}")
    timing_claim("the measured bubble follows (p-1)/(m+p-1) within -0.05 to +0.3 (the transfers)",
                 held=all(predict_bubble(2, 2, r["m"]) - 0.05 < r["bubble"] < predict_bubble(2, 2, r["m"]) + 0.3
                          for r in _pipe),
                 measured=", ".join(f"m={r['m']}: {r['bubble']:.3f}" for r in _pipe))
except NotImplementedError:
    print("finish the exercises first" if not os.environ.get("NBGRADER_EXECUTION") else
          "the measurement is skipped while grading")

# %% [markdown] id="c013"
# ## Going further (not graded)
#
# * Notebook 11 shards the course's whole Llama this way (`course_lib.parallel.shard_model`). Its attention,
#   `ShardedAttention`, differs from your `parallel_attention` in three ways: one fused QKV matrix, RoPE, and
#   a KV cache on each rank. Which of them change what a rank holds or what crosses the ranks?
# * Try `check_mlp_on_ranks(d=8, f=8, batch=2, seed=1, world_size=4)` and
#   `check_attention_on_ranks([(2, 4, 8, 8, 4, 2, 3)], world_size=4)`: four processes on your machine. What does
#   each rank hold, and how many bytes does each rank send per call?
# * Your function refuses more ranks than KV heads. Llama-3-70B has 64 query heads and 8 KV heads of 128: at
#   TP = 16, what would replicating the KV heads instead cost in KV-cache memory per rank and in all, and in
#   communication?

# %% [markdown] id="cw11p"
# ## Exercise 6 — Written analysis: the bubble formula against two real ranks (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Answer in 100 to 200 words, about the
# output of the cell after Exercise 5 (it is skipped while grading):
#
# 1. quote, for two values of `m`, the predicted bubble, the ideal timeline's and the measured one of the two
#    gloo ranks; explain why the ideal timeline matches the formula, and what the unbalanced stage does to the
#    bubble and why;
# 2. explain why the measured bubble is above the prediction, and whether it falls with `m` as the formula says;
# 3. with `p = 4` balanced stages, how many micro-batches keep the bubble under 10%, and what does raising `m`
#    cost at a fixed global batch?
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw11" nbgrader={"grade": true, "grade_id": "written_bubble", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of a reference run: the solution notebook on a 2-core CPU, torch 2.13; your
# numbers will differ: what matters is how you explain them.)*
#
# For m = 1 the formula gives 0.500, the ideal timeline 0.500 and the two gloo ranks measured 0.513; for m = 4,
# 0.200, 0.200 and 0.261. The ideal timeline agrees with (p - 1) / (m + p - 1) exactly: with equal stages the
# last stage starts after p - 1 slots and runs m, so the run lasts m + p - 1 slots, of which each rank is busy
# m. Unequal stages idle more, because the slowest stage sets the pace and the others wait for it: 10 layers
# on 4 ranks are [3, 3, 2, 2], a bubble of 0.355 at m = 8 against the formula's 0.273; with a head of 2 on the
# last of 3 stages ([11, 11, 12]), 0.082 at m = 64 against 0.030. There the bubble tends to 1 - 34 / (3 x 12)
# = 0.056, the share of every slot the faster stages wait, not to zero.
#
# The measured bubble is above the prediction because the hand-over is not free: each micro-batch's
# activations go through gloo (serialization, a socket, a copy), and the two processes share a busy 2-core
# CPU. These costs come with every micro-batch, so they do not shrink with m: the measured bubble fell from
# 0.513 to 0.261 as m went from 1 to 4, as the formula says, but its excess over the formula grew from 0.013 to
# 0.061.
#
# With p = 4, 3 / (m + 3) < 0.1 needs m > 27: at least 28 micro-batches. At a fixed global batch that makes each
# micro-batch small: each stage's matmuls run at a lower batch, further from compute-bound, and the per-
# micro-batch transfer and launch costs are paid 28 times.

# %% [markdown] id="c019" tags=["answer-key"]
# ### Answer key
#
# * **The whole model.** None of the three changes the communication: attention still costs one all-reduce of
#   `[B, T, D]` per layer, because every rank still computes whole heads. A fused QKV matrix is a layout:
#   it must be split into Q, K and V *before* sharding (`shard_fused_qkv`; a plain `chunk(p)` of its rows gives
#   rank 0 only query rows), and then each rank holds the same rows as yours. RoPE rotates each head's query
#   and key by the token's position, head by head, so it runs on the rank's own heads unchanged. The cache
#   on rank `r` holds its `K/p` KV heads, `[B, K/p, S, Dh]`: the KV cache is sharded like the weights, which
#   is what lets TP serve longer contexts. More: `shard_model` shards each attention layer by heads: with `H` query heads and `K` KV
#   heads, rank `r` keeps `H / p` query heads and the `K / p` KV heads they read (so `p` must divide `K`,
#   `check_tp_degree` says which `p` work), the output projection row-parallel with one all-reduce, and the
#   MLP as in this lab (gate and up column-parallel, down row-parallel, a second all-reduce): two all-reduces
#   per layer. Q, K and V are one fused matrix, split into Q, K and V *before* sharding (a naive chunk would
#   give rank 0 only query rows). The logits equal the single-process model's up to float32 summation order
#   (the partial sums are added in another order): notebook 11's `tp_check` asserts a max |difference| below
#   1e-4 at TP = 2 (bundled model) and 4 (a random model with 4 KV heads), forward and cached decoding, and
#   the same greedy tokens.
# * **Four processes.** `check_mlp_on_ranks(d=8, f=8, batch=2, seed=1, world_size=4)` passes: each rank
#   keeps 2 of the 8 hidden units (its `w1` shard is `[2, 8]`, its `w2` shard `[8, 2]`) and the ring sends
#   `2 * 3 / 4 = 1.5` times the output's bytes per rank instead of `1` at `p = 2`. `f = 6` fails with the
#   shard functions' `ValueError` (4 does not divide 6) on every rank. The run takes a few seconds longer,
#   all of it starting the four processes: the MLP itself is microseconds. The attention call on 4 ranks,
#   8 query heads and 4 KV heads of dimension 2, gives each rank 2 query heads and the 1 KV head of their
#   group: its `wq` shard is `[4, 8]`, its `wk` and `wv` shards `[2, 8]`, its `wo` shard `[8, 4]`. Each rank
#   all-reduces one `[2, 4, 8]` float32 tensor, 256 bytes, and sends `2 * 3 / 4 * 256 = 384` bytes in a ring
#   (the same output-sized all-reduce as the MLP's, whatever the number of heads).
# * **Replicating KV heads.** At TP = 16 each rank gets 4 query heads, half of one group of 8, so the 8 KV
#   heads are each held by 2 ranks (vLLM's `QKVParallelLinear` does this when the tensor-parallel size
#   exceeds the KV heads). The KV cache per rank is 1 head: `2 * 128 * 2 = 512` bytes per token per layer in
#   bf16, 40 KiB per token over 80 layers, 1/8 of the model's 320 KiB, not the 1/16 that sharding by 16 would
#   give; in all, the 16 ranks hold 640 KiB per token, twice the model's cache. `wk` and `wv` are replicated
#   the same way. The communication does not change: each rank still computes whole heads with their own KV
#   head, and the block ends with the same one all-reduce of `[B, T, D]`.
#
# #### Exercise 5's prediction, the reasoning behind the solution
#
# With stage times `t_s` (layers, plus `head_cost` on the last), micro-batch 0
# leaves the pipeline at `sum(t_s)`; each later one leaves `max(t_s)` after the one before it (the slowest
# stage is busy without a break from the moment micro-batch 0 reaches it, and the stages after it are at
# least as fast), so the makespan is `sum(t_s) + (m - 1) max(t_s)`. The busy rank-time is
# `m sum(t_s)` whatever the schedule, so the bubble is `1 - m sum(t_s) / (p (sum(t_s) + (m - 1) max(t_s)))`.
# Equal stages give back `(p - 1) / (m + p - 1)`. Unequal ones add a bubble that more micro-batches do not
# remove: as `m` grows it tends to `1 - mean(t_s) / max(t_s)`, not to 0. Ten layers on 4 stages (3, 3, 2,
# 2), m = 8: makespan 10 + 7 x 3 = 31, bubble 1 - 80 / 124 = 0.355, not the formula's 0.273; with a head
# of 1.5 layers on the last stage (3, 3, 2, 3.5): 11.5 + 7 x 3.5 = 36, bubble 0.361. 32 layers on 3 stages
# with a head of 2 (11, 11, 12): 0.153 at m = 16 and 0.082 at m = 64, where equal stages would give 0.111
# and 0.030: the 1 - 34/36 = 5.6% of the imbalance stays. Taking the whole run at the slowest pace,
# `(m + p - 1) max(t_s)`, overstates it (0.394 for the ten layers at m = 8). The cell after the tests prints
# these beside the course's timeline.
