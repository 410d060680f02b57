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
"""
from __future__ import annotations

from dataclasses import dataclass

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
