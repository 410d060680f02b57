"""Module 08 core: the acceptance rule reproduces the target distribution (chi-square, with a test that
the lecture sketch's rule fails it), temperature 0 equals greedy (ours == plain cached == HF assisted),
the KV caches stay in sync, the theory formulas, prompt lookup, and bad input.

Statistical tests use a false-alarm rate ALPHA = 1e-6 per test: a correct implementation fails one
of them about once in a million runs. Notation: p target probabilities, q draft, g draft length.
"""
import math

import pytest
import torch

from course_lib.generation import generate
from course_lib.kvcache import ContiguousCache
from course_lib.models import LlamaConfig, LlamaForCausalLM, load
from course_lib.speculative import (accept_step, acceptance_rate, break_even_acceptance, expected_tokens_per_pass,
                                    optimal_draft_length, probs_from_logits, speedup)
from course_lib.speculative.loop import check_tokenizers, speculative_generate
from course_lib.speculative.measure import measure
from course_lib.speculative.prompt_lookup import editing_prompts, prompt_lookup_generate, propose_ngram
from device_tools import assert_greedy_match, tol_for

ALPHA = 1e-6


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------
def plain_greedy(model, prompt, n):
    """Plain cached greedy decoding through the one loop: (ids [1, T + n], logits [1, n, V]) on the
    model's device."""
    out = generate(model, prompt, n, cache="contiguous", return_logits=True)
    return torch.cat([prompt.to(model.device), out.tokens.to(model.device)])[None], out.logits[None]


def chi2_pvalue(counts, probs) -> float:
    """Pearson chi-square goodness of fit of `counts` to `probs` (same shape), cells expecting fewer
    than 5 merged (smallest first). Survival function of chi2(df) = gammaincc(df/2, x/2)."""
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    if (counts[probs <= 0] > 0).any():
        return 0.0                                   # a token the target never emits was emitted
    n = counts.sum()
    expected = probs * n
    bins_o, bins_e, acc_o, acc_e = [], [], 0.0, 0.0
    for i in torch.argsort(expected).tolist():
        acc_o, acc_e = acc_o + float(counts[i]), acc_e + float(expected[i])
        if acc_e >= 5:
            bins_o.append(acc_o)
            bins_e.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 or acc_o > 0:                       # leftovers join the last bin
        bins_o[-1] += acc_o
        bins_e[-1] += acc_e
    o, e = torch.tensor(bins_o, dtype=torch.float64), torch.tensor(bins_e, dtype=torch.float64)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(bins_o) - 1
    assert df >= 1, "too few samples for a chi-square test: every bin must expect >= 5"
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_chi2_helper_matches_known_values():
    # chi2(1) at 3.8415 has survival 0.05; a perfect fit has p-value 1.
    counts = torch.tensor([50.0 + 3.8415 ** 0.5 * 5, 50.0 - 3.8415 ** 0.5 * 5])   # stat = 3.8415, df = 1
    assert abs(chi2_pvalue(counts, [0.5, 0.5]) - 0.05) < 1e-3
    assert chi2_pvalue([25, 25, 50], [0.25, 0.25, 0.5]) == pytest.approx(1.0)
    assert chi2_pvalue([1, 9], [0.0, 1.0]) == 0.0


def seed_rule(p, q, draft_tokens, generator):
    """The lecture sketch's rule (wrong): resample from p itself on rejection, and no bonus token."""
    out = []
    for i, t in enumerate(draft_tokens.tolist()):
        if float(torch.rand((), generator=generator)) < min(1.0, float(p[i, t] / q[i, t])):
            out.append(t)
        else:
            out.append(int(torch.multinomial(p[i], 1, generator=generator)))
            return out
    return out


def random_probs(rows, V, gen, scale=1.5):
    """Random probability rows on the generator's device."""
    return torch.softmax(scale * torch.randn(rows, V, generator=gen, dtype=torch.float64, device=gen.device),
                         -1).float()


def draft_sample(q, gen):
    return torch.multinomial(q, 1, generator=gen).squeeze(-1)            # [g]


