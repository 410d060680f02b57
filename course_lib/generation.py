"""Sampling and the plain generate loop.

Sampling turns the logits of the last position into the next token, in small composable steps
(the order Hugging Face uses too: temperature, then top-k, then top-p):

    apply_temperature(logits, t)   logits / t; t < 1 sharpens, t > 1 flattens
    top_k_filter(logits, k)        keep the k largest logits (ties with the k-th kept), others -> -inf
    top_p_filter(logits, p)        keep the smallest set of most likely tokens whose probability reaches p
                                   (the token that crosses p is kept; the most likely token always is)
    sampling_probs(logits, ...)    the distribution `sample` draws from (one-hot at the argmax for t = 0)
    sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None)
                                   temperature 0 means greedy (argmax, no randomness)

``generate(model, input_ids, max_new_tokens, ...)`` is the loop: by default every step runs the model on
the whole sequence so far (no KV cache), takes the last position's logits, samples, appends, and records
when each token was ready. ``cache=`` (Module 05) prefills once and feeds one token per step;
``compile=True`` (Module 12) runs that step compiled through a static cache. It returns the new tokens
and a ``Trace`` from which ``course_lib.perf.metrics`` computes TTFT, TPOT, tokens/s.

Shapes: logits [..., V] (any leading batch dims); sampled tokens [...].
"""
from __future__ import annotations

import math
import numbers
import time
from typing import Callable, NamedTuple

import torch

from course_lib.kvcache import ContiguousCache, KVCache, StaticCache
from course_lib.perf.metrics import TokenEvent, Trace

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter", "sampling_probs", "sample", "greedy",
           "generate", "decode_step", "GenerateOutput", "TokenEvent", "Trace", "model_logits", "context_length"]


# --------------------------------------------------------------------------------------------------
# Argument checks (shared by the sampling functions and generate)
# --------------------------------------------------------------------------------------------------
def _check_logits(logits):
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        got = type(logits).__name__ + (f" of {logits.dtype}" if isinstance(logits, torch.Tensor) else "")
        raise TypeError(f"logits must be a floating-point torch.Tensor of shape [..., vocab], got {got}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last (vocabulary) dimension, got shape {tuple(logits.shape)}")


