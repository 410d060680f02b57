"""course_lib.generation: sampling filters against transformers' logits warpers, sampling frequencies
against the filtered softmax, and the generate loop against transformers' generate on the bundled model."""
import math

import numpy as np
import pytest
import torch

from course_lib.generation import (GenerateOutput, SpecStats, TokenEvent, Trace, apply_repetition_penalty,
                                   apply_temperature, generate, greedy, model_logits, sample, sampling_probs,
                                   top_k_filter, top_p_filter)
from course_lib.kvcache import (ContiguousCache, H2OCache, MultiTierCache, QuantizedCache, SinkCache,
                                SlidingWindowCache, StaticCache)
from course_lib.models import LlamaConfig, LlamaForCausalLM, bundled_path, load
from device_tools import assert_greedy_match

lp = pytest.importorskip("transformers.generation.logits_process")


# --------------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    model, tok = load("tiny", device="cpu", verbose=False)
    return model, tok


@pytest.fixture(scope="module")
def hf_tiny():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(bundled_path("tiny"))).eval()


@pytest.fixture(scope="module")
def tiny_on(device):
    """The bundled model on each device of the `device` fixture (tests/conftest.py)."""
    model, tok = load("tiny", device=device, verbose=False)
    return model, tok


@pytest.fixture(scope="module")
def hf_tiny_on(device):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(bundled_path("tiny")), dtype=torch.float32).to(device).eval()


def _logits(rows=64, vocab=257, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale


# --------------------------------------------------------------------------------------------------
# filters vs transformers
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 5, 40, 256, 257, 1000])
def test_top_k_matches_transformers(k):
    x = _logits(seed=k)
    ref = lp.TopKLogitsWarper(top_k=k)(None, x.clone())
    assert torch.equal(top_k_filter(x, k), ref)


@pytest.mark.parametrize("scale", [0.3, 3.0, 10.0])
def test_top_p_matches_transformers(scale):
    x = _logits(rows=200, seed=int(scale * 10), scale=scale)
    for p in [1e-6, 0.05, 0.3, 0.5, 0.73, 0.9, 0.95, 0.999, 1.0]:
        ref = lp.TopPLogitsWarper(top_p=p)(None, x.clone())
        got = top_p_filter(x, p)
        assert torch.equal(torch.isinf(got), torch.isinf(ref)), f"p={p}"
        assert torch.equal(got, ref), f"p={p}"


def test_temperature_matches_transformers():
    x = _logits()
    for t in [0.1, 0.7, 1.0, 2.5]:
        assert torch.allclose(apply_temperature(x, t), lp.TemperatureLogitsWarper(t)(None, x.clone()))


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.2, 1.3, 2.0, 10.0])
def test_repetition_penalty_matches_transformers(penalty):
    """Random logits of both signs and random histories (repeats, and ids at both ends of the vocabulary):
    bit for bit transformers' RepetitionPenaltyLogitsProcessor, which takes the same ids."""
    g = torch.Generator().manual_seed(int(penalty * 10))
    for rows, vocab, n in [(64, 257, 30), (8, 2048, 200), (3, 11, 40), (5, 50, 1)]:
        x = torch.randn(rows, vocab, generator=g) * 3
        ids = torch.randint(0, vocab, (rows, n), generator=g)
        ids[0, :2] = torch.tensor([vocab - 1, 0])[:n]             # both ends of the vocabulary
        ref = lp.RepetitionPenaltyLogitsProcessor(penalty=float(penalty))(ids, x.clone())
        assert torch.equal(apply_repetition_penalty(x, ids, penalty), ref), (rows, vocab, n)


