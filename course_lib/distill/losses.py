"""Distillation losses (Module 04). All take logits, never probabilities, on any leading shape [..., V].

    kd_loss                 forward KL(p_T || q_S) on temperature-softened distributions, times T^2
    kd_loss_double_softmax  a tutorial's KD loss with a double softmax, kept to show what that bug does
    reverse_kl_loss         KL(q_S || p_T): mode-seeking, the student may drop some of the teacher's modes
    hard_label_loss         cross entropy on the data's next tokens
    distillation_loss       alpha * KD + (1 - alpha) * CE
    feature_loss            MSE between projected student hidden states and the teacher's (feature-based)
    relation_loss           MSE between pairwise cosine-similarity matrices (relation-based)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.validate import integer, number, probability

REDUCTIONS = ("batchmean", "sum", "none")


def _check_pair(student_logits, teacher_logits, temperature=1.0, reduction="batchmean"):
    for name, x in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor [..., vocab], got {type(x).__name__}")
        if x.dim() == 0:
            raise ValueError(f"{name} must have a vocabulary dimension, got a scalar")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student_logits and teacher_logits must have the same shape [..., vocab], got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    number(temperature, "temperature", 0, low_open=True, finite=False)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _reduce(per_position: torch.Tensor, reduction: str) -> torch.Tensor:
    """per_position [...] -> mean over positions ("batchmean"), sum, or unchanged ("none")."""
    if reduction == "none":
        return per_position
    return per_position.sum() if reduction == "sum" else per_position.mean()


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 2.0,
            reduction: str = "batchmean") -> torch.Tensor:
    """Forward KL(p_T || q_S) between the softened distributions, times T^2 (Hinton et al., 2015).

    student_logits, teacher_logits: [..., V]. p_T = softmax(teacher / T), q_S = softmax(student / T).
    "batchmean" averages the per-position KL over every leading position (what the math means by the
    KL "per token"); "sum" sums it; "none" returns it per position [...].

    Why T^2: the gradient of KL(softmax(t/T) || softmax(s/T)) with respect to s is (q_S - p_T) / T, and
    for large T the difference q_S - p_T itself shrinks like 1/T, so the gradient scales like 1/T^2.
    Multiplying by T^2 keeps its size roughly independent of T, so changing T does not secretly change
    the learning rate or the balance with the hard-label loss.
    """
    _check_pair(student_logits, teacher_logits, temperature, reduction)
    T = float(temperature)
    log_q = F.log_softmax(student_logits.float() / T, dim=-1)   # [..., V] student log-probs
    log_p = F.log_softmax(teacher_logits.float() / T, dim=-1)   # [..., V] teacher log-probs
    # kl_div(input=log q, target=log p, log_target=True) = sum_x p (log p - log q), elementwise
    kl = F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1)   # [...]
    return _reduce(kl, reduction) * T * T


def kd_loss_double_softmax(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                           temperature: float = 2.0) -> torch.Tensor:
    """A double-softmax KD loss met in tutorials, reproduced to show its bug: log_softmax of probabilities.

    softmax(student / T) is already a distribution; log_softmax of it treats those probabilities as
    logits in [0, 1], which makes an almost uniform distribution. The loss then measures the teacher's
    distance from uniform, is far from zero when the student equals the teacher, and hardly depends on
    the student at all (its gradient is about V times too small). Do not use; see `kd_loss`.
    """
    _check_pair(student_logits, teacher_logits, temperature)
    T = float(temperature)
    soft_teacher = F.softmax(teacher_logits.float() / T, dim=-1)
    soft_student = F.softmax(student_logits.float() / T, dim=-1)
    flat_s = F.log_softmax(soft_student, dim=-1).reshape(-1, soft_student.shape[-1])   # the bug
    return F.kl_div(flat_s, soft_teacher.reshape(flat_s.shape), reduction="batchmean") * T * T


def reverse_kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
                    reduction: str = "batchmean") -> torch.Tensor:
    """Reverse KL(q_S || p_T) = sum_x q_S log(q_S / p_T), times T^2.

    Mode-seeking: putting student mass where the teacher has almost none costs a lot, leaving out
    teacher mass costs little, so a weak student concentrates on the teacher's main modes (used for
    generative LMs, e.g. MiniLLM). Forward KL is mass-covering instead.
    """
    _check_pair(student_logits, teacher_logits, temperature, reduction)
    T = float(temperature)
    log_q = F.log_softmax(student_logits.float() / T, dim=-1)   # [..., V]
    log_p = F.log_softmax(teacher_logits.float() / T, dim=-1)   # [..., V]
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)               # [...]
    return _reduce(kl, reduction) * T * T


def hard_label_loss(student_logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross entropy (nats) of student_logits [..., V] against integer labels [...]."""
    if not isinstance(student_logits, torch.Tensor) or not student_logits.is_floating_point():
        raise TypeError("student_logits must be a floating-point torch.Tensor [..., vocab]")
    if not isinstance(labels, torch.Tensor) or labels.dtype not in (torch.long, torch.int32):
        raise TypeError("labels must be an integer torch.Tensor [...]")
    if labels.shape != student_logits.shape[:-1]:
        raise ValueError(f"labels must have shape {tuple(student_logits.shape[:-1])} (the logits without the "
                         f"vocabulary dimension), got {tuple(labels.shape)}")
    V = student_logits.shape[-1]
    return F.cross_entropy(student_logits.reshape(-1, V).float(), labels.reshape(-1).long(),
                           ignore_index=ignore_index)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      alpha: float = 0.5, temperature: float = 2.0, kind: str = "forward") -> torch.Tensor:
    """alpha * KD(student, teacher; T) + (1 - alpha) * CE(student, labels).

    kind: "forward" (kd_loss) or "reverse" (reverse_kl_loss). The T^2 inside the KD term keeps the two
    terms on comparable scales whatever T is, so alpha means the same thing at every temperature.
    """
    alpha = probability(alpha, "alpha")
    if kind not in ("forward", "reverse"):
        raise ValueError(f"kind must be 'forward' or 'reverse', got {kind!r}")
    kd = (kd_loss if kind == "forward" else reverse_kl_loss)(student_logits, teacher_logits, temperature)
    return alpha * kd + (1.0 - alpha) * hard_label_loss(student_logits, labels)