def tiny_model(seed, vocab, layers, hidden=32, scale=1.0, max_pos=128):
    torch.manual_seed(seed)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                     num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                                     max_position_embeddings=max_pos)).eval()
    with torch.no_grad():
        for prm in m.parameters():
            prm.mul_(scale)
    return m


@pytest.fixture(scope="module")
def pair(device):
    target, tok = load("tiny", device=device, verbose=False)
    draft, _ = load("tiny-draft", device=device, verbose=False)
    return target, draft, tok


@pytest.fixture(scope="module")
def greedy_refs(pair, prompts):
    """Plain cached greedy decoding of each prompt (30 new tokens) on the models' device, with the logits
    that chose each token: the reference for temperature 0."""
    target = pair[0]
    return [plain_greedy(target, p, 30) for p in prompts]


def assert_greedy(got, ref, n, device, what=""):
    """got [1, T + n] against the reference (ids, logits) of greedy_refs: the prompt, then the first n greedy
    tokens; exact on the CPU, up to a near-tie on CUDA (tests/device_tools.py)."""
    ids, logits = ref
    T = ids.shape[1] - logits.shape[1]
    assert got.shape[1] <= T + n and torch.equal(got[0, :T].cpu(), ids[0, :T].cpu()), what
    assert_greedy_match(got[0, T:], ids[0, T:T + n], logits[0], device, what=what)


@pytest.fixture(scope="module")
def prompts(pair):
    """Prompts on the CPU (the loops move them to the models' device)."""
    _, _, tok = pair
    texts = ["import os\nimport sys\n\n\ndef main(argv=None):\n",
             "class Queue:\n    \"\"\"A simple FIFO queue.\"\"\"\n\n    def __init__(self",
             "for i in range(10):\n    if i %"]
    return [torch.tensor(tok(t)["input_ids"]) for t in texts]


# --------------------------------------------------------------------------------------------------
# (a) The acceptance step reproduces p; the sketch's rule does not
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed,V", [(11, 5), (12, 8)])
def test_first_token_is_distributed_as_p_and_the_seed_rule_is_caught(seed, V):
    gen = torch.Generator().manual_seed(seed)
    p, q = random_probs(2, V, gen), random_probs(1, V, gen)      # g = 1: p has the bonus row
    N = 1500
    ours, wrong = torch.zeros(V), torch.zeros(V)
    for _ in range(N):
        d = draft_sample(q, gen)
        ours[accept_step(p, q, d, gen).tokens[0]] += 1
        wrong[seed_rule(p, q, d, gen)[0]] += 1
    # The sketch's first token has law min(p, q) + (1 - sum min(p, q)) p, not p; make sure the sample
    # is large enough to see it (noncentrality >= 100 fails alpha = 1e-6 with near certainty).
    beta = torch.minimum(p[0], q[0]).sum()
    law_wrong = torch.minimum(p[0], q[0]) + (1 - beta) * p[0]
    assert N * float(((law_wrong - p[0]) ** 2 / p[0]).sum()) > 100
    assert chi2_pvalue(ours, p[0]) > ALPHA
    assert chi2_pvalue(wrong, p[0]) < ALPHA


def test_two_tokens_over_passes_are_distributed_as_p0_times_p1():
    """g = 2 with position-indexed target rows P[j] (independent of the prefix): run passes until two
    tokens are out; their joint law must be P[0] x P[1], whether they came from one pass or two."""
    gen = torch.Generator().manual_seed(7)
    V, g, N = 5, 2, 1500
    P, Q = random_probs(4, V, gen), random_probs(4, V, gen)     # rows for output positions 0..3

    def first_two(rule):
        out = []
        while len(out) < 2:
            j = len(out)
            d = draft_sample(Q[j:j + g], gen)
            res = rule(P[j:j + g + 1], Q[j:j + g], d, gen)
            out += res.tokens if hasattr(res, "tokens") else res
        return out[0], out[1]

    ours, wrong = torch.zeros(V, V), torch.zeros(V, V)
    for _ in range(N):
        a, b = first_two(accept_step)
        ours[a, b] += 1
        a, b = first_two(seed_rule)
        wrong[a, b] += 1
    joint = P[0][:, None] * P[1][None, :]
    assert chi2_pvalue(ours, joint) > ALPHA
    assert chi2_pvalue(wrong, joint) < ALPHA


