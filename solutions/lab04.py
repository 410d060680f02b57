# %% [markdown] id="c002"
# # Lab 04 · Knowledge distillation
#
# In this lab you write the losses of Module 04 yourself:
#
# * **Part A (4 points): the KD loss** with a temperature and the T² factor.
# * **Part B (3 points): the combined loss** α·KD + (1 − α)·CE.
# * **Part C (3 points): the acceptance rate** Σ min(p, q) of a draft distribution q against a target p.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell. Run it: the tests you see check fixed examples and tell you
#   what was expected and what came. When grading, **hidden tests** also check your code on fresh random
#   inputs against the course's reference implementation, so make it correct in general.
# * Use `torch` and `torch.nn.functional`. Do not import the answers from `course_lib.distill`: the hidden
#   tests check that the code is your own.
# * Everything runs on a CPU in seconds. Total: 10 points.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import time

import torch
import torch.nn.functional as F

from course_lib.checks import check_close, check_equal, check_raises, check_shape


def _own_work(fn, name):
    """The grader's check that `fn` is the student's own, not course_lib.distill's."""
    if getattr(fn, "__module__", None) != "__main__":
        raise AssertionError(f"{name} must be defined in this notebook, not imported "
                             f"(it comes from {getattr(fn, '__module__', '?')})")
    for ref in fn.__code__.co_names:
        val = fn.__globals__.get(ref)
        mod = getattr(val, "__module__", None) or getattr(val, "__name__", "")
        if isinstance(mod, str) and mod.startswith("course_lib.distill"):
            raise AssertionError(f"{name} uses {ref} from {mod}: write it yourself")


# %% [markdown] id="c004"
# ## Part A · The KD loss (4 points)
#
# Implement `kd_loss(student_logits, teacher_logits, temperature)`: the forward KL divergence from the
# teacher's softened distribution to the student's, times T²,
#
# $$T^2 \cdot \frac{1}{N}\sum_{n=1}^{N} \sum_x p_T(x)\,\log\frac{p_T(x)}{q_S(x)},\qquad
#   p_T = \mathrm{softmax}(z_T / T),\quad q_S = \mathrm{softmax}(z_S / T),$$
#
# averaged over the N positions. The logits have shape `[..., V]` (any number of leading dimensions, all of
# them positions); return a scalar tensor. It must be differentiable with respect to `student_logits`.
#
# Hints: `F.log_softmax` of the **logits** divided by T gives log-probabilities directly (never take a
# softmax twice); `F.kl_div(input, target, log_target=True)` computes Σ exp(target)·(target − input)
# elementwise, that is KL(target ‖ input) — mind the order, and mind what its `reduction` divides by.
# Why T²: the gradient of the KL shrinks like 1/T² as T grows; the factor keeps its size independent of T.

# %% id="c005" nbgrader={"grade": false, "grade_id": "kd_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kd_loss(student_logits, teacher_logits, temperature=2.0):
    """T^2 * mean over positions of KL(softmax(teacher / T) || softmax(student / T))."""
    ### BEGIN SOLUTION
    T = float(temperature)
    log_q = F.log_softmax(student_logits / T, dim=-1)    # [..., V]
    log_p = F.log_softmax(teacher_logits / T, dim=-1)    # [..., V]
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)         # [...] per position
    return kl.mean() * T * T
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "kd_t1_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
_s = torch.tensor([[0.0, 1.0, 2.0]])
_t = torch.tensor([[2.0, 1.0, 0.0]])
check_close(kd_loss(_s, _t, 1.0), 1.1504207, "kd_loss([[0, 1, 2]], [[2, 1, 0]], T=1)", atol=1e-5)
check_close(kd_loss(_s, _s, 1.0), 0.0, "kd_loss(x, x, T=1) (student == teacher)", atol=1e-6)
check_close(kd_loss(_s + 5.0, _s, 1.0), 0.0, "kd_loss(x + 5, x, T=1) (shifting all logits changes nothing)",
            atol=1e-5)