def test_repetition_penalty_lowers_every_seen_token_and_no_other():
    """Whatever a seen logit's sign, penalty > 1 lowers it (the paper's plain division would raise a
    negative one) and the unseen logits keep their values; a list of ids for one row of logits works too."""
    x = torch.tensor([2.0, -2.0, 0.0, 1.0, -0.5])
    out = apply_repetition_penalty(x, [0, 1, 1, 2], 2.0)
    assert out.tolist() == [1.0, -4.0, 0.0, 1.0, -0.5]
    seen_probs = torch.softmax(out, -1)[:2] / torch.softmax(x, -1)[:2]
    assert bool((seen_probs < 1).all())
    assert torch.equal(apply_repetition_penalty(x, [], 1.3), x)             # nothing seen yet
    assert torch.equal(apply_repetition_penalty(x, [0, 3], 1.0), x)         # 1 is no penalty
    x3 = torch.randn(2, 3, 7)
    ids3 = torch.randint(0, 7, (2, 3, 4))
    ref = lp.RepetitionPenaltyLogitsProcessor(1.3)(ids3.reshape(6, 4), x3.reshape(6, 7).clone()).reshape(2, 3, 7)
    assert torch.equal(apply_repetition_penalty(x3, ids3, 1.3), ref)        # any leading dims


@pytest.mark.parametrize("call,error,match", [
    (lambda: apply_repetition_penalty(torch.zeros(5), [1], 0), ValueError, "penalty must be a finite positive"),
    (lambda: apply_repetition_penalty(torch.zeros(5), [1], -1.2), ValueError, "penalty"),
    (lambda: apply_repetition_penalty(torch.zeros(5), [1], float("nan")), ValueError, "penalty"),
    (lambda: apply_repetition_penalty(torch.zeros(5), [1], float("inf")), ValueError, "penalty"),
    (lambda: apply_repetition_penalty(torch.zeros(5), [1], True), ValueError, "penalty"),
    (lambda: apply_repetition_penalty(torch.zeros(5), [5], 1.2), ValueError, r"tokens must be token ids in \[0, 5\)"),
    (lambda: apply_repetition_penalty(torch.zeros(5), [-1], 1.2), ValueError, "tokens"),
    (lambda: apply_repetition_penalty(torch.zeros(2, 5), torch.zeros(3, 2, dtype=torch.long), 1.2), ValueError,
     "tokens must have shape"),
    (lambda: apply_repetition_penalty(torch.zeros(5), torch.zeros(2), 1.2), TypeError, "tokens must hold integer"),
    (lambda: apply_repetition_penalty(torch.zeros(5, dtype=torch.long), [1], 1.2), TypeError, "logits"),
])
def test_bad_repetition_penalty_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_top_p_keeps_the_crossing_token_and_the_top_token():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    kept = lambda p: (~torch.isinf(top_p_filter(logits, p))).nonzero().flatten().tolist()  # noqa: E731
    assert kept(0.45) == [0]  # 0.5 already reaches 0.45
    assert kept(0.55) == [0, 1]  # 0.5 < 0.55: the token that crosses p (0.3) is kept
    assert kept(0.85) == [0, 1, 2]
    assert kept(0.97) == [0, 1, 2, 3]
    assert kept(1e-9) == [0]  # the most likely token is always kept
    assert kept(1.0) == [0, 1, 2, 3]
    # the order in the vocabulary does not matter
    perm = torch.tensor([2, 0, 3, 1])
    assert (~torch.isinf(top_p_filter(logits[perm], 0.55))).nonzero().flatten().tolist() == [1, 3]


def test_top_k_keeps_ties_and_works_on_any_batch_shape():
    logits = torch.tensor([1.0, 3.0, 3.0, 2.0])
    assert torch.equal(top_k_filter(logits, 1), torch.tensor([-math.inf, 3.0, 3.0, -math.inf]))
    x = torch.randn(2, 3, 50)
    out = top_k_filter(x, 7)
    assert out.shape == x.shape and int((~torch.isinf(out)).sum(-1).min()) == 7
    assert top_p_filter(x, 0.5).shape == x.shape


def test_numpy_integers_are_accepted():
    x = _logits(rows=4)
    assert torch.equal(top_k_filter(x, np.int64(3)), top_k_filter(x, 3))
    assert torch.equal(top_p_filter(x, np.float64(0.5)), top_p_filter(x, 0.5))


