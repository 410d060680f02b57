"""The one generate loop: prefill, then decode (recompute, any KV cache, compiled, or speculative).

``generate(model, input_ids, max_new_tokens, ...)`` is the loop: by default every step runs the model on
the whole sequence so far (no KV cache), takes the last position's logits, samples, appends, and records
when each token was ready. ``cache=`` (Module 05) prefills once and feeds one token per step, through
any ``KVCache`` (the cache's ``attn_mask`` is passed on: a sliding window needs a banded prefill mask);
``compile=True`` (Module 12) runs that step compiled through a static cache; ``draft=`` (Module 08) lets
a draft model propose ``draft_length`` tokens that the model verifies in one forward (speculative
decoding, exact in distribution). It returns the new tokens and a ``Trace`` from which
``course_lib.perf.metrics`` computes TTFT, TPOT, tokens/s.

Sampling has one path, ``course_lib.sampling`` (temperature, top-k, top-p, a ``torch.Generator``); its
functions are re-exported here: apply_temperature, top_k_filter, top_p_filter, sampling_probs, sample,
greedy.

Why speculative decoding runs here and not in ``course_lib.speculative``: that package (layer 5) builds
on this one (layer 4: measurement, Medusa, prompt lookup, distillation's teacher), so the loop cannot
import it. The two pieces the draft path needs are at or below this layer: the acceptance rule is a
sampling rule (``course_lib.sampling.accept_step``) and the pass itself (``_Speculation``) is a few lines
of cache bookkeeping next to the loop it plugs into. ``course_lib.speculative`` re-exports both
(``speculative_generate`` is ``generate(..., draft=...)`` returning the full ids and ``SpecStats``).

Shapes: prompt [T] or [B, T]; logits [B, V] per step; new tokens [n] (one request) or [B, n].
"""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from course_lib.env import sync
from course_lib.kvcache import ContiguousCache, KVCache, StaticCache
from course_lib.perf.metrics import TokenEvent, Trace
from course_lib.sampling import (_check_temperature, _check_top_k, _check_top_p, accept_step, apply_temperature,
                                 greedy, probs_from_logits, sample, sampling_probs, top_k_filter, top_p_filter)

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter", "sampling_probs", "sample", "greedy",
           "generate", "decode_step", "GenerateOutput", "SpecStats", "TokenEvent", "Trace", "model_logits",
           "context_length", "check_pair"]


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


def _prompt_tensor(input_ids, why_one: str = "this runs one request (batch size 1)",
                   batch_hint: str = "Module 09 batches requests") -> torch.Tensor:
    """One prompt as an int64 tensor [T], from a list of ints or an integer tensor [T] / [1, T]."""
    ids = _prompt_batch(input_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"input_ids: {why_one}; got batch size {ids.shape[0]} ({batch_hint})")
    return ids[0]


def _check_int(x, name: str, low: int) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {x!r}")
    return int(x)


@dataclass
class SpecStats:
    """Counters of one speculative run (a = acceptance rate, g = draft length).

    passes: draft-verify passes (one target forward each, the prefill aside).
    drafted: proposals made; accepted: proposals that passed; emitted: new tokens returned.
    per_pass: accepted proposals in each pass; per_pass_drafted: proposals made in each pass (g, or fewer
        near max_new_tokens or with adaptive drafting).
    rejections: passes that ended on a rejection (the others ended with a bonus token).
    draft_seconds: the draft's forwards and sampling; target_seconds: the target's forwards and the
        acceptance step (both include their prefill); total_seconds: the whole call (the rest is
        bookkeeping).
    """
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    rejections: int = 0
    per_pass: list[int] = field(default_factory=list)
    per_pass_drafted: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    total_seconds: float = 0.0

    def record(self, num_accepted: int, drafted: int) -> None:
        """Count one pass that tested `drafted` proposals and kept the first `num_accepted`."""
        self.passes += 1
        self.drafted += drafted
        self.accepted += num_accepted
        self.rejections += num_accepted < drafted
        self.per_pass.append(num_accepted)
        self.per_pass_drafted.append(drafted)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted: the share of proposals kept (proposals after a rejection count as lost)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def per_token_acceptance(self) -> float:
        """accepted / (accepted + rejections): the estimate of a in the theory's model, where each
        *tested* proposal passes with probability a (proposals after a rejection are never tested).
        This is the a to put into ``expected_tokens_per_pass``."""
        tested = self.accepted + self.rejections
        return self.accepted / tested if tested else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens a pass produced (accepted + 1), before any cut at max_new_tokens or eos."""
        return (self.accepted + self.passes) / self.passes if self.passes else float("nan")


@dataclass(frozen=True)
class GenerateOutput:
    """What ``generate`` returns: unpack as ``tokens, trace = generate(...)``.

    tokens: the new tokens only, int64 on the CPU (the prompt is not repeated): [n] for one request
        (a list, [T] or [1, T] prompt), [B, n] for a batch of B > 1 prompts.
    trace: the timeline (start, one TokenEvent per step, prompt length); for a batch, one event per step
        with row 0's token (every row's token of a step is ready at the same time).
    logits: with ``return_logits=True``, the logits that chose each token, [n, V] or [B, n, V], on the
        model's device; else None.
    stats: with ``draft=``, the run's ``SpecStats`` (passes, acceptance, time in each model); else None.
    """
    tokens: torch.Tensor
    trace: Trace
    logits: torch.Tensor | None = None
    stats: SpecStats | None = None

    def __iter__(self):  # tokens, trace = generate(...)
        return iter((self.tokens, self.trace))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        return (self.tokens, self.trace)[i]


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


def _forward(fn, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits [B, T, V] of `ids` [B, T] through `cache`, with the cache's mask when it has one (a sliding
    window's banded prefill); None means the model's causal mask, and the call stays the plain one."""
    mask = cache.attn_mask(ids.shape[1], device=ids.device)
    if mask is None:
        return fn(ids, cache=cache)
    return fn(ids, cache=cache, attn_mask=mask)