def test_tokens_per_step_include_the_bonus():
    """E[tokens per step] = 1 + b0 + b0 b1 for g = 2 with b_i = sum_x min(p_i, q_i); the sketch without
    the bonus token emits b0 b1 fewer. With equal rows this is the theory's (1 - a^3) / (1 - a)."""
    gen = torch.Generator().manual_seed(3)
    V, N = 6, 1200
    p, q = random_probs(3, V, gen), random_probs(2, V, gen)
    b = acceptance_rate(p[:2].double(), q.double())
    want = float(1 + b[0] + b[0] * b[1])
    lengths = torch.tensor([len(accept_step(p, q, draft_sample(q, gen), gen).tokens) for _ in range(N)],
                           dtype=torch.float64)
    assert abs(float(lengths.mean()) - want) < 5 * float(lengths.std()) / math.sqrt(N)
    assert float(b[0] * b[1]) > 10 * float(lengths.std()) / math.sqrt(N)   # the no-bonus rule is off by this
    # equal rows: the closed form
    same_p, same_q = p[:1].repeat(3, 1), q[:1].repeat(2, 1)
    a = float(acceptance_rate(same_p[0].double(), same_q[0].double()))
    lengths = torch.tensor([len(accept_step(same_p, same_q, draft_sample(same_q, gen), gen).tokens)
                            for _ in range(N)], dtype=torch.float64)
    assert abs(float(lengths.mean()) - expected_tokens_per_pass(a, 2)) < 5 * float(lengths.std()) / math.sqrt(N)


def test_accept_step_records_and_residual(device):
    """Also on the device: p, q there and a seeded generator there (accept_step draws with it)."""
    gen = torch.Generator(device=device).manual_seed(5)
    p, q = random_probs(4, 7, gen), random_probs(3, 7, gen)
    assert p.device.type == q.device.type == gen.device.type   # a generator says "cuda", a tensor "cuda:0"
    for _ in range(50):
        d = draft_sample(q, gen)
        r = accept_step(p, q, d, gen)
        assert len(r.tokens) == r.num_accepted + 1
        assert r.tokens[:r.num_accepted] == d[:r.num_accepted].tolist()
        assert len(r.draws) == len(r.ratios) == min(r.num_accepted + 1, 3)
        for i, (u, ratio) in enumerate(zip(r.draws, r.ratios)):
            t = int(d[i])
            assert ratio == pytest.approx(min(1.0, float(p[i, t] / q[i, t])))
            assert (u < ratio) == (i < r.num_accepted)
        if r.bonus:
            assert r.num_accepted == 3 and r.residual is None
        else:
            assert r.residual.device == p.device
            i = r.num_accepted
            want = torch.clamp(p[i].double() - q[i].double(), min=0)
            torch.testing.assert_close(r.residual.double(), want / want.sum(), atol=1e-6, rtol=0)
            assert r.residual[r.tokens[-1]] > 0
    # the same generator seed gives the same step
    d = draft_sample(q, gen)
    r1 = accept_step(p, q, d, torch.Generator(device=device).manual_seed(9))
    r2 = accept_step(p, q, d, torch.Generator(device=device).manual_seed(9))
    assert (r1.tokens, r1.draws, r1.num_accepted) == (r2.tokens, r2.draws, r2.num_accepted)


def test_temperature_zero_is_greedy_verification():
    gen = torch.Generator().manual_seed(1)
    V, g = 50, 4
    logits_p, logits_q = torch.randn(g + 1, V, generator=gen), torch.randn(g, V, generator=gen)
    logits_q[:2] = logits_p[:2]                       # the draft agrees on the first two positions
    p, q = probs_from_logits(logits_p, 0.0), probs_from_logits(logits_q, 0.0)
    assert torch.equal(p.argmax(-1), logits_p.argmax(-1)) and torch.equal(p.sum(-1), torch.ones(g + 1))
    d = logits_q.argmax(-1)
    r = accept_step(p, q, d, gen)
    n = int((d == logits_p[:g].argmax(-1)).cumprod(0).sum())
    assert r.num_accepted == n >= 2
    assert r.tokens == d[:n].tolist() + [int(logits_p[n].argmax())]
    # ties: the lowest index, like torch.argmax
    assert int(probs_from_logits(torch.tensor([1.0, 3.0, 3.0]), 0.0).argmax()) == 1


