"""Measure speculative decoding against its theory, in one run: a, tokens per pass, c, verify cost,
predicted and measured speed-ups over plain cached decoding.

Notation: a = acceptance rate, g = draft length, c = draft step time / target step time (both one token
with a KV cache), verify_cost = target forward over g+1 tokens / target forward over 1 token.

Every timing is a median of repeats, taken by ``course_lib.perf.timing.interleave``: the plain and speculative
runs (each path on each prompt) take turns round by round, rotating who goes first, so that a slow spell of a
shared machine hits all of them alike.
"""
from __future__ import annotations

import statistics

import torch

from course_lib.generation import model_device, check_pair, generate
from course_lib.kvcache import ContiguousCache
from course_lib.perf.timing import interleave
from course_lib.validate import integer

from .loop import check_prompt, speculative_generate
from .prompt_lookup import prompt_lookup_generate
from .theory import expected_tokens_per_pass

__all__ = ["step_times", "measure", "measure_prompt_lookup", "compare_drafts"]


@torch.inference_mode()
def step_times(models: dict, context: torch.Tensor, num_tokens: dict, repeats: int = 25) -> dict:
    """Median seconds of one cached forward over k new tokens after `context` [T], per (model name, k).

    models: {name: model}; num_tokens: {name: [k, ...]}. Each model's cache is filled with the context
    once and cropped back after every timed forward, so every measurement sees the same cache length
    (like one decode step or one verification). The measurements are interleaved round by round (every
    (name, k) once per round), so a slow spell of a shared machine hits all of them alike.
    """
    ids = check_prompt(context)
    devices = {model_device(model) for model in models.values()}
    if len(devices) > 1:
        raise ValueError(f"models must be on one device to be timed together, got {sorted(map(str, devices))}")
    caches, base, fns, after = {}, {}, {}, {}
    for name, model in models.items():
        x = ids.to(model_device(model))
        caches[name] = ContiguousCache()
        model(x[None, :-1], cache=caches[name])
        base[name] = caches[name].get_seq_length()
        for k in num_tokens[name]:
            xk = x[-1:].repeat(k)[None]                            # [1, k]: the ids hardly matter here
            fns[(name, k)] = lambda model=model, xk=xk, cache=caches[name]: model(xk, cache=cache)
            after[(name, k)] = lambda cache=caches[name], n=base[name]: cache.crop(n)
    timings = interleave(fns, warmup=1, repeats=repeats, device=devices.pop(), after=after)
    return {job: t.median for job, t in timings.items()}


