"""Arithmetic intensity: FLOPs, bytes moved and FLOP/byte of every operation of a decoder layer.

Two ways of counting:

* ``mode="notes"`` reproduces the tables of the lecture notes exactly (``notes_forms``): multi-head
  attention with D x D projections, a 4D MLP with relu, *multiply-adds* as the work, *elements* (not
  bytes) as the traffic, attention per head. Intensities are exact fractions (or sympy expressions when
  you pass symbols). The notes also scale the scores by 1/sqrt(D); that changes no count, only the text.
* ``mode="real"`` (default) counts what a Llama-style model does: 2 FLOPs per multiply-add (2·M·N·K for
  a matmul), bytes for a chosen dtype, GQA K/V projections (num_key_value_heads), a SwiGLU MLP with three
  matrices, attention per head with the real head dim (scale 1/sqrt(head_dim)), KV-cache reads in
  decode, RMSNorm/RoPE/softmax/SiLU/residual adds as elementwise ops, the embedding and the LM head,
  and a batch dimension. Totals per layer and per model.

Every op reads its inputs from memory and writes its output (no fusion): the table is what an
unfused implementation moves. Fusion (FlashAttention, fused norms) removes some of the traffic of the
elementwise and attention rows, never of the weights.

    from course_lib.perf import intensity_table
    t = intensity_table("llama-2-7b", "decode", seq_len=1024, batch=1, dtype="fp16")
    t["q_proj"].intensity          # about 1 FLOP/byte: decode is memory-bound
    print(t.to_text())

Shape letters: B batch, T new tokens (prefill: L, decode: 1), S tokens attended to (prefill: L,
decode: L + 1), D hidden size, H query heads, K key/value heads, Dh head dim, F MLP hidden size,
V vocabulary.
"""
from __future__ import annotations

import numbers

from course_lib.models.config import LlamaConfig, as_config
from course_lib.perf.hardware import bytes_per_element, canonical_dtype
from course_lib.perf.notes_forms import notes_table
from course_lib.perf.ops import ELEMENTWISE_FLOPS, MODES, PHASES, OpCost, OpTable
from course_lib.validate import integer, one_of


# --- the real count ---------------------------------------------------------------------------------
def _real_rows(c: LlamaConfig, phase: str, L: int, B: int, a: float, w: float, kv: float, all_logits: bool):
    D, H, K, Dh, F, V, N = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                            c.intermediate_size, c.vocab_size, c.num_hidden_layers)
    T, S = (L, L) if phase == "prefill" else (1, L + 1)
    BT = B * T
    E = ELEMENTWISE_FLOPS
    rows: list[OpCost] = []

    def mm(name, comp, k_, n_, count=N, scope="layer", m_=BT, shapes=None):
        flops = 2 * m_ * k_ * n_
        nbytes = a * (m_ * k_ + m_ * n_) + w * k_ * n_
        rows.append(OpCost(name, comp, "matmul", flops, nbytes, count, scope, weight_bytes=w * k_ * n_,
                           shapes=shapes or f"[{m_}, {k_}] x [{k_}, {n_}]", m=m_, k=k_, n=n_))

    def ew(name, comp, flops, nbytes, count=N, scope="layer", weight_bytes=0, shapes=""):
        rows.append(OpCost(name, comp, "elementwise", flops, nbytes, count, scope, weight_bytes=weight_bytes,
                           shapes=shapes))

    def norm(name, count=N, scope="layer"):
        ew(name, "RMSNorm(x) * w", E["rmsnorm"] * BT * D, a * 2 * BT * D + w * D, count, scope,
           weight_bytes=w * D, shapes=f"[{BT}, {D}]")

    rows.append(OpCost("embed", "x = E[ids]", "memory", 0, (a + w) * BT * D, 1, "model",
                       weight_bytes=w * BT * D, shapes=f"{BT} rows of [{V}, {D}]"))
    norm("attn_norm")
    mm("q_proj", "Q = x W_Q", D, H * Dh)
    mm("k_proj", "K = x W_K", D, K * Dh)
    mm("v_proj", "V = x W_V", D, K * Dh)
    ew("rope", "RoPE(Q), RoPE(K)", E["rope"] * BT * (H + K) * Dh, a * (2 * BT * (H + K) * Dh + 2 * BT * Dh),
       shapes=f"[{B}, {H}+{K}, {T}, {Dh}]")
    rows.append(OpCost("kv_cache_write", "cache[K, V] <- K, V", "memory", 0, kv * 2 * BT * K * Dh, N, "layer",
                       kv_bytes=kv * 2 * BT * K * Dh, shapes=f"2 x [{B}, {K}, {T}, {Dh}]"))
    kv_read = kv * B * K * S * Dh  # one of K or V, only the K heads (GQA shares them)
    rows.append(OpCost("qk", "scores = Q K^T / sqrt(Dh)", "attention", 2 * B * H * T * S * Dh,
                       a * (B * H * T * Dh + B * H * T * S) + kv_read, N, "layer", kv_bytes=kv_read,
                       shapes=f"{B}x{H} heads: [{T}, {Dh}] x [{Dh}, {S}]"))
    ew("softmax", "P = softmax(scores + mask)", E["softmax"] * B * H * T * S, a * 2 * B * H * T * S,
       shapes=f"[{B}, {H}, {T}, {S}]")
    rows.append(OpCost("pv", "Z = P V", "attention", 2 * B * H * T * S * Dh,
                       a * (B * H * T * S + B * H * T * Dh) + kv_read, N, "layer", kv_bytes=kv_read,
                       shapes=f"{B}x{H} heads: [{T}, {S}] x [{S}, {Dh}]"))
    mm("o_proj", "out = Z W_O", H * Dh, D)
    ew("attn_residual", "x = x + out", E["residual"] * BT * D, a * 3 * BT * D, shapes=f"[{BT}, {D}]")
    norm("mlp_norm")
    mm("gate_proj", "G = x W_gate", D, F)
    mm("up_proj", "U = x W_up", D, F)
    ew("silu_mul", "A = silu(G) * U", E["silu_mul"] * BT * F, a * 3 * BT * F, shapes=f"[{BT}, {F}]")
    mm("down_proj", "y = A W_down", F, D)
    ew("mlp_residual", "x = x + y", E["residual"] * BT * D, a * 3 * BT * D, shapes=f"[{BT}, {D}]")
    norm("final_norm", count=1, scope="model")
    mm("lm_head", "logits = x W_vocab", D, V, count=1, scope="model", m_=BT if all_logits else B)
    return rows