# --------------------------------------------------------------------------------------------------
# (b) Temperature 0: speculative == target greedy (== HF assisted)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("g", [1, 3, 5])
def test_greedy_equals_target_greedy_bundled(pair, prompts, greedy_refs, g, device):
    target, draft, _ = pair
    for prompt, ref, n in zip(prompts, greedy_refs, (23, 17, 30)):   # lengths that end mid-pass
        got, stats = speculative_generate(target, draft, prompt, n, draft_length=g)
        assert got.device == target.device and got.shape == (1, prompt.numel() + n)
        assert_greedy(got, ref, n, device, what=f"g={g} n={n}")
        assert stats.emitted == n and sum(stats.per_pass) == stats.accepted
        assert stats.accepted + stats.passes >= n                 # the last pass may be cut


def test_greedy_equals_target_greedy_random_pair_and_adaptive():
    target, draft = tiny_model(1, 64, 2, scale=4.0), tiny_model(2, 64, 1, scale=4.0)
    gen = torch.Generator().manual_seed(0)
    for T in (1, 2, 9):
        prompt = torch.randint(0, 64, (T,), generator=gen)
        want = plain_greedy(target, prompt, 19)[0]
        for g in (1, 2, 4):
            assert torch.equal(speculative_generate(target, draft, prompt, 19, draft_length=g)[0], want)
        assert torch.equal(speculative_generate(target, draft, prompt, 19, draft_length=4, adaptive=0.5)[0], want)
    # the draft equal to the target accepts everything: g + 1 tokens per pass
    _, stats = speculative_generate(target, target, prompt, 19, draft_length=3)
    assert stats.per_pass[:4] == [3, 3, 3, 3] and stats.acceptance_rate == 1.0


def test_eos_stops_like_greedy(pair, prompts, greedy_refs, device):
    target, draft, _ = pair
    want = greedy_refs[0][0][0, prompts[0].numel():]
    eos = int(want[7])                                           # a token greedy emits at step 7 (or earlier)
    first = int((want == eos).nonzero()[0])
    got, stats = speculative_generate(target, draft, prompts[0], 30, draft_length=4, eos_token_id=eos)
    assert_greedy(got, greedy_refs[0], first + 1, device, what="eos")
    if torch.equal(got[0, prompts[0].numel():], want[:first + 1]):   # (always on the CPU; CUDA: no near-tie)
        assert stats.emitted == first + 1


def test_ours_equals_hf_assisted_equals_greedy(pair, prompts, greedy_refs, device):
    pytest.importorskip("transformers")
    from course_lib.speculative.hf import hf_assisted_generate, load_hf
    target, draft, _ = pair
    prompt = prompts[0]
    ours, _ = speculative_generate(target, draft, prompt, 24, draft_length=3)
    theirs, seconds = hf_assisted_generate(load_hf("tiny").to(device), load_hf("tiny-draft").to(device), prompt, 24,
                                           draft_length=3)
    assert theirs.device == target.device and seconds > 0
    assert_greedy(ours, greedy_refs[0], 24, device, what="ours")
    assert_greedy(theirs, greedy_refs[0], 24, device, what="transformers assisted")