def _check_temperature(temperature):
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or math.isnan(temperature) \
            or math.isinf(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")


def _check_top_k(k):
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k <= 0:
        raise ValueError(f"top_k must be a positive integer (or None for no top-k), got {k!r}")


def _check_top_p(p):
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or math.isnan(p) or not 0 < p <= 1:
        raise ValueError(f"top_p must be a number in (0, 1] (or None for no top-p), got {p!r}")


# --------------------------------------------------------------------------------------------------
# Sampling, step by step
# --------------------------------------------------------------------------------------------------
def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature (temperature > 0). Temperature 0 has no distribution: it is greedy,
    which ``sample``/``sampling_probs`` handle; here it is an error."""
    _check_logits(logits)
    _check_temperature(temperature)
    if temperature == 0:
        raise ValueError("temperature must be > 0 to rescale logits (temperature 0 means greedy: "
                         "use sample(..., temperature=0) or greedy(logits))")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the others to -inf.

    Tokens tied with the k-th largest logit are kept as well (so a row may keep more than k), as in
    Hugging Face's TopKLogitsWarper. k >= vocab keeps everything.
    """
    _check_logits(logits)
    _check_top_k(k)
    k = min(int(k), logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [..., 1] the k-th largest value
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose total probability reaches p;
    set the others to -inf.

    Sorted by probability (descending), token i is kept when the probability of the tokens before it
    is still below p, so the token that crosses p is kept, and the most likely token always is.
    p = 1 keeps everything. Ties are broken by the sort (stable: lower index first).
    """
    _check_logits(logits)
    _check_top_p(p)
    if p >= 1:
        return logits.clone()
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # [..., V]
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more likely tokens
    remove_sorted = before >= p
    remove_sorted[..., 0] = False  # the most likely token is always kept
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)  # back to vocab order
    return logits.masked_fill(remove, float("-inf"))


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary (the first index among equal maxima). [..., V] -> [...]"""
    _check_logits(logits)
    return torch.argmax(logits, dim=-1)


def sampling_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """The probabilities ``sample`` draws from, [..., V] in float32: softmax of the logits after
    temperature, then top-k, then top-p. For temperature 0, a one-hot at the argmax."""
    _check_logits(logits)
    _check_temperature(temperature)
    if top_k is not None:
        _check_top_k(top_k)
    if top_p is not None:
        _check_top_p(top_p)
    if temperature == 0:
        idx = greedy(logits)
        return torch.zeros_like(logits, dtype=torch.float32).scatter(-1, idx[..., None], 1.0)
    x = apply_temperature(logits.float(), temperature)
    if top_k is not None:
        x = top_k_filter(x, top_k)
    if top_p is not None:
        x = top_p_filter(x, top_p)
    return torch.softmax(x, dim=-1)


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row: [..., V] -> [...] (int64).

    temperature 0 is greedy (deterministic, the generator is not used). Pass a seeded
    ``torch.Generator`` (on the logits' device) for reproducible draws.
    """
    probs = sampling_probs(logits, temperature, top_k, top_p)
    if temperature == 0:
        return greedy(logits)
    flat = probs.reshape(-1, probs.shape[-1])  # [N, V]
    idx = torch.multinomial(flat, 1, generator=generator)  # [N, 1]
    return idx.reshape(probs.shape[:-1])


# --------------------------------------------------------------------------------------------------
# The generate loop (no KV cache)
# --------------------------------------------------------------------------------------------------
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


def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _prompt_tensor(input_ids, why_one: str = "generate runs one request (batch size 1)",
                   batch_hint: str = "Module 09 batches requests") -> torch.Tensor:
    """One prompt as an int64 tensor [T], from a list of ints or an integer tensor [T] / [1, T]."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        ids = input_ids
    elif isinstance(input_ids, (list, tuple)):
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in input_ids):
            raise TypeError("input_ids must be a list of int token ids or an integer tensor")
        ids = torch.tensor([int(t) for t in input_ids], dtype=torch.long, device="cpu")
    else:
        raise TypeError(f"input_ids must be a list of token ids or a tensor [T] / [1, T], "
                        f"got {type(input_ids).__name__}")
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"input_ids: {why_one}; got batch size {ids.shape[0]} ({batch_hint})")
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"input_ids must have shape [T] or [1, T], got {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token "
                         "(e.g. the BOS/EOS token as a start-of-text marker)")
    return ids.long()


class GenerateOutput(NamedTuple):
    """What ``generate`` returns: unpack as ``tokens, trace = generate(...)``.

    tokens: the new tokens only, int64 [n] on the CPU (the prompt is not repeated).
    trace: the request's timeline (start, one TokenEvent per token, prompt length).
    """
    tokens: torch.Tensor
    trace: Trace


def _check_generator(generator, device: torch.device):
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device.type} but the model is on {device.type}: create it "
                         f"there, torch.Generator(device={str(device)!r}).manual_seed(...)")


def _make_cache(model, cache, compile, batch: int, span: int):
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


