"""Lab 04's judge: the KD loss, its gradient across temperatures, the combined loss, the acceptance rate, and the
prediction of what a draft buys in speculative decoding.

Logits, labels and distributions are drawn here and sent as tensors; the losses are compared with
`course_lib.distill`'s here. The gradient is taken in the kernel (the student's loss, backward, the logits'
.grad sent back) and compared with the reference's gradient, which is what the T^2 factor is about. Part B
uses the student's Part A, so its planted values carry Part A's mistakes (charged once, in Part A).

Part D's configs are built in the kernel (`LlamaConfig`, a library class) with their `num_parameters` set to
None there: an answer must count from the fields itself, and one that calls the method fails with a message
that says so. The speed-up is compared with `theory.speedup` at c = `decode_reads(draft) / decode_reads(target)`
(the numbers a memory-bound step reads), the break-even with `theory.break_even_acceptance`. The break-even is
judged with the answer's own speed-up model in mind: a counting or pass mistake charged in the speed-up's
part is planted in the break-even's too, where it is not charged again.
"""
import math
from collections import Counter
from dataclasses import asdict

import torch

from course_grading.judging import Get, Judge, Let, call, ref
from course_lib.checks import check_close, diagnose
from course_lib.distill.losses import distillation_loss, hard_label_loss, kd_loss, kd_loss_double_softmax
from course_lib.models.config import LlamaConfig, decode_reads, preset
from course_lib.speculative.theory import acceptance_rate
from course_lib.speculative.theory import break_even_acceptance as ref_break_even
from course_lib.speculative.theory import expected_tokens_per_pass as ref_tokens
from course_lib.speculative.theory import speedup as ref_speedup

judge = Judge(references={
    "kd_t1_tests": ["course_lib.distill.losses.kd_loss"],
    "kd_temperature_tests": ["course_lib.distill.losses.kd_loss"],
    "combined_tests": ["course_lib.distill.losses.distillation_loss", "course_lib.distill.losses.kd_loss"],
    "acceptance_tests": ["course_lib.speculative.theory.acceptance_rate"],
    "predict_speedup_tests": ["course_lib.models.config.decode_reads", "course_lib.speculative.theory.speedup",
                              "course_lib.speculative.theory.expected_tokens_per_pass",
                              "course_lib.speculative.theory.optimal_draft_length"],
    "predict_break_even_tests": ["course_lib.speculative.theory.break_even_acceptance",
                                 "course_lib.models.config.decode_reads", "course_lib.speculative.theory.speedup"],
})


def randn(t, *shape, scale=1.0):
    return torch.randn(*shape, generator=t.torch_generator()) * scale


def draw_shape(t, v_max=300):
    """0 to 3 leading (position) dimensions and a vocabulary of 2 to v_max."""
    return tuple(t.rng.randint(1, 5) for _ in range(t.rng.randint(0, 3))) + (t.rng.randint(2, v_max),)


# ---------------------------------------------------------------------------------------------------
# Part A: the KD loss

def kd_mistakes(t, s, te, T):
    return {t.mistake("double_softmax"): kd_loss_double_softmax(s, te, T),
            t.mistake("no_t2"): kd_loss(s, te, T) / (T * T)}


def kd_case(t, what, s, te, T, unshifted=None):
    """The student's loss of (s, te) against the reference's; `unshifted`: logits s minus a shift the loss ignores."""
    got = t.call("kd_loss", s, te, T)
    shape = tuple(getattr(got, "shape", ()))
    t.expect(shape == (), f"{what}: expected a scalar, got shape {shape}")
    s = s if unshifted is None else unshifted
    check_close(got, kd_loss(s, te, T), what, rtol=1e-4, atol=1e-5, mistakes=kd_mistakes(t, s, te, T))


def kd_errors(t, cases):
    for what, args in cases:
        with t.case(f"kd_loss with {what}", group="errors"):
            t.raises(t.outcome("kd_loss", *args), "ValueError", what=f"kd_loss with {what}")