def test_hf_assisted_drops_only_transformers_internal_deprecation():
    """transformers' assisted generation warns about its own call of the assistant (generation_config
    plus max/min_new_tokens); hf_assisted_generate drops that one message, nothing else, and only
    during the call."""
    pytest.importorskip("transformers")
    import logging

    from course_lib.speculative.hf import _quiet_internal_deprecation, hf_assisted_generate
    log = logging.getLogger("transformers.generation.utils")
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    h = Keep(level=logging.WARNING)
    log.addHandler(h)
    try:
        with _quiet_internal_deprecation():
            log.warning("Passing `generation_config` together with generation-related arguments=({'x'}) is deprecated")
            log.warning("some other warning")
        log.warning("Passing `generation_config` together with generation-related arguments=({'y'}) outside")
        hf_assisted_generate("tiny", "tiny-draft", [1, 2, 3, 4, 5], 6, draft_length=2)
    finally:
        log.removeHandler(h)
    assert seen[:2] == ["some other warning",
                        "Passing `generation_config` together with generation-related arguments=({'y'}) outside"]
    assert not any("deprecated" in m for m in seen[2:]), seen


# --------------------------------------------------------------------------------------------------
# (c) The caches hold exactly the K/V of the kept tokens after every pass
# --------------------------------------------------------------------------------------------------
@torch.no_grad()
def fresh_cache(model, ids):
    cache = ContiguousCache()
    model(ids, cache=cache)
    return cache


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_in_sync_after_every_pass(pair, prompts, temperature, device):
    target, draft, _ = pair
    seen = {"passes": 0, "lagging": 0}

    def on_pass(ids, tcache, dcache):
        n = ids.shape[1]
        assert tcache.get_seq_length() == n - 1                  # the last token is pending
        d_len = dcache.get_seq_length()
        # n - 2 after a pass with all drafts kept; n - 3 only after the last pass, when one token was left to
        # emit and the draft had nothing to propose (budget 0: it did not run)
        assert d_len in (n - 1, n - 2) or (d_len == n - 3 and n == end), (n, d_len, end)
        seen["lagging"] += d_len == n - 2
        for model, cache, length in ((target, tcache, n - 1), (draft, dcache, d_len)):
            ref = fresh_cache(model, ids[:, :length])
            tol = tol_for(device, dict(atol=1e-5, rtol=1e-4))
            for layer in range(len(ref.k)):
                torch.testing.assert_close(cache.k[layer], ref.k[layer], **tol)
                torch.testing.assert_close(cache.v[layer], ref.v[layer], **tol)
        seen["passes"] += 1

    end = prompts[1].numel() + 24
    _, stats = speculative_generate(target, draft, prompts[1], 24, draft_length=3, temperature=temperature,
                                    generator=torch.Generator(device=device).manual_seed(4), on_pass=on_pass)
    assert seen["passes"] == stats.passes
    # both cases happened: a rejection (draft at n - 1) and a pass with all drafts kept (n - 2)
    assert stats.rejections > 0 and seen["lagging"] > 0


# --------------------------------------------------------------------------------------------------
# (d) Sampling: the first two tokens of speculative_generate follow the target's exact law
# --------------------------------------------------------------------------------------------------
@torch.no_grad()
def target_joint(target, prompt, temperature=1.0, top_k=None):
    """Exact P(x1, x2) of sampling two tokens from `target` after `prompt`, [V, V]."""
    V = target.config.vocab_size
    p1 = probs_from_logits(target(prompt[None])[0, -1], temperature, top_k)
    rows = []
    for x in range(V):
        ext = torch.cat([prompt, torch.tensor([x], device=prompt.device)])
        rows.append(probs_from_logits(target(ext[None])[0, -1], temperature, top_k))
    return p1[:, None] * torch.stack(rows)


@pytest.mark.parametrize("kw,trials", [(dict(temperature=1.0, draft_length=2), 600),
                                       (dict(temperature=0.8, top_k=3, draft_length=3, adaptive=0.6), 500)])
