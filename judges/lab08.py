"""Lab 08's judge: the acceptance step on deterministic cases, its output law by sampling, greedy speculative
decoding, and the speed-up model.

Part A's rules are judged where the step has one right answer whatever its random draws (one-hot rows, p == q,
a residual of one token, drafts the target likes at least as much as the draft), each case on several of the
kernel's generators. Part A's law is judged by sampling in the kernel: drafts drawn here from q, the student's
step run there on a generator this judge seeds (`generator`), the histogram of the emitted token tested
here against the target's row by a chi-square test at level 1e-9 on pairs chosen so that the classic mistake's
law is far from the target's: a correct step fails a case with probability about 1e-9, resampling from p
fails it with a statistic in the hundreds. Every sample is also checked against what the contract fixes (the
kept drafts are a prefix, a draft with p >= q is never rejected, a pass that keeps every draft adds one).
Part A's greedy decoding is judged pass by pass along the target's greedy output: with one-hot rows each pass
has one right answer, so a decoder built on the student's step gives the target's greedy output (in
ceil(n / (g + 1)) passes with a perfect draft) exactly when every pass here does. Part B's prediction (rates
that change along the draft) is compared with the expectation over the pass's outcomes (where it stops),
computed here, not the solution's sum by token.
"""
import functools

import torch

from course_grading.judging import Judge, Let, call, generator, ref
from course_lib.checks import check_close, check_equal
from course_lib.sampling import accept_step as ref_accept
from course_lib.speculative.theory import expected_tokens_per_pass as ref_tokens

judge = Judge(references={
    "accept_rules_tests": ["course_lib.sampling.accept_step"],
    "accept_stat_tests": ["course_lib.sampling.accept_step"],
    "accept_greedy_tests": ["course_lib.sampling.accept_step"],
    "predict_tokens_tests": ["course_lib.speculative.theory.expected_tokens_per_pass"],
    "predict_speedup_tests": ["course_lib.speculative.theory.speedup",
                              "course_lib.speculative.theory.expected_tokens_per_pass"],
})

LEVEL = 1e-9          # a correct step fails one chi-square case with about this probability


def onehot(tokens, V):
    return torch.nn.functional.one_hot(torch.as_tensor(tokens), V).double()


def tokens_of(got, what):
    """The emitted tokens as a list of ints (a list of ints, of 0-d tensors, or a 1-d tensor)."""
    if hasattr(got, "tolist"):
        got = got.tolist()
    if not isinstance(got, (list, tuple)):
        raise AssertionError(f"{what}: expected the list of emitted tokens, got {got!r}"[:300])
    return [int(x) for x in got]


def softmax(t, *shape, scale=1.5):
    return torch.softmax(scale * torch.randn(*shape, generator=t.torch_generator(), dtype=torch.float64), -1)


def draw_rows(t, q, n):
    """n drafts [g] with draft i ~ q[i], drawn here."""
    g = t.torch_generator()
    return torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(q.shape[0])], 1)


def seed(t):
    return t.rng.randrange(2**62)


# ---------------------------------------------------------------------------------------------------
# Part A: the rules, where the answer does not depend on the draws

def rules_case(t, what, p, q, drafts, want, reps=1, mistakes=None, group="values", gens=None):
    """One case: the step on (p, q, drafts), run `reps` times, each on a generator of its own (or on `gens`);
    every run must emit `want`. `mistakes(got)`: the known mistakes a wrong run matches."""
    ops = [call("accept_step", p, q, torch.as_tensor(drafts), gens[k] if gens else generator(seed(t)))
           for k in range(reps)]
    return what, group, ops, want, mistakes


