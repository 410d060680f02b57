"""What tensor and pipeline parallelism cost: bytes all-reduced, bytes held per GPU, and time per token.

Units: bytes, seconds, bytes per second. ``bpe`` = bytes per element (2 for fp16/bf16).

* Ring all-reduce of an N-byte tensor over p ranks: each rank sends (and receives) 2 (p - 1) / p * N bytes
  (a reduce-scatter then an all-gather, p - 1 steps each, N/p bytes per step), in 2 (p - 1) steps, each
  paying the link's latency: ``allreduce_time = 2 (p-1) * latency + 2 (p-1)/p * N / bandwidth`` (the
  alpha-beta model; NCCL switches to tree or low-latency protocols for small messages, so the latency
  term is an upper estimate there).
* Megatron tensor parallelism all-reduces the [tokens, D] activations twice per layer (after attention's
  O projection and the MLP's down projection): per token, 2 L all-reduces of D * bpe bytes.
* Per-GPU memory: the layers' weights / (tp * pp); the embedding and LM head whole on each TP rank (on the
  first and last pipeline stage); the KV cache of K / tp heads of L / pp layers.
* Time per decode step (memory-bound, batch small): the bytes each GPU reads / its memory bandwidth, plus
  the all-reduces over the link. ``time_model`` is the same law with a measured single-rank time.
* Expert parallelism (EP): the E experts of a MoE layer live E/p per rank; each token's k assignments
  travel to their experts' ranks (the *dispatch* all-to-all) and the outputs travel back (the *combine*
  all-to-all). An all-to-all of a B-byte buffer per rank sends (p-1)/p * B (the share addressed to the
  rank itself stays), in p-1 pairwise steps. The step waits for the most loaded rank: with the router's
  load per expert, imbalance = max rank load / mean rank load multiplies both the expert compute and the
  all-to-all time (``simulate_ep_dispatch`` moves real buffers and counts them). These count one row per
  (token, expert) assignment, an **upper bound**: a dispatch that sends a token once per destination rank
  (DeepEP's high-throughput kernels: ``get_dispatch_layout`` marks ``is_token_in_rank[token, rank]``) moves
  one row per (token, rank) pair, fewer whenever two of a token's experts share a rank (E/p > 1).
  ``ep_dispatch_rows`` counts both from a routing.
* Context parallelism (CP) by ring attention: each rank keeps N/p tokens' queries, K and V, and passes
  its K, V block to the next rank p-1 times: (p-1)/p * 2 N K Dh bpe bytes per rank per layer. The
  transfer hides behind a block's attention when 4 c^2 H Dh / F >= c 2 K Dh bpe / B + latency (c = N/p
  tokens per block, F FLOP/s, B bytes/s): ``ring_attention_overlap`` gives the smallest such c
  (``simulate_ring_attention`` runs it blockwise and counts the bytes passed).
"""
from __future__ import annotations

from dataclasses import dataclass

import math

import torch

from course_lib.attention.online_softmax import combine_splits
from course_lib.attention.reference import check_qkv
from course_lib.models.config import LlamaConfig, kv_cache_bytes
from course_lib.perf.roofline import DecodeStep
from course_lib.validate import integer, number