def test_sampled_speculative_matches_target_law(kw, trials, device):
    # A 4-token vocabulary and two different random one-layer models (a ~ 0.63 at temperature 1), a
    # one-token prompt (no prefill: cheap trials); every cell of the 4 x 4 joint expects >= 5 at 500 trials.
    # On each device: the models there, and a seeded generator there (every draw of the loop uses it).
    V = 4
    target, draft = tiny_model(3, V, 1, hidden=16, scale=3.0), tiny_model(4, V, 1, hidden=16, scale=3.0)
    target, draft = target.to(device), draft.to(device)
    prompt = torch.tensor([3], device=device)
    joint = target_joint(target, prompt, kw["temperature"], kw.get("top_k")).cpu()
    counts = torch.zeros(V, V)
    rejected = 0
    for s in range(trials):
        gen = torch.Generator(device=device).manual_seed(s)
        ids, stats = speculative_generate(target, draft, prompt, 3, generator=gen, **kw)
        ids = ids.cpu()
        counts[ids[0, 1], ids[0, 2]] += 1
        rejected += stats.rejections
    assert rejected > trials // 10           # the draft really differs: the residual path is exercised
    if "top_k" in kw:                        # top-k removed tokens: they must never appear
        assert counts[joint == 0].sum() == 0 and (joint == 0).any()
    assert chi2_pvalue(counts, joint) > ALPHA


# --------------------------------------------------------------------------------------------------
# Theory
# --------------------------------------------------------------------------------------------------
def test_theory_formulas():
    for a in (0.0, 0.3, 0.8, 0.999):
        for g in (0, 1, 4):
            assert expected_tokens_per_pass(a, g) == pytest.approx(sum(a ** k for k in range(g + 1)))
    assert expected_tokens_per_pass(1.0, 5) == 6
    assert speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8 ** 5) / 0.2 / 1.4)
    assert speedup(0.8, 4, 0.1, verify_cost=2.0) == pytest.approx((1 - 0.8 ** 5) / 0.2 / 2.4)
    for a, c in ((0.6, 0.23), (0.9, 0.05), (0.3, 0.5)):
        cost = lambda g: 1 + 0.15 * g                               # noqa: E731
        best = max(range(1, 17), key=lambda g: (speedup(a, g, c, cost(g)), -g))
        assert optimal_draft_length(a, c, verify_cost=cost) == best
    assert optimal_draft_length(0.9, 0.01, max_g=16) > optimal_draft_length(0.5, 0.01, max_g=16)
    gen = torch.Generator().manual_seed(0)
    p, q = random_probs(3, 9, gen), random_probs(3, 9, gen)
    torch.testing.assert_close(acceptance_rate(p, q), 1 - 0.5 * (p - q).abs().sum(-1))
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="acceptance rate"):
            expected_tokens_per_pass(bad, 3)
    with pytest.raises(ValueError, match="draft length"):
        speedup(0.5, -1, 0.1)


def test_break_even_acceptance():
    """The a at which speculative decoding is as fast as plain decoding: speedup = 1 there, above 1 just above
    it and below 1 just below; a = c at g = 1; rising with g (the k-th draft counts a^k for the same c); 0 when
    a pass is free, None when no a pays, 1 for a draft as dear as its target (no digits lost near 1)."""
    for c, g, v in ((0.1, 1, 1.0), (0.1, 4, 1.0), (0.0955, 6, 1.0), (0.3, 3, 1.0), (0.05, 8, 1.6), (0.2, 2, 0.9)):
        a = break_even_acceptance(c, g, v)
        assert 0 < a < 1 and speedup(a, g, c, v) == pytest.approx(1, abs=1e-12)
        assert speedup(a - 1e-6, g, c, v) < 1 < speedup(a + 1e-6, g, c, v)
    assert break_even_acceptance(0.1, 1) == pytest.approx(0.1, abs=1e-15)
    levels = [break_even_acceptance(0.05, g) for g in range(1, 17)]
    assert all(x < y for x, y in zip(levels, levels[1:]))
    assert break_even_acceptance(0.0, 3) == 0.0 and break_even_acceptance(0.1, 2, verify_cost=0.5) == 0.0
    assert break_even_acceptance(1.0, 5) == 1.0 and break_even_acceptance(1.0 + 1e-9, 5) is None
    assert break_even_acceptance(0.1, 4, verify_cost=5.0) is None          # 5 tokens at most, for 5.4 steps
    for bad in ((-0.1, 2), (0.1, 0), (0.1, 1.5)):
        with pytest.raises(ValueError):
            break_even_acceptance(*bad)
    with pytest.raises(ValueError, match="verify_cost"):
        break_even_acceptance(0.1, 2, verify_cost=0.0)


