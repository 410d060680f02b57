"""Every argument ``generate`` refuses, in one place (ValueError/TypeError naming it)."""
from __future__ import annotations

import numbers

import torch

from course_lib.kvcache import ContiguousCache
from course_lib.sampling import SamplingParams, draw_unchecked, sample_rows
from course_lib.validate import integer, number, optional, probability

from .calls import context_length, make_cache, model_device
from .speculative import check_draft


def check_pair(target, draft):
    """Target and draft must speak the same vocabulary: the same token id must mean the same token."""
    vt = getattr(getattr(target, "config", None), "vocab_size", None)
    vd = getattr(getattr(draft, "config", None), "vocab_size", None)
    if vt is None or vd is None or hasattr(target, "generation_config") or hasattr(draft, "generation_config"):
        raise TypeError("target and draft must be course models with a .config.vocab_size "
                        "(for Hugging Face models use course_lib.speculative.hf.hf_assisted_generate)")
    if vt != vd:
        raise ValueError(f"target and draft vocabularies differ: target vocab_size={vt}, draft "
                         f"vocab_size={vd}; speculative decoding needs one shared tokenizer")


def _check_generator(generator, device: torch.device):
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device.type} but the model is on {device.type}: create it "
                         f"there, torch.Generator(device={str(device)!r}).manual_seed(...)")