@judge.part("accept_rules_tests", groups={"values": 3, "errors": 1})
def accept_rules(t):
    cases = []
    # the visible examples, on generators of the grader's
    q = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    p = torch.cat([q, onehot([3], 4)])
    cases.append(rules_case(t, "accept_step with p == q on the drafts [1, 2] and p[2] one-hot on token 3 (all pass "
                                "+ bonus)", p, q, [1, 2], [1, 2, 3], 20, lambda got: {t.mistake("no_bonus"): [1, 2]}))
    p, q = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]), torch.tensor([[0.5, 0.5, 0.0]])
    cases.append(rules_case(t, "p[0] = [0, .5, .5], q[0] = [.5, .5, 0], draft [0]: rejected, the residual max(0, p - "
                                "q) is all on token 2", p, q, [0], [2], 20,
                            lambda got: {t.mistake("resample_from_p"): [1]}))
    p = torch.tensor([[0.2, 0.8, 0.0], [0.6, 0.0, 0.4], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]])
    cases.append(rules_case(t, "drafts [1, 1]: the first passes (p = q), the second has p = 0: replaced by the "
                                "residual [.6, 0, 0] -> token 0", p, q, [1, 1], [1, 0], 20,
                            lambda got: {t.mistake("resample_from_p"): [1, 2]}))
    cases.append(rules_case(t, "one-hot p = [1, 4, 2, 0], drafts [1, 4, 3]: accept 1 and 4, then the target's 2",
                            onehot([1, 4, 2, 0], 5), onehot([1, 4, 3], 5), [1, 4, 3], [1, 4, 2], 3, gens=[None] * 3))
    cases.append(rules_case(t, "one-hot p = [1, 4, 2, 0], drafts [1, 4, 2]: all accepted plus the bonus token 0",
                            onehot([1, 4, 2, 0], 5), onehot([1, 4, 2], 5), [1, 4, 2], [1, 4, 2, 0], 3,
                            lambda got: {t.mistake("no_bonus"): [1, 4, 2]}))
    # one-hot p and q (temperature 0): greedy verification, one right answer
    g = t.torch_generator()
    for _ in range(60):
        V, G = t.rng.randint(2, 8), t.rng.randint(1, 5)
        pt = torch.randint(0, V, (G + 1,), generator=g)
        dt = torch.where(torch.rand(G, generator=g) < 0.7, pt[:G], torch.randint(0, V, (G,), generator=g))
        P, Q = onehot(pt, V), onehot(dt, V)
        want = ref_accept(P, Q, dt, torch.Generator().manual_seed(0)).tokens
        cases.append(rules_case(t, f"accept_step on one-hot p (argmax {pt.tolist()}) and drafts {dt.tolist()}", P, Q,
                                dt, want, 1, (lambda got, w=want, G=G: {t.mistake("no_bonus"): w[:-1]}
                                              if len(w) == G + 1 else None)))
    # the drafts the target likes at least as much as the draft (p >= q there, p == q in some) are all kept;
    # the bonus row one-hot
    for k in range(30):
        V, G = t.rng.randint(2, 9), t.rng.randint(1, 5)
        Q = softmax(t, G, V)
        dt = torch.stack([torch.multinomial(Q[i], 1, generator=g)[0] for i in range(G)])
        rows = []
        for i in range(G):
            if k % 3 == 0:
                rows.append(Q[i])                       # p == q: min(1, p/q) = 1
            else:                                        # p[t] = q[t] + (1 - q[t]) r[t] >= q[t]
                rows.append(Q[i, dt[i]] * onehot(dt[i], V) + (1 - Q[i, dt[i]]) * softmax(t, V))
        b = t.rng.randrange(V)
        P = torch.stack(rows + [onehot(b, V)])
        kind = "p == q" if k % 3 == 0 else "p >= q"
        cases.append(rules_case(t, f"accept_step with {kind} at each of the drafts {dt.tolist()} (V={V}), bonus row "
                                   f"one-hot on {b}", P, Q, dt, dt.tolist() + [b], 4,
                                lambda got, d=dt.tolist(): {t.mistake("no_bonus"): d}))
    # a rejection whose residual max(0, p - q) is one token r: the first i drafts pass (p == q), draft i has p = 0
    for _ in range(12):
        V, G = t.rng.randint(3, 9), t.rng.randint(1, 4)
        i = t.rng.randrange(G)
        Q = softmax(t, G, V)
        dt = torch.stack([torch.multinomial(Q[j], 1, generator=g)[0] for j in range(G)])
        r = t.rng.choice([x for x in range(V) if x != int(dt[i])])
        qi = Q[i].clone()
        qi[r] = 0.0
        qi /= qi.sum()
        while float(qi[dt[i]]) < 0.05:          # a draft the draft model could have proposed
            qi[dt[i]] += 0.1
            qi /= qi.sum()
        s = t.rng.uniform(0.2, 0.9)
        pi = s * qi
        pi[dt[i]] = 0.0
        pi[r] = 1 - float(pi.sum())
        Q = Q.clone()
        Q[i] = qi
        P = torch.cat([Q[:i], pi[None], softmax(t, G - i, V)])
        want = dt[:i].tolist() + [r]
        support = set(torch.nonzero(pi).flatten().tolist())
        what = (f"drafts {dt.tolist()} (V={V}): {i} pass (p == q), draft {i} has p = 0 and the residual max(0, p - q) "
                f"is all on token {r}")
        # resampling from p picks any token of p[i]'s support, not only the residual's
        cases.append(rules_case(t, what, P, Q, dt, want, 8,
                                lambda got, w=want, sup=support: {t.mistake("resample_from_p"): got}
                                if got[:-1] == w[:-1] and len(got) == len(w) and got[-1] in sup else None))
    # errors: a drafted token the draft gives probability 0 (after drafts that surely pass)
    errors = [("accept_step with q[0, 2] = 0 for the drafted token 2", torch.full((2, 3), 1 / 3),
               torch.tensor([[0.5, 0.5, 0.0]]), [2])]
    for _ in range(5):
        V, G = t.rng.randint(2, 8), t.rng.randint(1, 4)
        i = t.rng.randrange(G)
        Q = softmax(t, G, V)
        dt = torch.stack([torch.multinomial(Q[j], 1, generator=g)[0] for j in range(G)])
        bad = t.rng.randrange(V)
        Q[i, bad] = 0.0
        Q[i] /= Q[i].sum()
        dt[i] = bad
        P = torch.cat([Q[:i], softmax(t, G + 1 - i, V)])
        errors.append((f"accept_step with q[{i}, {bad}] = 0 for the drafted token {bad} (drafts {dt.tolist()}, "
                       f"after {i} drafts that pass: p == q)", P, Q, dt.tolist()))
    for what, P, Q, dt in errors:
        cases.append((what, "errors", [call("accept_step", P, Q, torch.tensor(dt), generator(seed(t)))], None, None))

    outcomes = t.run([op for _, _, ops, _, _ in cases for op in ops])
    k = 0
    for what, group, ops, want, mistakes in cases:
        mine = outcomes[k:k + len(ops)]
        k += len(ops)
        with t.case(what, group=group):
            if group == "errors":
                t.raises(mine[0], "ValueError", what=what)
                continue
            for n, o in enumerate(mine):
                got = tokens_of(o.get(), what)
                check_equal(got, want, what + (f" (run {n + 1} of {len(mine)}, each on its own generator)"
                                               if len(mine) > 1 else ""),
                            mistakes=mistakes(got) if mistakes and got != want else None)