VISIBLE_S, VISIBLE_T = torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[2.0, 1.0, 0.0]])
BATCH_S = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0]]])
BATCH_T = torch.tensor([[[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]])


@judge.part("kd_t1_tests", groups={"values": 3, "errors": 1})
def kd_t1(t):
    x = randn(t, 3, 4, 50, scale=3)
    shift = randn(t, 3, 4, 1, scale=10)
    cases = [("kd_loss([[0, 1, 2]], [[2, 1, 0]], T=1)", VISIBLE_S, VISIBLE_T, None),
             ("kd_loss([[5, 6, 7]], [[2, 1, 0]], T=1) (the logits shifted by 5: the same loss)", VISIBLE_S + 5,
              VISIBLE_T, VISIBLE_S),
             ("kd_loss(x + c, y, T=1), x, y [3, 4, 50], with a different constant c per position (the loss of x, y)",
              x + shift, randn(t, 3, 4, 50, scale=3), x),
             ("kd_loss of the [1, 2, 4] batch at T=1 (mean over the 2 positions)", BATCH_S, BATCH_T, None),
             ("kd_loss of one distribution [7] at T=1 (no leading dimension)", randn(t, 7, scale=3),
              randn(t, 7, scale=3), None),
             ("kd_loss of [6, 2] at T=1 (two tokens)", randn(t, 6, 2, scale=3), randn(t, 6, 2, scale=3), None)]
    for _ in range(6):
        shape = draw_shape(t)
        cases.append((f"kd_loss of random logits {list(shape)} at T=1", randn(t, *shape, scale=3),
                      randn(t, *shape, scale=3), None))
    for what, s, te, unshifted in cases:
        with t.case(what, group="values"):
            kd_case(t, what, s, te, 1.0, unshifted)
    x, y = randn(t, 5, 30, scale=3), randn(t, 5, 30, scale=3)
    with t.case("kd_loss(x, x, T=1) is 0, kd_loss(x, y, T=1) is not", group="values"):
        same, other = t.run([call("kd_loss", x, x, 1.0), call("kd_loss", x, y, 1.0)])
        check_close(same.get(), 0.0, "kd_loss(x, x, T=1) (student == teacher)", atol=1e-5,
                    mistakes={t.mistake("double_softmax"): kd_loss_double_softmax(x, x, 1.0)})
        check_close(other.get(), kd_loss(x, y, 1.0), "kd_loss(x, y, T=1)", rtol=1e-4, atol=1e-5,
                    mistakes=kd_mistakes(t, x, y, 1.0))
    kd_errors(t, [("shapes (1, 3) and (1, 2, 4)", (VISIBLE_S, BATCH_S, 1.0)), ("T=0", (VISIBLE_S, VISIBLE_T, 0.0)),
                  ("shapes (16, 64) and (16, 10)", (randn(t, 16, 64), randn(t, 16, 10), 1.0)),
                  ("shapes (5,) and (1, 5)", (randn(t, 5), randn(t, 1, 5), 1.0))])


def gradient_case(t, what, s, te, T):
    """The gradient of the student's loss with respect to the student's logits, taken in the kernel."""
    got = t.run([Let("s", s), call("$s.requires_grad_", True, send=False),
                 call("kd_loss", ref("s"), te, T, store="loss"), call("$loss.backward", send=False), Get("$s.grad")])
    got[2].get()
    t.expect(got[3].ok, f"{what}: the loss could not be differentiated ({got[3].error or got[3].raised}): keep it a "
                        "torch expression of student_logits")
    grad = got[4].get()
    t.expect(grad is not None, f"{what}: student_logits.grad is None after backward: keep the loss a torch "
                               "expression of student_logits")

    def reference_grad(loss_fn):
        x = s.clone().requires_grad_(True)
        loss_fn(x, te, T).backward()
        return x.grad

    want = reference_grad(kd_loss)
    check_close(grad, want, what, rtol=1e-3, atol=1e-4 * float(want.abs().max()),
                mistakes={t.mistake("no_t2"): want / (T * T),
                          t.mistake("double_softmax"): reference_grad(kd_loss_double_softmax)})


@judge.part("kd_temperature_tests", groups={"values": 3, "gradient": 1, "errors": 1})
def kd_temperature(t):
    cases = [("kd_loss([[0, 1, 2]], [[2, 1, 0]], T=2)", VISIBLE_S, VISIBLE_T, 2.0),
             ("kd_loss([[0, 1, 2]], [[2, 1, 0]], T=4)", VISIBLE_S, VISIBLE_T, 4.0),
             ("kd_loss of the [1, 2, 4] batch at T=3", BATCH_S, BATCH_T, 3.0),
             ("kd_loss([[0, 50, 100]], [[100, 50, 0]], T=1) (large logits: no inf or nan)", VISIBLE_S * 50,
              VISIBLE_T * 50, 1.0),
             ("kd_loss of large logits [4, 40] at T=0.5 (no inf or nan)", randn(t, 4, 40, scale=50),
              randn(t, 4, 40, scale=50), 0.5)]
    for _ in range(16):
        shape = draw_shape(t)
        T = t.rng.uniform(0.5, 8.0)
        cases.append((f"kd_loss of random logits {list(shape)} at T={T:.3f}", randn(t, *shape, scale=4),
                      randn(t, *shape, scale=4), T))
    for what, s, te, T in cases:
        with t.case(what, group="values"):
            kd_case(t, what, s, te, T)
    gs = torch.linspace(-1, 1, 40).reshape(2, 20) * torch.tensor([[1.0], [-0.5]])
    gt = torch.linspace(-1, 1, 40).flip(0).reshape(2, 20)
    grads = [(gs, gt, 8.0), (gs, gt, 16.0)]
    a, b = randn(t, 16, 64), randn(t, 16, 64)
    grads += [(a, b, T) for T in (5.0, 10.0, 20.0)]
    shape = draw_shape(t, 100)
    grads.append((randn(t, *shape, scale=3), randn(t, *shape, scale=3), t.rng.uniform(0.5, 4.0)))
    for s, te, T in grads:
        what = f"the gradient of kd_loss with respect to student_logits {list(s.shape)} at T={T:g}"
        with t.case(what, group="gradient"):
            gradient_case(t, what, s, te, T)
    kd_errors(t, [("T=-1", (a, b, -1.0)), ("T=0", (a, b, 0.0)), ("shapes (16, 64) and (16, 10)", (a, b[:, :10], 2.0))])


# ---------------------------------------------------------------------------------------------------
# Part B: the combined loss

@judge.part("combined_tests", groups={"values": 3, "errors": 1})
def combined(t):
    cases = [("combined_loss([[0, 1, 2]], [[2, 1, 0]], [2], alpha=0, T=2) (pure cross entropy)", VISIBLE_S, VISIBLE_T,
              torch.tensor([2]), 0.0, 2.0),
             ("combined_loss([[0, 1, 2]], [[2, 1, 0]], [2], alpha=0.7, T=2)", VISIBLE_S, VISIBLE_T, torch.tensor([2]),
              0.7, 2.0),
             ("combined_loss on the [1, 2, 4] batch, alpha=0.25, T=3", BATCH_S, BATCH_T, torch.tensor([[3, 2]]), 0.25,
              3.0),
             ("combined_loss of [6, 11] logits, alpha=1, T=2.5 (pure KD)", randn(t, 6, 11, scale=3),
              randn(t, 6, 11, scale=3), torch.randint(0, 11, (6,), generator=t.torch_generator()), 1.0, 2.5)]
    for _ in range(16):
        shape = tuple(t.rng.randint(1, 4) for _ in range(t.rng.randint(1, 3))) + (t.rng.randint(2, 199),)
        labels = torch.randint(0, shape[-1], shape[:-1], generator=t.torch_generator())
        alpha, T = t.rng.random(), t.rng.uniform(0.5, 4.5)
        cases.append((f"combined_loss of random logits {list(shape)}, alpha={alpha:.3f}, T={T:.3f}",
                      randn(t, *shape, scale=3), randn(t, *shape, scale=3), labels, alpha, T))
    for what, s, te, y, alpha, T in cases:
        with t.case(what, group="values"):
            ce = hard_label_loss(s, y)
            # the answer uses its own Part A: Part A's mistakes carry over (charged there, not again here)
            wrong = {k: alpha * v + (1 - alpha) * ce for k, v in kd_mistakes(t, s, te, T).items()}
            check_close(t.call("combined_loss", s, te, y, alpha, T), distillation_loss(s, te, y, alpha, T), what,
                        rtol=1e-4, atol=1e-5, mistakes=wrong)
    for alpha in (1.5, -0.1):
        with t.case(f"combined_loss(alpha={alpha})", group="errors"):
            t.raises(t.outcome("combined_loss", VISIBLE_S, VISIBLE_T, torch.tensor([2]), alpha, 2.0), "ValueError",
                     what=f"combined_loss(alpha={alpha})")


# ---------------------------------------------------------------------------------------------------
# Part C: the acceptance rate

def distribution(t, shape, scale, sparse=False):
    logits = randn(t, *shape, scale=scale)
    if sparse:                 # some tokens impossible: exact zeros in the distribution
        logits[torch.rand(shape, generator=t.torch_generator()) < 0.4] = -float("inf")
        logits[..., 0] = logits[..., 0].clamp(min=-1e9)     # each row keeps a possible token
    return torch.softmax(logits, -1)


@judge.part("acceptance_tests", groups={"values": 3, "errors": 1})
def acceptance(t):
    cases = [("acceptance(p, p) for p = [0.5, 0.5]", torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5])),
             ("acceptance of disjoint p, q", torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])),
             ("acceptance([0.7, 0.2, 0.1], [0.5, 0.1, 0.4])", torch.tensor([0.7, 0.2, 0.1]),
              torch.tensor([0.5, 0.1, 0.4])),
             ("acceptance of uniform [2, 3, 4] against a drawn q", torch.full((2, 3, 4), 0.25),
              distribution(t, (2, 3, 4), 2)),
             ("acceptance of a one-hot p [3, 9] against a drawn q", torch.eye(9)[[2, 0, 8]],
              distribution(t, (3, 9), 2)),
             ("acceptance of distributions with zeros, [4, 12]", distribution(t, (4, 12), 2, sparse=True),
              distribution(t, (4, 12), 2, sparse=True)),
             ("acceptance of one token [5, 1] (always accepted)", torch.ones(5, 1), torch.ones(5, 1))]
    for _ in range(10):
        shape = draw_shape(t)
        sparse = t.rng.random() < 0.3
        p = distribution(t, shape, t.rng.uniform(0.5, 4), sparse)
        cases.append((f"acceptance of random distributions {list(shape)}" + (" with zeros" if sparse else ""), p,
                      distribution(t, shape, t.rng.uniform(0.5, 4), sparse)))
    for what, p, q in cases:
        with t.case(what, group="values"):
            got = t.call("acceptance", p, q)
            t.expect(tuple(getattr(got, "shape", ())) == tuple(p.shape[:-1]),
                     f"{what}: expected one rate per position, shape {tuple(p.shape[:-1])}, got "
                     f"{tuple(getattr(got, 'shape', ())) or type(got).__name__}")
            check_close(got, acceptance_rate(p, q), what, atol=1e-6)
    for what, p, q in (("shapes (3,) and (4,)", torch.ones(3) / 3, torch.ones(4) / 4),
                       ("shapes (2, 3) and (3, 2)", torch.ones(2, 3) / 3, torch.ones(3, 2) / 2),
                       ("shapes (2, 5) and (5,)", torch.ones(2, 5) / 5, torch.ones(5) / 5)):
        with t.case(f"acceptance of {what}", group="errors"):
            t.raises(t.outcome("acceptance", p, q), "ValueError", what=f"acceptance of {what}")