class FeatureProjector(torch.nn.Module):
    """A learned linear map from the student's hidden size to the teacher's (trained with the student).

    The student is narrower than the teacher, so its hidden states cannot be compared directly;
    FitNets-style feature distillation learns this projection jointly.
    device, dtype: where the weight is created (PyTorch's factory convention); build it on the hidden
    states' device, e.g. ``FeatureProjector(Ds, Dt, device=student_hidden.device)``.
    """

    def __init__(self, student_dim: int, teacher_dim: int, device=None, dtype=None):
        super().__init__()
        student_dim = integer(student_dim, "student_dim", low=1)
        teacher_dim = integer(teacher_dim, "teacher_dim", low=1)
        self.proj = torch.nn.Linear(student_dim, teacher_dim, bias=False, device=device, dtype=dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [..., Ds] -> [..., Dt]
        return self.proj(h)


def feature_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                 projector: FeatureProjector) -> torch.Tensor:
    """Mean squared error between projector(student_hidden) [..., Dt] and teacher_hidden [..., Dt].

    The course model returns the final hidden states (after the last norm) with return_hidden=True.
    """
    if not isinstance(projector, FeatureProjector):
        raise TypeError(f"projector must be a FeatureProjector, got {type(projector).__name__}")
    if student_hidden.shape[:-1] != teacher_hidden.shape[:-1]:
        raise ValueError(f"student_hidden and teacher_hidden must agree on the leading shape, got "
                         f"{tuple(student_hidden.shape)} and {tuple(teacher_hidden.shape)}")
    proj = projector.proj
    if student_hidden.shape[-1] != proj.in_features or teacher_hidden.shape[-1] != proj.out_features:
        raise ValueError(f"projector maps {projector.proj.in_features} -> {projector.proj.out_features} but the "
                         f"hidden sizes are {student_hidden.shape[-1]} and {teacher_hidden.shape[-1]}")
    where = projector.proj.weight.device
    if where != student_hidden.device or where != teacher_hidden.device:
        raise ValueError(f"projector is on {where} but the hidden states are on {student_hidden.device} and "
                         f"{teacher_hidden.device}: build it there, FeatureProjector(..., "
                         f"device=student_hidden.device), or move it with projector.to(...)")
    return F.mse_loss(projector(student_hidden.float()), teacher_hidden.float())


def relation_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor) -> torch.Tensor:
    """MSE between the pairwise cosine-similarity matrices of the tokens' representations.

    student_hidden [B, T, Ds], teacher_hidden [B, T, Dt] -> a scalar. Relation-based distillation copies
    how tokens relate to each other, not the features themselves, so no projection is needed: both
    similarity matrices are [B, T, T] whatever the hidden sizes.
    """
    for name, h in (("student_hidden", student_hidden), ("teacher_hidden", teacher_hidden)):
        if not isinstance(h, torch.Tensor) or h.dim() != 3:
            raise ValueError(f"{name} must be a [batch, tokens, dim] tensor")
    if student_hidden.shape[:2] != teacher_hidden.shape[:2]:
        raise ValueError(f"student_hidden and teacher_hidden must have the same [batch, tokens], got "
                         f"{tuple(student_hidden.shape[:2])} and {tuple(teacher_hidden.shape[:2])}")
    s = F.normalize(student_hidden.float(), dim=-1)   # [B, T, Ds] unit rows
    t = F.normalize(teacher_hidden.float(), dim=-1)   # [B, T, Dt]
    return F.mse_loss(s @ s.transpose(1, 2), t @ t.transpose(1, 2))   # [B, T, T] vs [B, T, T]
