# %% [markdown] id="c002"
# # Lab 04 · Knowledge distillation
#
# In this lab you write the losses of Module 04 yourself:
#
# * **Part A (4 points, contract): the KD loss** with a temperature, designed from its contract: what it
#   takes, what it returns, and the properties it must keep (among them a gradient whose size does not
#   depend on the temperature).
# * **Part B (3 points): the combined loss** α·KD + (1 − α)·CE.
# * **Part C (3 points): the acceptance rate** Σ min(p, q) of a draft distribution q against a target p.
# * **Part D (3 points, contract): predict** what a distilled draft buys in speculative decoding: the
#   speed-up from the two models' configs (the numbers a memory-bound decode step reads) and the draft's
#   acceptance rate, and the acceptance below which the draft slows decoding down; then a run of the bundled
#   draft and target measures both against your prediction.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell. Run it: the tests you see check fixed examples and tell you
#   what was expected and what came. When grading, the grader calls your functions on inputs of its own
#   (random logits, labels, configs and rates drawn for you, and a grid of edge cases) and compares them with the
#   course's reference implementation, so make it correct in general.
# * Use `torch` and `torch.nn.functional`. Do not import the answers from `course_lib.distill`: the grader
#   flags an answer that imports a reference, and while it grades, the references are not in the library.
# * Everything runs on a CPU in seconds (the measurement after Part D in about half a minute). Total: 15
#   points, 2 of them a written analysis your instructor grades (Part E).

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import os

import torch
import torch.nn.functional as F

from course_lib.checks import check_close, check_equal, check_raises, check_shape
from course_lib.models.config import LlamaConfig, preset

# What the known wrong answers mean (the tests name them when your answer matches one).
MISTAKES = {
    "double_softmax": "a softmax was taken twice (log_softmax of probabilities, the lecture notes' bug): "
                      "log_softmax takes the logits divided by T; see notebook 04, section '2. Temperature and "
                      "the T² factor'",
    "no_t2": "the loss lacks the T² factor: the KL between softened distributions has gradients that shrink "
             "like 1/T², and T² restores their size; see notebook 04, section '2. Temperature and the T² factor'",
    "parameter_ratio": "the draft's cost was taken from the parameter counts: a decode step reads what it multiplies "
                       "by, and an untied model's input embedding is only looked up (one row per token), so its V x D "
                       "table is held but not read; the LM head (V x D) is read in full, tied or not, and a tied and "
                       "an untied model of one shape read the same numbers; see notebook 01, section '4. The refined "
                       "table: FLOPs and bytes of a real model' (its embed and lm_head rows)",
    "lm_head_free": "the LM head was left out of what a step reads: every step multiplies the last hidden state by the "
                    "whole V x D output matrix (the embedding itself when tied) to get the V logits; see notebook 01, "
                    "section '4. The refined table: FLOPs and bytes of a real model' (its lm_head row)",
    "mlp_two": "the MLP was counted with two matrices: the course model's SwiGLU MLP has three (gate, up and "
               "down, D x F each); see notebook 01, section '4. The refined table: FLOPs and bytes of a real model'",
    "kv_full": "the k and v projections were counted at full width (D x H*Dh): with grouped-query attention "
               "they have num_key_value_heads heads, D x K*Dh each; see notebook 01, section '4. The refined table: "
               "FLOPs and bytes of a real model' (its k_proj and v_proj rows)",
    "cache_query_heads": "the KV cache was counted with a key and a value per query head: with grouped-query "
                         "attention a layer caches num_key_value_heads heads, 2 x K x Dh numbers per token; see "
                         "notebook 01, section '4. The refined table: FLOPs and bytes of a real model' (its qk and "
                         "pv rows read only the K heads)",
    "draft_free": "the draft's steps were left out of the cost of a pass: each of the g drafts costs one draft step, "
                  "c of a target step, whether it is kept or not; with a free draft any acceptance would pay; see "
                  "Part D's description of one pass",
    "no_verify": "the target's pass was left out of the cost of a pass: every pass ends with one target pass over "
                 "the g + 1 positions, as dear as a decode step, which is what plain decoding pays per token; see "
                 "Part D's description of one pass",
    "no_bonus": "a pass whose g drafts all pass was counted as g tokens: every pass ends with one token of the "
                "target, the bonus token when nothing was rejected, so it emits g + 1; see notebook 04, section "
                "'6. The course's draft: distilled from the target' (tokens per target pass)",
    "marginal_rate": "the break-even acceptance was taken as a = c, as if every draft were emitted with probability a: "
                     "draft k is emitted only when drafts 1 to k all passed (probability a^k) while it costs c like "
                     "the first, so for g > 1 the break-even lies above c and rises with g; see Part D, hint 3",
}


