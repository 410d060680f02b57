"""Structured pruning: remove whole attention heads, MLP neurons and decoder layers, so the model really
gets smaller (a smaller ``LlamaConfig``: dense matmuls of smaller shapes, no sparse kernel needed).

    unit_importance(model, method="weight"|"taylor", ids=None)   scores of every head, neuron and layer
    make_plan(model, scores, heads_per_group=, kv_groups=, neurons=, layers=)   what to keep, the same
                                                  count in every layer (a LlamaConfig is uniform)
    structured_masks(model, plan)                 the plan as weight masks (model stays its size)
    shrink(model, plan)                           a new, smaller model; its logits equal the masked model's
    structured_prune(model, sparsity, ...)        importance -> plan -> shrink at a given share of the
                                                  decoder's projection weights removed

Grouped-query attention: query head h reads KV head h // G. A plan keeps, in every surviving KV group, the
same number of query heads (so the smaller model is GQA again, with G' = heads kept per group) and may drop
whole KV groups (their K and V projections go too). Removing a head is exact once its o_proj columns are
gone: the head writes to the residual stream only through them. Likewise a neuron through its down_proj
column, and a layer through its o_proj and down_proj: masking those gives the same logits as removing.

Importance: "weight" is the norm of what a unit writes (its o_proj or down_proj columns; a layer's two
output projections); "taylor" is the first-order estimate of the loss change if the unit were zeroed,
|sum over tokens of activation . gradient| (Molchanov et al., 2019), from a backward pass on `ids`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch

from course_lib.models.llama import LlamaForCausalLM, causal_lm_loss
from course_lib.validate import integer, probability

from .masks import apply_masks


@dataclass
class StructuredPlan:
    """What survives: per original layer, the query heads and MLP neurons kept; the layers kept."""
    heads: list[list[int]]      # [L][kept query heads], sorted
    neurons: list[list[int]]    # [L][kept neurons], sorted
    layers: list[int]           # kept layer indices, sorted


def _layers(model):
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not hasattr(model, "config"):
        raise TypeError(f"model must be a course Llama model, got {type(model).__name__}")
    return layers


@torch.no_grad()
def _weight_scores(model):
    cfg = model.config
    H, Dh = cfg.num_attention_heads, cfg.head_dim
    heads, neurons, layers = [], [], []
    for layer in _layers(model):
        wo = layer.self_attn.o_proj.weight.float()                        # [D, H*Dh]
        wd = layer.mlp.down_proj.weight.float()                           # [D, F]
        heads.append(wo.reshape(wo.shape[0], H, Dh).pow(2).sum((0, 2)).sqrt())   # [H]
        neurons.append(wd.norm(dim=0))                                    # [F]
        layers.append(wo.norm() + wd.norm())
    return {"heads": torch.stack(heads), "neurons": torch.stack(neurons), "layers": torch.stack(layers)}


def _taylor_scores(model, ids: torch.Tensor, batch_size: int):
    cfg = model.config
    H, Dh = cfg.num_attention_heads, cfg.head_dim
    L = cfg.num_hidden_layers
    dev = model.device
    heads = torch.zeros(L, H, device=dev)
    neurons = torch.zeros(L, cfg.intermediate_size, device=dev)
    layers = torch.zeros(L, device=dev)
    handles = []

    def on_input(store, i, split_heads):
        def pre(module, args):
            a = args[0]                                                   # [B, T, H*Dh] or [B, T, F]
            if a.requires_grad:
                def grad_hook(g):
                    ag = (a.detach() * g).float().sum((0, 1))             # [H*Dh] or [F]
                    store[i] += (ag.reshape(H, Dh).sum(-1) if split_heads else ag).abs()
                a.register_hook(grad_hook)
        return pre

    def on_layer(i):
        def fwd(module, args, out):
            contribution = (out - args[0]).detach()                       # what the layer adds [B, T, D]
            if out.requires_grad:
                out.register_hook(lambda g: layers.__setitem__(i, layers[i] + (contribution * g).float().sum().abs()))
        return fwd

    for i, layer in enumerate(_layers(model)):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(on_input(heads, i, True)))
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(on_input(neurons, i, False)))
        handles.append(layer.register_forward_hook(on_layer(i)))
    try:
        with torch.enable_grad():
            for s in range(0, ids.shape[0], batch_size):
                x = ids[s:s + batch_size].to(dev)                          # [B, T+1]
                loss = causal_lm_loss(model(x[:, :-1]), x[:, 1:])
                grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
                del grads                                                 # the hooks took what they need
    finally:
        for h in handles:
            h.remove()
    return {"heads": heads, "neurons": neurons, "layers": layers}


def unit_importance(model, method: str = "weight", ids: torch.Tensor | None = None, batch_size: int = 8) -> dict:
    """{'heads': [L, H], 'neurons': [L, F], 'layers': [L]} importance scores (higher = keep).

    method="taylor" needs ids [N, T+1] (token windows; each predicts its next tokens)."""
    if method == "weight":
        return _weight_scores(model)
    if method == "taylor":
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 2:
            raise ValueError("ids must be token windows [N, T+1] (T >= 1) for method='taylor'")
        return _taylor_scores(model, ids, batch_size)
    raise ValueError(f"method must be 'weight' or 'taylor', got {method!r}")


def make_plan(model, scores: dict, heads_per_group: int | None = None, kv_groups: int | None = None,
              neurons: int | None = None, layers: int | None = None) -> StructuredPlan:
    """Keep, in every layer, the `kv_groups` best KV groups (by their heads' summed score), in each the
    `heads_per_group` best query heads, the `neurons` best MLP neurons; and the `layers` best layers.
    None keeps all of that kind."""
    cfg = model.config
    L, H, K, F_ = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    G = H // K
    hpg = integer(G if heads_per_group is None else heads_per_group, "heads_per_group", 1, G)
    kg = integer(K if kv_groups is None else kv_groups, "kv_groups", 1, K)
    nf = integer(F_ if neurons is None else neurons, "neurons", 1, F_)
    nl = integer(L if layers is None else layers, "layers", 1, L)
    hs = scores["heads"].float().cpu().reshape(L, K, G)                  # [L, K, G]
    head_keep, neuron_keep = [], []
    for i in range(L):
        groups = hs[i].sum(-1).topk(kg).indices.sort().values.tolist()
        kept = []
        for g in groups:
            kept += [g * G + j for j in hs[i, g].topk(hpg).indices.sort().values.tolist()]
        head_keep.append(kept)
        neuron_keep.append(scores["neurons"][i].float().cpu().topk(nf).indices.sort().values.tolist())
    layer_keep = scores["layers"].float().cpu().topk(nl).indices.sort().values.tolist()
    return StructuredPlan(head_keep, neuron_keep, layer_keep)


def _check_plan(cfg, plan: StructuredPlan):
    """(heads per group, groups, neurons) of a plan, after checking it is uniform across kept layers."""
    if not isinstance(plan, StructuredPlan):
        raise TypeError(f"plan must be a StructuredPlan, got {type(plan).__name__}")
    L, H, K = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    G = H // K
    if len(plan.heads) != L or len(plan.neurons) != L:
        raise ValueError(f"plan.heads and plan.neurons must have one entry per layer ({L})")
    if not plan.layers or sorted(set(plan.layers)) != list(plan.layers) or not all(0 <= i < L for i in plan.layers):
        raise ValueError(f"plan.layers must be sorted, distinct layer indices in [0, {L}), got {plan.layers}")
    shapes = set()
    for i in plan.layers:
        heads, neurons = plan.heads[i], plan.neurons[i]
        if not heads or sorted(set(heads)) != list(heads) or not all(0 <= h < H for h in heads):
            raise ValueError(f"plan.heads[{i}] must be sorted, distinct head indices in [0, {H}), got {heads}")
        in_range = all(0 <= j < cfg.intermediate_size for j in neurons)
        if not neurons or sorted(set(neurons)) != list(neurons) or not in_range:
            raise ValueError(f"plan.neurons[{i}] must be sorted, distinct neuron indices in [0, "
                             f"{cfg.intermediate_size})")
        per_group = {}
        for h in heads:
            per_group[h // G] = per_group.get(h // G, 0) + 1
        if len(set(per_group.values())) != 1:
            raise ValueError(f"plan.heads[{i}]: every kept KV group must keep the same number of query heads "
                             f"(GQA), got {per_group}")
        shapes.add((next(iter(per_group.values())), len(per_group), len(neurons)))
    if len(shapes) != 1:
        raise ValueError(f"every kept layer must keep the same number of heads per group, groups and neurons "
                         f"(one LlamaConfig), got {sorted(shapes)}")
    return shapes.pop()


def structured_masks(model, plan: StructuredPlan) -> dict[str, torch.Tensor]:
    """The plan as masks on o_proj (dropped heads' columns; all of a dropped layer) and down_proj (dropped
    neurons' columns; all of a dropped layer). ``apply_masks(model, structured_masks(model, plan))``."""
    cfg = model.config
    _check_plan(cfg, plan)
    Dh, dev = cfg.head_dim, model.device
    out = {}
    for i, layer in enumerate(_layers(model)):
        wo, wd = layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight
        mo = torch.zeros(wo.shape, dtype=torch.bool, device=dev)
        md = torch.zeros(wd.shape, dtype=torch.bool, device=dev)
        if i in plan.layers:
            for h in plan.heads[i]:
                mo[:, h * Dh:(h + 1) * Dh] = True
            md[:, torch.tensor(plan.neurons[i], device=dev)] = True
        out[f"model.layers.{i}.self_attn.o_proj"] = mo
        out[f"model.layers.{i}.mlp.down_proj"] = md
    return out


@torch.no_grad()
def shrink(model, plan: StructuredPlan) -> LlamaForCausalLM:
    """A new model with only what `plan` keeps: a smaller LlamaConfig (layers, heads, KV heads, MLP size;
    head_dim stated explicitly), weights copied. Its logits equal those of the masked model."""
    cfg = model.config
    hpg, groups, nf = _check_plan(cfg, plan)
    H, K, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    G = H // K
    new_cfg = replace(cfg, num_hidden_layers=len(plan.layers), num_attention_heads=hpg * groups,
                      num_key_value_heads=groups, head_dim=Dh, intermediate_size=nf)
    dev = model.device
    with torch.device("meta"):
        small = LlamaForCausalLM(new_cfg)
    small = small.to_empty(device=dev).to(model.dtype)
    small.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight)
    small.model.norm.weight.copy_(model.model.norm.weight)
    if cfg.tie_word_embeddings:
        small.lm_head.weight = small.model.embed_tokens.weight
    else:
        small.lm_head.weight.copy_(model.lm_head.weight)
    for new_i, i in enumerate(plan.layers):
        src, dst = model.model.layers[i], small.model.layers[new_i]
        heads = torch.tensor(plan.heads[i], device=dev)
        kv = torch.tensor(sorted({h // G for h in plan.heads[i]}), device=dev)
        rows = lambda idx: (idx[:, None] * Dh + torch.arange(Dh, device=dev)).reshape(-1)   # noqa: E731
        a, b = src.self_attn, dst.self_attn
        b.q_proj.weight.copy_(a.q_proj.weight[rows(heads)])               # [H'*Dh, D]
        b.k_proj.weight.copy_(a.k_proj.weight[rows(kv)])                  # [K'*Dh, D]
        b.v_proj.weight.copy_(a.v_proj.weight[rows(kv)])
        b.o_proj.weight.copy_(a.o_proj.weight[:, rows(heads)])            # [D, H'*Dh]
        nidx = torch.tensor(plan.neurons[i], device=dev)
        dst.mlp.gate_proj.weight.copy_(src.mlp.gate_proj.weight[nidx])    # [F', D]
        dst.mlp.up_proj.weight.copy_(src.mlp.up_proj.weight[nidx])
        dst.mlp.down_proj.weight.copy_(src.mlp.down_proj.weight[:, nidx])  # [D, F']
        dst.input_layernorm.weight.copy_(src.input_layernorm.weight)
        dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)
    return small.train(model.training)


def masked_copy(model, plan: StructuredPlan):
    """A deep copy of `model` holding the plan's masks (same size, pruned units zeroed)."""
    return apply_masks(copy.deepcopy(model), structured_masks(model, plan))


def structured_prune(model, sparsity: float, method: str = "weight", ids: torch.Tensor | None = None,
                     drop_groups: bool = False) -> LlamaForCausalLM:
    """A smaller model with about `sparsity` of each layer's query heads (or, with drop_groups, KV groups)
    and MLP neurons removed, the least important by `method`; at least one of each is kept."""
    sparsity = probability(sparsity, "sparsity", one=False)
    cfg = model.config
    G = cfg.num_attention_heads // cfg.num_key_value_heads
    keep = lambda n: max(1, round(n * (1 - sparsity)))                     # noqa: E731
    scores = unit_importance(model, method, ids)
    if drop_groups:
        plan = make_plan(model, scores, kv_groups=keep(cfg.num_key_value_heads), neurons=keep(cfg.intermediate_size))
    else:
        plan = make_plan(model, scores, heads_per_group=keep(G), neurons=keep(cfg.intermediate_size))
    return shrink(model, plan)


def projection_params(cfg) -> int:
    """Weights of the decoder layers' seven projections (what pruning removes) for a LlamaConfig."""
    D, H, K, Dh, F_ = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                       cfg.intermediate_size)
    return cfg.num_hidden_layers * (2 * D * H * Dh + 2 * D * K * Dh + 3 * D * F_)