def test_filters_do_not_modify_their_input():
    x = _logits(rows=4)
    x0 = x.clone()
    top_k_filter(x, 3), top_p_filter(x, 0.5), top_p_filter(x, 1.0), apply_temperature(x, 0.5)
    assert torch.equal(x, x0)


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_top_k(bad):
    with pytest.raises(ValueError, match="top_k"):
        top_k_filter(torch.zeros(5), bad)
    if bad is not None:
        with pytest.raises(ValueError, match="top_k"):
            sample(torch.zeros(5), top_k=bad)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.01, float("nan"), "0.9"])
def test_bad_top_p(bad):
    with pytest.raises(ValueError, match="top_p"):
        top_p_filter(torch.zeros(5), bad)
    with pytest.raises(ValueError, match="top_p"):
        sample(torch.zeros(5), top_p=bad)


@pytest.mark.parametrize("bad", [-0.5, -1, float("nan"), float("inf")])
def test_bad_temperature(bad):
    with pytest.raises(ValueError, match="temperature"):
        sample(torch.zeros(5), temperature=bad)
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(torch.zeros(5), bad)
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(torch.zeros(5), 0)  # greedy has no rescaled logits


def test_bad_logits():
    with pytest.raises(TypeError, match="logits"):
        sample(torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="logits"):
        top_k_filter([1.0, 2.0], 1)
    with pytest.raises(ValueError, match="logits"):
        sample(torch.zeros(3, 0))


# --------------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------------
def test_temperature_zero_is_greedy():
    x = _logits(rows=32)
    assert torch.equal(sample(x, temperature=0), x.argmax(-1))
    assert torch.equal(sample(x, temperature=0, top_k=3, top_p=0.5), x.argmax(-1))
    assert torch.equal(greedy(x), x.argmax(-1))
    p = sampling_probs(x, temperature=0)
    assert torch.equal(p.argmax(-1), x.argmax(-1)) and torch.equal(p.sum(-1), torch.ones(32))
    # ties: the first maximal index, like torch.argmax and HF
    assert int(sample(torch.tensor([0.0, 2.0, 2.0]), temperature=0)) == 1


def test_sampling_probs_is_softmax_of_filtered_logits_in_hf_order():
    x = _logits(rows=16)
    for t, k, p in [(1.0, None, None), (0.7, 20, None), (1.5, None, 0.8), (0.5, 30, 0.9)]:
        ref = x.clone()
        ref = lp.TemperatureLogitsWarper(t)(None, ref)
        if k is not None:
            ref = lp.TopKLogitsWarper(k)(None, ref)
        if p is not None:
            ref = lp.TopPLogitsWarper(p)(None, ref)
        assert torch.allclose(sampling_probs(x, t, k, p), torch.softmax(ref, -1), atol=1e-7)


def test_seeded_generator_reproduces_draws(device):
    """A seeded generator on the logits' device (a CUDA multinomial refuses a CPU generator)."""
    x = _logits(rows=100).to(device)
    a = sample(x, 1.0, 50, 0.9, generator=torch.Generator(device=device).manual_seed(7))
    b = sample(x, 1.0, 50, 0.9, generator=torch.Generator(device=device).manual_seed(7))
    c = sample(x, 1.0, 50, 0.9, generator=torch.Generator(device=device).manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (100,) and a.dtype == torch.long and a.device == x.device


def _chi2_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile; z=3.719 is the 1 - 1e-4 normal quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("t,k,p", [(1.0, None, None), (0.8, 6, None), (1.3, None, 0.8), (0.9, 8, 0.9)])
def test_sampling_frequencies_match_filtered_softmax(t, k, p, device):
    logits = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.6, 0.3, 0.1, -0.2, -0.8, -1.5, -2.5, -4.0], device=device)
    n = 40_000
    draws = sample(logits.expand(n, -1), t, k, p, generator=torch.Generator(device=device).manual_seed(1234))
    counts = torch.bincount(draws, minlength=logits.numel()).double().cpu()
    probs = sampling_probs(logits, t, k, p).double().cpu()
    assert counts[probs == 0].sum() == 0, "a filtered token was sampled"
    expected = probs[probs > 0] * n
    chi2 = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
    df = int((probs > 0).sum()) - 1
    assert chi2 < _chi2_critical(df), f"chi2={chi2:.1f} with {df} degrees of freedom"