def _prompt_batch(input_ids) -> torch.Tensor:
    """Prompts as an int64 tensor [B, T], from a list of ints or an integer tensor [T] / [B, T]."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        ids = input_ids
    elif isinstance(input_ids, (list, tuple)):
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in input_ids):
            raise TypeError("input_ids must be a list of int token ids or an integer tensor")
        ids = torch.tensor([int(t) for t in input_ids], dtype=torch.long, device="cpu")
    else:
        raise TypeError(f"input_ids must be a list of token ids or a tensor [T] / [B, T], "
                        f"got {type(input_ids).__name__}")
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] == 0:
        raise ValueError(f"input_ids must have shape [T] or [B, T] with B >= 1, got {tuple(ids.shape)}")
    if ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token "
                         "(e.g. the BOS/EOS token as a start-of-text marker)")
    return ids.long()


def prompt_tensor(input_ids, why_one: str = "this runs one request (batch size 1)",
                   batch_hint: str = "Module 09 batches requests") -> torch.Tensor:
    """One prompt as an int64 tensor [T], from a list of ints or an integer tensor [T] / [1, T]."""
    ids = _prompt_batch(input_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"input_ids: {why_one}; got batch size {ids.shape[0]} ({batch_hint})")
    return ids[0]


def settings_from_params(params, input_ids, model, max_new_tokens, temperature, top_k, top_p, generator,
                         eos_token_id, repetition_penalty):
    """generate's separate settings from `params` (a SamplingParams, or a list of one per row), which then
    must not be given separately as well; a seed becomes a generator on the model's device (unless
    `generator` is given)."""
    separate = {"max_new_tokens": max_new_tokens is not None, "temperature": temperature != 0.0,
                "top_k": top_k is not None, "top_p": top_p is not None, "eos_token_id": eos_token_id is not None,
                "repetition_penalty": repetition_penalty != 1.0}
    both = [name for name, given in separate.items() if given]
    if both:
        raise ValueError(f"params= holds the sampling settings; {', '.join(both)} given as well: give one or the other")
    rows = params if isinstance(params, (list, tuple)) else [params]
    if not rows or not all(isinstance(p, SamplingParams) for p in rows):
        raise TypeError(f"params must be a SamplingParams or a list of them (one per prompt), got {params!r}")
    if len(rows) > 1 and len(rows) != _prompts(input_ids)[0].shape[0]:
        raise ValueError(f"params: {len(rows)} SamplingParams for {_prompts(input_ids)[0].shape[0]} prompts")

    def field(name):
        values = [getattr(p, name) for p in rows]
        return values if len(rows) > 1 else values[0]
    if generator is None and any(p.seed is not None for p in rows):
        device = model_device(model)
        gens = [None if p.seed is None else torch.Generator(device=device).manual_seed(int(p.seed)) for p in rows]
        generator = gens if len(rows) > 1 else gens[0]
    eos = [list(p.stop_token_ids) or None for p in rows]
    return (field("max_new_tokens"), field("temperature"), field("top_k"), field("top_p"), generator,
            eos if len(rows) > 1 else eos[0], field("repetition_penalty"))


def check_generate(model, input_ids, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id,
                    callback, cache, compile, return_logits, draft, draft_length, adaptive, on_pass,
                    repetition_penalty=1.0):
    """Every argument of ``generate`` checked (ValueError/TypeError naming it). Returns the prompts [B, T]
    and their left padding [B] (None when all have the same length), each row's max_new_tokens and stop
    tokens (a set), ``draw(logits [B, V]) -> [B]`` (the sampling rule, shared or per row), the cache to
    decode through (None, or a KVCache) and the repetition penalty of each row as a [B, 1] tensor on the
    model's device (None when every row's is 1: the loop then skips it)."""
    ids, pad = _prompts(input_ids)                                      # [B, T]; [B] or None
    B, T = ids.shape
    device = model_device(model)
    limits, rows_n = _per_row(max_new_tokens, B, "max_new_tokens", lambda v: integer(v, "max_new_tokens", low=0))
    temps, rows_t = _per_row(temperature, B, "temperature", lambda v: number(v, "temperature", 0))  # 0 = greedy
    ks, rows_k = _per_row(top_k, B, "top_k", lambda v: optional(integer, v, "top_k", low=1))
    ps, rows_p = _per_row(top_p, B, "top_p", lambda v: optional(probability, v, "top_p", zero=False))
    gens, rows_g = _per_row(generator, B, "generator", lambda v: _check_generator(v, device))
    eos, rows_e = _eos_rows(eos_token_id, B)
    pens, rows_r = _per_row(repetition_penalty, B, "repetition_penalty",
                            lambda v: number(v, "repetition_penalty", 0, low_open=True))   # 1 = no penalty
    penalty = (torch.tensor([[float(v)] for v in pens], device=device) if any(float(v) != 1 for v in pens)
               else None)
    per_row = rows_n or rows_t or rows_k or rows_p or rows_g or rows_e or rows_r
    max_new_tokens = max(limits)
    if per_row:          # each row its own settings (a batch of requests; the static serving baseline)
        def draw(logits):
            return sample_rows(logits, temps, ks, ps, gens)
    else:                # checked above, once: the per-token draw does not check again
        def draw(logits):
            return draw_unchecked(logits, temps[0], ks[0], ps[0], gens[0])
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable (it receives a TokenEvent), got {type(callback).__name__}")
    if not isinstance(compile, (bool, str)):
        raise TypeError(f"compile must be True, False or a torch.compile backend name, got {compile!r}")
    if pad is not None:
        if cache is None or compile:
            raise ValueError("input_ids: prompts of different lengths are left-padded and decode through a KV cache "
                             "that takes their masks: give cache='contiguous' (and compile=False)")
        if not (cache == "contiguous" or isinstance(cache, ContiguousCache)):
            raise ValueError(f"input_ids: prompts of different lengths need cache='contiguous' or a ContiguousCache, "
                             f"got {cache!r}")
    if draft is not None:
        if per_row:
            raise ValueError("draft= runs one request: give max_new_tokens, temperature, top_k, top_p, generator "
                             "and eos_token_id for it alone, not per row")
        if penalty is not None:
            raise ValueError(f"repetition_penalty={repetition_penalty!r}: speculative decoding (draft=) does not "
                             "apply a repetition penalty (the draft's proposals and the target's verification would "
                             "both need it); leave repetition_penalty=1.0")
        if hasattr(draft, "propose"):       # a draft object: proposals verified greedily
            check_draft(model, draft, temperature, adaptive)
        else:
            check_pair(model, draft)
        draft_length = integer(draft_length, "draft_length", low=1)
        optional(probability, adaptive, "adaptive", zero=False, one=False)   # a confidence threshold
        if B != 1:
            raise ValueError(f"input_ids: speculative decoding (draft=) runs one request; got batch size {B} "
                             "(each row would accept a different number of tokens)")
        if compile or return_logits:
            raise ValueError("draft= runs eager and returns no logits: leave compile=False, return_logits=False")
        cache = ContiguousCache() if cache in (None, "contiguous") else cache
        if not isinstance(cache, ContiguousCache):
            raise ValueError(f"with draft=, cache must be None, 'contiguous' or a ContiguousCache (each pass crops "
                             f"it), got {type(cache).__name__}")
        V = model.config.vocab_size
        if int(ids.max()) >= V or int(ids.min()) < 0:
            raise ValueError(f"input_ids must be token ids in [0, {V}), got values up to {int(ids.max())}")
    elif adaptive is not None or on_pass is not None:
        raise ValueError("adaptive and on_pass belong to speculative decoding: give draft= as well")
    # The model sees the prompt and every new token but the last (which is never fed back); in a batch
    # every row runs until the last one ends, so the longest prompt and the largest max_new_tokens count.
    span = T + max(max_new_tokens - 1, 0)
    for name, m in (("model", model), ("draft", draft)):   # a draft object has no context (None)
        ctx = context_length(m) if m is not None else None
        repositions = m is model and getattr(cache, "reposition", False) is True  # SinkCache: positions inside
        if ctx is not None and span > ctx and not repositions:
            raise ValueError(f"prompt of {T} tokens + max_new_tokens={max_new_tokens} needs {span} positions "
                             f"(the last new token is never fed back), past the {name}'s context of {ctx} "
                             "tokens (config.max_position_embeddings)")
    cache = make_cache(model, cache, compile, B, span)
    if cache is not None and getattr(cache, "max_len", span) < span:
        raise ValueError(f"cache holds max_len={cache.max_len} tokens but this request needs {span}")
    return ids, (pad.to(device) if pad is not None else None), limits, eos, draw, cache, penalty


def prompt_tokens_seen(ids: torch.Tensor, pad: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """[B, V] bool: which token ids each prompt row [B, T] holds, its left padding (pad [B]) left out (the pad
    id 0 is no token of the row). The repetition penalty's memory at the first step."""
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        raise ValueError(f"input_ids must be token ids in [0, {vocab}) for repetition_penalty, got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    seen = torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=ids.device)
    real = torch.ones_like(ids, dtype=torch.bool)
    if pad is not None:
        real = torch.arange(ids.shape[1], device=ids.device)[None, :] >= pad[:, None]     # [B, T]
    return seen.scatter_(1, ids, real)


def _per_row(value, B: int, name: str, check) -> tuple[list, bool]:
    """One setting for every row, or a list/tuple of B settings (one per row); each checked."""
    if isinstance(value, (list, tuple)):
        if len(value) != B:
            raise ValueError(f"{name}: got {len(value)} values for a batch of {B} prompts (one per row, or one "
                             "for all)")
        for v in value:
            check(v)
        return list(value), True
    check(value)
    return [value] * B, False


def _eos_set(e, name: str = "eos_token_id") -> set:
    if e is None:
        return set()
    if isinstance(e, numbers.Integral) and not isinstance(e, bool):
        return {int(e)}
    if isinstance(e, (list, tuple, set, frozenset)) and all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                                                            for x in e):
        return {int(x) for x in e}
    raise ValueError(f"{name} must be an int, a list of ints or None (or one of those per row), got {e!r}")


