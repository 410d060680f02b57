"""Model calls, caches and the compiled decode step: what the loop runs a model through."""
from __future__ import annotations

import torch

from course_lib.kvcache import ContiguousCache, KVCache, StaticCache


def model_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of a course model (returns a tensor) or a Hugging Face model (returns .logits).

    Hugging Face models are called with use_cache=False: this is the recompute-everything baseline.
    """
    if hasattr(model, "generation_config"):  # a transformers PreTrainedModel
        out = model(input_ids=input_ids, use_cache=False)
    else:
        out = model(input_ids)
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}; expected logits or an object with .logits")


def context_length(model) -> int | None:
    """The model's context window (config.max_position_embeddings), or None if it does not say."""
    cfg = getattr(model, "config", None)
    n = getattr(cfg, "max_position_embeddings", None)
    return int(n) if n is not None else None


def model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def make_cache(model, cache, compile, batch: int, span: int):
    """The cache generate decodes through: None (recompute), a fresh one by name, or the caller's."""
    if hasattr(model, "generation_config") and (cache is not None or compile):
        raise ValueError("cache= and compile= need a course model (course_lib.models); a transformers model "
                         "brings its own cache: use model.generate")
    if compile and cache is None:
        cache = "static"
    if cache is None or isinstance(cache, KVCache):
        if compile and not isinstance(cache, StaticCache):
            raise ValueError(f"compile=True needs a StaticCache (fixed shapes), got {type(cache).__name__}")
        if cache is not None and cache.get_seq_length() != 0:
            raise ValueError("cache must be empty: generate prefills the prompt into it")
        return cache
    if cache == "contiguous":
        return ContiguousCache()
    if cache == "static":
        # Sized to the request rounded up to 256 tokens (capped at the context): a compiled step is
        # reused by every request in the same size bucket, and attention reads few unused slots.
        ctx = model.config.max_position_embeddings
        return StaticCache.for_model(model, batch, min(ctx, -(-span // 256) * 256))
    raise ValueError(f"cache must be None, 'contiguous', 'static' or an empty KVCache, got {cache!r}")


def decode_step(model, compile: bool | str = True):
    """``model`` itself, or its forward compiled for one-token steps through a ``StaticCache``.

    compile=True: ``torch.compile(fullgraph=True)``, with CUDA graphs (mode "reduce-overhead") on a
    GPU, where a step of a small model is launch-bound; inductor's C++ code on a CPU. A string names
    another torch.compile backend ("eager" traces the graph without generating code: a cheap check that
    the step has no graph break). Compiled once per model and setting; a new cache size compiles again.
    """
    if not compile:
        return model
    backend = "inductor" if compile is True else str(compile)
    mode = "reduce-overhead" if backend == "inductor" and model.device.type == "cuda" else None
    steps = model.__dict__.setdefault("_compiled_decode_steps", {})
    if (backend, mode) not in steps:
        steps[(backend, mode)] = torch.compile(model.forward, backend=backend, mode=mode, fullgraph=True,
                                               dynamic=False)
    return steps[(backend, mode)]


def forward_through(fn, ids: torch.Tensor, cache: KVCache, pad: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, T, V] of `ids` [B, T] through `cache`, with the cache's mask when it has one (a sliding
    window's banded prefill); None means the model's causal mask, and the call stays the plain one.
    Left-padded rows (pad [B] > 0) get their own positions (from 0 at their first real token) and a mask
    that hides the pads (a pad query sees itself only, which keeps its softmax finite)."""
    if pad is not None:
        past, T = cache.get_seq_length(), ids.shape[1]
        q = torch.arange(past, past + T, device=ids.device)[None, :, None]           # [1, T, 1] query index
        k = torch.arange(past + T, device=ids.device)[None, None, :]                  # [1, 1, S] key index
        mask = ((k <= q) & (k >= pad[:, None, None])) | (k == q)                      # [B, T, S]
        positions = (q[..., 0] - pad[:, None]).clamp(min=0)                           # [B, T]
        return fn(ids, cache=cache, positions=positions, attn_mask=mask[:, None])
    mask = cache.attn_mask(ids.shape[1], device=ids.device)
    if mask is None:
        return fn(ids, cache=cache)
    return fn(ids, cache=cache, attn_mask=mask)