# --------------------------------------------------------------------------------------------------
# generate
# --------------------------------------------------------------------------------------------------
PROMPTS = ["def main(argv):\n", "import os\nimport sys\n\n", "class Parser:\n    def __init__(self, text):"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generate_equals_transformers(tiny_on, hf_tiny_on, prompt, device):
    """Both models on the same device. CPU: the same tokens, exactly. CUDA: the two implementations run
    different kernels (our attention module vs transformers' SDPA call, other matmul shapes), so their
    logits differ in the last bits (~1e-5); where the top two logits are that close, greedy may pick
    either. There the tokens must agree up to a first difference that is such a near-tie, and the logits
    of both within the device's tolerance up to it (tests/device_tools.py); after it the continuations
    are different texts and are not compared."""
    model, tok = tiny_on
    ids = tok(prompt)["input_ids"]
    n = 24
    tokens, trace = generate(model, ids, n, eos_token_id=tok.eos_token_id)
    out = hf_tiny_on.generate(torch.tensor([ids], device=device), do_sample=False, max_new_tokens=n,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                              output_logits=True, return_dict_in_generate=True)
    ref = out.sequences[0, len(ids):]
    hf_logits = torch.cat(out.logits)                                        # [n_ref, V] per step
    with torch.no_grad():                                                    # ours, teacher-forced on our tokens
        seq = torch.tensor([ids + tokens.tolist()], device=device)
        our_logits = model_logits(model, seq)[0, len(ids) - 1:-1]           # [n, V]: step i chose token i
    assert_greedy_match(tokens, ref, hf_logits, device, our_logits, what=repr(prompt))
    assert len(trace) == len(tokens) and trace.prompt_tokens == len(ids)
    assert trace.token_ids == tokens.tolist()


def test_greedy_without_eos_runs_to_max_new_tokens(tiny, hf_tiny):
    model, tok = tiny
    ids = tok(PROMPTS[0])["input_ids"]
    tokens, _ = generate(model, ids, 20)
    cfg = hf_tiny.generation_config
    old = cfg.eos_token_id
    try:
        cfg.eos_token_id = None
        ref = hf_tiny.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=20,
                               pad_token_id=tok.pad_token_id)[0, len(ids):]
    finally:
        cfg.eos_token_id = old
    assert len(tokens) == 20 and tokens.tolist() == ref.tolist()


def test_sampled_generate_equals_transformers_with_same_seed(tiny, hf_tiny):
    """Same warpers in the same order and one torch.multinomial per step: with the same global seed,
    the draws match transformers' sampled generate token for token."""
    model, tok = tiny
    ids = tok(PROMPTS[1])["input_ids"]
    for t, k, p in [(0.8, 0, 1.0), (1.2, 40, 0.9)]:
        torch.manual_seed(99)
        tokens, _ = generate(model, ids, 20, temperature=t, top_k=k or None, top_p=p,
                             eos_token_id=tok.eos_token_id)
        torch.manual_seed(99)
        ref = hf_tiny.generate(torch.tensor([ids]), do_sample=True, temperature=t, top_k=k, top_p=p,
                               max_new_tokens=20, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id)[0, len(ids):]
        assert tokens.tolist() == ref.tolist(), (t, k, p)