# %% [markdown] id="c004"
# ## Part A · The KD loss (4 points, contract)
#
# Write `kd_loss(student_logits, teacher_logits, temperature)`, the response-based distillation loss of
# Module 04 [@hinton2015distilling]: the student learns the teacher's distribution softened by a temperature T.
#
# **Contract.**
#
# * *Takes* two logit tensors of the same shape `[..., V]` (any number of leading dimensions, all of them
#   positions) and a temperature T > 0.
# * *Returns* a scalar tensor: the forward KL divergence KL(p_T ‖ q_S) from the teacher's softened
#   distribution p_T = softmax(z_T / T) to the student's q_S = softmax(z_S / T), **averaged over the
#   positions**, times a factor that makes the size of its gradient independent of T:
#   $$T^2 \cdot \frac{1}{N}\sum_{n=1}^{N} \sum_x p_T(x)\,\log\frac{p_T(x)}{q_S(x)}.$$
# * *Invariants*: differentiable with respect to `student_logits`; 0 when the student's logits equal the
#   teacher's, or differ by a constant per position (a softmax ignores shifts); ≥ 0; at T = 1 it is the plain
#   KL of the two softmaxes; the gradient's norm hardly changes between T = 5, 10 and 20.
# * *Numerics*: no probabilities are logged (work with log-probabilities), so logits of size 50 do not
#   produce `inf` or `nan`.
# * *Refuses* (`ValueError`): logits of different shapes, a temperature that is not > 0.
#
# The grader compares your loss with `course_lib.distill`'s on random logits of random shapes and
# temperatures, and your loss's gradient with the reference's at several temperatures.
#
# <details><summary>Hint 1: which functions</summary>
#
# `F.log_softmax` of the **logits** divided by T gives log-probabilities directly (never take a softmax
# twice). `F.kl_div(input, target, log_target=True)` computes Σ exp(target)·(target − input) elementwise,
# that is KL(target ‖ input): mind the order, and mind what its `reduction` divides by (`"batchmean"`
# divides by the first dimension only). Summing over the last dimension and taking `.mean()` is safest.
# </details>
#
# <details><summary>Hint 2: why T²</summary>
#
# The gradient of the softened KL with respect to a student logit is (q_S − p_T) / T, and for large T both
# softened distributions approach uniform with differences of order 1/T, so the gradient shrinks like
# 1/T². Multiplying the loss by T² keeps its size independent of T (and comparable with the cross entropy
# it is mixed with in Part B).
# </details>

# %% id="c005" nbgrader={"grade": false, "grade_id": "kd_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kd_loss(student_logits, teacher_logits, temperature=2.0):
    """T^2 * mean over positions of KL(softmax(teacher / T) || softmax(student / T))."""
    ### BEGIN SOLUTION
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student_logits and teacher_logits must have the same shape, got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    if not float(temperature) > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    T = float(temperature)
    log_q = F.log_softmax(student_logits / T, dim=-1)    # [..., V]
    log_p = F.log_softmax(teacher_logits / T, dim=-1)    # [..., V]
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)         # [...] per position
    return kl.mean() * T * T
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "kd_t1_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
_s = torch.tensor([[0.0, 1.0, 2.0]])
_t = torch.tensor([[2.0, 1.0, 0.0]])
check_close(kd_loss(_s, _t, 1.0), 1.1504207, "kd_loss([[0, 1, 2]], [[2, 1, 0]], T=1)", atol=1e-5,
            mistakes={MISTAKES["double_softmax"]: 0.4503597})
check_close(kd_loss(_s, _s, 1.0), 0.0, "kd_loss(x, x, T=1) (student == teacher)", atol=1e-6)
check_close(kd_loss(_s + 5.0, _s, 1.0), 0.0, "kd_loss(x + 5, x, T=1) (shifting all logits changes nothing)",
            atol=1e-5)
_s2 = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0]]])
_t2 = torch.tensor([[[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]])
check_close(kd_loss(_s2, _t2, 1.0), 0.3726465, "kd_loss of a [1, 2, 4] batch at T=1 (mean over the 2 positions)",
            atol=1e-5, mistakes={MISTAKES["double_softmax"]: 0.0765866})
check_shape(kd_loss(_s2, _t2, 1.0), (), "kd_loss(...) (a scalar)")
# T = 1 is the plain KL divergence of the two softmaxes
_p, _q = torch.softmax(_t2, -1), torch.softmax(_s2, -1)
check_close(kd_loss(_s2, _t2, 1.0), (_p * (_p / _q).log()).sum(-1).mean(), "kd_loss at T=1 vs sum p log(p/q)",
            atol=1e-5)
check_raises(lambda: kd_loss(_s, _s2, 1.0), ValueError, "kd_loss of shapes (1, 3) and (1, 2, 4)")
check_raises(lambda: kd_loss(_s, _t, 0.0), ValueError, "kd_loss at T=0")
print("Part A (T = 1): visible tests passed")

# %% id="c007" nbgrader={"grade": true, "grade_id": "kd_temperature_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_close(kd_loss(_s, _t, 2.0), 1.2806268, "kd_loss([[0, 1, 2]], [[2, 1, 0]], T=2)", atol=1e-5,
            mistakes={MISTAKES["no_t2"]: 0.3201567, MISTAKES["double_softmax"]: 0.5498006})
