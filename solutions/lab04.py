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
# * **Part D (2 points): predict** the draft's cost per token, `c` of Module 08's speed-up model, from the
#   two models' configs (their parameter counts), then measure it on the bundled draft and target.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell. Run it: the tests you see check fixed examples and tell you
#   what was expected and what came. When grading, the grader calls your functions on inputs of its own
#   (random logits, labels and configs drawn for you, and a grid of edge cases) and compares them with the
#   course's reference implementation, so make it correct in general.
# * Use `torch` and `torch.nn.functional`. Do not import the answers from `course_lib.distill`: the grader
#   flags an answer that imports a reference, and while it grades, the references are not in the library.
# * Everything runs on a CPU in seconds. Total: 14 points, 2 of them a written analysis your
#   instructor grades (Part E).

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
    "tied_twice": "the LM head was counted separately although it is tied: with tie_word_embeddings the output "
                  "projection is the embedding matrix itself, one V x D block, counted once; see notebook 04, "
                  "the opening section 'Module 04 · Knowledge distillation' (446,848 and 4,680,960 parameters)",
    "mlp_two": "the MLP was counted with two matrices: the course model's SwiGLU MLP has three (gate, up and "
               "down, D x F each); see notebook 04, the opening section 'Module 04 · Knowledge distillation'",
    "kv_full": "the k and v projections were counted at full width (D x H*Dh): with grouped-query attention "
               "they have num_key_value_heads heads, D x K*Dh each; see notebook 04, the opening "
               "section 'Module 04 · Knowledge distillation'",
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
# ## Part D · Predict: the draft's cost per token (2 points)
#
# A draft is worth distilling only if it is much cheaper than its target. Module 08's speed-up model takes
# that cheapness as one number, `c`: the cost of a draft step in units of a target step. At batch 1 a decode
# step reads every weight once, so before measuring anything the model of this course predicts `c` as the
# ratio of the two models' parameter counts; notebook 04 opens with it (the bundled draft has 10.5x fewer
# parameters than its target).
#
# Write `predict_cost_ratio(draft_cfg, target_cfg)`: the draft's parameter count divided by the target's,
# both computed by you from the `LlamaConfig` fields (`vocab_size` V, `hidden_size` D, `intermediate_size`
# F, `num_hidden_layers`, `num_attention_heads` H, `num_key_value_heads` K, `head_dim` Dh,
# `tie_word_embeddings`). Count every weight the course model holds, exactly:
#
# * per layer: the q and o projections (D × H·Dh each), the k and v projections (D × K·Dh each), the
#   SwiGLU MLP's gate, up and down matrices (D × F each), and two RMSNorm weight vectors (D each); no biases;
# * once: the token embedding (V × D), the final RMSNorm (D), and the LM head (V × D), which is the
#   embedding itself, counted once, when `tie_word_embeddings` is true.
#
# Raise `TypeError` when an argument is not a `LlamaConfig`. Compute the count yourself: the configs the
# grader passes have no `num_parameters` method, and `flops_per_token` is not in the library while it
# grades. The cell after the tests loads the bundled draft and target and puts your prediction next to
# their measured time per token.

# %% id="c015" nbgrader={"grade": false, "grade_id": "predict_cost", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_cost_ratio(draft_cfg, target_cfg):
    """Draft parameters / target parameters, both counted from their LlamaConfig."""
    ### BEGIN SOLUTION
    def count(cfg, name):
        if not isinstance(cfg, LlamaConfig):
            raise TypeError(f"{name} must be a LlamaConfig, got {type(cfg).__name__}")
        D, F_, V, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
        H, K = cfg.num_attention_heads, cfg.num_key_value_heads
        layer = 2 * D * H * Dh + 2 * D * K * Dh + 3 * D * F_ + 2 * D   # q, o; k, v (GQA); gate, up, down; 2 norms
        embeddings = V * D * (1 if cfg.tie_word_embeddings else 2)     # a tied LM head is the embedding itself
        return cfg.num_hidden_layers * layer + embeddings + D          # + the final norm

    return count(draft_cfg, "draft_cfg") / count(target_cfg, "target_cfg")
    ### END SOLUTION


# %% id="c016" nbgrader={"grade": true, "grade_id": "predict_cost_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Properties any exact count has (the grader checks the values on configs of its own): no expected number here.
import dataclasses as _dc

_small = LlamaConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
_big = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=1)
check_close(predict_cost_ratio(_big, _big), 1.0, "predict_cost_ratio(cfg, cfg)")
_r = float(predict_cost_ratio(_small, _big))
assert 0 < _r < 1, f"predict_cost_ratio(small, big) = {_r!r}: a smaller draft must cost a fraction of the target"
check_close(_r * predict_cost_ratio(_big, _small), 1.0, "predict_cost_ratio(a, b) * predict_cost_ratio(b, a)",
            rtol=1e-9)
assert predict_cost_ratio(_small, _dc.replace(_big, tie_word_embeddings=False)) < _r, \
    "an untied LM head is a second V x D matrix: the untied target must count more parameters than the tied one"
assert predict_cost_ratio(_small, _dc.replace(_big, num_key_value_heads=2)) < _r, \
    "with grouped-query attention k and v have K * Dh rows: two KV heads must count more than one"