# ---------------------------------------------------------------------------------------------------
# Part A: the law of the output, by sampling

def chi2_pvalue(counts, probs):
    """Pearson's chi-square test that `counts` were drawn from `probs`: the p-value (the lab's helper)."""
    counts, probs = torch.as_tensor(counts, dtype=torch.float64), torch.as_tensor(probs, dtype=torch.float64)
    keep = probs > 0
    if float(counts[~keep].sum()) > 0:
        return 0.0
    expected = counts.sum() * probs[keep]
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def resampled_law(p, q):
    """The law of the emitted token at a position if a rejected draft were replaced by a sample of p."""
    keep = torch.minimum(p, q)
    return keep + (1 - keep.sum()) * p


def far_pair(t, min_p=0.02, min_div=0.1):
    """Random small p, q whose first rows are such that resampling from p is far from p (chi-square divergence
    >= min_div) and every token of p[0] is likely enough for the chi-square approximation."""
    for _ in range(10000):
        V, G = t.rng.randint(3, 6), t.rng.randint(1, 3)
        P, Q = softmax(t, G + 1, V), softmax(t, G, V)
        wrong = resampled_law(P[0], Q[0])
        if float(P[0].min()) >= min_p and float(((wrong - P[0]) ** 2 / P[0]).sum()) >= min_div:
            return P, Q
    raise RuntimeError("no random pair found")


