"""How good a draft is this student for this teacher (Module 04, used again in Module 08).

    acceptance_rate / acceptance_rates   mean over held-out positions of sum_x min(p_T(x), q_S(x)): the
                                         probability that speculative sampling accepts a drafted token
                                         (temperature 0: greedy agreement, how often the argmaxes match)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# sum_x min(p(x), q(x)) = 1 - TV(p, q): the probability that speculative sampling accepts a token drafted
# from q against the target p (Module 08). One definition for the course, in speculative.theory.
from course_lib.speculative.theory import acceptance_rate as expected_acceptance
from course_lib.validate import number


def _windows(ids: list[int], W: int):
    """Non-overlapping windows of W+1 tokens (one token overlap), as score_texts scores them."""
    for s in range(0, len(ids) - 1, W):
        yield ids[s:s + W + 1]


@torch.no_grad()
def acceptance_rates(teacher, student, texts, tokenizer=None, temperatures=(1.0, 0.0), max_len: int | None = None,
                     max_tokens: int | None = None, progress: bool = False) -> dict:
    """{temperature: rate} on held-out text; see `acceptance_rate`. One forward pass of each model."""
    ids_list = _as_id_lists(texts, tokenizer)
    for i, T in enumerate(temperatures):           # checked, not converted: the values are the result's keys
        number(T, f"temperatures[{i}]", 0, finite=False)
    W = max_len or int(min(teacher.config.max_position_embeddings, student.config.max_position_embeddings))
    device = next(teacher.parameters()).device
    sums = {T: 0.0 for T in temperatures}
    n = 0
    it = ids_list
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(ids_list, desc="acceptance", unit="text")
    for ids in it:
        for chunk in _windows(ids, W):
            if max_tokens is not None and n >= max_tokens:
                break
            x = torch.tensor(chunk[:-1], device=device)[None]          # [1, t]
            lp, lq = teacher(x).float()[0], student(x).float()[0]       # [t, V] each
            for T in temperatures:
                if T == 0:
                    sums[T] += (lp.argmax(-1) == lq.argmax(-1)).sum().item()
                else:
                    sums[T] += expected_acceptance(F.softmax(lp / T, -1), F.softmax(lq / T, -1)).sum().item()
            n += x.shape[1]
    if n == 0:
        raise ValueError("texts must contain at least one token to predict")
    return {T: sums[T] / n for T in temperatures}


def acceptance_rate(teacher, student, texts, temperature: float = 1.0, tokenizer=None,
                    max_len: int | None = None, max_tokens: int | None = None) -> float:
    """Mean over held-out positions of sum_x min(p_T(x), q_S(x)) at `temperature`.

    That is the expected acceptance probability of one drafted token in speculative sampling when
    both models sample at this temperature. temperature=0 gives greedy agreement: the fraction of
    positions where the two argmaxes are equal (greedy speculative decoding accepts exactly those).
    texts: list of strings (with tokenizer; each gets an EOS in front as in bits_per_byte) or a list
    of token-id lists.
    """
    return acceptance_rates(teacher, student, texts, tokenizer, (temperature,), max_len, max_tokens)[temperature]


def _as_id_lists(texts, tokenizer) -> list[list[int]]:
    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, torch.Tensor):
        return [row.tolist() for row in (texts[None] if texts.dim() == 1 else texts)]
    if not isinstance(texts, (list, tuple)) or not texts:
        raise ValueError("texts must be a non-empty list of strings or of token-id lists")
    if isinstance(texts[0], str):
        if tokenizer is None:
            raise ValueError("tokenizer is needed when texts are strings")
        eos = tokenizer.eos_token_id
        return [[eos] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts if t]
    return [list(t) for t in texts]