# ---------------------------------------------------------------------------------------------------
# Part D: predict what a draft buys

def reads(cfg, context, mistake=None):
    """The numbers one decode step reads (`decode_reads`), or what one known mistake counts instead."""
    if mistake is None:
        return decode_reads(cfg, context)
    D, F_, V, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    H, K, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    kv_weights = H if mistake == "kv_full" else K
    kv_cache = H if mistake == "cache_query_heads" else K
    layer = 2 * D * H * Dh + 2 * D * kv_weights * Dh + (2 if mistake == "mlp_two" else 3) * D * F_ + 2 * D
    head = 0 if mistake == "lm_head_free" else V * D
    table = V * D if mistake == "parameter_ratio" and not cfg.tie_word_embeddings else 0   # the untied embedding
    return L * layer + D + head + table + 2 * L * kv_cache * Dh * context


COUNT_MISTAKES = ("parameter_ratio", "lm_head_free", "mlp_two", "kv_full", "cache_query_heads")
PASS_MISTAKES = ("draft_free", "no_verify", "no_bonus")


def speedup_with(a, g, c, mistake=None):
    """The model's speed-up (theory.speedup), or what one known mistake about a pass makes of it."""
    if mistake is None:
        return ref_speedup(a, g, c)
    tokens, cost = ref_tokens(a, g), g * c + 1
    if mistake == "draft_free":
        cost = 1.0
    elif mistake == "no_verify":
        cost = g * c
    elif mistake == "no_bonus":
        tokens -= a ** g
    return tokens / cost if cost > 0 else float("inf")


