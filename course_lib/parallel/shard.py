"""Tensor-parallel copies of the course's Llama: ours (``shard_model``) and PyTorch's (``parallelize_dtensor``).

Called inside each rank of a process group (see ``launch``), on the same full model on every rank::

    tp = shard_model(model, world_size)            # this rank's shard (a new model; `model` is untouched)
    logits = tp(ids)                                # == model(ids): the same logits on every rank

``shard_model`` replaces each layer's attention by ``ShardedAttention`` (its heads; fused QKV split
before sharding) and each MLP by ``ShardedMLP`` (its F/p columns): two all-reduces per layer. The
embedding, the norms and the LM head stay whole on every rank (replicated; a vocabulary-parallel head
would save memory at the price of an all-gather). The model's forward, KV-cache contract and generate
loop are unchanged: a cache on rank r stores its K/p KV heads.

``parallelize_dtensor`` does the same with the production API, ``torch.distributed.tensor.parallel``:
``ColwiseParallel`` on q/k/v/gate/up, ``RowwiseParallel`` on o/down, on a 1-D device mesh.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import torch.distributed as dist
import torch.nn as nn

from course_lib.validate import integer

from .layers import ShardedAttention, ShardedMLP


def check_tp_degree(cfg, world_size: int) -> None:
    """ValueError unless ``world_size`` divides the query heads, the KV heads and the MLP width of ``cfg``."""
    world_size = integer(world_size, "world_size", low=1)
    for what in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        n = getattr(cfg, what)
        if n % world_size:
            ok = [p for p in range(1, n + 1) if cfg.num_attention_heads % p == 0
                  and cfg.num_key_value_heads % p == 0 and cfg.intermediate_size % p == 0]
            raise ValueError(f"world_size={world_size} must divide {what}={n} of this model (tensor-parallel "
                             f"degrees that work: {ok})")


def tp_degrees(cfg, up_to: int = 64) -> list[int]:
    """The tensor-parallel degrees (<= up_to) this config can be sharded over."""
    return [p for p in range(1, up_to + 1) if cfg.num_attention_heads % p == 0
            and cfg.num_key_value_heads % p == 0 and cfg.intermediate_size % p == 0]


def _rank_and_check(world_size, rank, group):
    if rank is None:
        rank = dist.get_rank(group) if dist.is_initialized() else 0
    if world_size > 1:
        if not dist.is_initialized():
            raise RuntimeError(f"shard_model(world_size={world_size}) runs inside a process group: call it in a "
                               f"worker started by course_lib.parallel.launch (or under torchrun)")
        if dist.get_world_size(group) != world_size:
            raise ValueError(f"world_size={world_size} but the process group has {dist.get_world_size(group)} ranks")
    return rank


def shard_model(model: nn.Module, world_size: int, rank: int | None = None, group=None) -> nn.Module:
    """This rank's tensor-parallel copy of a ``LlamaForCausalLM`` (see the module docstring)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "model") or not hasattr(model.model, "layers"):
        raise TypeError(f"model must be a course_lib LlamaForCausalLM, got {type(model).__name__}")
    check_tp_degree(cfg, world_size)
    rank = _rank_and_check(world_size, rank, group)
    tp = copy.deepcopy(model)
    for layer in tp.model.layers:
        layer.self_attn = ShardedAttention(layer.self_attn, rank, world_size, group)
        layer.mlp = ShardedMLP(layer.mlp, rank, world_size, group)
    tp.tp_rank, tp.tp_world_size = rank, world_size
    return tp.eval()


def parallelize_dtensor(model: nn.Module, world_size: int, device_type: str = "cpu") -> nn.Module:
    """The same split with PyTorch's production API (a copy; ``model`` is untouched): a 1-D DeviceMesh over
    the default group and ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``. Each
    attention module is told its local head counts (as torchtitan does), since the model reshapes by
    ``cfg.num_attention_heads``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    cfg = model.config
    check_tp_degree(cfg, world_size)
    _rank_and_check(world_size, None, None)
    mesh = init_device_mesh(device_type, (world_size,))
    tp = copy.deepcopy(model)
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    for layer in tp.model.layers:
        parallelize_module(layer, mesh, plan)
        a = layer.self_attn
        a.cfg = replace(a.cfg, num_attention_heads=cfg.num_attention_heads // world_size,
                        num_key_value_heads=cfg.num_key_value_heads // world_size, head_dim=cfg.head_dim)
    return tp.eval()