def check_structure(t, out, drafts, P, Q, what):
    """What the contract fixes for every run: the kept drafts are a prefix of the drafts, then one token; a draft
    with p >= q is never rejected."""
    G = len(drafts)
    t.expect(1 <= len(out) <= G + 1, f"{what}: emitted {out} for the {G} drafts {drafts}: a pass emits the kept "
                                     f"drafts and one token more (1 to {G + 1} tokens)")
    t.expect(out[:len(out) - 1] == drafts[:len(out) - 1], f"{what}: emitted {out} for the drafts {drafts}: the "
                                                          "tokens before the last must be the kept drafts")
    j = len(out) - 1
    if j < G and out[j] != drafts[j]:
        t.expect(float(P[j, drafts[j]]) < float(Q[j, drafts[j]]),
                 f"{what}: draft {j} (token {drafts[j]}) was rejected although p = {float(P[j, drafts[j]]):.4g} >= "
                 f"q = {float(Q[j, drafts[j]]):.4g}: such a draft is always kept")


CHUNK = 500          # runs per request to the kernel, each request on a generator of its own


def sample_case(t, what, P, Q, trials, position=0):
    """Run the step `trials` times in the kernel on drafts drawn here, on generators the grader seeds; the
    histogram of the token emitted at `position` (among runs that kept the drafts before it) against
    P[position]."""
    drafts = draw_rows(t, Q, trials)
    got = []
    for start in range(0, trials, CHUNK):
        ops = [Let("p", P), Let("q", Q), Let("gen", generator(seed(t)))]
        ops += [call("accept_step", ref("p"), ref("q"), drafts[k], ref("gen"))
                for k in range(start, min(trials, start + CHUNK))]
        out = t.run(ops)
        for o in out[:3]:
            o.get()
        got += out[3:]
    G, V = Q.shape
    counts, reached, bonus, again = torch.zeros(V, dtype=torch.long), 0, 0, []
    for k, o in enumerate(got):
        dr = drafts[k].tolist()
        out = tokens_of(o.get(), what)
        check_structure(t, out, dr, P, Q, f"{what}, run {k + 1}")
        bonus += len(out) == G + 1
        if out == dr[:len(out)]:             # the last draft kept and nothing after it, or rejected and emitted
            again.append((k, out, dr))
        if out[:position] == dr[:position] and len(out) > position:
            reached += 1
            counts[out[position]] += 1
    if not bonus and any(len(out) == G for _, out, _ in again):
        k, out, dr = next(x for x in again if len(x[1]) == G)
        raise AssertionError(f"{what}, run {k + 1}: emitted {out}, the drafts and nothing more, and no run of "
                             f"{trials} emitted {G + 1} tokens: {t.mistake('no_bonus')}")
    law = P[position]
    t.expect(reached >= trials * 0.2, f"{what}: only {reached} of {trials} runs reached position {position}")
    pv = chi2_pvalue(counts, law)
    if pv <= LEVEL:
        wrong = resampled_law(law, Q[position]) if position < G else law
        why = (f": {t.mistake('resample_from_p')}" if chi2_pvalue(counts, wrong) > 1e-3 else
               ": is the step's rule exact?")
        raise AssertionError(f"{what}: the emitted token does not follow p[{position}] (chi-square p-value {pv:.2g} "
                             f"over {reached} runs; counts {counts.tolist()}, expected about "
                             f"{[round(x, 1) for x in (reached * law).tolist()]}){why}")
    if again:                               # the residual max(0, p - q) is 0 at a rejected draft (p < q there)
        k, out, dr = again[0]
        raise AssertionError(f"{what}, run {k + 1}: emitted {out} for the drafts {dr}: the last token is draft "
                             f"{len(out) - 1} again, after a rejection (the residual never gives it: p < q there) "
                             "or with no token after it")


@judge.part("accept_stat_tests", groups={"first": 3, "later": 1})
def accept_stat(t):
    pairs = [(torch.tensor([[0.10, 0.20, 0.30, 0.40], [0.25, 0.25, 0.25, 0.25], [0.4, 0.3, 0.2, 0.1]]),
              torch.tensor([[0.40, 0.30, 0.20, 0.10], [0.70, 0.10, 0.10, 0.10]]))]
    pairs += [far_pair(t) for _ in range(8)]
    for P, Q in pairs:
        P, Q = P.double(), Q.double()
        what = (f"the first emitted token over 2000 runs, V={P.shape[1]}, g={Q.shape[0]}, p[0] = "
                f"{[round(x, 3) for x in P[0].tolist()]}, q[0] = {[round(x, 3) for x in Q[0].tolist()]}")
        with t.case(what, group="first"):
            sample_case(t, what, P, Q, 2000)
    # the token after a kept draft 0 follows p[1]: draft 0 is always t0 (q[0] one-hot), kept with p[0, t0]
    for _ in range(3):
        P, Q = far_pair(t, min_div=0.12)
        P, Q = torch.cat([P[:1], P]), torch.cat([Q[:1], Q])      # rows 1.. are the pair's
        V, t0 = P.shape[1], t.rng.randrange(P.shape[1])
        a = t.rng.uniform(0.6, 0.85)
        P[0] = a * onehot(t0, V) + (1 - a) * softmax(t, V)
        Q[0] = onehot(t0, V)
        what = (f"the token after a kept draft 0 over 2500 runs, V={V}, g={Q.shape[0]}, p[1] = "
                f"{[round(x, 3) for x in P[1].tolist()]}, q[1] = {[round(x, 3) for x in Q[1].tolist()]}")
        with t.case(what, group="later"):
            sample_case(t, what, P, Q, 2500, position=1)