def planted_speedups(t, dc, gc, a, g, n, want):
    """{misconception: its value} for the case, those that differ from the right value."""
    c = reads(dc, n) / reads(gc, n)
    wrong = {m: speedup_with(a, g, reads(dc, n, m) / reads(gc, n, m)) for m in COUNT_MISTAKES}
    wrong.update({m: speedup_with(a, g, c, m) for m in PASS_MISTAKES})
    return {t.mistake(m): v for m, v in wrong.items() if math.isfinite(v) and abs(v / want - 1) > 1e-9}


def break_even_of(spd):
    """The break-even of a speed-up function a -> speed-up that rises with a (0.0 / None at the ends)."""
    if spd(0.0) >= 1:
        return 0.0
    if spd(1.0) < 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if spd(mid) >= 1 else (mid, hi)
    return hi


def planted_break_evens(t, dc, gc, g, n, want, first=()):
    """{misconception: its break-even}: Part D's counting and pass mistakes carried into the break-even (charged in
    predict_speedup_tests, not again), and the break-even taken as a = c. `first`: the misconceptions the answer's
    own speed-up showed, put first in that order, so that where two mistakes give one break-even (a free draft
    and a free verification both make every rate pay) the one the answer made is named."""
    wrong = {m: ref_break_even(reads(dc, n, m) / reads(gc, n, m), g) for m in COUNT_MISTAKES}
    c = reads(dc, n) / reads(gc, n)
    wrong.update({m: break_even_of(lambda a, m=m: speedup_with(a, g, c, m)) for m in PASS_MISTAKES})
    wrong["marginal_rate"] = c
    planted = {t.mistake(m): none_as_nan(v) for m, v in wrong.items() if not same_break_even(v, want)}
    ahead = {k: planted[k] for k in first if k in planted}
    return {**ahead, **planted}