@pytest.mark.parametrize("penalty", [1.2, 1.3])
def test_repetition_penalty_in_generate_equals_transformers(tiny, hf_tiny, penalty):
    """generate(repetition_penalty=...) is transformers' generate with the same penalty (prompt tokens count
    too, as there): greedy token for token with and without a KV cache, and sampled with the same global
    seed (the penalty comes before the warpers in both)."""
    model, tok = tiny
    ids = tok(PROMPTS[2])["input_ids"]
    hf_args = dict(max_new_tokens=40, repetition_penalty=penalty, eos_token_id=None, pad_token_id=tok.pad_token_id)
    ref = hf_tiny.generate(torch.tensor([ids]), do_sample=False, **hf_args)[0, len(ids):].tolist()
    plain = generate(model, ids, 40).tokens.tolist()
    assert generate(model, ids, 40, repetition_penalty=penalty).tokens.tolist() == ref != plain
    assert generate(model, ids, 40, repetition_penalty=penalty, cache="contiguous").tokens.tolist() == ref
    torch.manual_seed(5)
    ours = generate(model, ids, 30, temperature=0.8, top_p=0.9, repetition_penalty=penalty).tokens.tolist()
    torch.manual_seed(5)
    hf_args["max_new_tokens"] = 30
    ref = hf_tiny.generate(torch.tensor([ids]), do_sample=True, temperature=0.8, top_k=0, top_p=0.9,
                           **hf_args)[0, len(ids):].tolist()
    assert ours == ref


def test_repetition_penalty_per_row_in_a_batch(tiny):
    """One penalty per row: each row of a batch (left-padded prompts too: the padding is no token of the row)
    decodes as it would alone; the returned logits are the penalized ones that chose the tokens."""
    model, tok = tiny
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    pens = [1.0, 1.3, 1.2]
    batch = generate(model, prompts, 16, repetition_penalty=pens, cache="contiguous", return_logits=True)
    for p, r, row, logits in zip(prompts, pens, batch.tokens, batch.logits):
        alone = generate(model, p, 16, repetition_penalty=r, return_logits=True)
        assert row.tolist() == alone.tokens.tolist()
        assert torch.allclose(logits, alone.logits, atol=1e-4)
        with torch.no_grad():                      # the raw logits, teacher-forced on the row's tokens: [n, V]
            raw = model_logits(model, torch.tensor([p + row.tolist()]))[0, len(p) - 1:-1]
        history = torch.tensor(p + row.tolist())
        penalized = torch.stack([apply_repetition_penalty(raw[i], history[:len(p) + i], r) for i in range(16)])
        assert torch.allclose(logits, penalized, atol=1e-4)


def test_generate_accepts_hf_models_and_tensor_prompts(tiny, hf_tiny):
    model, tok = tiny
    ids = tok(PROMPTS[2])["input_ids"]
    a, _ = generate(model, ids, 12)
    b, _ = generate(hf_tiny, torch.tensor([ids]), 12)
    c, _ = generate(model, torch.tensor(ids), 12)
    d, _ = generate(model, [np.int64(i) for i in ids], np.int64(12))
    assert a.tolist() == b.tolist() == c.tolist() == d.tolist()
    assert model_logits(hf_tiny, torch.tensor([ids])).shape == (1, len(ids), model.config.vocab_size)