def measure(target, draft, prompts, draft_lengths=(1, 2, 3, 4, 6), max_new_tokens: int = 64,
            temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
            repeats: int = 3, seed: int = 0, adaptive: float | None = None) -> list[dict]:
    """One row per draft length g, all measured in the same run:

    a: accepted / drafted; a_tested: accepted / tested proposals (the a of the theory);
    tokens_per_pass (measured) and tokens_per_pass_pred = expected_tokens_per_pass(a_tested, d) averaged
    over the passes, d = the drafts each pass made (g, except in the last pass or with `adaptive`);
    c: draft one-token step / target one-token step; verify_cost: target over g+1 tokens / one token;
    speedup_ideal / speedup_refined: the theory's speedup(a_tested, d, c, verify) summed over the passes
    (tokens / cost) with verify = 1 / with the measured target cost over d+1 tokens;
    speedup_measured: plain cached decoding time / speculative time on the same prompts and
    max_new_tokens (median over `repeats` interleaved runs of the paired ratio); plus ms per token of both.
    """
    check_pair(target, draft)
    prompts = [check_prompt(p) for p in prompts]
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    draft_lengths = [integer(g, f"draft_lengths[{i}]", low=1) for i, g in enumerate(draft_lengths)]
    repeats = integer(repeats, "repeats", low=1)
    device = model_device(target)

    # Costs: one token with a KV cache for both models, and k = 1..g+1 tokens for the target, after the
    # first prompt.
    times = step_times({"target": target, "draft": draft}, prompts[0],
                       {"target": list(range(1, max(draft_lengths) + 2)), "draft": [1]})
    t_step, d_step = times[("target", 1)], times[("draft", 1)]
    c = d_step / t_step
    verify = {k - 1: times[("target", k)] / t_step for k in range(1, max(draft_lengths) + 2)}  # by drafts

    gen = torch.Generator(device=device)
    stats = {g: [] for g in draft_lengths}
    for p in prompts[:1]:                                     # warm-up both paths (short runs)
        generate(target, p, 4, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen, cache="contiguous")
        speculative_generate(target, draft, p, 4, draft_length=2)
    calls = {}                                                # (key, prompt i) -> calls so far = the round

    def run(key, i):
        r = calls[(key, i)] = calls.get((key, i), -1) + 1
        gen.manual_seed(seed + 1000 * r + i)
        if key == "plain":
            generate(target, prompts[i], max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                     generator=gen, cache="contiguous")
        else:
            _, st = speculative_generate(target, draft, prompts[i], max_new_tokens, draft_length=key,
                                         temperature=temperature, top_k=top_k, top_p=top_p,
                                         generator=gen, adaptive=adaptive)
            stats[key].append(st)

    # one candidate per (path, prompt), interleaved; a path's time in round r is the sum over the prompts
    jobs = {(key, i): (lambda key=key, i=i: run(key, i)) for i in range(len(prompts))
            for key in ["plain", *draft_lengths]}
    timings = interleave(jobs, warmup=0, repeats=repeats, device=device)
    runs = {key: [sum(timings[(key, i)].times[r] for i in range(len(prompts))) for r in range(repeats)]
            for key in ["plain", *draft_lengths]}

    plain_s = statistics.median(runs["plain"])
    n_tokens = max_new_tokens * len(prompts)
    rows = []
    for g in draft_lengths:
        sts = stats[g]
        drafted = sum(s.drafted for s in sts)
        accepted = sum(s.accepted for s in sts)
        tested = accepted + sum(s.rejections for s in sts)
        passes = sum(s.passes for s in sts)
        a = accepted / drafted
        a_tested = accepted / tested if tested else 1.0
        # Predictions pass by pass with the number of drafts each pass really made (fewer than g in the
        # last pass, or with adaptive drafting): tokens = sum E[tokens | d drafts], cost = sum (d c + verify).
        per_pass = [d for s in sts for d in s.per_pass_drafted]
        tokens_pred = sum(expected_tokens_per_pass(a_tested, d) for d in per_pass)
        cost_ideal = sum(d * c + 1.0 for d in per_pass)
        cost_refined = sum(d * c + verify[d] for d in per_pass)
        spec_s = statistics.median(runs[g])
        rows.append({
            "g": g, "a": a, "a_tested": a_tested,
            "tokens_per_pass": (accepted + passes) / passes,
            "tokens_per_pass_pred": tokens_pred / passes,
            "c": c, "verify_cost": verify[g],
            "speedup_ideal": tokens_pred / cost_ideal,
            "speedup_refined": tokens_pred / cost_refined,
            "speedup_measured": statistics.median(x / y for x, y in zip(runs["plain"], runs[g])),  # paired
            "plain_ms_per_token": 1e3 * plain_s / n_tokens,
            "spec_ms_per_token": 1e3 * spec_s / n_tokens,
            "target_step_ms": 1e3 * t_step, "draft_step_ms": 1e3 * d_step,
            "drafts_per_pass": len(per_pass) and sum(per_pass) / len(per_pass),
        })
    return rows


def measure_prompt_lookup(target, prompts, draft_lengths=(4, 8), max_new_tokens: int = 64,
                          max_ngram: int = 3, repeats: int = 3) -> list[dict]:
    """Prompt-lookup decoding vs plain greedy cached decoding, interleaved: one row per g with a,
    tokens per pass and the measured speed-up (c ~ 0: the draft is a search)."""
    prompts = [check_prompt(p) for p in prompts]
    draft_lengths = [integer(g, f"draft_lengths[{i}]", low=1) for i, g in enumerate(draft_lengths)]
    max_new = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
    stats = {g: [] for g in draft_lengths}
    calls = {}

    def run(key):
        first = key not in calls                              # the statistics of one run suffice
        calls[key] = True
        for p, n in zip(prompts, max_new):
            if key == "plain":
                generate(target, p, n, cache="contiguous")
            else:
                _, st = prompt_lookup_generate(target, p, n, draft_length=key, max_ngram=max_ngram)
                if first:
                    stats[key].append(st)

    timings = interleave({key: (lambda key=key: run(key)) for key in ["plain", *draft_lengths]}, warmup=0,
                         repeats=integer(repeats, "repeats", low=1), device=model_device(target))
    runs = {key: t.times for key, t in timings.items()}
    plain_s = statistics.median(runs["plain"])
    rows = []
    for g in draft_lengths:
        sts = stats[g]
        drafted = sum(s.drafted for s in sts)
        accepted = sum(s.accepted for s in sts)
        passes = sum(s.passes for s in sts)
        rows.append({"g": g, "a": accepted / drafted if drafted else float("nan"),
                     "tokens_per_pass": (accepted + passes) / passes,
                     "speedup_measured": statistics.median(x / y for x, y in zip(runs["plain"], runs[g])),
                     "plain_ms_per_token": 1e3 * plain_s / sum(max_new),
                     "spec_ms_per_token": 1e3 * statistics.median(runs[g]) / sum(max_new)})
    return rows