_s2 = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0]]])
_t2 = torch.tensor([[[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]])
check_close(kd_loss(_s2, _t2, 1.0), 0.3726465, "kd_loss of a [1, 2, 4] batch at T=1 (mean over the 2 positions)",
            atol=1e-5)
check_shape(kd_loss(_s2, _t2, 1.0), (), "kd_loss(...) (a scalar)")
# T = 1 is the plain KL divergence of the two softmaxes
_p, _q = torch.softmax(_t2, -1), torch.softmax(_s2, -1)
check_close(kd_loss(_s2, _t2, 1.0), (_p * (_p / _q).log()).sum(-1).mean(), "kd_loss at T=1 vs sum p log(p/q)",
            atol=1e-5)
print("Part A (T = 1): visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.distill import kd_loss as _ref_kd

_own_work(kd_loss, "kd_loss")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _shape in ((5, 7), (3, 4, 50), (2, 2, 3, 11)):
    _a = torch.randn(*_shape, generator=_g) * 3
    _b = torch.randn(*_shape, generator=_g) * 3
    check_close(kd_loss(_a, _b, 1.0), _ref_kd(_a, _b, 1.0), f"kd_loss at T=1, random {_shape} (seed {_seed})",
                atol=1e-4, rtol=1e-4)
    check_close(kd_loss(_a, _a, 1.0), 0.0, f"kd_loss(x, x, T=1), random {_shape}", atol=1e-5)
### END HIDDEN TESTS

# %% id="c007" nbgrader={"grade": true, "grade_id": "kd_temperature_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_close(kd_loss(_s, _t, 2.0), 1.2806268, "kd_loss([[0, 1, 2]], [[2, 1, 0]], T=2)", atol=1e-5)
check_close(kd_loss(_s, _t, 4.0), 1.3196300, "kd_loss([[0, 1, 2]], [[2, 1, 0]], T=4)", atol=1e-5)
check_close(kd_loss(_s2, _t2, 3.0), 0.3662757, "kd_loss of the [1, 2, 4] batch at T=3", atol=1e-5)
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
### BEGIN HIDDEN TESTS
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _ in range(20):
    _shape = (int(torch.randint(1, 5, (1,), generator=_g)), int(torch.randint(1, 6, (1,), generator=_g)),
              int(torch.randint(2, 300, (1,), generator=_g)))
    _T = float(torch.rand(1, generator=_g)) * 7.5 + 0.5
    _a = torch.randn(*_shape, generator=_g) * 4
    _b = torch.randn(*_shape, generator=_g) * 4
    check_close(kd_loss(_a, _b, _T), _ref_kd(_a, _b, _T), f"kd_loss at T={_T:.2f}, random {_shape} (seed {_seed})",
                atol=1e-4, rtol=1e-4)
_a, _b = torch.randn(16, 64, generator=_g), torch.randn(16, 64, generator=_g)
_ns = [_grad_norm(T, _a, _b) for T in (5.0, 10.0, 20.0)]
check_close(max(_ns) / min(_ns), 1.0, f"gradient norms at T = 5, 10, 20 should be about equal: {_ns}", atol=0.3)
### END HIDDEN TESTS

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
### BEGIN HIDDEN TESTS
from course_lib.distill import distillation_loss as _ref_combined

_own_work(combined_loss, "combined_loss")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _ in range(20):
    _B, _L, _V = (int(torch.randint(1, 4, (1,), generator=_g)), int(torch.randint(1, 6, (1,), generator=_g)),
                  int(torch.randint(2, 200, (1,), generator=_g)))
    _a, _b = torch.randn(_B, _L, _V, generator=_g) * 3, torch.randn(_B, _L, _V, generator=_g) * 3
    _lab = torch.randint(0, _V, (_B, _L), generator=_g)
    _al, _T = float(torch.rand(1, generator=_g)), float(torch.rand(1, generator=_g)) * 4 + 0.5
    check_close(combined_loss(_a, _b, _lab, _al, _T), _ref_combined(_a, _b, _lab, _al, _T),
                f"combined_loss random [{_B}, {_L}, {_V}], alpha={_al:.2f}, T={_T:.2f} (seed {_seed})",
                atol=1e-4, rtol=1e-4)
check_raises(lambda: combined_loss(_a, _b, _lab, -0.1, 2.0), ValueError, "combined_loss(alpha=-0.1)")
### END HIDDEN TESTS

# %% [markdown] id="c011"
# ## Part C · The acceptance rate (3 points)
#
# In speculative sampling a draft proposes x ~ q and the target accepts it with probability
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
### BEGIN HIDDEN TESTS
_own_work(acceptance, "acceptance")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
_p = torch.softmax(torch.randn(6, 30, generator=_g) * 2, -1)
_q = torch.softmax(torch.randn(6, 30, generator=_g) * 2, -1)
check_close(acceptance(_p, _q), 1 - 0.5 * (_p - _q).abs().sum(-1), f"acceptance = 1 - TV on random rows (seed {_seed})",
            atol=1e-5)
# the simulated speculative sampling acceptance
_x = torch.multinomial(_q[0], 200_000, replacement=True, generator=_g)
_acc = (torch.rand(200_000, generator=_g) < (_p[0, _x] / _q[0, _x]).clamp(max=1)).float().mean()
check_close(acceptance(_p[0], _q[0]), _acc, f"acceptance vs simulated speculative sampling (seed {_seed})", atol=0.01)
### END HIDDEN TESTS
