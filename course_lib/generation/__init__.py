"""The one generate loop: prefill, then decode (recompute, any KV cache, compiled, or speculative).

``generate(model, input_ids, max_new_tokens, ...)`` is the loop: by default every step runs the model on
the whole sequence so far (no KV cache), takes the last position's logits, samples, appends, and records
when each token was ready. ``cache=`` (Module 05) prefills once and feeds one token per step, through
any ``KVCache`` (the cache's ``attn_mask`` is passed on: a sliding window needs a banded prefill mask);
``compile=True`` (Module 12) runs that step compiled through a static cache; ``draft=`` (Module 08) makes
each step a draft-then-verify pass (speculative decoding, exact in distribution). It returns the new
tokens and a ``Trace`` from which ``course_lib.perf.metrics`` computes TTFT, TPOT, tokens/s. The package,
by role: ``loop.py`` the loop; ``speculative.py`` the draft-then-verify pass and the ``Draft`` protocol;
``tree.py`` token trees and their verification; ``calls.py`` the model calls, caches and the compiled
step; ``checks.py`` every argument check (``check_generate``); ``output.py`` what ``generate`` returns.

Drafts. ``draft=`` takes a draft *model* (a course model with the same vocabulary: it proposes
``draft_length`` tokens, sampled like the target) or a draft *object*, declared by the ``Draft`` protocol
(``speculative.py``, checked once by ``check_draft``): anything with
``propose(seq [n], budget, hidden)`` that returns a chain of tokens [k] (k <= budget) to follow ``seq``,
or a ``TokenTree`` rooted at ``seq[-1]`` of depth <= budget. ``generate`` verifies every proposal itself,
one target forward per pass: a chain causally (``accept_step``, or its greedy form), a tree with the
tree attention mask (``verify_tree``). Prompt lookup (``speculative.prompt_lookup.PromptLookupDraft``) and
Medusa (``speculative.medusa.MedusaDraft``) are such objects; a draft whose ``needs_hidden`` is True
receives the target's final hidden state [D] at the last verified token (Medusa's heads read it); one whose
``needs_hidden`` is ``"all"`` receives [m, D], the hidden states at every position verified since its last
pass (the prompt's after the prefill), and proposes chains (EAGLE's and MTP's drafts keep their own cache
of them); one with ``verified(n)`` learns after each pass that seq[:n] was kept; one with ``reset()`` is
reset when a generate call starts. The context rule is the same for all.

Sampling has one path, ``course_lib.sampling`` (a repetition penalty, then temperature, top-k, top-p, a
``torch.Generator``); its functions are re-exported here: apply_repetition_penalty, apply_temperature,
top_k_filter, top_p_filter, sampling_probs, sample, greedy, sample_rows (each row its own settings); and its
stop rule ``finish_reason`` (the serving engine's too).

Why speculative decoding runs here and not in ``course_lib.speculative``: that package (layer 5) builds
on this one (layer 4: measurement, Medusa, prompt lookup, distillation's teacher), so the loop cannot
import it. What verification needs is at or below this layer: the acceptance rule is a sampling rule
(``course_lib.sampling.accept_step``); the pass (``Speculation``) and tree verification (``verify_tree``,
the tree mask) are bookkeeping next to the loop they plug into; keeping the accepted path is the cache's own
``compact``.
``course_lib.speculative`` re-exports them and holds the drafts (``speculative_generate``,
``prompt_lookup_generate`` and ``medusa_generate`` are ``generate(..., draft=...)`` returning the full ids).

Shapes: prompt [T] or [B, T] (or a list of B prompts of different lengths, left-padded); logits [B, V] per
step; new tokens [n] (one request) or [B, n]; a tree of N nodes.
"""
from __future__ import annotations

from course_lib.perf.metrics import TokenEvent, Trace
# the sampling functions stay importable from here (course_lib.sampling is their home and lists them)
from course_lib.sampling import (apply_repetition_penalty, apply_temperature, finish_reason, greedy, sample,
                                 sample_rows, sampling_probs, top_k_filter, top_p_filter)

from .calls import context_length, decode_step, model_device, model_logits
from .checks import check_pair, prompt_tensor
from .loop import generate
from .output import GenerateOutput, SpecStats
from .speculative import Draft, check_draft
from .tree import TokenTree, TreeVerification, tree_attention_mask, tree_depths, tree_positions, verify_tree

__all__ = ["generate", "decode_step", "GenerateOutput", "SpecStats", "TokenEvent", "Trace", "model_logits",
           "model_device", "context_length", "check_pair", "prompt_tensor", "Draft", "check_draft", "TokenTree",
           "TreeVerification", "verify_tree", "tree_attention_mask", "tree_positions", "tree_depths"]