def compare_drafts(target, drafts: dict, prompts, max_new_tokens: int = 64, repeats: int = 3) -> list[dict]:
    """Several drafts against plain greedy cached decoding, all interleaved in one run (Module 08's table).

    drafts: {name: (draft, g)}: a draft course model or a draft object (Medusa, EAGLE, MTP, prompt lookup),
    and the draft length it runs at (for a tree: its depth). Every run is greedy and checked equal to the
    plain greedy tokens (a draft that changed the output is an error, not a row). One row per draft:
    a (accepted / drafted), a_tested (accepted / tested proposals), tokens_per_pass, drafts_per_pass,
    depth_acceptance (per depth k < g, the share of passes that kept a proposal at depth k), draft_share (the draft's
    share of the decoding time: its own c, whatever the draft is), speedup_measured
    (median over `repeats` interleaved rounds of the paired time ratio plain / speculative), and ms per token.
    """
    prompts = [check_prompt(p) for p in prompts]
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    if not isinstance(drafts, dict) or not drafts:
        raise ValueError("drafts must be a non-empty dict {name: (draft, draft_length)}")
    for name, pair in drafts.items():
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"drafts[{name!r}] must be a pair (draft, draft_length), got {type(pair).__name__}")
        integer(pair[1], f"drafts[{name!r}] draft_length", low=1)
        if not hasattr(pair[0], "propose"):
            check_pair(target, pair[0])
    max_new_tokens = integer(max_new_tokens, "max_new_tokens", low=1)
    device = model_device(target)
    plain = [generate(target, p, max_new_tokens, cache="contiguous").tokens for p in prompts]
    stats = {name: [] for name in drafts}
    first = set()

    def run(key):
        for i, p in enumerate(prompts):
            if key == "plain":
                generate(target, p, max_new_tokens, cache="contiguous")
                continue
            draft, g = drafts[key]
            out = generate(target, p, max_new_tokens, draft=draft, draft_length=g)
            if key not in first:                                   # the statistics of one round suffice
                if not torch.equal(out.tokens.cpu(), plain[i].cpu()):
                    raise AssertionError(f"draft {key!r} changed the greedy output of prompt {i}: speculative "
                                         f"decoding must not (a bug in the draft's verification)")
                stats[key].append(out.stats)
        first.add(key)

    timings = interleave({key: (lambda key=key: run(key)) for key in ["plain", *drafts]}, warmup=0,
                         repeats=integer(repeats, "repeats", low=1), device=device)
    runs = {key: t.times for key, t in timings.items()}
    n_tokens = max_new_tokens * len(prompts)
    rows = []
    for name, (draft, g) in drafts.items():
        sts = stats[name]
        drafted, accepted = sum(s.drafted for s in sts), sum(s.accepted for s in sts)
        tested = accepted + sum(s.rejections for s in sts)
        passes = sum(s.passes for s in sts)
        draft_s, target_s = sum(s.draft_seconds for s in sts), sum(s.target_seconds for s in sts)
        rows.append({"name": name, "g": g, "a": accepted / drafted if drafted else float("nan"),
                     "a_tested": accepted / tested if tested else float("nan"),
                     "tokens_per_pass": (accepted + passes) / passes, "drafts_per_pass": drafted / passes,
                     "draft_share": draft_s / (draft_s + target_s),
                     # share of passes whose proposal at depth k (0-based) was kept: deeper ones need all before
                     "depth_acceptance": [sum(a > k for s in sts for a in s.per_pass) / passes for k in range(g)],
                     "speedup_measured": statistics.median(x / y for x, y in zip(runs["plain"], runs[name])),
                     "plain_ms_per_token": 1e3 * statistics.median(runs["plain"]) / n_tokens,
                     "spec_ms_per_token": 1e3 * statistics.median(runs[name]) / n_tokens})
    return rows