class _Speculation:
    """Speculative decoding's state and one draft-then-verify pass (Module 08; the theory and the
    acceptance rule are in ``course_lib.speculative``).

    One pass: the draft proposes up to g tokens (one cached forward each); the target scores the pending
    token and the proposals in ONE cached forward; ``accept_step`` keeps a prefix of the proposals and
    adds one token of its own (corrected or bonus), so a pass emits 1..g+1 tokens, distributed exactly
    as the target would sample them (at temperature 0: equal to the target's greedy decoding); both
    caches are cropped back to the tokens kept.

    KV-cache invariant (the tests check it after every pass through ``on_pass``), with seq[:n] kept:
        target cache: exactly n - 1 tokens, the K/V of seq[:n-1]; the last token is "pending": the
            target computes its K/V in the next pass, in the forward that verifies the next proposals.
        draft cache: n - 1 tokens as well, except after a pass where all g proposals passed: then n - 2,
            because the last proposal was never fed to the draft (its job was only to be checked). The
            next pass feeds the draft the 1 or 2 tokens it lacks together with its first step.
    """

    def __init__(self, target, draft, prompt: torch.Tensor, max_new_tokens: int, draft_length: int,
                 sampling: tuple, generator, adaptive: float | None, eos: set, tcache: KVCache, on_pass):
        self.target, self.draft, self.g_max = target, draft, draft_length
        self.sampling, self.generator, self.adaptive, self.eos, self.on_pass = (sampling, generator, adaptive,
                                                                               eos, on_pass)
        self.device = _model_device(target)
        self.end = prompt.numel() + max_new_tokens
        # One buffer for the whole sequence: the draft writes its proposals right after the last kept
        # token, verification keeps a prefix of them and writes its own token after that prefix.
        self.seq = torch.empty(self.end, dtype=torch.long, device=self.device)
        self.seq[:prompt.numel()] = prompt.to(self.device)
        self.n = prompt.numel()                                     # tokens kept so far: seq[:n]
        self.tcache, self.dcache = tcache, ContiguousCache()
        self.stats = SpecStats()

    def prefill(self):
        """Both models read the prompt except its last token, which stays pending (the invariant)."""
        if self.n > 1:
            t0 = time.perf_counter()
            self.target(self.seq[None, :self.n - 1], cache=self.tcache)
            sync(self.device)
            t1 = time.perf_counter()
            self.draft(self.seq[None, :self.n - 1], cache=self.dcache)
            sync(self.device)
            self.stats.target_seconds += t1 - t0
            self.stats.draft_seconds += time.perf_counter() - t1

    def step(self) -> list[int]:
        """One pass: the new tokens it keeps (1..g+1, cut after an eos)."""
        seq, n, stats = self.seq, self.n, self.stats
        temperature, top_k, top_p = self.sampling
        is_greedy = temperature == 0
        g = min(self.g_max, self.end - n - 1)           # a pass emits at most g + 1 tokens: never waste any

        # 1. Draft: g cached steps; the first also feeds the tokens the draft's cache lacks.
        t0 = time.perf_counter()
        q_rows = []                                                        # drafted x [V]
        x = seq[self.dcache.get_seq_length():n]                            # [1] or [2] tokens
        drafted = 0
        for i in range(g):
            logits = self.draft(x[None], cache=self.dcache)[0, -1]        # [V]
            if is_greedy:
                tok = logits.argmax()
                confidence = torch.softmax(logits, -1).max() if self.adaptive is not None else None
            else:
                q = probs_from_logits(logits, temperature, top_k, top_p)   # [V]
                tok = torch.multinomial(q, 1, generator=self.generator)[0]
                q_rows.append(q)
                confidence = q.max() if self.adaptive is not None else None
            seq[n + i] = tok
            x = seq[n + i:n + i + 1]
            drafted += 1
            if self.adaptive is not None and float(confidence) < self.adaptive:
                break                                                      # the draft is unsure: verify now
        sync(self.device)
        t1 = time.perf_counter()

        # 2. Verify: one target forward over the pending token and the proposals, [1 + drafted] positions.
        tlogits = self.target(seq[None, n - 1:n + drafted], cache=self.tcache)[0]   # [drafted + 1, V]
        proposals = seq[n:n + drafted]                                               # [drafted]

        # 3. Accept. At temperature 0, p and q are one-hot and accept_step reduces to this comparison.
        if is_greedy:
            best = tlogits.argmax(-1)                                       # [drafted + 1]
            num_ok = int((best[:drafted] == proposals).cumprod(0).sum())   # leading matches
            seq[n + num_ok] = best[num_ok]                                  # corrected or bonus token
        else:
            p = probs_from_logits(tlogits, temperature, top_k, top_p)      # [drafted + 1, V]
            q = torch.stack(q_rows) if q_rows else p.new_zeros(0, p.shape[-1])
            res = accept_step(p, q, proposals, self.generator)
            num_ok = res.num_accepted
            seq[n + num_ok] = res.tokens[-1]
        sync(self.device)
        stats.draft_seconds += t1 - t0
        stats.target_seconds += time.perf_counter() - t1
        stats.record(num_ok, drafted)

        # Keep seq[:n + num_ok + 1], or up to and including an eos among them.
        new = seq[n:n + num_ok + 1].tolist()
        cut = next((i + 1 for i, t in enumerate(new) if t in self.eos), len(new))
        new = new[:cut]
        self.n = n = n + cut

        # 4. Re-sync the caches with seq[:n] (the invariant above).
        self.tcache.crop(n - 1)
        self.dcache.crop(min(self.dcache.get_seq_length(), n - 1))
        if self.on_pass is not None:
            self.on_pass(seq[None, :n], self.tcache, self.dcache)
        return new