def test_seeded_sampling_in_generate_is_reproducible(tiny_on, device):
    """The seeded generator lives on the model's device (where the logits are sampled)."""
    model, tok = tiny_on
    ids = tok(PROMPTS[0])["input_ids"]
    runs = [generate(model, ids, 15, temperature=1.0, top_p=0.95,
                     generator=torch.Generator(device=device).manual_seed(s))[0].tolist() for s in (5, 5, 6)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_callback_events_and_trace(tiny):
    model, tok = tiny
    ids = tok(PROMPTS[0])["input_ids"]
    events = []
    out = generate(model, ids, 8, callback=events.append)
    assert isinstance(out, GenerateOutput)
    tokens, trace = out
    assert isinstance(trace, Trace) and all(isinstance(e, TokenEvent) for e in events)
    assert events == trace.events
    assert [e.index for e in events] == list(range(8))
    assert [e.token_id for e in events] == tokens.tolist()
    assert all(e.start == trace.start for e in events)
    times = trace.times
    assert trace.start < times[0] and all(a <= b for a, b in zip(times, times[1:]))
    assert trace.ttft == events[0].elapsed > 0
    assert math.isclose(trace.tpot, (times[-1] - times[0]) / 7)
    assert math.isclose(trace.e2e, times[-1] - trace.start)
    assert math.isclose(trace.tokens_per_second, 8 / trace.e2e)
    m = trace.metrics()
    assert m.n_tokens == 8 and m.ttft == trace.ttft


def test_callback_returning_true_stops(tiny):
    model, tok = tiny
    tokens, trace = generate(model, tok(PROMPTS[0])["input_ids"], 10, callback=lambda e: e.index == 2)
    assert len(tokens) == 3 and len(trace) == 3


def test_eos_stops_and_is_included(tiny):
    model, tok = tiny
    ids = tok(PROMPTS[0])["input_ids"]
    free, _ = generate(model, ids, 6)
    stop_at = free[2].item()
    first = free.tolist().index(stop_at)
    tokens, _ = generate(model, ids, 6, eos_token_id=[12345, stop_at])
    assert tokens.tolist() == free.tolist()[:first + 1]


def test_zero_new_tokens_gives_an_empty_trace(tiny):
    model, tok = tiny
    tokens, trace = generate(model, tok(PROMPTS[0])["input_ids"], 0)
    assert tokens.numel() == 0 and len(trace) == 0
    with pytest.raises(ValueError, match="empty"):
        trace.ttft


def test_context_limit(tiny):
    model, _ = tiny
    ctx = model.config.max_position_embeddings
    ids = [1] * (ctx - 1)
    tokens, _ = generate(model, ids, 2)  # the first new token is fed at the last position; the second never is
    assert len(tokens) == 2
    with pytest.raises(ValueError, match="context"):
        generate(model, ids, 3)
    with pytest.raises(ValueError, match="context"):
        generate(model, [1] * (ctx + 1), 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(input_ids=[]), "input_ids"),
    (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), "input_ids"),
    (dict(input_ids=torch.zeros(1, 2, 3, dtype=torch.long)), "input_ids"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=2.0), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(eos_token_id="x"), "eos_token_id"),
    (dict(repetition_penalty=0), "repetition_penalty must be a finite positive number, got 0"),
    (dict(repetition_penalty=-1.3), "repetition_penalty"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(repetition_penalty="1.2"), "repetition_penalty"),
    (dict(repetition_penalty=True), "repetition_penalty"),
    (dict(repetition_penalty=None), "repetition_penalty"),
    (dict(repetition_penalty=[1.2, 1.3]), "repetition_penalty: got 2 values for a batch of 1"),
])
def test_generate_bad_arguments(tiny, kwargs, match):
    model, _ = tiny
    args = dict(input_ids=[1, 2, 3], max_new_tokens=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        generate(model, **args)


def test_repetition_penalty_is_refused_with_a_draft(tiny):
    """Speculative decoding would need the penalty in the draft's proposals and in the verification alike;
    generate refuses it rather than verifying against the wrong distribution. 1.0 (no penalty) passes."""
    model, tok = tiny
    draft, _ = load("tiny-draft", device="cpu", verbose=False)
    ids = tok(PROMPTS[0])["input_ids"]
    with pytest.raises(ValueError, match="repetition_penalty=1.2: speculative decoding"):
        generate(model, ids, 4, draft=draft, repetition_penalty=1.2)
    assert generate(model, ids, 4, draft=draft, repetition_penalty=1.0).tokens.tolist() == \
        generate(model, ids, 4).tokens.tolist()


def test_generate_type_errors(tiny):
    model, _ = tiny
    with pytest.raises(TypeError, match="input_ids"):
        generate(model, "hello", 2)
    with pytest.raises(TypeError, match="input_ids"):
        generate(model, torch.zeros(3), 2)
    with pytest.raises(TypeError, match="callback"):
        generate(model, [1, 2], 2, callback=3)


# --------------------------------------------------------------------------------------------------
# One loop: every cache, batches, the draft hook, the context edge
# --------------------------------------------------------------------------------------------------
def random_model(seed, vocab=64, layers=1, hidden=32, context=32):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context)
    return LlamaForCausalLM(cfg).eval()


