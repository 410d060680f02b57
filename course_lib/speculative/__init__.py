"""Module 08: speculative decoding.

Notation: p = target probabilities, q = draft probabilities, g = draft length, a = acceptance rate,
c = draft/target cost ratio per token.

    from course_lib.speculative import speculative_generate, accept_step, expected_tokens_per_pass
    ids, stats = speculative_generate(target, draft, prompt_ids, 64, draft_length=4)   # course models
    # = course_lib.generation.generate(target, prompt_ids, 64, draft=draft, draft_length=4): the one loop
    generate(target, prompt_ids, 64, draft=PromptLookupDraft(), draft_length=8)          # no draft model
    generate(target, prompt_ids, 64, draft=MedusaDraft(target, heads), draft_length=2)   # a tree per pass

The pass and the acceptance rule live below this package (``course_lib.generation``, ``course_lib.sampling``)
so that the one generate loop runs them; they are re-exported here with the theory and measurements.

acceptance      accept_step (min(1, p/q), residual max(0, p - q), bonus token), probs_from_logits
                (the derivation; the code is course_lib.sampling)
theory          expected_tokens_per_pass, speedup, optimal_draft_length, break_even_acceptance, acceptance_rate
loop            speculative_generate (generate(..., draft=) with full ids), SpecStats, check_tokenizers
prompt_lookup   PromptLookupDraft (n-gram drafting, a draft for generate), prompt_lookup_generate, propose_ngram,
                editing_prompts
measure         measure (a, tokens/pass, c, verify cost, predicted vs measured speed-up), step_times
hf              hf_assisted_generate (transformers' assisted generation, the outside oracle)
tree            TokenTree, build_tree, tree_attention_mask, verify_tree (one pass over a candidate tree; the
                verification itself sits beside the generate loop)
medusa          MedusaHeads, train_medusa, MedusaDraft (a tree draft for generate), medusa_generate,
                load_medusa_heads (bundled heads for `tiny`)
eagle           drafting from the target's features: EagleHead / EagleDraft (EAGLE, one layer, recurrent),
                MTPHeads / MTPDraft (DeepSeek-V3's multi-token prediction modules, one per depth),
                train_feature_heads, load_feature_heads (bundled for `tiny`)
"""
from .acceptance import StepResult, accept_step, probs_from_logits
from .hf import hf_assisted_generate
from .loop import SpecStats, check_tokenizers, speculative_generate
from .medusa import MedusaDraft, MedusaHeads, MedusaStats, load_medusa_heads, medusa_generate, train_medusa
from .eagle import (EagleDraft, EagleHead, MTPDraft, MTPHeads, feature_head_accuracy, load_feature_heads,
                    train_feature_heads)
from .measure import compare_drafts, measure, measure_prompt_lookup, step_times
from .prompt_lookup import PromptLookupDraft, editing_prompts, prompt_lookup_generate, propose_ngram
from .theory import acceptance_rate, break_even_acceptance, expected_tokens_per_pass, optimal_draft_length, speedup
from .tree import DEFAULT_PATHS, TokenTree, build_tree, tree_attention_mask, tree_positions, verify_tree

__all__ = ["acceptance_rate", "expected_tokens_per_pass", "optimal_draft_length", "speedup", "break_even_acceptance",
           "speculative_generate", "check_tokenizers", "editing_prompts", "PromptLookupDraft",
           "prompt_lookup_generate", "propose_ngram", "measure", "measure_prompt_lookup", "step_times",
           "compare_drafts", "hf_assisted_generate", "DEFAULT_PATHS", "build_tree", "MedusaHeads", "MedusaStats",
           "MedusaDraft", "train_medusa", "medusa_generate", "load_medusa_heads", "EagleHead", "EagleDraft",
           "MTPHeads", "MTPDraft", "train_feature_heads", "feature_head_accuracy", "load_feature_heads"]