check_close(kd_loss(_s, _t, 4.0), 1.3196300, "kd_loss([[0, 1, 2]], [[2, 1, 0]], T=4)", atol=1e-5,
            mistakes={MISTAKES["no_t2"]: 0.0824769})
check_close(kd_loss(_s2, _t2, 3.0), 0.3662757, "kd_loss of the [1, 2, 4] batch at T=3", atol=1e-5,
            mistakes={MISTAKES["no_t2"]: 0.0406973})
check_close(kd_loss(_s * 50, _t * 50, 1.0), 100.0, "kd_loss([[0, 50, 100]], [[100, 50, 0]], T=1) (large logits: "
            "no inf or nan)", rtol=1e-4)
# the gradient's size hardly changes with T (that is what the T^2 is for)
def _grad_norm(T, s, t):
    s = s.clone().requires_grad_(True)
    kd_loss(s, t, T).backward()
    return s.grad.norm().item()
_gs = torch.linspace(-1, 1, 40).reshape(2, 20) * torch.tensor([[1.0], [-0.5]])
_gt = torch.linspace(-1, 1, 40).flip(0).reshape(2, 20)
_n8, _n16 = _grad_norm(8.0, _gs, _gt), _grad_norm(16.0, _gs, _gt)
check_close(_n16 / _n8, 1.0, "gradient norm at T=16 / at T=8 (should be about 1)", atol=0.15)
print("Part A (temperature): visible tests passed")

# %% [markdown] id="c008"
# ## Part B · The combined loss (3 points)
#
# In practice the student also learns from the data: implement
#
# `combined_loss(student_logits, teacher_logits, labels, alpha, temperature)` =
# α · `kd_loss(student_logits, teacher_logits, temperature)` + (1 − α) · CE(student_logits, labels),
#
# where CE is the mean cross entropy (in nats, at temperature 1) of the student's logits `[..., V]` against
# the integer labels `[...]` (same leading shape). Raise a `ValueError` when alpha is not in [0, 1].
# Use your `kd_loss` from Part A.

# %% id="c009" nbgrader={"grade": false, "grade_id": "combined_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def combined_loss(student_logits, teacher_logits, labels, alpha=0.5, temperature=2.0):
    """alpha * KD + (1 - alpha) * cross entropy on the labels."""
    ### BEGIN SOLUTION
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    V = student_logits.shape[-1]
    ce = F.cross_entropy(student_logits.reshape(-1, V), labels.reshape(-1))
    return alpha * kd_loss(student_logits, teacher_logits, temperature) + (1 - alpha) * ce
    ### END SOLUTION


# %% id="c010" nbgrader={"grade": true, "grade_id": "combined_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
_y = torch.tensor([2])
check_close(combined_loss(_s, _t, _y, 0.0, 2.0), 0.4076059, "combined_loss(alpha=0) (pure cross entropy)", atol=1e-5)
check_close(combined_loss(_s, _t, _y, 0.7, 2.0), 1.0187205, "combined_loss([[0, 1, 2]], [[2, 1, 0]], [2], alpha=0.7, T=2)",
            atol=1e-5)
check_close(combined_loss(_s2, _t2, torch.tensor([[3, 2]]), 0.25, 3.0), 0.7976469,
            "combined_loss on the [1, 2, 4] batch, alpha=0.25, T=3", atol=1e-5)
check_raises(lambda: combined_loss(_s, _t, _y, 1.5, 2.0), ValueError, "combined_loss(alpha=1.5)")
print("Part B: visible tests passed")

# %% [markdown] id="c011"
# ## Part C · The acceptance rate (3 points)
#
# In speculative sampling [@leviathan2023fast; @chen2023accelerating] a draft proposes x ~ q and the target
# accepts it with probability
# min(1, p(x) / q(x)). Averaged over the draft's proposals, the acceptance probability is Σ_x min(p(x), q(x)).
# Implement `acceptance(p, q)` for probability tensors of shape `[..., V]`, returning a tensor `[...]`
# (one rate per position). Raise a `ValueError` when the shapes differ.

# %% id="c012" nbgrader={"grade": false, "grade_id": "acceptance_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def acceptance(p, q):
    """sum_x min(p(x), q(x)) over the last dimension."""
    ### BEGIN SOLUTION
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q).sum(-1)
    ### END SOLUTION


# %% id="c013" nbgrader={"grade": true, "grade_id": "acceptance_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_close(acceptance(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5])), 1.0, "acceptance(p, p)")
check_close(acceptance(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])), 0.0, "acceptance of disjoint p, q")
check_close(acceptance(torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.5, 0.1, 0.4])), 0.7,
            "acceptance([0.7, 0.2, 0.1], [0.5, 0.1, 0.4])", atol=1e-6)