assert predict_cost_ratio(_small, _dc.replace(_big, num_hidden_layers=3)) < _r, "one more layer must count more"
assert predict_cost_ratio(_dc.replace(_small, intermediate_size=32), _big) > _r, "a wider MLP must count more"
check_raises(lambda: predict_cost_ratio("tiny-draft", _big), TypeError, "predict_cost_ratio('tiny-draft', cfg)")
print("Part D: visible tests passed (the grader checks the values on configs of its own)")

# %% [markdown] id="c017"
# ## Measure: the draft's cost per token (not graded)
#
# The bundled draft and target of notebook 04: your predicted `c`, their parameter counts, and the
# measured time of one forward pass over a short window, draft over target (CPU, median of a few runs).
# The parameter ratio is a model of the cost, not the cost: the attention over the window, the embedding
# lookup (a gather, not a matmul), the norms and the fixed cost of each call do not scale with the parameter
# count, and threads help a large matmul more than a small one, so the measured ratio can land on either
# side of the prediction. That is why Module 08 measures `c` this way before it predicts a speed-up. The
# grader skips this cell.

# %% id="c018"
from course_lib.models import load as _load_model
from course_lib.perf.timing import benchmark

try:
    _pred_c = predict_cost_ratio(preset("tiny-draft"), preset("tiny"))
except NotImplementedError:
    _pred_c = None
if os.environ.get("NBGRADER_EXECUTION"):        # a measurement, not a test: the grader skips it
    print("the measurement is skipped while grading")
elif _pred_c is None:
    print("Finish the exercises above first.")
else:
    _tm, _ = _load_model("tiny", device="cpu")
    _dm, _ = _load_model("tiny-draft", device="cpu")
    _ids = torch.arange(5, 69).view(1, -1)          # a 64-token window
    with torch.no_grad():
        _t_s = benchmark(lambda: _tm(_ids), warmup=2, repeats=7).median
        _d_s = benchmark(lambda: _dm(_ids), warmup=2, repeats=7).median
    print(f"parameters: draft {_dm.num_parameters():,}, target {_tm.num_parameters():,}; ratio "
          f"{_dm.num_parameters() / _tm.num_parameters():.4f}")
    print(f"predicted c = {_pred_c:.4f}; measured c = {_d_s / _t_s:.4f} (draft {1e3 * _d_s:.2f} ms, target "
          f"{1e3 * _t_s:.2f} ms per forward pass; timings on a shared machine are noisy)")

# %% [markdown] id="c019"
# ## Going further
#
# 1. **Why 1 − TV.** Show that Σ_x min(p(x), q(x)) = 1 − ½ Σ_x |p(x) − q(x)|: the acceptance is one minus
#    the total variation distance. What acceptance does a draft get that is the target with its two most
#    likely tokens swapped?
# 2. **The best draft length.** With an acceptance rate a = 0.8 and a draft whose pass costs c = 0.1 of the
#    target's, the speed-up of speculative decoding is E[tokens per pass] / (g·c + 1) (Module 08). Which draft
#    length g maximizes it, and why does a longer draft stop paying?
# 3. **Forward or reverse.** Your `kd_loss` is KL(teacher ‖ student). What changes in the student if you
#    train it with KL(student ‖ teacher) instead, and which one suits a draft for speculative decoding?

# %% [markdown] id="cw04p"
# ## Part E · Written analysis: the parameter ratio against the measured cost (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Run the measurement cell above first (it
# is skipped while grading), then answer in 100 to 200 words, about **your** numbers:
#
# 1. quote your predicted `c` and the measured one, and the measured / predicted ratio;
# 2. explain the gap: name at least two costs of a forward pass that do not scale with the parameter count,
#    and say which of the two models each one hurts relatively more (so, which way it moves `c`);
# 3. with Module 08's model (acceptance `a = 0.7`, `g = 4` drafts per pass, verification cost 1), compute the
#    predicted speed-up with your predicted `c` and with your measured `c`, and say what the difference means
#    for choosing a draft.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw04" nbgrader={"grade": true, "grade_id": "written_cost_ratio", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer: the numbers in brackets are what a student quotes from their own run.)*
#
# My prediction was c = 0.0955 (446,848 parameters against 4,680,960); the measured c was [c_m], [c_m / 0.0955]
# times the prediction.
#
# The parameter ratio assumes a forward pass costs its weights. Three costs do not scale that way. The fixed
# cost of every operator call (Python, dispatch) is about the same per call in both models, and the draft's one
# layer still runs a norm, the projections, RoPE, attention and the MLP: a larger share of its small total,
# which raises c. Threads speed up the target's larger matmuls more than the draft's small ones: c rises again.
# The embedding table counts as parameters, but a lookup reads one row of it; the table is a far larger share
# of the draft's parameters than of the target's, so this one pulls c below the ratio (unless the table is also
# the LM head, which reads all of it). On my run the first two won: c landed above the prediction.
#
# With a = 0.7 and g = 4 a pass emits (1 - 0.7⁵) / 0.3 = 2.77 tokens. With c = 0.0955 it costs 4 x 0.0955 + 1 =
# 1.38 target steps: a speed-up of 2.0. With my measured c = [c_m] it costs [4c_m + 1]: [2.77 / (4c_m + 1)].
# A draft's worth is its measured cost, not its size: a draft ten times smaller in parameters can be only three
# times cheaper, which can halve the gain.

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