# --- the entry points ------------------------------------------------------------------------------
def intensity_table(model, phase: str, seq_len: int, batch: int = 1, dtype="fp16", *, mode: str = "real",
                    weight_dtype=None, kv_dtype=None, all_logits: bool = True) -> OpTable:
    """Per-operation FLOPs, bytes and FLOP/byte of one forward pass of `phase`.

    model: anything course_lib.models.config.as_config takes: a LlamaConfig, a name ('tiny',
        'llama-2-7b', 'llama-3-8b', ...: preset_names()), a model with a .config, a config.json dict.
    phase: 'prefill' (seq_len prompt tokens at once) or 'decode' (one new token per sequence, with
        seq_len tokens already in the KV cache, so attention reads seq_len + 1 keys and values).
    batch: sequences processed together. dtype: bytes per element of activations (and weights and
        the KV cache unless weight_dtype / kv_dtype say otherwise): 'fp32', 'fp16', 'bf16', 'fp8',
        'int8', 'int4' or a number of bytes.
    mode: 'real' (default) or 'notes' (the lecture notes' table exactly, see notes_forms; uses only
        hidden_size and num_attention_heads, batch must be 1, dtype is ignored: the notes count elements).
    all_logits: the LM head computes logits for every position (what model(ids) does); False counts
        only the last position of each sequence (all that generation needs).

    Attention FLOPs are dense: the causal mask's zeros are computed too (as SDPA's math path and the
    FLOP counters do); a causal kernel such as FlashAttention skips about half of them in prefill.
    """
    one_of(mode, "mode", MODES)
    one_of(phase, "phase", PHASES)
    seq_len, batch = integer(seq_len, "seq_len", low=1), integer(batch, "batch", low=1)
    cfg = as_config(model)
    if mode == "notes":
        if batch != 1:
            raise ValueError(f"batch must be 1 in notes mode (the lecture notes have no batch), got {batch}")
        t = notes_table(phase, seq_len, cfg.hidden_size, cfg.num_attention_heads)
        t.label = cfg.name
        return t
    a = bytes_per_element(dtype)
    w = a if weight_dtype is None else bytes_per_element(weight_dtype, "weight_dtype")
    kv = a if kv_dtype is None else bytes_per_element(kv_dtype, "kv_dtype")
    rows = _real_rows(cfg, phase, seq_len, batch, a, w, kv, all_logits)
    name = f"{dtype} B/elem" if isinstance(dtype, numbers.Real) else canonical_dtype(dtype)
    return OpTable(phase=phase, mode="real", model=cfg, seq_len=seq_len, batch=batch, dtype=name, rows=rows)


def prefill_decode_tables(model, seq_len: int, batch: int = 1, dtype="fp16", **kw) -> tuple[OpTable, OpTable]:
    """(prefill of seq_len tokens, decode of the next token after them)."""
    return (intensity_table(model, "prefill", seq_len, batch, dtype, **kw),
            intensity_table(model, "decode", seq_len, batch, dtype, **kw))



__all__ = ["intensity_table", "prefill_decode_tables"]
