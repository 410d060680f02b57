"""The scripts that make the bundled models (layer 6: applications, above everything they use).

    python -m course_lib.training.train           # the target `tiny`, the draft `tiny-draft-scratch`, the tokenizer
    python -m course_lib.training.distill_draft   # the default draft `tiny-draft`, distilled from `tiny` (Module 04)

``make train`` runs both. The models themselves (``course_lib.models``) and distillation's losses and loop
(``course_lib.distill``) sit in lower layers; nothing in the library imports these scripts.
"""