def none_as_nan(x):
    return float("nan") if x is None else x


def same_break_even(x, y):
    return (x is None and y is None) or (x is not None and y is not None and abs(x - y) <= 1e-6)


def config_ops(name, cfg):
    """Build `cfg` (fields, or a preset's name) in the kernel as `name`, a new LlamaConfig (never the library's
    shared preset object), its num_parameters() method shadowed by None."""
    fields = asdict(preset(cfg)) if isinstance(cfg, str) else cfg
    return [call("lib:course_lib.models.config.LlamaConfig", store=name, send=False, **fields),
            call(f"${name}.__setattr__", "num_parameters", None, send=False)]


def random_config(t):
    kv = t.rng.randint(1, 4)
    heads, dh = kv * t.rng.randint(1, 4), 2 * t.rng.randint(2, 16)
    explicit = t.rng.random() < 0.5                 # an explicit head_dim need not be hidden_size / heads
    return dict(vocab_size=t.rng.randint(50, 50_000), hidden_size=t.rng.randint(8, 400) if explicit else heads * dh,
                intermediate_size=t.rng.randint(8, 1500), num_hidden_layers=t.rng.randint(1, 32),
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=dh if explicit else None,
                tie_word_embeddings=t.rng.random() < 0.5)


def random_pair(t):
    """A draft and a target: mostly a smaller draft (fewer layers, narrower), sometimes any two configs."""
    d, g = random_config(t), random_config(t)
    if t.rng.random() < 0.75 and d["num_hidden_layers"] > g["num_hidden_layers"]:
        d["num_hidden_layers"], g["num_hidden_layers"] = g["num_hidden_layers"], d["num_hidden_layers"]
    return d, g