check_shape(acceptance(torch.full((2, 3, 4), 0.25), torch.full((2, 3, 4), 0.25)), (2, 3), "acceptance of [2, 3, 4]")
check_raises(lambda: acceptance(torch.ones(3) / 3, torch.ones(4) / 4), ValueError, "acceptance of shapes (3,) and (4,)")
print("Part C: visible tests passed")


# %% [markdown] id="c014"
# ## Part D · Predict: what a distilled draft buys (3 points, contract)
#
# Distillation gives a draft that the target accepts often (Part C). Speculative decoding (Module 08) turns
# that into speed only if the draft is also cheap: every pass pays for the draft's steps, whether its tokens
# are kept or not, and for one pass of the target. Notebook 04 (section 6) counted the tokens a pass emits;
# here you put a price on the pass, from the two models' shapes, and predict what a draft buys, and how good
# it must be to buy anything at all.
#
# **The cost model.** One sequence, on an accelerator where a decode step is memory-bound (Module 01): a
# step takes a time proportional to the numbers it reads from memory, weights and cached keys and values
# alike (all stored in one format), each number read once per step. The course model's weights: per layer,
# the q and o projections (D × H·Dh each), k and v (D × K·Dh each), the SwiGLU MLP's gate, up and down
# (D × F each) and two RMSNorm vectors (D each); once, the token embedding (V × D), the final RMSNorm (D) and
# the LM head (V × D), which is the embedding matrix itself when `tie_word_embeddings` is true; no biases.
# With n tokens cached, each layer's attention also reads the key and the value of every cached token. Leave
# out the rows a step only looks up (one row of D numbers per token) and the new token's own key and value.
# (V = `vocab_size`, D = `hidden_size`, F = `intermediate_size`, H = `num_attention_heads`,
# K = `num_key_value_heads`, Dh = `head_dim`, and `num_hidden_layers` layers.)
#
# **One pass of speculative decoding.** The draft proposes g tokens, one decode step each; the target then
# scores the g + 1 positions in one pass, which reads its weights and its cache once, as one decode step
# does; the drafts are accepted in order, each with probability a independently of the others, up to the
# first rejection; the pass emits the accepted drafts and one token of the target (the correction at the
# rejection, or a bonus token when all g passed). Take the context as n tokens throughout a pass. Plain
# decoding runs one target decode step per token.
#
# **Contract.**
#
# * `predict_speedup(draft_cfg, target_cfg, a, g, context=0)` *takes* two `LlamaConfig`s, the acceptance rate
#   `a` in [0, 1], the draft length `g` (an int ≥ 0; 0 is plain decoding) and the context n (an int ≥ 0), and
#   *returns* the predicted speed-up of speculative decoding over plain decoding of the target (tokens per
#   unit of time, over plain decoding's), a float.
# * `break_even_acceptance(draft_cfg, target_cfg, g, context=0)`, for g ≥ 1, *returns* the acceptance rate at
#   which the predicted speed-up is exactly 1 (within 1e-6): below it the draft slows decoding down; `None`
#   when no rate in [0, 1] reaches 1. (It is never 0: see the invariants.)
# * *Invariants*: the speed-up is 1 at g = 0, rises with `a`, is below 1 at a = 0 (g ≥ 1), never above g + 1.
# * *Refuses*: `TypeError` when a config is not a `LlamaConfig`; `ValueError` when `a` is not in [0, 1], `g`
#   is not an int ≥ 0 (≥ 1 for the break-even) or `context` is not an int ≥ 0.
# * Count from the configs' fields yourself: the grader passes `LlamaConfig`s whose `num_parameters` method
#   is removed, and the course's own model of this is not in the library while it grades.
#
# The grader draws its own pairs of configs (tied and untied LM heads, grouped-query attention, any depth and
# width), rates, draft lengths and contexts, and compares with the course's model: within 1e-9 (relative) for
# the speed-up, 1e-6 for the break-even. The visible tests check units, limits and directions, not values.
# The cell after them measures the bundled pair and puts your predictions beside a real run.
#
# <details><summary>Hint 1: what a step reads is not what a model holds</summary>
#
# Module 01's floor, (parameters × bytes + KV bytes) / bandwidth, counts every parameter once. Be exact: for
# each weight, ask what the step does with it (multiplies by all of it, or looks up one row), and for the
# cache, how many heads a layer stores. Pitfall: a tied and an untied model of the same shape hold different
# numbers of parameters; do they read different numbers?
# </details>
#
# <details><summary>Hint 2: the price of a pass</summary>
#
# Put every cost in units of one target decode step, so plain decoding costs 1 per token. Then a pass has a
# cost (every step it runs, of either model) and an expected number of tokens (notebook 04, section 6).
# Pitfall: leaving out a step that every pass runs, or the token that every pass gets from the target.
# </details>
#
# <details><summary>Hint 3: the break-even</summary>
#
# "A draft pays when it is accepted more often than it costs" (a > c, with c the draft's step in target steps)
# is right for g = 1 only: the k-th draft is emitted only when the k − 1 before it passed too, yet it costs as
# much as the first. The speed-up rises with `a`, so the crossing of 1 can be bracketed and halved.
# </details>

