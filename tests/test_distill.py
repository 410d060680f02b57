"""Module 04: distillation losses against brute-force definitions and torch's KLDivLoss, the T^2 factor,
a tutorial's double-softmax bug, acceptance rate, and the training loop (scratch == course_lib.training.train)."""

import pytest
import torch
import torch.nn.functional as F

from course_lib import distill as D
from course_lib.models import LlamaConfig, LlamaForCausalLM, load
from device_tools import tol_for


def fresh(*shape, scale=3.0):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def brute_kl(p_logits, q_logits, T):
    """sum_x p log(p / q) per position, p = softmax(p_logits/T), q = softmax(q_logits/T), by hand."""
    p = torch.exp(p_logits / T) / torch.exp(p_logits / T).sum(-1, keepdim=True)
    q = torch.exp(q_logits / T) / torch.exp(q_logits / T).sum(-1, keepdim=True)
    return (p * (p.log() - q.log())).sum(-1)


@pytest.mark.parametrize("T", [0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("shape", [(7, 11), (2, 5, 33)])
def test_kd_loss_matches_brute_force(T, shape):
    s, t = fresh(*shape), fresh(*shape)
    want = brute_kl(t, s, T) * T * T                                   # KL(p_T || q_S) T^2 per position
    got_none = D.kd_loss(s, t, T, reduction="none")
    assert got_none.shape == shape[:-1]
    torch.testing.assert_close(got_none.double(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(D.kd_loss(s, t, T).double(), want.mean(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(D.kd_loss(s, t, T, reduction="sum").double(), want.sum(), rtol=1e-4, atol=1e-4)


def test_kd_loss_matches_torch_kldivloss_oracle():
    T = 2.0
    s, t = fresh(6, 9, 50).float(), fresh(6, 9, 50).float()
    oracle = torch.nn.KLDivLoss(reduction="batchmean", log_target=True)
    want = oracle(F.log_softmax(s / T, -1).reshape(-1, 50), F.log_softmax(t / T, -1).reshape(-1, 50)) * T * T
    torch.testing.assert_close(D.kd_loss(s, t, T), want, rtol=1e-5, atol=1e-6)


def test_kd_loss_zero_iff_equal_and_t1_is_plain_kl():
    s = fresh(4, 3, 20)
    assert D.kd_loss(s, s.clone(), 3.0).abs().item() < 1e-6
    assert D.kd_loss(s + 7.0, s, 3.0).abs().item() < 1e-6             # a shift of all logits changes nothing
    t = fresh(4, 3, 20)
    assert D.kd_loss(s, t, 1.0).item() > 1e-3
    p, q = F.softmax(t, -1), F.softmax(s, -1)
    torch.testing.assert_close(D.kd_loss(s, t, 1.0).double(), (p * (p / q).log()).sum(-1).mean(), rtol=1e-5, atol=1e-6)


def _grad_norm(loss_fn, s, t, T):
    s = s.clone().requires_grad_(True)
    loss_fn(s, t, T).backward()
    return s.grad.norm().item()


def test_t_squared_keeps_gradient_scale():
    s, t = fresh(64, 100, scale=1.0), fresh(64, 100, scale=1.0)
    with_t2 = [_grad_norm(D.kd_loss, s, t, T) for T in (4.0, 8.0, 16.0)]
    without = [g / T**2 for g, T in zip(with_t2, (4.0, 8.0, 16.0))]
    assert max(with_t2) / min(with_t2) < 1.3, f"T^2-scaled gradient norms should be about equal: {with_t2}"
    for a, b in zip(without, without[1:]):                             # without T^2: 1/T^2, so /4 per doubling
        assert 3.0 < a / b < 5.0, f"unscaled gradient should shrink ~4x per doubling of T: {without}"


def test_double_softmax_bug_is_caught():
    V = 2048
    s, t = fresh(16, V), fresh(16, V)
    # student == teacher: the correct loss is 0, the buggy one is large (it measures the teacher vs ~uniform)
    assert D.kd_loss(t, t, 2.0).item() < 1e-6
    buggy_equal = D.kd_loss_double_softmax(t, t, 2.0).item()
    assert buggy_equal > 1.0, buggy_equal
    # what it computes: KL(p_T || softmax(q_S)) where softmax(q_S) is nearly uniform
    p, q = F.softmax(t / 2, -1), F.softmax(s / 2, -1)
    r = F.softmax(q, -1)
    assert (r.max(-1).values * V).max().item() < 2.8, "softmax of probabilities is within e^1 of uniform"
    torch.testing.assert_close(D.kd_loss_double_softmax(s, t, 2.0).double(),
                               (p * (p.log() - r.log())).sum(-1).mean() * 4, rtol=1e-4, atol=1e-4)
    # the teacher is not even a stationary point: training on it moves a perfect student away, towards
    # a one-hot copy of the teacher's argmax (the loss is ~ -sum p_T q_S + const)
    assert _grad_norm(D.kd_loss_double_softmax, t, t, 2.0) > 1e-5
    z = t[:4].float().clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=0.05)
    for _ in range(150):
        loss = D.kd_loss_double_softmax(z, t[:4].float(), 2.0)
        opt.zero_grad(); loss.backward(); opt.step()
    top_before = F.softmax(t[:4] / 2, -1).max(-1)
    top_after = F.softmax(z.detach() / 2, -1).max(-1)
    assert torch.equal(top_after.indices, top_before.indices)
    assert (top_after.values > 4 * top_before.values.float()).all(), (top_before.values, top_after.values)
    assert D.kd_loss(z.detach(), t[:4].float(), 2.0).item() > 0.5


@pytest.mark.parametrize("T", [1.0, 3.0])
def test_reverse_kl_matches_brute_force_and_differs_from_forward(T):
    s, t = fresh(5, 4, 30), fresh(5, 4, 30)
    want = brute_kl(s, t, T).mean() * T * T                             # KL(q_S || p_T)
    torch.testing.assert_close(D.reverse_kl_loss(s, t, T).double(), want, rtol=1e-4, atol=1e-5)
    assert abs(D.reverse_kl_loss(s, t, T).item() - D.kd_loss(s, t, T).item()) > 1e-3
    assert D.reverse_kl_loss(t, t, T).abs().item() < 1e-6


def test_hard_label_and_combined_loss():
    s, t = fresh(3, 6, 40).float(), fresh(3, 6, 40).float()
    y = torch.randint(0, 40, (3, 6))
    logq = s - s.logsumexp(-1, keepdim=True)
    ce = -logq.gather(-1, y[..., None]).mean()
    torch.testing.assert_close(D.hard_label_loss(s, y), ce)
    for alpha in (0.0, 0.3, 1.0):
        want = alpha * D.kd_loss(s, t, 2.0) + (1 - alpha) * ce
        torch.testing.assert_close(D.distillation_loss(s, t, y, alpha, 2.0), want)
    rev = 0.5 * D.reverse_kl_loss(s, t, 2.0) + 0.5 * ce
    torch.testing.assert_close(D.distillation_loss(s, t, y, 0.5, 2.0, kind="reverse"), rev)


def test_feature_and_relation_losses(device):
    torch.manual_seed(torch.seed() % 2**31)
    hs, ht = torch.randn(2, 7, 12, device=device), torch.randn(2, 7, 20, device=device)
    proj = D.FeatureProjector(12, 20, device=device)                     # built where the hidden states are
    assert proj.proj.weight.device == hs.device
    want = ((hs @ proj.proj.weight.T - ht) ** 2).mean()
    torch.testing.assert_close(D.feature_loss(hs, ht, proj), want, **tol_for(device, dict(rtol=1.3e-6, atol=1e-5)))
    assert D.feature_loss(hs, proj(hs).detach(), proj).item() < 1e-12
    # a projector left on another device: a clear error ("meta" is a second device on every machine)
    with pytest.raises(ValueError, match="device=student_hidden.device"):
        D.feature_loss(hs, ht, D.FeatureProjector(12, 20, device="meta"))
    # relation loss by hand: cosine similarity of every pair of tokens
    def sims(h):
        return torch.tensor([[[F.cosine_similarity(h[b, i], h[b, j], dim=0).item() for j in range(7)]
                              for i in range(7)] for b in range(2)])
    torch.testing.assert_close(D.relation_loss(hs, ht).cpu(), ((sims(hs) - sims(ht)) ** 2).mean(), rtol=1e-4,
                               atol=1e-6)
    # a teacher that is the student seen through an isometry (any width) has the same relations
    Q, _ = torch.linalg.qr(torch.randn(20, 12, device=device))          # [20, 12], orthonormal columns
    assert D.relation_loss(hs, 3.0 * hs @ Q.T).item() < 1e-10
    assert D.relation_loss(hs, ht).item() > 1e-3


def test_expected_acceptance_is_speculative_sampling_acceptance():
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    p = torch.softmax(torch.randn(8, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(8, generator=g) * 2, -1)
    a = D.expected_acceptance(p, q).item()
    torch.testing.assert_close(a, 1 - 0.5 * (p - q).abs().sum().item(), rtol=0, atol=1e-6)  # 1 - TV
    x = torch.multinomial(q, 200_000, replacement=True, generator=g)       # draft proposes x ~ q
    accept = torch.rand(200_000, generator=g) < (p[x] / q[x]).clamp(max=1)  # target accepts w.p. min(1, p/q)
    assert abs(accept.float().mean().item() - a) < 0.01
    assert D.expected_acceptance(p, p).item() == pytest.approx(1.0, abs=1e-6)


@pytest.fixture(scope="module")
def pair(device):
    t, tok = load("tiny", device=device)
    d, _ = load("tiny-draft", device=device)
    return t, d, tok


def test_acceptance_rate_on_text(pair, device):
    t, d, tok = pair
    text = "import os\n\ndef walk(path):\n    for name in os.listdir(path):\n        yield name\n"
    assert D.acceptance_rate(t, t, [text], tokenizer=tok) == pytest.approx(1.0, abs=1e-5)
    assert D.acceptance_rate(t, t, [text], 0.0, tokenizer=tok) == 1.0
    ids = torch.tensor([[tok.eos_token_id] + tok(text)["input_ids"]], device=device)
    with torch.no_grad():
        p, q = F.softmax(t(ids[:, :-1])[0], -1), F.softmax(d(ids[:, :-1])[0], -1)
    want = torch.minimum(p, q).sum(-1).mean().item()
    assert D.acceptance_rate(t, d, [text], tokenizer=tok) == pytest.approx(want, abs=1e-5)
    assert 0.2 < want < 1.0
    greedy = (p.argmax(-1) == q.argmax(-1)).float().mean().item()
    assert D.acceptance_rate(t, d, [text], 0.0, tokenizer=tok) == pytest.approx(greedy)


def _tiny(d, layers, seed):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))


def test_scratch_mode_is_the_training_script(device):
    """Same init, data order and schedule as course_lib.training.train: identical weights. On a device too:
    both draw the windows with a generator on the stream's device and train where the stream is."""
    from course_lib.training.train import TrainSettings, train_model
    stream = torch.randint(0, 64, (3000,), generator=torch.Generator().manual_seed(1)).to(device)
    ref, _ = train_model(_tiny(32, 1, 0).config, stream, TrainSettings(steps=6, batch=3, seq_len=16, warmup=2))
    assert ref.device == stream.device
    ours, hist = D.distill(_tiny(64, 2, 1).to(device), D.new_student(ref, seed=0), steps=6, batch_size=3,
                           seq_len=16, mode="scratch", stream=stream, warmup=2, progress=False)
    # CPU: the same computation, equal to float rounding; CUDA: the embedding's backward adds with atomics
    # (summation order not fixed), so the two runs agree to the device tolerance
    tol = tol_for(device, dict(rtol=1.3e-6, atol=1e-5))
    for (n, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items()):
        torch.testing.assert_close(a, b, msg=n, **tol)
    assert len(hist["loss"]) == 6 and hist["tokens"] == 6 * 3 * 16


@pytest.mark.parametrize("mode", ["white_box", "black_box", "scratch"])
def test_distill_modes_learn(mode, device):
    """Models on the device, the token stream on the host (the loop moves each batch; black_box samples the
    teacher's text on the device with a generator there)."""
    teacher = _tiny(64, 2, 1).to(device)
    # a teacher with something to teach: its logits depend strongly on the last token
    with torch.no_grad():
        teacher.lm_head.weight.mul_(30)
    stream = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(2))
    student = D.new_student(_tiny(32, 1, 0).to(device), seed=3)
    assert student.device == teacher.device
    before = D.acceptance_rate(teacher, student, stream[None, :200])
    student, hist = D.distill(teacher, student, steps=60, batch_size=8, seq_len=32, mode=mode, stream=stream,
                              lr=1e-2, feature_weight=0.5 if mode == "white_box" else 0.0, progress=False)
    first, last = sum(hist["loss"][:5]) / 5, sum(hist["loss"][-5:]) / 5
    assert last < first, f"{mode}: loss {first:.3f} -> {last:.3f}"
    after = D.acceptance_rate(teacher, student, stream[None, :200])
    if mode != "scratch":   # the data is random tokens: only the teacher's signal is learnable
        assert after > before + 0.05, f"{mode}: acceptance {before:.3f} -> {after:.3f}"


@pytest.mark.parametrize("stream_on", ["host", "device"])
def test_teacher_corpus_is_seeded_and_starts_with_training_prompts(device, stream_on):
    teacher = _tiny(32, 1, 1).to(device)
    stream = (torch.arange(1000) % 64).to("cpu" if stream_on == "host" else device)
    a = D.generate_teacher_corpus(teacher, stream, 5, 12, prompt_len=4, seed=7, progress=False)
    b = D.generate_teacher_corpus(teacher, stream, 5, 12, prompt_len=4, seed=7, progress=False)
    assert a.shape == (5, 13) and torch.equal(a, b)
    assert a.device == stream.device                        # the corpus is kept where the stream is
    for row in a:   # a window of the stream: consecutive values mod 64
        assert torch.equal(row[1:4], (row[0] + torch.arange(1, 4, device=a.device)) % 64)


def test_teacher_corpus_continues_each_prompt_with_the_generate_loop(device):
    """Near temperature 0 the sampled continuation is the teacher's greedy one: what generate writes for
    that prompt alone (the corpus is written in batches, here of 2 and then 1)."""
    from course_lib.generation import generate
    teacher = _tiny(32, 1, 1).to(device)
    with torch.no_grad():
        teacher.lm_head.weight.mul_(30)   # well-separated logits: no near-ties for the tiny temperature to flip
    stream = torch.randint(0, 64, (500,), generator=torch.Generator().manual_seed(3))
    corpus = D.generate_teacher_corpus(teacher, stream, 3, 12, prompt_len=4, temperature=1e-4, batch_size=2,
                                       progress=False)
    for row in corpus:
        assert torch.equal(generate(teacher, row[:4], 9).tokens, row[4:])


def test_bad_input_raises():
    s = torch.randn(2, 5)
    with pytest.raises(ValueError, match="temperature"):
        D.kd_loss(s, s, temperature=0)
    with pytest.raises(ValueError, match="same shape"):
        D.kd_loss(s, torch.randn(2, 6))
    with pytest.raises(TypeError, match="student_logits"):
        D.kd_loss(s.long(), s)
    with pytest.raises(ValueError, match="reduction"):
        D.kd_loss(s, s, reduction="mean")
    with pytest.raises(ValueError, match="alpha"):
        D.distillation_loss(s, s, torch.zeros(2, dtype=torch.long), alpha=1.5)
    with pytest.raises(ValueError, match="labels"):
        D.hard_label_loss(s, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="mode"):
        D.distill(_tiny(32, 1, 0), _tiny(32, 1, 0), steps=1, mode="grey_box", stream=torch.arange(100) % 64)
    with pytest.raises(ValueError, match="hidden"):
        D.feature_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 8), D.FeatureProjector(5, 8))
    with pytest.raises(ValueError, match="student_dim"):
        D.FeatureProjector(0, 8)
    with pytest.raises(ValueError, match="is on meta"):
        D.feature_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 8), D.FeatureProjector(4, 8, device="meta"))