def as_config(cfg):
    return preset(cfg) if isinstance(cfg, str) else LlamaConfig(**cfg)


def describe(cfg) -> str:
    if isinstance(cfg, str):
        return repr(cfg)
    c = as_config(cfg)
    return (f"LlamaConfig(V={c.vocab_size}, D={c.hidden_size}, F={c.intermediate_size}, layers={c.num_hidden_layers}, "
            f"H={c.num_attention_heads}, K={c.num_key_value_heads}, Dh={c.head_dim}, "
            f"{'tied' if c.tie_word_embeddings else 'untied'})")


SMALL = dict(vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1)
BIG = dict(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=1)
PAIRS = [(SMALL, BIG), ("tiny-draft", "tiny"), ("smollm2-135m", "smollm2-1.7b"), ("smollm2-360m", "llama-3-8b"),
         ({**SMALL, "tie_word_embeddings": False}, {**BIG, "tie_word_embeddings": False}),   # untied, both
         (SMALL, {**BIG, "tie_word_embeddings": False}), ({**SMALL, "tie_word_embeddings": False}, BIG),
         ({**BIG, "num_hidden_layers": 1, "num_key_value_heads": 4}, {**BIG, "head_dim": 6}),  # MHA; Dh other than D/H
         ({**SMALL, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 10}, "tiny"),
         ("tiny", "llama-2-7b")]                                                              # an untied MHA target


def calls_in_kernel(t, name, cases):
    """One request: each case's two configs built in the kernel, then `name` called on them; the outcomes."""
    ops = []
    for k, (d, g, args) in enumerate(cases):
        ops += config_ops(f"d{k}", d) + config_ops(f"g{k}", g) + [call(name, ref(f"d{k}"), ref(f"g{k}"), *args)]
    return [o for o, op in zip(t.run(ops), ops) if op.send]


def num_parameters_called(o, what):
    if o.raised is not None and o.raised.is_a("TypeError") and "not callable" in o.raised.message:
        raise AssertionError(f"{what}: the answer calls the config's num_parameters(); count from the config's "
                             "fields yourself (the grader's configs have no num_parameters)")