def ring_allreduce_bytes(nbytes: float, p: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``nbytes`` over ``p`` ranks: 2(p-1)/p * N."""
    p, nbytes = integer(p, "p", low=1), number(nbytes, "nbytes", 0, finite=False)
    return 2 * (p - 1) / p * nbytes


@dataclass(frozen=True)
class Link:
    """A link between GPUs: nominal bandwidth per direction (bytes/s) and per-message latency (s)."""
    name: str
    bandwidth: float
    latency: float


# Nominal, per direction. NVLink 4 (H100 SXM): 900 GB/s total = 450 GB/s each way; PCIe 4.0 / 5.0 x16:
# 32 / 64 GB/s; InfiniBand NDR: 400 Gb/s = 50 GB/s; Ethernet 100 / 10 Gb/s: 12.5 / 1.25 GB/s. Latencies per
# ring step are orders of magnitude (about a microsecond over NVLink, so an 8-GPU all-reduce of a few KiB
# takes ~20 us, the order NCCL reaches there; ~10 us through PCIe; tens of us across a network), not
# measurements: measure your own with nccl-tests, or with ``workers.tp_timing`` here.
LINKS = {
    "nvlink4": Link("NVLink 4 (H100 SXM)", 450e9, 1.5e-6),
    "pcie5": Link("PCIe 5.0 x16", 64e9, 10e-6),
    "pcie4": Link("PCIe 4.0 x16", 32e9, 10e-6),
    "infiniband-ndr": Link("InfiniBand NDR 400 Gb/s", 50e9, 5e-6),
    "ethernet-100g": Link("Ethernet 100 Gb/s", 12.5e9, 20e-6),
    "ethernet-10g": Link("Ethernet 10 Gb/s", 1.25e9, 50e-6),
}


def get_link(link) -> Link:
    if isinstance(link, Link):
        return link
    if link not in LINKS:
        raise ValueError(f"link must be a Link or one of {sorted(LINKS)}, got {link!r}")
    return LINKS[link]


def allreduce_time(nbytes: float, p: int, link) -> float:
    """Seconds for one ring all-reduce of ``nbytes`` over ``p`` ranks on ``link`` (alpha-beta model)."""
    link = get_link(link)
    if p == 1:
        return 0.0
    return 2 * (p - 1) * link.latency + ring_allreduce_bytes(nbytes, p) / link.bandwidth


def tp_comm_per_token(cfg: LlamaConfig, p: int, bpe: float = 2, tokens: int = 1) -> dict:
    """Tensor-parallel communication for ``tokens`` tokens (a decode step of a batch of that many):
    2 all-reduces per layer of tokens * D * bpe bytes each; bytes each rank sends per layer and in all."""
    p, tokens = integer(p, "p", low=1), integer(tokens, "tokens", low=1)
    msg = tokens * cfg.hidden_size * bpe
    per_layer = 2 * ring_allreduce_bytes(msg, p)
    return {"allreduces_per_layer": 2, "allreduces": 2 * cfg.num_hidden_layers, "message_bytes": msg,
            "sent_bytes_per_layer": per_layer, "sent_bytes": per_layer * cfg.num_hidden_layers}


def layer_parameters(cfg: LlamaConfig) -> dict:
    """Parameters of one decoder layer by part: the shardable matrices and the replicated norms."""
    D, H, K, Dh, F_ = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                       cfg.intermediate_size)
    return {"attention": D * H * Dh + 2 * D * K * Dh + H * Dh * D, "mlp": 3 * D * F_, "norms": 2 * D}


def per_gpu_memory(cfg: LlamaConfig, tp: int = 1, pp: int = 1, context: int = 0, batch: int = 1,
                   bpe: float = 2, kv_bpe: float | None = None) -> dict:
    """Bytes held by the fullest GPU under tensor parallelism ``tp`` and pipeline parallelism ``pp``:
    weights (the stage's layers' matrices / tp, its norms whole, the embedding and LM head whole on the
    first / last stage) and the KV cache of ``batch`` sequences of ``context`` tokens (K / tp heads)."""
    tp, pp = integer(tp, "tp", low=1), integer(pp, "pp", low=1)
    for what in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(cfg, what) % tp:
            raise ValueError(f"tp={tp} must divide {what}={getattr(cfg, what)}")
    if pp > cfg.num_hidden_layers:
        raise ValueError(f"pp={pp} exceeds num_hidden_layers={cfg.num_hidden_layers}")
    kv_bpe = bpe if kv_bpe is None else kv_bpe
    layers = -(-cfg.num_hidden_layers // pp)                               # the fullest stage
    lp = layer_parameters(cfg)
    emb = cfg.vocab_size * cfg.hidden_size
    if pp == 1:      # one GPU holds the embedding, the head (the same matrix when tied) and the final norm
        ends = emb + (0 if cfg.tie_word_embeddings else emb) + cfg.hidden_size
    else:            # the last stage needs the head (a copy of the embedding when tied) and the final norm
        ends = emb + cfg.hidden_size
    weights = (layers * ((lp["attention"] + lp["mlp"]) / tp + lp["norms"]) + ends) * bpe
    kv = kv_cache_bytes(layers, cfg.num_key_value_heads // tp, cfg.head_dim, context, batch, kv_bpe)
    return {"weights": weights, "kv": kv, "total": weights + kv, "layers_per_stage": layers}


def tp_step_time(cfg: LlamaConfig, p: int, link, hbm_bandwidth: float, context: int = 0, batch: int = 1,
                 bpe: float = 2) -> dict:
    """Modelled seconds per decode step at tensor parallelism p, memory-bound: each GPU reads its weights
    and KV (``per_gpu_memory``) at ``hbm_bandwidth`` bytes/s (``course_lib.perf.DecodeStep`` with no compute
    floor: at a small batch decode is far below it), then 2 L all-reduces of [batch, D] over ``link``.
    Returns compute_s, comm_s, total_s."""
    mem = per_gpu_memory(cfg, tp=p, context=context, batch=batch, bpe=bpe)
    # the one decode-step model on this GPU's bytes; no peak given, so no compute floor (FLOPs not modelled)
    compute = DecodeStep(weight_bytes=mem["weights"], kv_bytes=mem["kv"], flops=0.0, bandwidth=hbm_bandwidth,
                         peak=None).time
    comm = tp_comm_per_token(cfg, p, bpe, tokens=batch)
    comm_s = comm["allreduces"] * allreduce_time(comm["message_bytes"], p, link)
    return {"compute_s": compute, "comm_s": comm_s, "total_s": compute + comm_s}


def time_model(t1: float, p: int, allreduces: int, allreduce_s: float, parallel_cores: int | None = None) -> float:
    """Predicted seconds per step at TP=p from a measured single-rank step ``t1``: t1 / p' + allreduces *
    allreduce_s, where p' = min(p, parallel_cores) (ranks beyond the cores share them: no speed-up)."""
    p = integer(p, "p", low=1)
    eff = p if parallel_cores is None else max(1, min(p, parallel_cores))
    return t1 / eff + (allreduces * allreduce_s if p > 1 else 0.0)


def gpt3_175b() -> LlamaConfig:
    """GPT-3 175B's shape in the course's config (96 layers, d=12288, 96 heads, vocab 50257, context
    2048). GPT-3 is not a Llama (GELU MLP of 4d, learned positions, biases): use ``gpt3_parameters``."""
    return LlamaConfig(vocab_size=50257, hidden_size=12288, intermediate_size=4 * 12288, num_hidden_layers=96,
                       num_attention_heads=96, num_key_value_heads=96, max_position_embeddings=2048,
                       tie_word_embeddings=True, name="GPT-3 175B")


def gpt3_parameters(L: int = 96, d: int = 12288, vocab: int = 50257, context: int = 2048) -> int:
    """GPT-3's parameters: per layer 4 d^2 (attention) + 8 d^2 (MLP of 4d) + 13 d (biases, 2 layer norms),
    plus the token and position embeddings and the final norm (the LM head is the tied embedding)."""
    return L * (12 * d * d + 13 * d) + vocab * d + context * d + 2 * d


def notes_example(gpus: int = 16, bpe: float = 2, batch: int = 8, context: int = 2048) -> dict:
    """The notes' "175B parameters on 16 GPUs with tensor parallelism, ~11B each", in bytes: parameters
    per GPU, weight bytes per GPU at ``bpe``, the KV cache per GPU for ``batch`` x ``context`` tokens, and
    the all-reduce traffic and latency per token (TP=16 spans two 8-GPU machines: their link decides)."""
    n = gpt3_parameters()
    d, L = 12288, 96
    kv_total = gpt3_175b().kv_cache_bytes(context, batch, bpe)      # K and V, every layer, every token
    comm = 2 * L                                                   # all-reduces per token
    msg = d * bpe
    return {"parameters": n, "params_per_gpu": n / gpus, "weight_bytes_per_gpu": n * bpe / gpus,
            "weight_bytes_total": n * bpe, "kv_bytes_per_gpu": kv_total / gpus,
            "allreduces_per_token": comm, "sent_bytes_per_token": comm * ring_allreduce_bytes(msg, gpus),
            "comm_s_per_token": {k: comm * allreduce_time(msg, gpus, k) for k in ("nvlink4", "infiniband-ndr",
                                                                                   "ethernet-100g")}}


# --- expert parallelism ------------------------------------------------------------------------------------
def alltoall_bytes(nbytes_per_rank: float, p: int) -> float:
    """Bytes each rank sends (and receives) in an all-to-all of a ``nbytes_per_rank`` buffer split evenly
    over ``p`` destinations: (p-1)/p of it (its own share does not leave the rank)."""
    p = integer(p, "p", low=1)
    nbytes_per_rank = number(nbytes_per_rank, "nbytes_per_rank", 0, finite=False)
    return (p - 1) / p * nbytes_per_rank


def alltoall_time(nbytes_per_rank: float, p: int, link) -> float:
    """Seconds for one all-to-all on ``link`` (alpha-beta, pairwise exchange: p-1 steps, each paying the
    latency, every rank sending (p-1)/p of its buffer at the link's bandwidth)."""
    link = get_link(link)
    sent = alltoall_bytes(nbytes_per_rank, p)
    return 0.0 if p == 1 else (p - 1) * link.latency + sent / link.bandwidth


def _expert_load(load, p: int) -> torch.Tensor:
    """The router's assignments per expert as an int64 tensor [E] with p dividing E (checked)."""
    t = torch.as_tensor(load, device="cpu")                 # counts for a cost model: host arithmetic
    if t.dim() != 1 or t.numel() == 0 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool \
            or bool((t < 0).any()):
        raise ValueError(f"load must be a 1-D sequence of counts >= 0 per expert, got {load!r}")
    if t.numel() % p:
        raise ValueError(f"p={p} must divide the number of experts len(load)={t.numel()} (E/p experts per rank)")
    return t.to(torch.int64)


def rank_loads(load, p: int) -> torch.Tensor:
    """Assignments per rank [p] when rank r holds experts r*E/p ... (r+1)*E/p - 1 (``load``: per expert)."""
    p = integer(p, "p", low=1)
    t = _expert_load(load, p)
    return t.view(p, -1).sum(1)


def load_imbalance(load, p: int) -> float:
    """max rank load / mean rank load: 1 when the router spreads assignments evenly over the ranks, p when
    one rank's experts take all of them. What the slowest rank costs the whole step."""
    r = rank_loads(load, p).double()
    if r.sum() == 0:
        raise ValueError("load holds no assignments: the imbalance of nothing is undefined")
    return float(r.max() / r.mean())


def ep_moe_layer_comm(tokens: int, hidden: int, top_k: int, p: int, bpe: float = 2, load=None,
                      link=None) -> dict:
    """Expert-parallel communication of one MoE layer, each of ``p`` ranks holding ``tokens`` tokens of
    ``hidden`` elements and sending each token to its ``top_k`` experts: a dispatch and a combine
    all-to-all of tokens * top_k * hidden * bpe bytes per rank. ``load`` (assignments per expert, from
    the router) sets the imbalance; the most loaded rank receives imbalance times the mean. With
    ``link``, the seconds of both all-to-alls at the most loaded rank's volume.

    One row per (token, expert) assignment: the upper bound. A dispatch that sends a token once per
    destination rank sends ``ep_dispatch_rows(...)["ratio"]`` of it (1 when every rank holds one expert)."""
    tokens, hidden = integer(tokens, "tokens", low=1), integer(hidden, "hidden", low=1)
    top_k, p = integer(top_k, "top_k", low=1), integer(p, "p", low=1)
    bpe = number(bpe, "bpe", 0, low_open=True)
    buffer = tokens * top_k * hidden * bpe
    imb = 1.0 if load is None else load_imbalance(load, p)
    mean = alltoall_bytes(buffer, p)
    out = {"buffer_bytes": buffer, "alltoalls": 2, "sent_bytes_per_alltoall": mean,
           "sent_bytes_per_layer": 2 * mean, "imbalance": imb, "max_rank_bytes_per_layer": 2 * imb * mean}
    if link is not None:
        out["comm_s"] = 2 * alltoall_time(imb * buffer, p, link)
    return out


def _check_routing(experts, num_experts) -> tuple[int, int, int, int]:
    """(p, T, k, num_experts) of a routing ``experts`` [p, T, k] (expert numbers, p dividing num_experts)."""
    if not isinstance(experts, torch.Tensor) or experts.dim() != 3 or experts.is_floating_point() \
            or experts.is_complex() or experts.dtype == torch.bool:
        raise ValueError(f"experts must be an integer tensor [p, tokens, k], got "
                         f"{getattr(experts, 'shape', type(experts).__name__)}")
    p, T, k = experts.shape
    if p < 1:
        raise ValueError("experts must hold at least one rank (its shape is [p, tokens, k] with p >= 1)")
    num_experts = integer(num_experts, "num_experts", low=p)
    if num_experts % p:
        raise ValueError(f"p={p} must divide num_experts={num_experts}")
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= num_experts):
        raise ValueError(f"experts must be expert numbers in [0, {num_experts})")
    return p, T, k, num_experts