# %% id="c015" nbgrader={"grade": false, "grade_id": "predict_speedup", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_speedup(draft_cfg, target_cfg, a, g, context=0):
    """Predicted speed-up of speculative decoding (g drafts a pass, acceptance a) over plain decoding."""
    ### BEGIN SOLUTION
    def reads(cfg, name):                            # numbers one decode step reads
        if not isinstance(cfg, LlamaConfig):
            raise TypeError(f"{name} must be a LlamaConfig, got {type(cfg).__name__}")
        D, F_, V, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
        H, K, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
        layer = 2 * D * H * Dh + 2 * D * K * Dh + 3 * D * F_ + 2 * D    # q, o; k, v (GQA); gate, up, down; 2 norms
        head = V * D          # the LM head, read in full, tied or not; an untied embedding table: one row, left out
        cache = 2 * L * K * Dh * context                                # a key and a value of K heads, per layer
        return L * layer + D + head + cache                             # + the final norm

    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be an int >= 0, got {context!r}")
    c = reads(draft_cfg, "draft_cfg") / reads(target_cfg, "target_cfg")   # a draft step, in target steps
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1:
        raise ValueError(f"a must be an acceptance rate in [0, 1], got {a!r}")
    if isinstance(g, bool) or not isinstance(g, int) or g < 0:
        raise ValueError(f"g must be an int >= 0, got {g!r}")
    tokens = sum(a ** k for k in range(g + 1))   # draft k is emitted when drafts 1..k passed; + the target's token
    return tokens / (g * c + 1)                  # g draft steps and one verification, in target steps
    ### END SOLUTION


def break_even_acceptance(draft_cfg, target_cfg, g, context=0):
    """The acceptance rate at which predict_speedup is 1 (None: no rate in [0, 1] reaches it)."""
    ### BEGIN SOLUTION
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ValueError(f"g must be an int >= 1, got {g!r}")

    def pays(a):
        return predict_speedup(draft_cfg, target_cfg, a, g, context) >= 1

    if not pays(1.0):
        return None
    lo, hi = 0.0, 1.0                                # the speed-up rises with a: pays(hi), not pays(lo)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pays(mid) else (mid, hi)
    return hi
    ### END SOLUTION


# %% id="c016" nbgrader={"grade": true, "grade_id": "predict_speedup_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# What any right model of the speed-up keeps (the grader checks the values, on configs of its own).
import dataclasses as _dc

_small = LlamaConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
_big = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=1)


def _speedup(d, t, a, g, context=0):
    got = predict_speedup(d, t, a, g, context)
    check_equal(isinstance(got, float) and 0 < got <= g + 1, True,
                f"predict_speedup(..., a={a}, g={g}, context={context}) = {got!r}: a float above 0 and at most "
                f"g + 1 = {g + 1} (the most tokens a pass emits, for at least one target step)")
    return got


check_close(_speedup(_small, _big, 0.7, 0), 1.0, "predict_speedup(small, big, a=0.7, g=0): no draft is plain decoding")
check_equal(_speedup(_small, _big, 0.0, 3) < 1, True, "predict_speedup(small, big, a=0, g=3) < 1: a draft that is "
            "always rejected makes decoding slower")
_curve = [_speedup(_small, _big, a, 4) for a in (0.0, 0.25, 0.5, 0.75, 1.0)]
check_equal(all(x < y for x, y in zip(_curve, _curve[1:])), True,
            f"the speed-up rises with a (a = 0, 0.25, ..., 1 at g = 4: {[round(s, 4) for s in _curve]})")
check_close(_speedup(_big, _big, 1.0, 4), 1.0, "predict_speedup(cfg, cfg, a=1, g=4): a draft as dear as its target "
            "gains nothing, even when it is always right", rtol=1e-9)
_free = _speedup(_small, _dc.replace(_big, num_hidden_layers=5000), 1.0, 4)
check_equal(4.99 < _free <= 5, True, f"a perfect draft that costs next to nothing beside a 5000-layer target: close to "
            f"g + 1 = 5 tokens per target step, got {_free!r}")
_base = _speedup(_small, _big, 0.6, 3)
check_equal(_speedup(_small, _dc.replace(_big, num_key_value_heads=2), 0.6, 3) > _base, True,
            "a target with more KV heads reads more a step: the same draft buys more")
check_equal(_speedup(_dc.replace(_small, num_hidden_layers=2), _big, 0.6, 3) < _base, True,
            "a draft with one more layer reads more a step: it buys less")
_wide = _dc.replace(_big, intermediate_size=8)          # the target's attention and cache, a narrower MLP
check_equal(_speedup(_wide, _big, 0.6, 3, context=10**6) < _speedup(_wide, _big, 0.6, 3), True,
            "a draft that caches as much per token as its target (same layers and KV heads) gets relatively dearer "
            "at a long context: it must buy less at context=10**6 than at 0")