def _eos_rows(eos_token_id, B: int) -> tuple[list[set], bool]:
    """The stop tokens of each row: one int / list of ints / None for all rows, or a list of B of those."""
    if isinstance(eos_token_id, (list, tuple)) and eos_token_id and all(
            e is None or isinstance(e, (list, tuple, set, frozenset)) for e in eos_token_id):
        if len(eos_token_id) != B:
            raise ValueError(f"eos_token_id: got {len(eos_token_id)} stop-token lists for a batch of {B} prompts")
        return [_eos_set(e) for e in eos_token_id], True
    return [_eos_set(eos_token_id)] * B, False


def _prompts(input_ids) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompts [B, T] and their left padding [B]: a list of prompts (lists of ids or [T_i] tensors) of
    different lengths is left-padded with id 0 to the longest (pad[i] = T - T_i); else pad is None."""
    if not (isinstance(input_ids, (list, tuple)) and input_ids
            and all(isinstance(p, (list, tuple, torch.Tensor)) for p in input_ids)):
        return _prompt_batch(input_ids), None
    rows = [prompt_tensor(p, "each prompt of a list is one request").to("cpu") for p in input_ids]  # [T_i] each
    T = max(r.numel() for r in rows)
    if all(r.numel() == T for r in rows):
        return torch.stack(rows), None
    ids = torch.stack([torch.cat([r.new_zeros(T - r.numel()), r]) for r in rows])                    # [B, T]
    return ids, torch.tensor([T - r.numel() for r in rows], dtype=torch.long, device="cpu")