def test_measure_reports_consistent_rows(pair, prompts):
    target, draft, _ = pair
    rows = measure(target, draft, prompts[:1], draft_lengths=(1, 3), max_new_tokens=13, repeats=1)
    assert [r["g"] for r in rows] == [1, 3]
    for r in rows:
        assert 0 <= r["a"] <= r["a_tested"] <= 1
        assert 1 <= r["tokens_per_pass"] <= r["g"] + 1
        assert r["c"] > 0 and r["verify_cost"] > 0 and r["speedup_measured"] > 0
        if r["drafts_per_pass"] == r["g"]:                      # every pass drafted g: the closed form
            assert r["speedup_refined"] == pytest.approx(speedup(r["a_tested"], r["g"], r["c"], r["verify_cost"]))


# --------------------------------------------------------------------------------------------------
# Prompt lookup
# --------------------------------------------------------------------------------------------------
def test_propose_ngram():
    t = torch.tensor([5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 5, 6, 7])
    assert propose_ngram(t, 3, max_ngram=3).tolist() == [2, 3, 5]          # latest earlier "5 6 7"
    assert propose_ngram(t, 10, max_ngram=3).tolist() == [2, 3, 5, 6, 7]
    assert propose_ngram(torch.tensor([1, 2, 3, 4]), 3).tolist() == []     # nothing repeats
    assert propose_ngram(torch.tensor([4, 1, 2, 9, 2]), 2, max_ngram=3).tolist() == [9, 2]   # falls to n=1


def test_prompt_lookup_equals_greedy(pair, prompts, device):
    target, _, tok = pair
    edit = editing_prompts(tok, num=1)[0][0]
    for prompt in (edit, prompts[2]):
        ref = plain_greedy(target, prompt, 25)
        got, stats = prompt_lookup_generate(target, prompt, 25, draft_length=6)
        assert_greedy(got, ref, 25, device, what="prompt lookup")
        assert stats.emitted == 25
    assert stats.passes <= 25


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------
def test_bad_input(pair, prompts):
    target, draft, tok = pair
    other = tiny_model(0, 100, 1)
    with pytest.raises(ValueError, match="2048.*100|100.*2048"):
        speculative_generate(target, other, prompts[0], 4)
    with pytest.raises(ValueError, match="draft_length"):
        speculative_generate(target, draft, prompts[0], 4, draft_length=0)
    with pytest.raises(ValueError, match="empty"):
        speculative_generate(target, draft, [], 4)
    with pytest.raises(TypeError, match="integer"):
        speculative_generate(target, draft, torch.tensor([1.0, 2.0]), 4)
    with pytest.raises(ValueError, match="batch size"):
        speculative_generate(target, draft, torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="adaptive"):
        speculative_generate(target, draft, prompts[0], 4, adaptive=1.5)
    with pytest.raises(ValueError, match="context"):
        speculative_generate(target, draft, prompts[0], 600)
    check_tokenizers(tok, tok)
    from transformers import AutoTokenizer
    from course_lib.models import bundled_path
    shuffled = AutoTokenizer.from_pretrained(str(bundled_path("tiny")))
    shuffled.add_tokens(["<extra_token_for_the_test>"])
    with pytest.raises(ValueError, match="tokenizers differ"):
        check_tokenizers(tok, shuffled)

    p = torch.full((3, 4), 0.25)
    q = torch.full((2, 4), 0.25)
    d = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"\[3, V\]"):
        accept_step(p[:2], q, d)
    with pytest.raises(ValueError, match=r"shape \[g\]"):
        accept_step(p, q, d[None])
    with pytest.raises(ValueError, match="sum to 1"):
        accept_step(p * 1.1, q, d)
    q0 = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    with pytest.raises(ValueError, match="q\\[0, 0\\] = 0"):
        accept_step(p, q0, d)
    with pytest.raises(ValueError, match="vocabulary size"):
        accept_step(p, torch.full((2, 5), 0.2), d)
    with pytest.raises(TypeError, match="integer"):
        accept_step(p, q, d.float())
