"""The acceptance step of speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Notation used everywhere in ``course_lib.speculative``:
    p   TARGET probabilities (the model whose distribution we must reproduce)
    q   DRAFT probabilities (the cheap model that proposes tokens)
    g   draft length (gamma): tokens proposed per pass
    a   acceptance rate (alpha); c: draft/target cost ratio per token

One pass: the draft samples g tokens t_0..t_{g-1} from q; the target scores them all in one forward,
giving p at the g draft positions plus one more (the "bonus" position). Then, left to right:

    accept t_i with probability min(1, p_i(t_i) / q_i(t_i))          (a coin flip, not a threshold)
    on the first rejection: emit one token from normalize(max(0, p_i - q_i)) and stop
    if all g are accepted: emit a bonus token from p_g (the target's next-token distribution)

Why this is exact: token x is emitted at position i by acceptance with probability q(x) min(1, p(x)/q(x))
= min(p(x), q(x)); it is rejected with total probability 1 - sum_x min(p(x), q(x)) = sum_x max(0, p(x)-q(x)),
and then drawn from max(0, p - q) normalized. The two add up to min(p, q) + max(0, p - q) = p(x).
Resampling from p itself on rejection (a common mistake) over-weights the tokens the draft likes; dropping
the bonus token wastes the target's last row. At temperature 0 p and q are one-hot, so the rule becomes
greedy verification: accept iff the draft picked the target's argmax, otherwise emit the target's argmax.

The code lives in ``course_lib.sampling`` (the bottom of the generation stack), so that the one generate
loop, ``course_lib.generation.generate(..., draft=...)``, runs it without importing this package.
"""
from course_lib.sampling import StepResult, accept_step, probs_from_logits

__all__ = ["StepResult", "accept_step", "probs_from_logits"]