# ---------------------------------------------------------------------------------------------------
# Part A: greedy speculative decoding

@functools.lru_cache(maxsize=1)
def tiny_pair():
    from course_lib.models import load
    target, _ = load("tiny", device="cpu")
    draft, _ = load("tiny-draft", device="cpu")
    return target.eval(), draft.eval()


def greedy_passes(target_fn, draft_fn, prompt, n, g):
    """The passes of greedy speculative decoding with the reference's step: [(p, q, drafts, tokens)], and the
    ids. One-hot rows: every pass has one right answer."""
    ids, passes = list(prompt), []
    while len(ids) < len(prompt) + n:
        drafts, q_rows = [], []
        for _ in range(g):
            logits = draft_fn(ids + drafts)[-1]
            q_rows.append(onehot(int(logits.argmax()), logits.shape[-1]))
            drafts.append(int(logits.argmax()))
        logits = target_fn(ids + drafts)[-(g + 1):]
        p, q = onehot(logits.argmax(-1), logits.shape[-1]), torch.stack(q_rows)
        out = ref_accept(p, q, torch.tensor(drafts), torch.Generator().manual_seed(0)).tokens
        passes.append((p, q, drafts, out))
        ids += out
    return passes, ids[:len(prompt) + n]


def greedy_decode(target_fn, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(target_fn(ids)[-1].argmax()))
    return ids


def greedy_case(t, what, target_fn, draft_fn, prompt, n, g, gen=True):
    passes, ids = greedy_passes(target_fn, draft_fn, prompt, n, g)
    if ids != greedy_decode(target_fn, prompt, n):
        raise RuntimeError(f"{what}: the reference's passes do not give the greedy output")
    perfect = draft_fn is target_fn
    label = what + (f": each of the {len(passes)} passes must emit g + 1 = {g + 1} tokens" if perfect else "")
    with t.case(label):
        got = t.run([call("accept_step", p, q, torch.tensor(d), generator(seed(t)) if gen else None)
                     for p, q, d, _ in passes])
        done = len(prompt)
        for k, (o, (p, q, d, want)) in enumerate(zip(got, passes)):
            mine = tokens_of(o.get(), what)
            check_equal(mine, want, f"{what}: pass {k + 1} (after {done - len(prompt)} tokens), one-hot p (argmax "
                                    f"{p.argmax(-1).tolist()}) and drafts {d}"
                        + (" (with a perfect draft every pass keeps the g drafts and adds the bonus)" if perfect
                           else ""),
                        mistakes={t.mistake("no_bonus"): d} if want == d + want[-1:] else None)
            done += len(want)