def test_every_cache_gives_the_recompute_greedy_tokens(tiny):
    """Caches that keep every token here (budgets above prompt + new tokens) are exact: through the one
    loop they give the tokens of the no-cache baseline, and logits within float rounding."""
    model, tok = tiny
    ids = tok("def parse(text):\n    ")["input_ids"]
    n = 16
    want = generate(model, ids, n, return_logits=True)                 # recompute, no cache
    caches = {"contiguous": "contiguous", "static (by name)": "static", "ContiguousCache": ContiguousCache(),
              "StaticCache": StaticCache.for_model(model, 1, 64), "SlidingWindowCache": SlidingWindowCache(64),
              "SinkCache": SinkCache(window=60, sinks=4), "H2OCache": H2OCache(heavy=32, recent=32),
              "QuantizedCache": QuantizedCache(bits=8, residual=64), "MultiTierCache": MultiTierCache(recent=64)}
    assert len(ids) + n < 60
    for name, cache in caches.items():
        got = generate(model, ids, n, cache=cache, return_logits=True)
        assert torch.equal(got.tokens, want.tokens), name
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4, msg=name)
        assert len(got.trace.events) == n


def test_banded_window_cache_takes_its_mask_through_generate():
    """A window smaller than the prompt needs the cache's banded prefill mask: generate must equal feeding
    the tokens one at a time (where no mask is needed), which it would not with the plain causal mask."""
    model = random_model(3, context=64)
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(0))
    got = generate(model, ids, 6, cache=SlidingWindowCache(8), return_logits=True)
    cache, logits = SlidingWindowCache(8), None
    for t in ids:                                                         # token by token: no mask needed
        logits = model(t.view(1, 1), cache=cache)[0, -1]
    torch.testing.assert_close(got.logits[0], logits, rtol=1e-4, atol=1e-4)


def test_batch_equals_each_row_alone():
    model = random_model(4)
    ids = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    for cache in (None, "contiguous", "static"):
        out = generate(model, ids, 5, cache=cache, return_logits=True)
        assert out.tokens.shape == (3, 5) and out.logits.shape == (3, 5, 64) and len(out.trace.events) == 5
        for r in range(3):
            alone = generate(model, ids[r], 5, cache=cache, return_logits=True)
            assert torch.equal(out.tokens[r], alone.tokens), (cache, r)
            torch.testing.assert_close(out.logits[r], alone.logits, rtol=1e-4, atol=1e-4)
    assert generate(model, ids[:1], 5).tokens.shape == (5,)                # one request: [n], as before


@pytest.mark.parametrize("g", [1, 3])
def test_draft_hook_greedy_equals_plain_greedy(tiny, g):
    """Speculative decoding through the one loop (a random draft: many rejections and corrections) gives
    plain greedy decoding token for token, with the same output type, a Trace and the SpecStats."""
    model, tok = tiny
    draft = random_model(5, vocab=model.config.vocab_size, context=model.config.max_position_embeddings)
    ids = tok("import os\nimport sys\n\n")["input_ids"]
    want = generate(model, ids, 12, cache="contiguous")
    got = generate(model, ids, 12, draft=draft, draft_length=g)
    assert isinstance(got, GenerateOutput) and torch.equal(got.tokens, want.tokens)
    assert isinstance(got.stats, SpecStats) and got.stats.emitted == 12 and got.stats.rejections > 0
    assert [e.index for e in got.trace.events] == list(range(12)) and got.trace.prompt_tokens == len(ids)
    # the draft equal to the target accepts everything: g + 1 tokens per pass
    same = generate(model, ids, 12, draft=model, draft_length=g)
    assert torch.equal(same.tokens, want.tokens) and same.stats.acceptance_rate == 1.0
    # eos and callback stop it like the plain loop
    eos = int(want.tokens[6])
    stop = generate(model, ids, 12, draft=draft, draft_length=g, eos_token_id=eos).tokens
    assert torch.equal(stop, want.tokens[:want.tokens.tolist().index(eos) + 1])
    assert len(generate(model, ids, 12, draft=draft, draft_length=g, callback=lambda e: e.index == 4).tokens) == 5