@torch.inference_mode()
def generate(model, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id: int | list[int] | None = None,
             callback: Callable[[TokenEvent], bool | None] | None = None,
             cache=None, compile: bool | str = False) -> GenerateOutput:
    """Generate up to `max_new_tokens` tokens after the prompt `input_ids` (list of ids, [T] or [1, T]).

    The default temperature 0 is greedy decoding (like ``model.generate(do_sample=False)``); give
    temperature > 0 (and optionally top_k / top_p, and a seeded ``generator`` on the model's device) to
    sample. Generation stops after an `eos_token_id` token (included in the output) if one is given.
    ``callback(event)`` runs after each token with a ``TokenEvent(index, token_id, time, start)``
    (``time.perf_counter()`` seconds, taken once the token is on the host, so device work is finished);
    if it returns True, generation stops there (streaming UIs, custom stop rules).

    cache: None (default) is the baseline without a KV cache: each step runs the model over the *whole*
    sequence, so step i costs about as much as a prefill of prompt + i tokens. With a cache (Module 05:
    "contiguous", "static", or an empty ``KVCache``) the prompt is prefilled once and each step feeds
    one token. compile (Module 12, the gpt-fast recipe): the decode step compiled whole, through a
    ``StaticCache`` (made if none is given; see ``decode_step``); the prefill stays eager. The first call
    compiles (seconds to a minute); greedy output equals the eager loop's.
    """
    ids = _prompt_tensor(input_ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    max_new_tokens = int(max_new_tokens)
    _check_temperature(temperature)
    if top_k is not None:
        _check_top_k(top_k)
    if top_p is not None:
        _check_top_p(top_p)
    ctx = context_length(model)
    # The model sees the prompt and every new token but the last (which is never fed back).
    span = ids.numel() + max(max_new_tokens - 1, 0)
    if ctx is not None and span > ctx:
        raise ValueError(f"prompt of {ids.numel()} tokens + max_new_tokens={max_new_tokens} needs {span} "
                         f"positions, past the model's context of {ctx} tokens (config.max_position_embeddings)")
    if eos_token_id is None:
        eos = set()
    elif isinstance(eos_token_id, numbers.Integral) and not isinstance(eos_token_id, bool):
        eos = {int(eos_token_id)}
    elif isinstance(eos_token_id, (list, tuple, set)) and all(isinstance(e, numbers.Integral) for e in eos_token_id):
        eos = {int(e) for e in eos_token_id}
    else:
        raise ValueError(f"eos_token_id must be an int, a list of ints or None, got {eos_token_id!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable (it receives a TokenEvent), got {type(callback).__name__}")
    if not isinstance(compile, (bool, str)):
        raise TypeError(f"compile must be True, False or a torch.compile backend name, got {compile!r}")
    device = _model_device(model)
    _check_generator(generator, device)
    cache = _make_cache(model, cache, compile, 1, span)
    if cache is not None and getattr(cache, "max_len", span) < span:
        raise ValueError(f"cache holds max_len={cache.max_len} tokens but this request needs {span}")
    step = decode_step(model, compile) if cache is not None else None

    start = time.perf_counter()
    seq = ids.to(device)[None]  # [1, T]: everything so far, prompt + generated
    trace = Trace(start=start, events=[], prompt_tokens=int(ids.numel()))
    new_tokens: list[int] = []
    step_input = seq            # what the model sees first: the prompt
    for i in range(max_new_tokens):
        if cache is None:
            # No cache: the whole sequence again (with a cache it is only the tokens it has not seen).
            logits = model_logits(model, seq)[:, -1, :]                     # [1, V] the last position predicts
        elif i == 0:
            logits = model(step_input, cache=cache)[:, -1, :]               # prefill, eager
        else:
            logits = step(step_input, cache=cache)[:, -1, :]                # one token through the cache
        token = sample(logits, temperature, top_k, top_p, generator)  # [1]
        token_id = int(token)  # copies to the host: waits for the device, so the time below is real
        now = time.perf_counter()
        event = TokenEvent(index=i, token_id=token_id, time=now, start=start)
        trace.events.append(event)
        new_tokens.append(token_id)
        step_input = token.view(1, 1).to(seq.dtype)
        if cache is None:
            seq = torch.cat([seq, step_input], dim=1)  # [1, T + i + 1]
        stop = callback(event) if callback is not None else None
        if token_id in eos or stop is True:
            break
    return GenerateOutput(torch.tensor(new_tokens, dtype=torch.long, device="cpu"), trace)