@judge.part("accept_greedy_tests")
def accept_greedy(t):
    # the visible bigram tables
    tg = torch.Generator().manual_seed(3)
    T = torch.randn(50, 50, generator=tg)
    D = T + 0.7 * torch.randn(50, 50, generator=tg)
    target, draft = (lambda ids: T[torch.tensor(ids)]), (lambda ids: D[torch.tensor(ids)])
    for g in (1, 3, 5):
        greedy_case(t, f"greedy speculative decoding of 40 tokens (the visible 50 x 50 bigram tables, g={g})",
                    target, draft, [7], 40, g, gen=False)
        greedy_case(t, f"greedy speculative decoding of 40 tokens with the target as its own draft (the visible "
                       f"tables, g={g})", target, target, [7], 40, g, gen=False)
    # random bigram tables
    gen = t.torch_generator()
    for _ in range(3):
        V, g = t.rng.randint(5, 60), t.rng.randint(1, 6)
        scale = t.rng.uniform(0, 1)
        Tr = torch.randn(V, V, generator=gen)
        Dr = Tr + scale * torch.randn(V, V, generator=gen)
        target = lambda ids, Tr=Tr: Tr[torch.tensor(ids)]       # noqa: E731
        draft = lambda ids, Dr=Dr: Dr[torch.tensor(ids)]        # noqa: E731
        prompt = [t.rng.randrange(V)]
        greedy_case(t, f"greedy speculative decoding of 30 tokens (random {V} x {V} bigram tables, draft noise "
                       f"{scale:.2f}, prompt {prompt}, g={g})", target, draft, prompt, 30, g)
        greedy_case(t, f"greedy speculative decoding of 30 tokens with the target as its own draft (random {V} x {V} "
                       f"tables, g={g})", target, target, prompt, 30, g)
    # the course's tiny target and tiny-draft
    tm, dm = tiny_pair()
    for _ in range(2):
        prompt = [t.rng.randrange(tm.config.vocab_size) for _ in range(6)]
        g = t.rng.randint(2, 5)
        with torch.no_grad():
            greedy_case(t, f"greedy speculative decoding of 16 tokens with the course's tiny + tiny-draft (prompt "
                           f"{prompt}, g={g})", lambda ids: tm(torch.tensor([ids]))[0],
                        lambda ids: dm(torch.tensor([ids]))[0], prompt, 16, g)


# ---------------------------------------------------------------------------------------------------
# Part B: the speed-up model

def tokens_by_outcome(accept):
    """E[tokens per pass] over the pass's outcomes: it stops at draft j + 1 (drafts 1..j passed, j + 1 failed)
    with probability a_1..a_j (1 - a_(j+1)) and emits j + 1 tokens; all g pass with probability a_1..a_g and
    emit g + 1. Not the solution's sum by token."""
    total, reach = 0.0, 1.0
    for j, a in enumerate(accept):
        total += reach * (1 - a) * (j + 1)
        reach *= a
    return total + reach * (len(accept) + 1)


def mean_rate_tokens(accept):
    """The planted mistake: the notebook's constant-rate formula with the mean rate."""
    return ref_tokens(sum(accept) / len(accept), len(accept)) if accept else 1.0


def draw_accept(t):
    """A draft's rates: constant, falling (a draft or heads that guess further ahead), rising, or anything."""
    g = t.rng.randint(1, 12)
    kind = t.rng.choice(["constant", "falling", "rising", "any", "falling"])
    if kind == "constant":
        return [round(t.rng.uniform(0, 1), 3)] * g
    if kind == "any":
        return [t.rng.choice([t.rng.uniform(0, 1), 1.0, 0.0, round(t.rng.uniform(0, 1), 2)]) for _ in range(g)]
    first, decay = t.rng.uniform(0.5, 1), t.rng.uniform(0.6, 0.98)
    rates = [first * decay ** i for i in range(g)]
    return rates if kind == "falling" else rates[::-1]


TOKEN_GRID = [[], [1.0], [0.0], [0.5], [0.8] * 4, [0.9, 0.75, 0.6, 0.45], [0.45, 0.6, 0.75, 0.9], [1.0] * 12,
              [0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0], [0.999] * 32, [1e-6, 0.5], [0.9 * 0.85 ** i for i in range(8)]]


@judge.part("predict_tokens_tests", groups={"values": 3, "errors": 1})
def predict_tokens(t):
    cases = TOKEN_GRID + [draw_accept(t) for _ in range(40)]
    got = t.run([call("expected_tokens_per_pass", acc) for acc in cases])
    for acc, o in zip(cases, got):
        want = tokens_by_outcome(acc)
        what = f"expected_tokens_per_pass({[round(a, 4) for a in acc]})"
        with t.case(what, group="values"):
            check_close(o.get(), want, what, rtol=1e-9,
                        mistakes={t.mistake("tokens_without_target_token"): want - 1,
                                  t.mistake("mean_acceptance"): mean_rate_tokens(acc),
                                  t.mistake("independent_positions"): 1 + sum(acc)})
    bad = [[1.5, 0.3], [0.5, -0.1], [-0.1], [0.2, 0.3, 1.0000001]]
    got = t.run([call("expected_tokens_per_pass", acc) for acc in bad])
    for acc, o in zip(bad, got):
        what = f"expected_tokens_per_pass({acc})"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what + " (rates must be probabilities in [0, 1])")