def test_draft_hook_sampling_is_reproducible_and_checked():
    target, draft = random_model(6), random_model(7)
    ids = [1, 2, 3]
    runs = [generate(target, ids, 12, temperature=1.0, top_k=20, draft=draft, draft_length=3,
                     generator=torch.Generator(device="cpu").manual_seed(9)).tokens for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and runs[0].shape == (12,)
    with pytest.raises(ValueError, match="vocab"):
        generate(target, ids, 4, draft=random_model(8, vocab=65))
    with pytest.raises(ValueError, match="one request"):
        generate(target, torch.ones(2, 3, dtype=torch.long), 4, draft=draft)
    with pytest.raises(ValueError, match="draft_length"):
        generate(target, ids, 4, draft=draft, draft_length=0)
    with pytest.raises(ValueError, match="draft"):
        generate(target, ids, 4, adaptive=0.5)                            # speculative-only settings


@pytest.mark.parametrize("how", ["recompute", "cache", "static", "compiled", "draft"])
def test_context_edge_follows_the_engine_rule(how):
    """The last new token is never fed back: prompt + max_new_tokens - 1 == context fits, one more does not
    (the serving engine's rule), through every path of the loop."""
    model = random_model(10, context=32)
    kw = {"recompute": {}, "cache": {"cache": "contiguous"}, "static": {"cache": "static"},
          "compiled": {"cache": "static", "compile": "eager"}, "draft": {"draft": random_model(11, context=32)}}[how]
    P = 20
    ids = list(range(1, P + 1))
    out = generate(model, ids, 32 - P + 1, **kw)                          # P + N - 1 == context
    assert len(out.tokens) == 32 - P + 1
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, ids, 32 - P + 2, **kw)                            # P + N - 1 == context + 1


# --- one SamplingParams for every entrance -------------------------------------------------------------------
def test_generate_takes_sampling_params(tiny):
    """generate(params=SamplingParams(...)) is generate with the same separate settings (greedy, seeded sampling,
    one per row); the engine's, the server's and the baselines' SamplingParams is this one class."""
    import course_lib.serving as serving
    from course_lib.sampling import SamplingParams
    assert serving.SamplingParams is SamplingParams
    model, _ = tiny
    prompt = [5, 17, 99, 3]
    want = generate(model, prompt, 6, eos_token_id=[7], repetition_penalty=1.3, cache="contiguous").tokens
    got = generate(model, prompt, params=SamplingParams(max_new_tokens=6, stop_token_ids=(7,), repetition_penalty=1.3),
                   cache="contiguous").tokens
    assert torch.equal(got, want)
    sampled = generate(model, prompt, 8, temperature=0.9, top_k=20, top_p=0.9,
                       generator=torch.Generator().manual_seed(11)).tokens
    seeded = generate(model, prompt, params=SamplingParams(max_new_tokens=8, temperature=0.9, top_k=20, top_p=0.9,
                                                           seed=11)).tokens
    assert torch.equal(sampled, seeded)
    rows = [SamplingParams(max_new_tokens=3), SamplingParams(max_new_tokens=5, temperature=1.2, seed=2)]
    per_row = generate(model, [prompt, prompt[:2]], params=rows, cache="contiguous").tokens
    lists = generate(model, [prompt, prompt[:2]], [3, 5], temperature=[0.0, 1.2],
                     generator=[None, torch.Generator().manual_seed(2)], cache="contiguous").tokens
    assert torch.equal(per_row, lists)
    with pytest.raises(ValueError, match="temperature given as well"):
        generate(model, prompt, params=rows[0], temperature=0.5)
    with pytest.raises(TypeError, match="max_new_tokens"):
        generate(model, prompt)
    with pytest.raises(TypeError, match="SamplingParams"):
        generate(model, prompt, params={"max_new_tokens": 3})
    with pytest.raises(ValueError, match="3 SamplingParams for 2 prompts"):
        generate(model, [prompt, prompt], params=rows + rows[:1], cache="contiguous")