@judge.part("predict_speedup_tests", groups={"values": 3, "errors": 1})
def predict_speedup(t):
    cases = [(d, g, (a, gl, n)) for d, g in PAIRS
             for a, gl, n in ((0.7, 4, 0), (t.rng.choice([0.0, 1.0, 0.999, 1e-6, 0.5]), t.rng.choice([0, 1, 3, 12]),
                                                        t.rng.choice([0, 1, 513, 32768])))]
    cases += [(SMALL, BIG, (0.8, 0, 0)), (BIG, BIG, (1.0, 5, 100)), (BIG, SMALL, (0.9, 2, 0)),
              (SMALL, BIG, (0.0, 8, 0)), (SMALL, BIG, (1.0, 1, 10**6))]
    for _ in range(36):
        d, g = random_pair(t)
        a = t.rng.choice([round(t.rng.uniform(0, 0.999), 3), t.rng.uniform(0, 0.999), 1.0])
        n = t.rng.choice([0, t.rng.randint(1, 4096), t.rng.randint(4096, 131072)])
        cases.append((d, g, (a, t.rng.randint(0, 16), n)))
    for (d, g, (a, gl, n)), o in zip(cases, calls_in_kernel(t, "predict_speedup", cases)):
        dc, gc = as_config(d), as_config(g)
        what = f"predict_speedup({describe(d)}, {describe(g)}, a={a!r}, g={gl}, context={n})"
        want = ref_speedup(a, gl, decode_reads(dc, n) / decode_reads(gc, n))
        with t.case(what, group="values"):
            num_parameters_called(o, what)
            check_close(o.get(), want, what, rtol=1e-9, atol=0, mistakes=planted_speedups(t, dc, gc, a, gl, n, want))
    errors = [("TypeError", "('tiny-draft', a LlamaConfig, 0.5, 2)", ["tiny-draft", ref("g"), 0.5, 2]),
              ("TypeError", "(a LlamaConfig, a dict, 0.5, 2)", [ref("g"), {"hidden_size": 8}, 0.5, 2]),
              ("TypeError", "(None, a LlamaConfig, 0.5, 2)", [None, ref("g"), 0.5, 2]),
              ("ValueError", "(draft, target, a=1.5, g=2)", [ref("d"), ref("g"), 1.5, 2]),
              ("ValueError", "(draft, target, a=-0.1, g=2)", [ref("d"), ref("g"), -0.1, 2]),
              ("ValueError", "(draft, target, a=0.5, g=-1)", [ref("d"), ref("g"), 0.5, -1]),
              ("ValueError", "(draft, target, a=0.5, g=2.5)", [ref("d"), ref("g"), 0.5, 2.5]),
              ("ValueError", "(draft, target, a=0.5, g=2, context=-1)", [ref("d"), ref("g"), 0.5, 2, -1])]
    ops = config_ops("d", SMALL) + config_ops("g", BIG) + [call("predict_speedup", *args) for _, _, args in errors]
    for (kind, what, _), o in zip(errors, t.run(ops)[4:]):
        with t.case(f"predict_speedup{what}", group="errors"):
            t.raises(o, kind, what=f"predict_speedup{what}")