@judge.part("predict_speedup_tests", groups={"values": 3, "errors": 1})
def predict_speedup(t):
    cases = [([0.8] * 4, 0.05, None), ([0.9, 0.75, 0.6, 0.45], 0.05, 1.6), ([0.0] * 3, 0.1, None),
             ([1.0] * 4, 0.0, None), ([], 0.3, 2.0), ([1.0] * 8, 0.1, 2.0), ([0.45, 0.6, 0.75, 0.9], 0.0, 1.0),
             ([0.3], 0.5, None), ([0.9 * 0.85 ** i for i in range(6)], 0.05, 1.9)]
    for _ in range(40):
        acc = draw_accept(t)
        cases.append((acc, t.rng.uniform(0, 0.5), t.rng.choice([None, 1.0 + 0.15 * len(acc),
                                                                1.0 + 2 * t.rng.random()])))
    got = t.run([call("speedup", acc, c) if vc is None else call("speedup", acc, c, verify_cost=vc)
                 for acc, c, vc in cases])
    for (acc, c, vc), o in zip(cases, got):
        what = f"speedup({[round(a, 4) for a in acc]}, {c!r}" + ("" if vc is None else f", verify_cost={vc!r}") + ")"
        cost = len(acc) * c + (1.0 if vc is None else vc)
        with t.case(what, group="values"):
            want = tokens_by_outcome(acc) / cost
            check_close(o.get(), want, what, rtol=1e-9,
                        mistakes={t.mistake("tokens_without_target_token"): want - 1 / cost,
                                  t.mistake("mean_acceptance"): mean_rate_tokens(acc) / cost,
                                  t.mistake("independent_positions"): (1 + sum(acc)) / cost})
    bad = [([0.5], -0.1, None), ([0.5, 0.5], 0.1, 0.0), ([0.5], 0.1, -1.0), ([1.5], 0.1, None)]
    got = t.run([call("speedup", acc, c) if vc is None else call("speedup", acc, c, verify_cost=vc)
                 for acc, c, vc in bad])
    for (acc, c, vc), o in zip(bad, got):
        what = f"speedup({acc}, {c!r}" + ("" if vc is None else f", verify_cost={vc!r}") + ")"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what + " (c >= 0, verify_cost > 0, rates in [0, 1])")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("on a rejection the replacement is sampled from p instead of the residual max(0, p - q); and the expected "
         "tokens per pass count the accepted drafts only (no +1 for the target's token)",
         {"accept_answer": solution_with("lab08", "accept_answer", {
             "out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))":
             "out.append(int(torch.multinomial(p[i], 1, generator=generator)))"}),
          "predict_speedup": solution_with("lab08", "predict_speedup", {
              "    tokens, reach = 1.0, 1.0": "    tokens, reach = 0.0, 1.0"})},
         ["resample_from_p", "tokens_without_target_token"]),
        ("no bonus token when every draft is accepted",
         {"accept_answer": solution_with("lab08", "accept_answer", {
             "    out.append(int(torch.multinomial(p[g], 1, generator=generator)))\n": ""})},
         ["no_bonus"]),
        ("the draft summarized by its mean rate in the constant-rate formula",
         {"predict_speedup": solution_with("lab08", "predict_speedup", {
             "    tokens, reach = 1.0, 1.0": "    mean = sum(accept) / len(accept) if accept else 0.0\n"
                                           "    accept = [mean] * len(accept)\n"
                                           "    tokens, reach = 1.0, 1.0"})},
         ["mean_acceptance"]),
        ("each draft counted with its own rate, as if a pass went on after a rejection",
         {"predict_speedup": solution_with("lab08", "predict_speedup", {
             "        reach *= a\n": "        reach = a\n"})},
         ["independent_positions"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_speedup_model": {"points": 2, "rubric": [
        (1, "quotes their own a, c, and predicted vs measured tokens per pass and speed-up for at least two g"),
        (1, "explains the disagreements by named broken assumptions (acceptances correlated along the text, "
            "not independent; verification costing more than one step on a CPU without a cache, growing with "
            "g; per-pass overhead) and compares the g the measurement and the model favour"),
    ]},
}