check_raises(lambda: predict_speedup("tiny-draft", _big, 0.5, 2), TypeError, "predict_speedup('tiny-draft', cfg, ...)")
for _bad in (dict(a=1.5, g=2), dict(a=0.5, g=-1), dict(a=0.5, g=2, context=-1)):
    check_raises(lambda: predict_speedup(_small, _big, **_bad), ValueError, f"predict_speedup(small, big, {_bad})")
print("Part D (speed-up): visible tests passed (the grader checks the values on configs of its own)")

# %% id="c016b" nbgrader={"grade": true, "grade_id": "predict_break_even_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
_levels = {g: break_even_acceptance(_small, _big, g) for g in (1, 2, 4, 8)}
check_equal(all(isinstance(x, float) and 0 < x < 1 for x in _levels.values()), True,
            f"break_even_acceptance(small, big, g) for g = 1, 2, 4, 8: {_levels}: a draft cheaper than its target "
            "breaks even at a rate strictly between 0 and 1")
for _g, _x in _levels.items():
    check_close(predict_speedup(_small, _big, _x, _g), 1.0, f"predict_speedup at break_even_acceptance(small, big, "
                f"{_g}) = {_x:.6f}", atol=1e-4)
    check_equal(predict_speedup(_small, _big, max(0.0, _x - 0.01), _g) < 1 < predict_speedup(_small, _big,
                min(1.0, _x + 0.01), _g), True, f"g = {_g}: slower than plain decoding just below the break-even, "
                "faster just above")
check_equal(_levels[1] < _levels[2] < _levels[4] < _levels[8], True, "a longer draft needs a higher acceptance rate "
            "to pay: its later drafts are emitted less often than its first, and cost as much")
check_close(break_even_acceptance(_big, _big, 3), 1.0, "break_even_acceptance(cfg, cfg, 3): a draft as dear as its "
            "target breaks even only when always accepted", atol=1e-6)
check_equal(break_even_acceptance(_big, _small, 2), None, "break_even_acceptance(big, small, 2): a draft dearer than "
            "its target never pays")
check_raises(lambda: break_even_acceptance(_small, _big, 0), ValueError, "break_even_acceptance(small, big, g=0)")
check_raises(lambda: break_even_acceptance(_small, None, 2), TypeError, "break_even_acceptance(small, None, 2)")
print("Part D (break-even): visible tests passed (the grader checks the values on configs of its own)")

# %% [markdown] id="c017"
# ## Measure: what the bundled draft buys on this machine (not graded)
#
# The bundled `tiny` target and its distilled `tiny-draft`, sampling at temperature 1. The cell measures the
# draft's acceptance rate with your Part C `acceptance` on held-out code and predicts with your Part D
# functions; then it runs speculative sampling at a few draft lengths against plain decoding, both with a KV
# cache, interleaved and repeated so that a slow spell of the machine hits all of them
# (`course_lib.speculative.measure`), and shows the prediction beside the measurement. The run also measures
# your model's two assumptions: `c`, a draft step's time over a target step's (your model: their reads), and
# `verify_cost`, the target's pass over g + 1 positions over one step (your model: 1). The columns "theory
# with the measured c" put the measured values into Module 08's speed-up formula, so that you can tell which
# assumption the gap comes from. Timings are shown and judged by a verdict, never asserted. The grader skips
# this cell.

# %% id="c018"
from course_lib.models import load as _load_model
from course_lib.models.corpus import load_split as _load_split
from course_lib.perf.claims import timing_claim
from course_lib.speculative.measure import measure as _measure

_DRAFT_LENGTHS, _NEW, _PROMPT = (1, 2, 4), 32, 24
try:                                              # the measurement runs your Parts C and D: are they there?
    _ready = float(acceptance(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]))) == 0.5
    _ready = _ready and predict_speedup(preset("tiny-draft"), preset("tiny"), 0.5, 1) > 0
    break_even_acceptance(preset("tiny-draft"), preset("tiny"), 1)
except Exception:                                 # noqa: BLE001 - unfinished or wrong: the tests above say which
    _ready = False
if os.environ.get("NBGRADER_EXECUTION"):        # a measurement, not a test: the grader skips it
    print("the measurement is skipped while grading")
elif not _ready:
    print("finish Parts C and D first: the measurement runs your acceptance and your predictions")
