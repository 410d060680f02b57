"""The outside oracle: Hugging Face transformers' assisted generation on the same model pair.

``model.generate(..., assistant_model=draft)`` is transformers' speculative decoding. Greedy assisted
decoding is exact (it returns the target's greedy tokens), so at temperature 0 it must agree with
``speculative_generate`` and with plain greedy decoding; the tests check all three agree.
The bundled course models are saved in the Hugging Face Llama layout, so their folders load with
``AutoModelForCausalLM.from_pretrained``.
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import torch

from course_lib.models import BUNDLED, bundled_path
from course_lib.validate import integer

from .loop import check_prompt

__all__ = ["hf_assisted_generate", "load_hf"]


def load_hf(path_or_model):
    """A transformers causal LM in eval mode: a loaded model is returned as is; a bundled name
    ('tiny', 'tiny-draft') or a folder is loaded with AutoModelForCausalLM.from_pretrained."""
    if hasattr(path_or_model, "generate") and hasattr(path_or_model, "generation_config"):
        return path_or_model.eval()
    if not isinstance(path_or_model, (str, Path)):
        raise TypeError("expected a transformers model, a bundled model name or a model folder, got "
                        f"{type(path_or_model).__name__}")
    from transformers import AutoModelForCausalLM

    path = bundled_path(path_or_model) if str(path_or_model).lower() in BUNDLED else Path(path_or_model)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


class _DropInternalDeprecation(logging.Filter):
    """transformers' own assisted generation calls the assistant's ``generate`` with both a
    ``generation_config`` and ``max_new_tokens``/``min_new_tokens``, and then warns that this is
    deprecated: a message about its internals, not about our call, which a student would read as an
    error of theirs. Only that message is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Passing `generation_config` together with generation-related" not in record.getMessage()


@contextlib.contextmanager
def _quiet_internal_deprecation():
    log = logging.getLogger("transformers.generation.utils")
    f = _DropInternalDeprecation()
    log.addFilter(f)
    try:
        yield
    finally:
        log.removeFilter(f)


@torch.inference_mode()
def hf_assisted_generate(target_path_or_model, draft, input_ids, max_new_tokens: int,
                         draft_length: int = 4, temperature: float = 0.0, seed: int | None = None):
    """Run transformers' assisted generation; returns (ids [1, T + N], seconds).

    target_path_or_model / draft: transformers models, bundled names or folders (see ``load_hf``).
    draft_length: tokens the assistant proposes per pass (a constant schedule, like ours).
    temperature 0 is greedy (exact); temperature > 0 samples (seeded with `seed` if given).
    """
    target, assistant = load_hf(target_path_or_model), load_hf(draft)
    ids = check_prompt(input_ids)[None].to(target.device)
    max_new_tokens = integer(max_new_tokens, "max_new_tokens", low=1)
    draft_length = integer(draft_length, "draft_length", low=1)
    kw = dict(do_sample=False) if temperature == 0 else dict(do_sample=True, temperature=float(temperature),
                                                            top_k=0, top_p=1.0)
    if seed is not None:
        torch.manual_seed(seed)
    assistant.generation_config.num_assistant_tokens = draft_length
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0   # no early stop: fixed g
    start = time.perf_counter()
    with _quiet_internal_deprecation():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant,
                              max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                              eos_token_id=None, pad_token_id=0, **kw)
    return out, time.perf_counter() - start