def ep_dispatch_rows(experts: torch.Tensor, num_experts: int) -> dict:
    """Rows each rank sends in one MoE layer's dispatch all-to-all, counted two ways from a routing:
    ``experts`` [p, T, k] holds the expert numbers chosen for the T tokens of each of p ranks, rank r
    holding experts r*E/p ... (r+1)*E/p - 1.

    * ``per_assignment`` [p]: one row per (token, expert) assignment whose expert lives on another rank,
      what ``ep_moe_layer_comm`` and ``simulate_ep_dispatch`` count: the upper bound;
    * ``per_rank`` [p]: one row per (token, destination rank) pair, destination another rank: what a
      dispatch that sends a token once to each rank holding any of its experts moves (DeepEP's
      high-throughput dispatch, whose layout is ``is_token_in_rank[token, rank]``); the receiver hands the
      row to each of its experts the token chose, and the combine returns one row per pair the same way;
    * ``ratio`` = sum(per_rank) / sum(per_assignment) (1.0 when nothing leaves a rank): the share of the
      upper bound's bytes a deduplicating dispatch sends, 1 exactly when no two of a token's experts share
      a rank (always so with one expert per rank and distinct experts per token).
    Multiply by hidden * bpe for bytes. Host arithmetic on the routing; any device."""
    p, T, k, num_experts = _check_routing(experts, num_experts)
    per = num_experts // p
    dest = (experts // per).to(torch.long)                                     # [p, T, k] rank of each choice
    src = torch.arange(p, device=dest.device).view(p, 1, 1)
    per_assignment = (dest != src).sum(dim=(1, 2))                             # [p]
    hit = torch.zeros(p, T, p, dtype=torch.bool, device=dest.device)
    hit.scatter_(2, dest, True)                                                # [p, T, p] token t goes to rank r
    hit[torch.arange(p, device=dest.device), :, torch.arange(p, device=dest.device)] = False   # own rank stays
    per_rank = hit.sum(dim=(1, 2))                                             # [p]
    a, r = int(per_assignment.sum()), int(per_rank.sum())
    return {"per_assignment": per_assignment.tolist(), "per_rank": per_rank.tolist(),
            "ratio": r / a if a else 1.0}


def simulate_ep_dispatch(experts: torch.Tensor, num_experts: int, hidden: int = 8,
                         dtype: torch.dtype = torch.float16) -> dict:
    """Simulate the dispatch all-to-all: ``experts`` [p, T, k] are the expert numbers chosen for the T
    tokens of each of p ranks; rank r holds experts r*E/p ... . Every rank builds one buffer per
    destination rank (its tokens' rows, once per assignment to an expert there), sends the buffers
    addressed to other ranks, and the receivers check that they got their assignments' rows. Returns
    sent and received bytes per rank (lists) and the assignments per rank; the combine all-to-all sends
    the same buffers back, so it moves the same bytes in the other direction."""
    p, T, k, num_experts = _check_routing(experts, num_experts)
    per = num_experts // p
    gen = torch.Generator(device=experts.device).manual_seed(0)
    # each rank's tokens
    x = torch.randn(p, T, integer(hidden, "hidden", low=1), generator=gen, device=experts.device).to(dtype)
    sent, received = [0] * p, [0] * p
    inbox = [[] for _ in range(p)]
    for src in range(p):
        dest = experts[src] // per                                           # [T, k] rank of each assignment
        for dst in range(p):
            tok = (dest == dst).nonzero()[:, 0]                              # token of each assignment there
            buf = x[src, tok]                                                # the rows, one per assignment
            if dst != src:                                                   # a local assignment stays put
                sent[src] += buf.numel() * buf.element_size()
                received[dst] += buf.numel() * buf.element_size()
            inbox[dst].append(buf)
    for dst in range(p):                                                     # the receivers hold their rows
        want = torch.cat([x[src, (experts[src] // per == dst).nonzero()[:, 0]] for src in range(p)])
        if not torch.equal(torch.cat(inbox[dst]), want):
            raise AssertionError(f"rank {dst} did not receive its assignments' rows")
    load = torch.bincount(experts.reshape(-1), minlength=num_experts)
    return {"sent": sent, "received": received, "rank_load": load.view(p, per).sum(1).tolist(),
            "bytes_per_row": hidden * x.element_size()}


# --- context parallelism: ring attention ------------------------------------------------------------------
def ring_attention_comm(seq_len: int, kv_heads: int, head_dim: int, p: int, bpe: float = 2,
                        layers: int = 1) -> dict:
    """Ring attention over ``p`` ranks, each holding seq_len/p tokens: per layer each rank passes a K,V
    block of seq_len/p * 2 * kv_heads * head_dim * bpe bytes to its neighbour p-1 times, i.e.
    (p-1)/p * 2 * seq_len * kv_heads * head_dim * bpe bytes per rank per layer."""
    seq_len, p = integer(seq_len, "seq_len", low=1), integer(p, "p", low=1)
    kv_heads, head_dim = integer(kv_heads, "kv_heads", low=1), integer(head_dim, "head_dim", low=1)
    layers, bpe = integer(layers, "layers", low=1), number(bpe, "bpe", 0, low_open=True)
    if seq_len % p:
        raise ValueError(f"p={p} must divide seq_len={seq_len} (equal blocks of seq_len/p tokens)")
    block = seq_len // p
    block_bytes = 2 * block * kv_heads * head_dim * bpe
    per_layer = (p - 1) * block_bytes
    return {"block_tokens": block, "block_bytes": block_bytes, "steps": p - 1,
            "sent_bytes_per_layer": per_layer, "sent_bytes": per_layer * layers}


def ring_attention_overlap(heads: int, kv_heads: int, head_dim: int, link, flops: float, bpe: float = 2,
                           block_tokens: int | None = None) -> dict:
    """When a ring step's transfer hides behind its attention: a block of c tokens costs 4 c^2 heads
    head_dim FLOPs (Q K^T and P V against one K,V block, 2 FLOPs a multiply-add) at ``flops`` FLOP/s, and
    its K,V (2 c kv_heads head_dim bpe bytes) take latency + bytes / bandwidth on ``link``. Returns the
    smallest c with compute >= transfer (``min_block_tokens``, the root of the quadratic, rounded up) and
    the bandwidth-only bound c >= kv_heads * bpe * flops / (2 heads bandwidth) (= flops / bandwidth for
    multi-head attention in 2-byte elements). Causal masking halves the average block's work: a rank then
    needs about twice the block to hide its transfers. With ``block_tokens``: that block's compute and
    transfer seconds and whether the transfer hides (``overlaps``)."""
    link = get_link(link)
    heads, kv_heads = integer(heads, "heads", low=1), integer(kv_heads, "kv_heads", low=1)
    head_dim = integer(head_dim, "head_dim", low=1)
    flops, bpe = number(flops, "flops", 0, low_open=True), number(bpe, "bpe", 0, low_open=True)
    a = 4 * heads * head_dim / flops                      # compute seconds = a c^2
    b = 2 * kv_heads * head_dim * bpe / link.bandwidth    # transfer seconds = b c + latency
    c = (b + math.sqrt(b * b + 4 * a * link.latency)) / (2 * a)
    out = {"min_block_tokens": math.ceil(c), "bandwidth_bound_tokens": b / a}
    if block_tokens is not None:
        n = integer(block_tokens, "block_tokens", low=1)
        out.update(compute_s=a * n * n, transfer_s=b * n + link.latency, overlaps=a * n * n >= b * n + link.latency)
    return out


def simulate_ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: int, causal: bool = False,
                            scale: float | None = None):
    """Ring attention with ``p`` simulated ranks in one process. Rank r holds the r-th block of N/p
    queries and keys/values (q [B, H, N, Dh], k/v [B, K, N, Dh]); at step s it attends to the K,V block
    it holds (that of rank r - s), keeps the block's softmax partials (max, sum, weighted values), then
    passes the block to rank r + 1 (not after the last step). The partials merge by the log-sum-exp
    reduction (``combine_splits``), so the result equals full attention. Returns (out [B, H, N, Dh] in q's
    dtype, bytes sent per rank)."""
    B, H, K, T, S, Dh = check_qkv(q, k, v)
    p = integer(p, "p", low=1)
    if T != S or T % p:
        raise ValueError(f"q and k must have the same length divisible by p={p}, got {T} and {S}")
    c, G = T // p, H // K
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    held = [(k[:, :, r * c:(r + 1) * c], v[:, :, r * c:(r + 1) * c], r) for r in range(p)]   # (K, V, owner)
    parts = [([], [], []) for _ in range(p)]                                  # per rank: m, l, acc per step
    sent = [0] * p
    for step in range(p):
        for r in range(p):
            kb, vb, owner = held[r]
            qr = q[:, :, r * c:(r + 1) * c].float()
            kr = kb.float().repeat_interleave(G, dim=1)
            s = (qr @ kr.transpose(-1, -2)) * scale                                  # [B, H, c, c]
            if causal:                                      # global positions: query r*c+i, key owner*c+j
                qi = torch.arange(r * c, (r + 1) * c, device=s.device)[:, None]
                kj = torch.arange(owner * c, (owner + 1) * c, device=s.device)[None, :]
                s = s.masked_fill(kj > qi, float("-inf"))
            m = s.max(-1).values                                                      # -inf: all masked
            w = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m)[..., None])
            parts[r][0].append(m)
            parts[r][1].append(w.sum(-1))
            parts[r][2].append(w @ vb.float().repeat_interleave(G, dim=1))
        if step < p - 1:                                   # pass every block one rank along the ring
            for r in range(p):
                sent[r] += held[r][0].numel() * held[r][0].element_size() + \
                    held[r][1].numel() * held[r][1].element_size()
            held = [held[(r - 1) % p] for r in range(p)]
    out = torch.cat([combine_splits(torch.stack(m, -1), torch.stack(l, -1), torch.stack(a, -2))
                     for m, l, a in parts], dim=2)
    return out.to(q.dtype), sent