else:
    _tm, _tok = _load_model("tiny", device="cpu")
    _dm, _ = _load_model("tiny-draft", device="cpu")
    _tok.model_max_length = 10**9                  # we cut the windows ourselves
    _ids = _tok("\n".join(_load_split("heldout", max_files=2))[:6000])["input_ids"]
    with torch.no_grad():                          # Part C's rate on 256 positions of held-out code
        _w = torch.tensor([_ids[:256]])
        _a = float(acceptance(torch.softmax(_tm(_w)[0], -1), torch.softmax(_dm(_w)[0], -1)).mean())
    _prompts = [torch.tensor(_ids[300 + 100 * i: 300 + 100 * i + _PROMPT]) for i in range(2)]
    _n = _PROMPT + _NEW // 2                       # the context, halfway through a generation
    _cd, _ct = _dm.config, _tm.config
    _rows = _measure(_tm, _dm, _prompts, draft_lengths=_DRAFT_LENGTHS, max_new_tokens=_NEW, temperature=1.0,
                     repeats=3)
    print(f"Part C's acceptance of tiny-draft on held-out code: a = {_a:.3f}; parameters: draft "
          f"{_dm.num_parameters():,}, target {_tm.num_parameters():,} (both tie their LM head to the embedding)")
    print(f"measured: c = {_rows[0]['c']:.3f} (draft step {_rows[0]['draft_step_ms']:.2f} ms, target step "
          f"{_rows[0]['target_step_ms']:.2f} ms, on this CPU)")
    print(f"{'g':>3} {'a run':>6} {'verify':>7} | {'your speed-up':>13} {'(run a)':>8} {'break-even':>10} | "
          f"{'theory, measured c':>18} {'+ verify':>8} | {'measured':>8}")
    for _r in _rows:
        _g = _r["g"]
        _mine = predict_speedup(_cd, _ct, _a, _g, _n)
        _mine_run = predict_speedup(_cd, _ct, min(1.0, max(0.0, _r["a_tested"])), _g, _n)
        _be = break_even_acceptance(_cd, _ct, _g, _n)
        print(f"{_g:>3} {_r['a_tested']:>6.3f} {_r['verify_cost']:>7.2f} | {_mine:>13.2f} {_mine_run:>8.2f} "
              f"{'none' if _be is None else f'{_be:.3f}':>10} | {_r['speedup_ideal']:>18.2f} "
              f"{_r['speedup_refined']:>8.2f} | {_r['speedup_measured']:>8.2f}")
    _best = max(_rows, key=lambda r: predict_speedup(_cd, _ct, _a, r["g"], _n))
    _pred = predict_speedup(_cd, _ct, _a, _best["g"], _n)
    timing_claim(f"speculative sampling with tiny-draft at g = {_best['g']} is {'faster' if _pred > 1 else 'not faster'} "
                 "than plain decoding on this machine, as your model predicts",
                 held=(_best["speedup_measured"] > 1) == (_pred > 1),
                 measured=f"predicted {_pred:.2f}x, measured {_best['speedup_measured']:.2f}x; measured c "
                          f"{_best['c']:.3f}, verify_cost {_best['verify_cost']:.2f}",
                 advice="Your model assumes memory-bound steps and a verification as cheap as one step: compare the "
                        "measured c and verify_cost with those assumptions (Part E), then re-run the cell to see "
                        "how much of the gap is noise.");

# %% [markdown] id="c019"
# ## Going further
#
# 1. **Why 1 − TV.** Show that Σ_x min(p(x), q(x)) = 1 − ½ Σ_x |p(x) − q(x)|: the acceptance is one minus
#    the total variation distance. What acceptance does a draft get that is the target with its two most
#    likely tokens swapped?
# 2. **The best draft length.** With the model of Part D, an acceptance rate a = 0.8 and a draft step that
#    costs c = 0.1 of a target step: which draft length g maximizes the speed-up, and why does a longer draft
#    stop paying?
# 3. **Forward or reverse.** Your `kd_loss` is KL(teacher ‖ student). What changes in the student if you
#    train it with KL(student ‖ teacher) instead, and which one suits a draft for speculative decoding?
# 4. **A long context.** SmolLM2-135M can draft for SmolLM2-1.7B (one tokenizer; `preset("smollm2-135m")`,
#    `preset("smollm2-1.7b")`). With your `predict_speedup` at a = 0.7 and g = 4, how does the predicted
#    speed-up change from a context of 0 to 8192 and 32768 tokens, and why? Which way, and how far, would it
#    go for a draft with as many layers and KV heads as its target?