@judge.part("predict_break_even_tests", groups={"values": 3, "errors": 1})
def predict_break_even(t):
    cases = [(d, g, (gl, n)) for d, g in PAIRS for gl, n in ((1, 0), (t.rng.choice([2, 4, 8, 16]),
                                                                      t.rng.choice([0, 7, 4096])))]
    cases += [(BIG, BIG, (3, 0)), (BIG, BIG, (1, 50)), (BIG, SMALL, (2, 0)), ("tiny", "tiny-draft", (1, 0)),
              (SMALL, BIG, (16, 10**6))]
    for _ in range(20):
        d, g = random_pair(t)
        cases.append((d, g, (t.rng.randint(1, 16), t.rng.choice([0, t.rng.randint(1, 131072)]))))
    # the answer's own speed-up on each case (at a = 0.3): which of its mistakes its break-even carries, on the
    # case and most often over the part (where two mistakes agree on a case, the part tells them apart)
    probes = calls_in_kernel(t, "predict_speedup", [(d, g, (0.3, gl, n)) for d, g, (gl, n) in cases])
    shown = []
    for (d, g, (gl, n)), probe in zip(cases, probes):
        dc, gc = as_config(d), as_config(g)
        spd = ref_speedup(0.3, gl, decode_reads(dc, n) / decode_reads(gc, n))
        shown.append(diagnose(probe.value, planted_speedups(t, dc, gc, 0.3, gl, n, spd), rtol=1e-9, atol=0)
                     if probe.ok else None)
    usual = [k for k, _ in Counter(k for k in shown if k).most_common(1)]
    for (d, g, (gl, n)), o, here in zip(cases, calls_in_kernel(t, "break_even_acceptance", cases), shown):
        dc, gc = as_config(d), as_config(g)
        want = ref_break_even(decode_reads(dc, n) / decode_reads(gc, n), gl)
        what = (f"break_even_acceptance({describe(d)}, {describe(g)}, g={gl}, context={n})"
                + (" (None: no acceptance in [0, 1] pays; shown as nan)" if want is None else ""))
        with t.case(what, group="values"):
            num_parameters_called(o, what)
            got = o.get()
            t.expect(got is None or isinstance(got, (int, float)), f"{what}: expected a float or None, got {got!r}")
            check_close(none_as_nan(got), none_as_nan(want), what + (" (your None is shown as nan)" if got is None
                                                                     else ""),
                        rtol=0, atol=1e-6, mistakes=planted_break_evens(t, dc, gc, gl, n, want, usual + [here]))
    errors = [("ValueError", "(draft, target, g=0)", [ref("d"), ref("g"), 0]),
              ("ValueError", "(draft, target, g=-2)", [ref("d"), ref("g"), -2]),
              ("ValueError", "(draft, target, g=2, context=-1)", [ref("d"), ref("g"), 2, -1]),
              ("TypeError", "('tiny-draft', a LlamaConfig, 2)", ["tiny-draft", ref("g"), 2]),
              ("TypeError", "(a LlamaConfig, None, 2)", [ref("d"), None, 2])]
    ops = config_ops("d", SMALL) + config_ops("g", BIG) + [call("break_even_acceptance", *args)
                                                           for _, _, args in errors]
    for (kind, what, _), o in zip(errors, t.run(ops)[4:]):
        with t.case(f"break_even_acceptance{what}", group="errors"):
            t.raises(o, kind, what=f"break_even_acceptance{what}")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("the lecture notes' double softmax: log_softmax of the student's probabilities instead of its logits",
         {"kd_answer": solution_with("lab04", "kd_answer", {
             "    log_q = F.log_softmax(student_logits / T, dim=-1)":
             "    log_q = F.log_softmax(F.softmax(student_logits / T, dim=-1), dim=-1)"})},
         ["double_softmax"]),
        ("the KD loss without the T^2 factor (charged in Part A, not again in Part B), and the draft's cost taken "
         "from the parameter counts (an untied embedding table read in full; charged in the speed-up, not again in "
         "the break-even)",
         {"kd_answer": solution_with("lab04", "kd_answer", {"    return kl.mean() * T * T": "    return kl.mean()"}),
          "predict_speedup": solution_with("lab04", "predict_speedup", {
              "        head = V * D ": "        head = V * D * (1 if cfg.tie_word_embeddings else 2) "})},
         ["no_t2", "parameter_ratio"]),
        ("a pass whose drafts all pass counted as g tokens (no bonus token; charged in the speed-up, not again in "
         "the break-even), and the break-even taken as a = c whatever g",
         {"predict_speedup": solution_with("lab04", "predict_speedup", {
             "    tokens = sum(a ** k for k in range(g + 1))": "    tokens = sum(a ** k for k in range(g))",
             "    if not pays(1.0):\n":
             "    return 1 / predict_speedup(draft_cfg, target_cfg, 0.0, 1, context) - 1   # c\n"
             "    if not pays(1.0):\n"})},
         ["no_bonus", "marginal_rate"]),
        ("the draft's steps left out of a pass's cost",
         {"predict_speedup": solution_with("lab04", "predict_speedup", {
             "    return tokens / (g * c + 1)": "    return tokens / 1"})},
         ["draft_free"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_draft_speedup": {"points": 2, "rubric": [
        (1, "quotes their own predicted and measured speed-ups for two draft lengths, and the measured c and "
            "verify_cost beside the model's (c from the reads, verification 1); explains the gap by the broken "
            "assumptions (the tiny models' steps are not memory-bound on a CPU: per-call cost and arithmetic make "
            "the one-layer draft relatively dearer than its reads; verifying g + 1 positions costs more than one "
            "step, growing with g; each pass's bookkeeping), apportioned with the 'theory with the measured c' "
            "columns"),
        (1, "works out the break-even acceptance at g = 1 from the measured c and verify_cost (1 + a = c + "
            "verify_cost), compares it with the measured a, and says which lever matters where (here the cost of "
            "the steps, not the acceptance; on a GPU serving a large target the reads ratio is small and a "
            "verification costs about one step, so a better-distilled draft, a higher a, is the lever)"),
    ]},
}