@torch.inference_mode()
def generate(model, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id: int | list[int] | None = None,
             callback: Callable[[TokenEvent], bool | None] | None = None,
             cache=None, compile: bool | str = False, return_logits: bool = False,
             draft=None, draft_length: int = 4, adaptive: float | None = None,
             on_pass: Callable | None = None) -> GenerateOutput:
    """Generate up to `max_new_tokens` tokens after the prompt `input_ids` (list of ids, [T] or [B, T]).

    The default temperature 0 is greedy decoding (like ``model.generate(do_sample=False)``); give
    temperature > 0 (and optionally top_k / top_p, and a seeded ``generator`` on the model's device) to
    sample. Generation stops after an `eos_token_id` token (included in the output) if one is given; in a
    batch, a row that produced one repeats it until every row has. ``callback(event)`` runs after each
    token (each step, for a batch) with a ``TokenEvent(index, token_id, time, start)``
    (``time.perf_counter()`` seconds, taken once the token is on the host, so device work is finished);
    if it returns True, generation stops there (streaming UIs, custom stop rules).

    cache: None (default) is the baseline without a KV cache: each step runs the model over the *whole*
    sequence, so step i costs about as much as a prefill of prompt + i tokens. With a cache (Module 05:
    "contiguous", "static", or an empty ``KVCache`` of any kind) the prompt is prefilled once and each
    step feeds one token. compile (Module 12, the gpt-fast recipe): the decode step compiled whole,
    through a ``StaticCache`` (made if none is given; see ``decode_step``); the prefill stays eager. The
    first call compiles (seconds to a minute); greedy output equals the eager loop's.
    return_logits: also return the logits that chose each token (``GenerateOutput.logits``).

    The context: the model sees the prompt and every new token but the last (which is never fed back),
    so prompt + max_new_tokens - 1 must fit in config.max_position_embeddings (the serving engine's
    rule), unless the cache places positions inside itself (``SinkCache``: generation runs past it).

    draft (Module 08): a draft course model with the same vocabulary; speculative decoding, one request,
    ``draft_length`` proposals per pass (at temperature 0 the output equals plain greedy decoding token
    for token; otherwise it is distributed exactly as sampling from `model`). The target's cache is
    `cache` (None or an empty ``ContiguousCache``: the pass crops it). `adaptive`: None, or a confidence
    threshold in (0, 1): a pass stops proposing after a token whose draft probability max_x q(x) is below
    it. ``on_pass(ids [1, n], target_cache, draft_cache)`` runs after every pass (tests, visualizations).
    The output's ``stats`` holds the run's ``SpecStats``; the trace's tokens of one pass share its time.
    """
    ids = _prompt_batch(input_ids)                                      # [B, T] on the host or the device
    B, T = ids.shape
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    max_new_tokens = int(max_new_tokens)
    _check_temperature(temperature)
    if top_k is not None:
        _check_top_k(top_k)
    if top_p is not None:
        _check_top_p(top_p)
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
    if draft is not None:
        check_pair(model, draft)
        draft_length = _check_int(draft_length, "draft_length", 1)
        if adaptive is not None and (isinstance(adaptive, bool) or not isinstance(adaptive, numbers.Real)
                                     or not 0 < adaptive < 1):
            raise ValueError(f"adaptive must be None or a confidence threshold in (0, 1), got {adaptive!r}")
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
    # The model sees the prompt and every new token but the last (which is never fed back).
    span = T + max(max_new_tokens - 1, 0)
    for name, m in (("model", model), ("draft", draft)):
        ctx = context_length(m) if m is not None else None
        repositions = m is model and getattr(cache, "reposition", False) is True  # SinkCache: positions inside
        if ctx is not None and span > ctx and not repositions:
            raise ValueError(f"prompt of {T} tokens + max_new_tokens={max_new_tokens} needs {span} positions "
                             f"(the last new token is never fed back), past the {name}'s context of {ctx} "
                             "tokens (config.max_position_embeddings)")
    device = _model_device(model)
    _check_generator(generator, device)
    cache = _make_cache(model, cache, compile, B, span)
    if cache is not None and getattr(cache, "max_len", span) < span:
        raise ValueError(f"cache holds max_len={cache.max_len} tokens but this request needs {span}")

    start = time.perf_counter()
    trace = Trace(start=start, events=[], prompt_tokens=T)
    rows: list[list[int]] = []                  # the new tokens, one [B] list per step
    chosen_by: list[torch.Tensor] = []          # the logits [B, V] behind each step's tokens

    def emit(step_tokens: list[int]) -> bool:
        """Record one step's tokens [B] (ready now); True when generation must stop."""
        event = TokenEvent(index=len(rows), token_id=step_tokens[0], time=time.perf_counter(), start=start)
        trace.events.append(event)
        rows.append(step_tokens)
        stop = callback(event) if callback is not None else None
        return stop is True or len(rows) == max_new_tokens or all(t in eos for t in step_tokens)

    spec = None
    if max_new_tokens == 0:
        pass
    elif draft is not None:                 # speculative: each pass emits 1..g+1 tokens
        spec = _Speculation(model, draft, ids[0], max_new_tokens, draft_length, (temperature, top_k, top_p),
                            generator, adaptive, eos, cache, on_pass)
        spec.prefill()
        stop = False
        while not stop:
            stop = any(emit([t]) for t in spec.step())   # any() stops at the first that says stop
    else:
        step = decode_step(model, compile) if cache is not None else None
        seq = ids.to(device)                # [B, T]: everything so far (grows only without a cache)
        x = seq                             # what the model sees first: the prompt
        pad = [None] * B                    # the eos each finished row repeats
        for i in range(max_new_tokens):
            if cache is None:
                # No cache: the whole sequence again (with a cache only the tokens it has not seen).
                logits = model_logits(model, seq)[:, -1, :]                 # [B, V] the last position
            else:
                logits = _forward(model if i == 0 else step, x, cache)[:, -1, :]  # prefill eager, then steps
            token = sample(logits, temperature, top_k, top_p, generator)   # [B]
            toks = token.tolist()           # copies to the host: waits for the device, so times are real
            if any(p is not None for p in pad):
                toks = [t if p is None else p for t, p in zip(toks, pad)]
                token = torch.tensor(toks, dtype=torch.long, device=device)
            pad = [p if p is not None else (t if t in eos else None) for t, p in zip(toks, pad)]
            if return_logits:
                chosen_by.append(logits)
            if emit(toks):
                break
            x = token.view(B, 1).to(seq.dtype)
            if cache is None:
                seq = torch.cat([seq, x], dim=1)                                # [B, T + i + 1]

    tokens = torch.tensor(rows, dtype=torch.long, device="cpu").reshape(len(rows), B).T  # [B, n]
    logits = None
    if return_logits:                                                                    # [B, n, V]
        vocab = getattr(getattr(model, "config", None), "vocab_size", 0)
        logits = torch.stack(chosen_by, dim=1) if chosen_by else torch.zeros(B, 0, vocab, device=device)
    if spec is not None:
        spec.stats.emitted = len(rows)
        spec.stats.total_seconds = time.perf_counter() - start
    if B == 1:
        tokens, logits = tokens[0], (logits[0] if logits is not None else None)
    return GenerateOutput(tokens.contiguous(), trace, logits, spec.stats if spec is not None else None)