# %% [markdown] id="cw04p"
# ## Part E · Written analysis: your prediction against this machine (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Run the measurement cell above first (it
# is skipped while grading), then answer in 100 to 200 words, about **your** numbers:
#
# 1. quote, for two draft lengths, your predicted speed-up and the measured one, and the measured `c` and
#    `verify_cost` beside what your model assumes for them;
# 2. explain the gap by the assumptions of your model that this machine breaks: is a decode step of these two
#    models memory-bound here, and what do a draft step and a verification pass cost instead? Use the
#    "theory with the measured c" columns to say how much of the gap each assumption accounts for;
# 3. from the measured `c` and `verify_cost`, work out the acceptance rate the draft would need at g = 1 to
#    break even on this machine, compare it with your measured `a`, and say whether a better-distilled draft
#    or a cheaper one would help more here, and which on a GPU serving a large target.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw04" nbgrader={"grade": true, "grade_id": "written_draft_speedup", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of one run on a 2-core AMD EPYC CPU, PyTorch 2.13, 2 threads; yours will
# differ.)*
#
# Part C gave a = 0.664 on held-out code; with c = 0.0955 from the reads (both models tie their embeddings, so
# reads equal parameters) my model predicted 1.52x at g = 1 and 1.87x at g = 4. The run measured 0.82x and
# 0.75x: speculative sampling was slower. It measured c = 0.190, twice my 0.0955, and a verification costing
# 1.49 steps at g = 1 and 1.95 at g = 4, where my model assumes 1.
#
# These two tiny models are not memory-bound on a CPU: a step pays a fixed cost for each of its operator calls,
# and the one-layer draft runs the same kinds of calls as each of the target's six layers, so it costs a fifth
# of the target, not a tenth; and scoring g + 1 positions costs more arithmetic than one, with no idle units to
# hide it. With the run's own a (0.640, 0.601) my model says 1.50x and 1.67x; the measured c brings it to 1.36x
# and 1.32x; the measured verify_cost to 0.98x and 0.86x; the rest, down to 0.82x and 0.75x, is each pass's
# bookkeeping. The verification is the largest share at both lengths; c matters more the longer the draft.
#
# At g = 1 a pass emits 1 + a tokens for c + verify_cost = 1.68 steps: it breaks even at a = 0.68, above the
# 0.64 measured. Here only cheaper steps would help; on a GPU serving a large target the reads ratio is small
# and a verification costs about one step, so there the acceptance, a better-distilled draft, is the lever.

# %% [markdown] id="c020" tags=["answer-key"]
# ### Answer key
#
# 1. For every x, min(p, q) = (p + q − |p − q|) / 2. Summed over x, with Σp = Σq = 1, that gives
#    Σ min(p, q) = 1 − ½ Σ|p − q| = 1 − TV(p, q). Swapping the target's two most likely tokens, with
#    probabilities p₁ > p₂, changes only those two entries, each by p₁ − p₂: TV = p₁ − p₂ and the acceptance
#    is 1 − (p₁ − p₂). With p₁ = 0.5 and p₂ = 0.3, 0.8: the draft is accepted 80 % of the time although its
#    favourite token is wrong.
# 2. E = (1 − 0.8^(g+1)) / 0.2 and the speed-up E / (0.1 g + 1): g = 1 gives 1.64, g = 3 gives 2.27,
#    g = 5 gives 2.46, g = 6 gives 2.47 (the best), g = 8 gives 2.41, g = 10 gives 2.29
#    (`course_lib.speculative.theory.optimal_draft_length(0.8, 0.1)` returns 6). Token i of a pass is kept
#    only with probability a^i, so each extra draft token adds less (0.8⁷ = 0.21 tokens for the 7th) while
#    it costs the same c = 0.1 pass: past the optimum the cost grows faster than the tokens.
# 3. KL(student ‖ teacher) weighs the log-ratio by the student's probabilities: the student is punished for
#    putting mass where the teacher has little, not for missing some of the teacher's modes, so it becomes
#    mode-seeking (sharp, on the teacher's main mode). The forward KL is mass-covering: the student spreads to
#    cover every token the teacher likes; notebook 04, section 3 fits both to a bimodal teacher. Which suits a
#    draft has no answer in general. The acceptance Σ min(p, q) = 1 − TV (item 1) is symmetric: it is lost
#    where the draft misses the target's mass and where it spreads mass the target does not have, so TV is the
#    objective speculative sampling itself sets, and neither KL is it. Greedy verification instead accepts a
#    token when the draft's argmax matches the target's, which rewards a draft sharp on the target's main
#    mode. DistillSpec trained drafts with several divergences, forward and reverse KL among them, and found
#    that the best divergence depends on the task and on the decoding strategy (greedy or sampling), the
#    other key choice being to train on the draft's own samples (on-policy data) [@zhou2024distillspec]:
#    measure the acceptance on your task and your decoding rather than pick a divergence by its shape.
# 4. At a = 0.7 and g = 4 a pass emits (1 − 0.7⁵) / 0.3 = 2.77 tokens. At a context of 0, c is the ratio of the
#    weights read, 134,515,008 / 1,711,376,384 = 0.0786 (both tie their embeddings): a speed-up of 2.11. At
#    8192 tokens c = 0.0909 (2.03x), at 32768 c = 0.1038 (1.96x). The cache adds reads per token in
#    proportion to layers x KV heads x head_dim: SmolLM2-1.7B has full multi-head attention (24 layers x 32
#    KV heads of 64: 98,304 numbers per token), the 135M draft grouped-query attention (30 layers x 3 KV
#    heads of 64: 11,520), 11.7% of the target's, more than its 7.9% share of the weights. As the context
#    grows, c moves from the weights' ratio toward the caches' ratio, 0.117 (1.89x in the limit): the draft
#    gets relatively dearer, slowly. A draft with as many layers and KV heads as its target (and the same
#    head_dim) caches as much per token, so c tends to 1 and the speed-up to 2.77 / 5 = 0.55: at long contexts
#    it slows decoding down whatever its width. A draft for long contexts needs a small cache more than small
#    weights (few layers, few KV heads, or a cache of its own that keeps only recent tokens).
