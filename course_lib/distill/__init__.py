"""Knowledge distillation: a small student learns from a large teacher (Module 04).

    losses.py       kd_loss (forward KL with T^2), reverse_kl_loss, hard_label_loss, distillation_loss,
                    FeatureProjector + feature_loss, relation_loss, and kd_loss_double_softmax (a common bug,
                    kept to show what it does)
    acceptance.py   acceptance_rate / acceptance_rates: how good a draft the student is for the teacher
    train.py        distill (white-box / black-box / scratch on the same budget), generate_teacher_corpus,
                    token_stream, new_student

The command that distils the bundled default draft `tiny-draft` and installs it with its model-card
section lives with the models' training script: `python -m course_lib.training.distill_draft`.
"""
# acceptance_rate: p, q's is speculative's
from .acceptance import acceptance_rate, acceptance_rates, expected_acceptance
from .losses import (REDUCTIONS, FeatureProjector, distillation_loss, feature_loss, hard_label_loss, kd_loss,
                     kd_loss_double_softmax, relation_loss, reverse_kl_loss)
from .train import MODES, distill, generate_teacher_corpus, new_student, token_stream

__all__ = ["kd_loss", "kd_loss_double_softmax", "reverse_kl_loss", "hard_label_loss", "distillation_loss",
           "FeatureProjector", "feature_loss", "relation_loss", "REDUCTIONS", "acceptance_rates",
           "expected_acceptance", "distill", "generate_teacher_corpus", "token_stream", "new_student", "MODES"]
