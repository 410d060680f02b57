# %% [markdown] id="c002"
# # 08 · Speculative decoding
#
# Decoding one token at a time is slow for a reason we met in Module 01: at batch 1 every step reads all
# the weights to produce a single token, so the GPU waits on memory, not on arithmetic. Scoring **several**
# tokens in one forward costs about the same as scoring one. Speculative decoding exploits that: a cheap
# **draft** guesses `g` tokens, the expensive **target** checks all of them in one pass, and a clever
# acceptance rule keeps the output distributed **exactly** as if the target had sampled alone. Two groups
# published it independently: *speculative decoding* at Google [@leviathan2023fast] and *speculative
# sampling* at DeepMind [@chen2023accelerating]; the rule below is the same in both.
#
# In this notebook:
#
# 1. one draft-then-verify pass, by hand;
# 2. the acceptance rule `min(1, p/q)`, the residual `max(0, p - q)` and the bonus token, why the output
#    follows the target exactly, and an empirical check; a common but wrong sketch of the rule, shown biased;
# 3. temperature 0 is greedy decoding, token for token;
# 4. the theory: expected tokens per pass and the speed-up model;
# 5. measured on this machine, against the theory (and why a CPU disagrees with the GPU idealization);
# 6. choosing a draft; prompt-lookup drafting; Medusa heads and tree verification;
# 7. drafting from the target's own features: an EAGLE head and DeepSeek-V3-style multi-token prediction,
#    measured against the distilled draft and Medusa; adaptive draft length; transformers' assisted generation;
# 8. a step-through widget.
#
# Notation throughout (the same in `course_lib.speculative`): **p** = target probabilities, **q** = draft
# probabilities, **g** = draft length, **a** = acceptance rate, **c** = cost of a draft step / cost of a
# target step.

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()
N_TRIALS = 3000 if QUICK else 20000          # acceptance steps in the empirical checks
GEN_TOKENS = 24 if QUICK else 128            # tokens generated in the timed runs
NUM_PROMPTS = 2 if QUICK else 6
DRAFT_LENGTHS = (1, 2, 4) if QUICK else (1, 2, 3, 4, 6, 8)
REPEATS = 1 if QUICK else 3
MEDUSA_STEPS = 30 if QUICK else 600          # only used if the bundled Medusa heads are missing
MEDUSA_TOKENS = 4096 if QUICK else 200_000
FEATURE_STEPS = 40 if QUICK else 1500        # only used if the bundled EAGLE / MTP heads are missing
FEATURE_TOKENS = 4096 if QUICK else 300_000

# %% id="c004"
import math

import matplotlib.pyplot as plt
import torch

from course_lib.generation import generate
from course_lib.models import load
from course_lib.models.corpus import load_split
from course_lib.speculative import (acceptance_rate, accept_step, expected_tokens_per_pass, measure,
                                    optimal_draft_length, probs_from_logits, speculative_generate, speedup)

torch.set_num_threads(1)
torch.manual_seed(0)
target, tok = load("tiny", device="cpu")
tok.model_max_length = 10**9        # we cut the texts ourselves; silence the length warning
draft, _ = load("tiny-draft", device="cpu")
n_target = sum(p.numel() for p in target.parameters())
n_draft = sum(p.numel() for p in draft.parameters())
print(f"target: {n_target / 1e6:.2f}M parameters, draft: {n_draft / 1e6:.2f}M ({n_draft / n_target:.0%} of the target)")

heldout = load_split("heldout", max_files=20)
prompts = []
for text in heldout:
    ids = tok.encode(text[:2000])
    if len(ids) >= 48:
        prompts.append(torch.tensor(ids[:32]))
    if len(prompts) == NUM_PROMPTS:
        break
print(f"{len(prompts)} held-out prompts of 32 tokens, e.g. {tok.decode(prompts[0].tolist())[:60]!r}")


def chi2_pvalue(counts, probs):
    """Pearson's chi-square goodness-of-fit p-value of `counts` under `probs` (cells with probs > 0)."""
    counts, probs = counts.double(), probs.double()
    keep = probs > 0
    expected = counts.sum() * probs[keep]
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def a_tested(st):
    """The acceptance rate of the theory: accepted / tested proposals (after a rejection the rest of a
    pass's proposals are never tested)."""
    return st.accepted / max(st.accepted + st.rejections, 1)


# %% [markdown] id="c005"
# ## 1 · One pass, by hand
#
# The draft proposes `g = 4` tokens one after the other (4 cheap forwards). The target then runs **one**
# forward over the context plus the 4 proposals; its logits at the last 5 positions give `p` at each
# proposal and one more row, the distribution of the token **after** the last proposal. `accept_step`
# then decides.

# %% id="c006"
g = 4
gen = torch.Generator().manual_seed(1)
ctx = prompts[0].tolist()
with torch.no_grad():
    drafts, q_rows = [], []
    for _ in range(g):
        q_row = probs_from_logits(draft(torch.tensor([ctx + drafts]))[0, -1])
        drafts.append(int(torch.multinomial(q_row, 1, generator=gen)))
        q_rows.append(q_row)
    p = probs_from_logits(target(torch.tensor([ctx + drafts]))[0, -(g + 1):])   # [g+1, V]: one target pass
q = torch.stack(q_rows)                                                          # [g, V]
res = accept_step(p, q, torch.tensor(drafts), gen)
print("context:", repr(tok.decode(ctx[-12:])))
for i, t in enumerate(drafts):
    if i < len(res.draws):
        verdict = "accept" if i < res.num_accepted else "REJECT"
        print(f"  draft {i}: {tok.decode([t])!r:12} p={float(p[i, t]):.3f} q={float(q[i, t]):.3f} "
              f"min(1,p/q)={res.ratios[i]:.3f} u={res.draws[i]:.3f} -> {verdict}")
    else:
        print(f"  draft {i}: {tok.decode([t])!r:12} not tested (comes after a rejection)")
print(f"emitted {len(res.tokens)} tokens: {[tok.decode([t]) for t in res.tokens]} "
      f"({res.num_accepted} accepted + 1 {'bonus' if res.bonus else 'corrected'})")
assert len(res.tokens) == res.num_accepted + 1

# %% [markdown] id="c007"
# ## 2 · The acceptance rule, and why the output follows the target
#
# For each proposal `t ~ q`, left to right:
#
# * draw `u` uniform in [0, 1) and **accept** `t` if `u < min(1, p(t) / q(t))`;
# * at the first rejection, emit one token drawn from the **residual** `r = max(0, p - q) / sum(max(0, p - q))`
#   and end the pass;
# * if all `g` pass, emit a **bonus** token from the target's last row `p[g]`: the target computed it anyway.
#
# **Why the first emitted token is distributed as p** (the rest follows by repeating the argument, since
# after an accepted token we are in the same situation one position later). Fix a token `x`. It can come
# out in two ways:
#
# * drafted and accepted: `q(x) * min(1, p(x)/q(x)) = min(p(x), q(x))`;
# * some draft rejected, then `x` drawn from the residual. The chance of a rejection is
#   `1 - sum_y min(p(y), q(y))`, and since `p(y) = min(p(y), q(y)) + max(0, p(y) - q(y))` for every `y`,
#   that is exactly `sum_y max(0, p(y) - q(y))`: the normalizer of the residual. So this route gives
#   `sum_y max(0, p(y) - q(y)) * max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y)) = max(0, p(x) - q(x))`.
#
# Together: `min(p(x), q(x)) + max(0, p(x) - q(x)) = p(x)`. Nothing about `q` survives: a bad draft only
# makes us reject more often, it never changes what we emit. The acceptance rate of one proposal is
# `a = sum_x min(p(x), q(x)) = 1 - TV(p, q)`, one minus the total variation distance. This is the proof of
# both papers [@leviathan2023fast; @chen2023accelerating], in the notation of `course_lib.speculative`.
#
# > **Claim checked: the lecture notes cite "Accelerating Large Language Model Decoding with Speculative
# > Sampling" as Leviathan et al., 2023.** That title is Chen, Borgeaud, Irving, Lespiau, Sifre and Jumper
# > (DeepMind, arXiv 2302.01318, February 2023), who sped up Chinchilla 70B by 2-2.5x
# > [@chen2023accelerating]. Leviathan, Kalman and Matias (Google) wrote "Fast Inference from Transformers
# > via Speculative Decoding" (arXiv 2211.17192, November 2022; ICML 2023), with T5-XXL
# > [@leviathan2023fast]. The two papers found the same acceptance rule independently; the notes' line
# > merges them into one that does not exist. Cite each for what it did: Leviathan et al. for the name
# > *speculative decoding*, the analysis of section 4 and the expected-speed-up model; Chen et al. for
# > *speculative sampling* and its measurements on a 70B model.
#
# **The empirical check.** Below, real `p` and `q` from the two models at one position (top-6 filtered so
# the histogram is readable; the rule then reproduces the filtered target), fresh drafts from `q` each
# trial, and the histogram of the first emitted token against `p`.

# %% id="c008"
with torch.no_grad():
    ctx = prompts[1].tolist()
    lt = target(torch.tensor([ctx]))[0, -1]
    ld = draft(torch.tensor([ctx]))[0, -1]
p1 = probs_from_logits(lt, 1.0, top_k=6)
q1 = probs_from_logits(ld, 1.0, top_k=6)
support = sorted(set((p1 > 0).nonzero().flatten().tolist()) | set((q1 > 0).nonzero().flatten().tolist()))
print(f"a = sum min(p, q) = {float(acceptance_rate(p1, q1)):.3f} on this position")
# rows: p at the position and a bonus row (irrelevant for the first token); g = 1 keeps the demo fast
P1, Q1 = torch.stack([p1, p1]), q1[None]


def first_token_counts(step, P, Q, trials, gen):
    drafts = torch.multinomial(Q[0], trials, replacement=True, generator=gen)
    counts = torch.zeros(P.shape[-1], dtype=torch.long)
    for t in drafts:
        counts[step(P, Q, t[None], gen)[0]] += 1
    return counts


gen = torch.Generator().manual_seed(2)
counts = first_token_counts(lambda P, Q, d, g_: accept_step(P, Q, d, g_).tokens, P1, Q1, N_TRIALS, gen)
pv = chi2_pvalue(counts, p1)
print(f"{N_TRIALS} trials, chi-square p-value {pv:.3f}")
assert counts[p1 == 0].sum() == 0, "emitted a token the target gives probability 0"
assert pv > 1e-4, pv       # a correct rule fails this 1 time in 10,000

labels = [repr(tok.decode([t]))[1:-1] for t in support]
x = torch.arange(len(support)).float()
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.bar(x - 0.27, p1[support], 0.27, label="p (target)", color="#1f5fbf")
ax.bar(x, q1[support], 0.27, label="q (draft)", color="#a0a0a0")
ax.bar(x + 0.27, counts[support].double() / N_TRIALS, 0.27, label="emitted (speculative)", color="#1a7f37")
ax.set_xticks(x.tolist())
ax.set_xticklabels(labels, rotation=30)
ax.set_title(f"first emitted token over {N_TRIALS} passes: follows p, not q (chi-square p = {pv:.2f})")
ax.legend(fontsize=8)
plt.show()


# %% [markdown] id="c009"
# > **Claim checked: "on rejection, resample from the target; when all drafts pass, we are done."**
# > Informal write-ups of speculative decoding sometimes sketch the algorithm this way. Both halves are wrong.
# >
# > * **Resampling from p** emits `x` with probability `min(p(x), q(x)) + (1 - a) p(x)`, not `p(x)`: the
# >   tokens the draft likes get counted twice. The cell below runs that rule and measures the bias.
# > * **No bonus token** keeps the output correct but throws away the target's last row. The token drawn
# >   after a rejection (the residual, or the corrected token) is still emitted, so every pass still emits at
# >   least one token; what is lost is the bonus in the one case where all `g` drafts pass, which has
# >   probability `a^g`. A pass then emits on average `1 + a + ... + a^(g-1) = (1 - a^g) / (1 - a)` tokens
# >   instead of `1 + a + ... + a^g`: `a^g` fewer, a loss that grows with the quality of the draft. The cell
# >   below prints both, and a simulation after it checks both formulas.

# %% id="c010"
def wrong_step(P, Q, d, gen):
    """The sketched rule: on rejection, sample from p (no residual); no bonus token."""
    out = []
    for i in range(d.numel()):
        t = int(d[i])
        if float(torch.rand((), generator=gen)) < min(1.0, float(P[i, t] / Q[i, t])):
            out.append(t)
            continue
        out.append(int(torch.multinomial(P[i], 1, generator=gen)))
        return out
    return out or [-1]


a1 = float(acceptance_rate(p1, q1))
law_wrong = torch.minimum(p1, q1) + (1 - a1) * p1
gen = torch.Generator().manual_seed(3)
counts_wrong = first_token_counts(wrong_step, P1, Q1, N_TRIALS, gen)
pv_wrong = chi2_pvalue(counts_wrong, p1)
tv_wrong = 0.5 * float((law_wrong - p1).abs().sum())
print(f"resample-from-p: exact total variation from p = {tv_wrong:.3f}; chi-square p-value {pv_wrong:.2g}")
for t in sorted(support, key=lambda t: -float(p1[t]))[:4]:
    print(f"  {tok.decode([t])!r:10} p={float(p1[t]):.3f}  wrong rule: exact {float(law_wrong[t]):.3f}, "
          f"measured {int(counts_wrong[t]) / N_TRIALS:.3f}   correct rule measured {int(counts[t]) / N_TRIALS:.3f}")
assert pv_wrong < 1e-6, pv_wrong
for a_ in (0.5, 0.8):       # without the bonus: 1 + a + ... + a^(g-1), i.e. a^g fewer
    print(f"a={a_}, g=4: tokens per pass with the bonus {expected_tokens_per_pass(a_, 4):.3f}, "
          f"without {sum(a_ ** j for j in range(4)):.3f} (a^g = {a_ ** 4:.3f} fewer)")

# %% [markdown] id="c010a"
# A simulation of the two formulas: in each pass the `g = 4` proposals are accepted independently with
# probability `a`; `k` = the number of leading acceptances. With the bonus a pass emits `k + 1` tokens, without
# it `min(k + 1, g)` (the residual token after a rejection is still emitted). The check allows 5 standard
# errors of the mean over the simulated passes
# (a correct formula fails that about 6 times in 10 million; the seed makes the run reproducible).

# %% id="c010b"
N_PASSES = 400_000
gen = torch.Generator().manual_seed(5)
for a_ in (0.5, 0.8):
    k = (torch.rand(N_PASSES, 4, generator=gen) < a_).int().cumprod(1).sum(1)   # leading acceptances, 0..g
    sims = {"with the bonus": (k + 1).double(), "without": (k + 1).clamp(max=4).double()}
    formulas = {"with the bonus": expected_tokens_per_pass(a_, 4), "without": sum(a_ ** j for j in range(4))}
    for name, x in sims.items():
        mean, se = float(x.mean()), float(x.std()) / math.sqrt(N_PASSES)
        print(f"a={a_}, g=4, {name:14s}: simulated {mean:.4f} +- {se:.4f} (1 s.e.), formula {formulas[name]:.4f}")
        assert abs(mean - formulas[name]) < 5 * se, (a_, name, mean, formulas[name])
    assert int(sims["without"].min()) >= 1       # without the bonus a pass never emits 0 tokens

# %% [markdown] id="c011"
# ### Acceptance is a coin flip, not a threshold
#
# A proposal with `p/q = 0.3` is accepted 30% of the time, not never. A deterministic rule such as
# "accept if `p(t)/q(t) >= 0.5`" looks reasonable but is biased: it removes every token the draft
# over-rates by more than 2x, and gives no way to put the right mass back. Measured, per draft token:

# %% id="c012"
gen = torch.Generator().manual_seed(4)
trials = N_TRIALS
d_all = torch.multinomial(q1, trials, replacement=True, generator=gen)
acc = torch.zeros(len(p1)), torch.zeros(len(p1))
for t in d_all:
    r = accept_step(P1, Q1, t[None], gen)
    acc[1][t] += 1
    acc[0][t] += r.num_accepted
print(" token       min(1,p/q)   measured acceptance")
for t in support:
    if acc[1][t] >= 50:
        ratio = min(1.0, float(p1[t] / q1[t]))
        print(f" {tok.decode([t])!r:10}  {ratio:10.3f}   {float(acc[0][t] / acc[1][t]):10.3f}  ({int(acc[1][t])} drafts)")
        assert abs(float(acc[0][t] / acc[1][t]) - ratio) < 5 * math.sqrt(0.25 / float(acc[1][t])) + 1e-9
thr = lambda pp, qq: torch.where(pp / qq.clamp_min(1e-30) >= 0.5, qq, torch.zeros_like(qq))  # accepted mass
law_thr = thr(p1, q1) + (1 - thr(p1, q1).sum()) * torch.clamp(p1 - q1, min=0) / torch.clamp(p1 - q1, min=0).sum()
print(f"threshold rule (accept iff p/q >= 0.5, residual otherwise): total variation from p = "
      f"{0.5 * float((law_thr - p1).abs().sum()):.3f} (the coin-flip rule: 0)")

# %% [markdown] id="c013"
# ## 3 · Temperature 0 is greedy decoding
#
# At temperature 0, `p` and `q` are one-hot on their argmax. Then `min(1, p/q)` is 1 if the draft picked
# the target's argmax and 0 otherwise, and the residual is the target's one-hot: the rule becomes **greedy
# verification**, and the output must equal the target's own greedy decoding token for token.
# `speculative_generate` (KV caches for both models, cropped after every rejection) checks that here; it is
# the library's one generate loop with a draft, `generate(target, ids, n, draft=draft, draft_length=g)`,
# returning the whole sequence.

# %% id="c014"
for pr in prompts:
    ref = generate(target, pr, GEN_TOKENS, cache="contiguous").tokens         # plain greedy, new tokens [n]
    for g_ in DRAFT_LENGTHS:
        out, st = speculative_generate(target, draft, pr, GEN_TOKENS, draft_length=g_, temperature=0.0)
        assert torch.equal(out[0, len(pr):].cpu(), ref), (g_, out, ref)
print(f"greedy speculative == greedy target on {len(prompts)} prompts x g in {DRAFT_LENGTHS} "
      f"({GEN_TOKENS} tokens each); last run: a = {a_tested(st):.2f}, "
      f"{st.emitted / st.passes:.2f} tokens per pass")
print("continuation:", repr(tok.decode(out[0, -GEN_TOKENS:].tolist())[:80]))

# %% [markdown] id="c015"
# ## 4 · How much does it buy? The speed-up model
#
# Suppose each proposal passes independently with probability `a` (the simplification Leviathan et al.
# analyse [@leviathan2023fast]). A pass emits `k + 1` tokens when the first `k` pass (the `+ 1` is the
# corrected or bonus token), so
#
# `E[tokens per pass] = 1 + a + a^2 + ... + a^g = (1 - a^(g+1)) / (1 - a)`     (`g + 1` at `a = 1`).
#
# A pass costs `g` draft steps (`c` each, in target steps) and one target verification over `g + 1`
# tokens. On a GPU at batch 1 that verification costs about one decode step (memory-bound: the weights are
# read once either way), so
#
# `speed-up = E[tokens per pass] / (g c + verify_cost)`, with `verify_cost ≈ 1` on a GPU.
#
# Longer drafts help until the extra draft steps and the rejected tail cost more than they bring; the best
# `g` grows with `a` and shrinks with `c`.

# %% id="c016"
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
gs = list(range(0, 13))
for a_ in (0.5, 0.7, 0.8, 0.9, 0.95):
    axes[0].plot(gs, [speedup(a_, g_, 0.05) for g_ in gs], marker="o", ms=3, label=f"a = {a_}")
axes[0].set_xlabel("draft length g")
axes[0].set_ylabel("predicted speed-up (c = 0.05)")
axes[0].axhline(1, color="grey", lw=0.7)
axes[0].legend(fontsize=8)
cs = [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5]
for a_ in (0.6, 0.8, 0.9):
    axes[1].plot(cs, [optimal_draft_length(a_, c_) for c_ in cs], marker="o", label=f"a = {a_}")
axes[1].set_xscale("log")
axes[1].set_xlabel("draft/target cost ratio c")
axes[1].set_ylabel("best g")
axes[1].legend(fontsize=8)
plt.tight_layout()
plt.show()
print(f"a = 0.8, c = 0.05: best g = {optimal_draft_length(0.8, 0.05)}, "
      f"speed-up {speedup(0.8, optimal_draft_length(0.8, 0.05), 0.05):.2f}x; "
      f"a = 0.5: best g = {optimal_draft_length(0.5, 0.05)}, {speedup(0.5, optimal_draft_length(0.5, 0.05), 0.05):.2f}x")
assert optimal_draft_length(0.9, 0.01) >= optimal_draft_length(0.6, 0.01) >= optimal_draft_length(0.6, 0.3)
assert speedup(0.0, 4, 0.1) < 1                       # a useless draft costs time

# %% [markdown] id="c017"
# ## 5 · Measured on this machine
#
# `course_lib.speculative.measure` runs plain cached greedy decoding and speculative decoding for each `g`
# on the same prompts, interleaved (so a slow moment of a shared machine hits all of them), and measures in
# the same run: `a`, tokens per pass, `c` (draft step / target step, both with a KV cache) and the target's
# cost of verifying `g + 1` tokens relative to one (`verify_cost`). It predicts the speed-up twice: with
# the GPU idealization `verify_cost = 1`, and with the measured `verify_cost`.

# %% id="c018"
rows = measure(target, draft, prompts, draft_lengths=DRAFT_LENGTHS, max_new_tokens=GEN_TOKENS, repeats=REPEATS)
r0 = rows[0]
print(f"target step {r0['target_step_ms']:.2f} ms, draft step {r0['draft_step_ms']:.2f} ms: c = {r0['c']:.2f}; "
      f"plain decoding {r0['plain_ms_per_token']:.2f} ms/token   (CPU, 1 thread)")
print("(a = accepted / tested proposals)")
print("  g     a   tokens/pass (pred)   verify_cost   speed-up: ideal  with verify  measured")
for r in rows:
    print(f"{r['g']:3d} {r['a_tested']:5.2f}   {r['tokens_per_pass']:6.2f} ({r['tokens_per_pass_pred']:5.2f})"
          f"   {r['verify_cost']:10.2f}   {r['speedup_ideal']:14.2f}  {r['speedup_refined']:11.2f}"
          f"  {r['speedup_measured']:8.2f}")
err_ideal = sum(abs(r["speedup_ideal"] - r["speedup_measured"]) for r in rows) / len(rows)
err_refined = sum(abs(r["speedup_refined"] - r["speedup_measured"]) for r in rows) / len(rows)
print(f"mean |predicted - measured| speed-up: idealized {err_ideal:.3f}, with the measured verify_cost {err_refined:.3f}"
      f" -> closer in this run: {'the measured verify_cost' if err_refined < err_ideal else 'the idealization'}")
n_over = sum(r["speedup_ideal"] > r["speedup_measured"] for r in rows)
print(f"the idealized prediction is above the measured speed-up in {n_over} of {len(rows)} rows; "
      f"measured verify_cost {min(r['verify_cost'] for r in rows):.2f} to {max(r['verify_cost'] for r in rows):.2f}")
for r in rows:
    assert abs(r["tokens_per_pass"] - r["tokens_per_pass_pred"]) < 0.5 * r["tokens_per_pass_pred"]

fig, ax = plt.subplots(figsize=(9, 3.2))
ax.plot([r["g"] for r in rows], [r["speedup_ideal"] for r in rows], "o--", label="predicted, verify_cost = 1 (GPU idealization)")
ax.plot([r["g"] for r in rows], [r["speedup_refined"] for r in rows], "s--", label="predicted, measured verify_cost")
ax.plot([r["g"] for r in rows], [r["speedup_measured"] for r in rows], "^-", label="measured")
ax.axhline(1, color="grey", lw=0.7)
ax.set_xlabel("draft length g")
ax.set_ylabel("speed-up over plain decoding")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))     # beside the plot, off the data
plt.tight_layout()
plt.show()

# %% [markdown] id="c019"
# What the table says:
#
# * **Tokens per pass** agree with `(1 - a^(g+1)) / (1 - a)` computed from the measured `a` (the formula
#   assumes independent acceptances; on real text easy and hard stretches cluster, which the per-pass
#   prediction partly absorbs).
# * **The idealized model tends to over-predict on this CPU** because `verify_cost` is not 1: scoring
#   `g + 1` tokens costs noticeably more than scoring one (the cell prints the measured range, and in how
#   many rows the idealized prediction was above the measurement in this run; with noisy timings not
#   always all of them). On a GPU at batch 1 a decode step is memory-bound: the
#   time goes into reading the weights, and 5 tokens reuse each weight read 5 times for almost free. Here
#   the model is tiny (its weights sit in the CPU caches) and the small matrix products are bound by
#   arithmetic and per-call overhead, so more tokens take more time. The cell prints the mean error of
#   both predictions and which one was closer in this run. Which one wins varies from run to run: both
#   share the measured `c`, and timings on a shared machine are noisy, so this is reported, not asserted.
# * **c** (printed above) is far from the few percent of real deployments, which pair e.g. a 70B target
#   with a 1B-class draft: our draft has about a tenth of the target's parameters, but per-layer and
#   per-call overheads do not shrink with the width, and on a shared machine `c` moves from run to run.
#
# The measured speed-ups are timings on a shared CPU: noisy, reported here, not asserted.

# %% [markdown] id="c020"
# ## 6 · Choosing the draft
#
# The acceptance rate is `a = E[sum_x min(p(x), q(x))]` over the positions we decode: a draft is good when
# its distribution is close to the target's, not when it is accurate on its own. We can estimate `a`
# without generating anything, from one forward of each model over held-out text (at temperature 1; at
# temperature 0, `a` is the rate of argmax agreement). A draft distilled from the target (Module 04) is
# trained to match exactly these distributions.
#
# The cell also sets these estimates beside section 5, at the same `g = 4`: the greedy run's `a` on the
# target's own continuation of a prompt, and the predicted speed-up both with the GPU idealization
# (`verify_cost = 1`) and with the `verify_cost` measured in section 5.

# %% id="c021"
G_CMP = 4                                    # in DRAFT_LENGTHS in both modes
r_g = next(r for r in rows if r["g"] == G_CMP)
c_ = r0["c"]
drafts_to_compare = {"tiny-draft (distilled)": draft, "tiny-draft-scratch": load("tiny-draft-scratch", device="cpu")[0]}
ids_eval = torch.tensor([tok.encode("\n".join(heldout[-6:])[:3000])[:256 if QUICK else 512]])
with torch.no_grad():
    lt = target(ids_eval)[0]
    for name, dm in drafts_to_compare.items():
        ldm = dm(ids_eval)[0]
        a_t1 = float(acceptance_rate(torch.softmax(lt, -1), torch.softmax(ldm, -1)).mean())
        a_t0 = float((lt.argmax(-1) == ldm.argmax(-1)).float().mean())
        _, st = speculative_generate(target, dm, prompts[0], GEN_TOKENS, draft_length=G_CMP)
        a_run = a_tested(st)
        print(f"{name:24s} estimated a on held-out text: temperature 1 {a_t1:.3f}, temperature 0 {a_t0:.3f}; "
              f"greedy run on prompt 0: a = {a_run:.2f}, {st.emitted / st.passes:.2f} tokens per pass")
        print(f"{'':24s} predicted speed-up at g = {G_CMP}, c = {c_:.2f}: from the held-out a = {a_t0:.2f}: "
              f"{speedup(a_t0, G_CMP, c_):.2f}x ideal, {speedup(a_t0, G_CMP, c_, r_g['verify_cost']):.2f}x with "
              f"verify_cost {r_g['verify_cost']:.2f}; from the greedy run's a: {speedup(a_run, G_CMP, c_):.2f}x ideal, "
              f"{speedup(a_run, G_CMP, c_, r_g['verify_cost']):.2f}x")
print(f"section 5, tiny-draft at g = {G_CMP} on {len(prompts)} prompts: a = {r_g['a_tested']:.2f}, predicted "
      f"{r_g['speedup_ideal']:.2f}x ideal, {r_g['speedup_refined']:.2f}x with the measured verify_cost; "
      f"measured {r_g['speedup_measured']:.2f}x")

# %% [markdown] id="c021a"
# Why the predicted speed-up here can sit far from the measured ones of section 5 (the numbers are
# printed above):
#
# * **Different text.** The held-out estimate scores the drafts on human-written code, one position at a
#   time; section 5 (over all prompts) and the greedy run here (prompt 0 only) measure `a` on the target's
#   own greedy continuations of the prompts, a different text, and the `a`s printed above differ. The two
#   predictions per draft (from the held-out `a` and from the greedy run's `a`, same `c` and `g`) differ by
#   exactly that.
# * **Different cost model.** The "ideal" figures assume `verify_cost = 1`; on this CPU the `verify_cost`
#   measured in section 5 (printed above) is not 1, and the figures "with verify_cost" use it instead.
# * **One `g`, one `c`.** The figure is for `g = 4`, which need not be the best draft length here, and uses
#   the `c` measured once in section 5, which moves from run to run on a shared machine.
#
# Compare like with like: the section 5 row at the same `g` (last line above) is the measured number, and
# its prediction uses the `a` of the same runs. The held-out estimate is a cheap way to compare drafts
# without generating, not a prediction of the speed-up to two digits.

# %% [markdown] id="c022"
# ## 7 · Drafting without a draft model: prompt lookup
#
# When the output copies from the input (editing code, answering from a document, summarizing), the
# cheapest draft is the input itself: find the last few generated tokens earlier in the context and propose
# what followed them there (n-gram matching, "prompt lookup decoding" [@saxena2023prompt]). `c ≈ 0` (a search, no model), and
# greedy verification keeps the output exactly the target's. We test it on an input-grounded task: a
# held-out function, then its first line again, so continuing means largely repeating the body.

# %% id="c023"
from course_lib.speculative import editing_prompts, measure_prompt_lookup, prompt_lookup_generate

edit = editing_prompts(tok, num=1 if QUICK else 4)
n_copy = GEN_TOKENS if QUICK else 96
for pr, body_len in edit:
    ref = generate(target, pr, n_copy, cache="contiguous").tokens
    out, st = prompt_lookup_generate(target, pr, n_copy, draft_length=8)
    assert torch.equal(out[0, len(pr):].cpu(), ref)
print(f"prompt lookup == greedy; a (accepted / tested) = {a_tested(st):.2f}, {st.emitted / st.passes:.2f} tokens per pass")
for r in measure_prompt_lookup(target, [pr for pr, _ in edit], draft_lengths=(4, 8), max_new_tokens=n_copy,
                               repeats=REPEATS):
    print(f"g = {r['g']}: a = {r['a']:.2f}, tokens per pass {r['tokens_per_pass']:.2f}, "
          f"measured speed-up {r['speedup_measured']:.2f}x (CPU, 1 thread; a here = accepted / proposed)")

# %% [markdown] id="c024"
# ## 8 · Medusa heads and tree verification
#
# Medusa drops the separate draft: small extra **heads** on the target's own last hidden state guess the
# tokens 2, 3, 4 steps ahead [@cai2024medusa]. Each head gives its top-k candidates, and instead of one chain
# we verify a **tree** of candidate continuations in one target forward (token-tree verification, introduced
# by SpecInfer [@miao2024specinfer]). The trick is the **tree attention mask**: all
# tree nodes sit in one sequence, but each node may attend only to the context, its ancestors and itself,
# so every branch is scored as if it were alone. Greedy verification then keeps the longest branch that
# agrees with the target's argmax, plus one token of the target's own.

# %% id="c025"
from course_lib.speculative.tree import DEFAULT_PATHS, tree_attention_mask
from course_lib.speculative.medusa import load_medusa_heads, medusa_generate, train_medusa

parents = [-1]
index = {(): 0}
for path in DEFAULT_PATHS:                 # nodes in the order of the paths, each after its parent
    index[path] = len(parents)
    parents.append(index[path[:-1]])
mask = tree_attention_mask(parents)
fig, ax = plt.subplots(figsize=(3.6, 3.6))
ax.imshow(mask.numpy(), cmap="Greens")
labels = ["root"] + ["".join(str(i) for i in p) for p in DEFAULT_PATHS]
ax.set_xticks(range(len(labels)))
ax.set_xticklabels(labels, rotation=90, fontsize=7)
ax.set_yticks(range(len(labels)))
ax.set_yticklabels(labels, fontsize=7)
ax.set_title("tree attention mask (row attends to column)", fontsize=9)
plt.show()
for path, i in index.items():        # each node sees exactly itself and its ancestors, no other branch
    assert set(mask[i].nonzero().flatten().tolist()) == {index[path[:k]] for k in range(len(path) + 1)}

try:
    heads = load_medusa_heads("tiny")
    where = "bundled heads"
except FileNotFoundError:
    heads, _ = train_medusa(target, heldout[:10], tok, steps=MEDUSA_STEPS, num_heads=3, seq_len=128,
                            max_tokens=MEDUSA_TOKENS, progress=False)
    where = f"heads trained here for {MEDUSA_STEPS} steps (the bundled heads are missing)"
pr = prompts[0]
ref = generate(target, pr, GEN_TOKENS, cache="contiguous").tokens
out, mst = medusa_generate(target, heads, pr, GEN_TOKENS)
assert torch.equal(out[0, len(pr):].cpu(), ref)
print(f"Medusa ({where}): output == greedy; {mst.tokens_per_pass:.2f} tokens per verification, tree of "
      f"{mst.tree_size} nodes; head acceptance {[round(h, 2) for h in mst.head_acceptance]}")

# %% [markdown] id="c025a"
# ## 9 · Drafting from the target's own features: EAGLE and multi-token prediction
#
# Medusa's heads read **one** hidden state and guess tokens 2, 3, 4 ahead, each head blind to what the
# others chose: head 2 must guess the token after a token it does not know. Two designs that engines ship
# in 2026 draft from the target's features too, but one token at a time, each step told the token before:
#
# * **EAGLE** [@li2024eagle] drafts *autoregressively at the feature level*. The target's final hidden
#   state `f_i` (the vector its `lm_head` turns into the distribution of token `i+1`) is smoother than
#   tokens, so **one decoder layer** predicts the next feature from the previous ones:
#   `f^_{i+1} = Layer(FC([e(t_{i+1}); f_i]))`, and the target's own frozen `lm_head` reads `f^_{i+1}`.
#   The embedding `e(t_{i+1})` of the token actually chosen is the paper's key point: `f_{i+1}` depends
#   on which token was sampled, and without it the feature is uncertain. Drafting `g` tokens feeds back
#   the predicted feature `g - 1` times. Trained with the target frozen: SmoothL1 on the feature plus
#   0.1 × the cross entropy against the target's own distribution, as in the paper.
# * **Multi-token prediction (MTP)** as in DeepSeek-V3 [@deepseekai2024deepseekv3] uses the same block
#   (with each input RMS-normed) as `K` **sequential modules, one per depth**: module `k` reads module
#   `k-1`'s output at position `i` and the embedding of token `i+k`, and predicts token `i+k+1`. DeepSeek
#   trains the modules *with* the model, as an extra training signal (independent heads on a shared
#   trunk are Gloeckle et al.'s version [@gloeckle2024better]), and engines use them as the draft. Here
#   the target is frozen and only the modules train, on the text's tokens: a post-hoc MTP. A chain is at
#   most `K` long.
#
# Both need more from the loop than Medusa: EAGLE's layer attends over *all* past features, so after each
# verification it must see the true features of every token kept, not only the last. A draft declares
# `needs_hidden = "all"` and `generate` hands it the target's hidden states at every newly verified
# position (the prompt's after the prefill); the draft keeps its own one-layer KV cache of them and drops
# what it built on its own guesses (`course_lib.speculative.eagle`; `tests/test_speculative_eagle.py`
# checks the cached proposals against the equations recomputed from scratch at every pass).

# %% id="c025b"
from course_lib.speculative import (EagleDraft, EagleHead, MedusaDraft, MTPDraft, MTPHeads, compare_drafts,
                                    feature_head_accuracy, load_feature_heads, train_feature_heads)

feature_heads, where_f = {}, {}
for kind in ("eagle", "mtp"):
    try:
        feature_heads[kind] = load_feature_heads(kind)
        where_f[kind] = "bundled, trained offline for {steps} steps on {train_tokens:,} tokens".format(
            **feature_heads[kind].info["training"])
    except FileNotFoundError:
        fresh = EagleHead(target.config) if kind == "eagle" else MTPHeads(target.config, 2)
        feature_heads[kind], _ = train_feature_heads(target, fresh, heldout[:10], tok, steps=FEATURE_STEPS,
                                                     seq_len=128, max_tokens=FEATURE_TOKENS, progress=False)
        where_f[kind] = f"trained here for {FEATURE_STEPS} steps (the bundled ones are missing)"
eagle, mtp = feature_heads["eagle"], feature_heads["mtp"]
K = len(mtp.blocks)
n_medusa = sum(p.numel() for p in heads.parameters())
for name, n in (("distilled draft model", n_draft), ("Medusa heads (3, lm_head shared)", n_medusa),
                ("EAGLE head (1 layer + FC)", eagle.num_parameters()), (f"MTP modules ({K})", mtp.num_parameters())):
    print(f"{name:34s} {n / 1e6:5.2f}M parameters ({n / n_target:4.0%} of the target)")
print(f"EAGLE: {where_f['eagle']}; MTP: {where_f['mtp']}")

# Teacher-forced agreement with the target's greedy choice on held-out text (no generation): EAGLE's first
# drafted token, and each MTP module at its depth.
agree_e = feature_head_accuracy(target, eagle, heldout[-4:], tok, max_tokens=4096 if QUICK else 32768)["agree"]
agree_m = feature_head_accuracy(target, mtp, heldout[-4:], tok, max_tokens=4096 if QUICK else 32768)["agree"]
print(f"agreement with the target's argmax, teacher-forced: EAGLE step 1 {agree_e[0]:.2f}; MTP modules "
      f"{', '.join(f'{a:.2f}' for a in agree_m)} (depth 1..{K})")

G_FEAT = 4
medusa_draft = MedusaDraft(target, heads)
candidates = {"distilled draft, chain": (draft, G_FEAT),
              f"Medusa, tree of {len(medusa_draft.paths) + 1}": (medusa_draft, medusa_draft.depth),
              "EAGLE, chain": (EagleDraft(target, eagle), G_FEAT),
              f"MTP x{K}, chain": (MTPDraft(target, mtp), K)}
cmp_rows = compare_drafts(target, candidates, prompts, max_new_tokens=GEN_TOKENS, repeats=REPEATS)
print(f"\n{len(prompts)} prompts x {GEN_TOKENS} greedy tokens, every output == plain greedy (checked); "
      f"plain decoding {cmp_rows[0]['plain_ms_per_token']:.2f} ms/token (CPU, 1 thread)")
print(f"{'draft':26s} {'g':>2s} {'a':>5s} {'tokens/pass':>11s}  {'draft share':>11s}  {'speed-up':>8s}   "
      f"kept at depth 1..g")
for r in cmp_rows:
    print(f"{r['name']:26s} {r['g']:2d} {r['a']:5.2f} {r['tokens_per_pass']:11.2f}  {r['draft_share']:11.0%}  "
          f"{r['speedup_measured']:7.2f}x   {' '.join(f'{x:.2f}' for x in r['depth_acceptance'])}")
by = {r["name"]: r for r in cmp_rows}
r_e, r_m = by["EAGLE, chain"], by[f"MTP x{K}, chain"]
assert r_m["tokens_per_pass"] <= K + 1                    # at most one proposal per module, plus the target's
for r in cmp_rows:                                        # a chain keeps a prefix: deeper is never more often
    assert all(x >= y for x, y in zip(r["depth_acceptance"], r["depth_acceptance"][1:]))
r_med = next(r for r in cmp_rows if r["name"].startswith("Medusa"))
if where_f["eagle"].startswith("bundled"):               # greedy on fixed prompts: deterministic
    assert r_e["tokens_per_pass"] > r_med["tokens_per_pass"], (r_e, r_med)

fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for r in cmp_rows:
    axes[0].plot(range(1, r["g"] + 1), r["depth_acceptance"], "o-", label=r["name"])
axes[0].set_xlabel("depth in the pass")
axes[0].set_ylabel("share of passes that kept it")
axes[0].legend(fontsize=7)
names = [r["name"].split(",")[0] for r in cmp_rows]
axes[1].bar(names, [r["tokens_per_pass"] for r in cmp_rows], color="tab:blue", label="tokens per pass")
axes[1].bar(names, [r["speedup_measured"] for r in cmp_rows], width=0.4, color="tab:orange",
            label="measured speed-up")
axes[1].axhline(1, color="grey", lw=0.7)
axes[1].tick_params(axis="x", labelsize=7)
axes[1].legend(fontsize=7)
plt.tight_layout()
plt.show()
best_tpp = max(cmp_rows, key=lambda r: r["tokens_per_pass"])
fastest = max(cmp_rows, key=lambda r: r["speedup_measured"])
print(f"most tokens per pass: {best_tpp['name']} ({best_tpp['tokens_per_pass']:.2f}); fastest in this run: "
      f"{fastest['name']} ({fastest['speedup_measured']:.2f}x; timings on a shared CPU, reported, not asserted)")
print(f"EAGLE's drafting took {r_e['draft_share']:.0%} of its decoding time: its layer has "
      f"{eagle.num_parameters() / n_target:.0%} of the target's parameters, and the target has only "
      f"{target.config.num_hidden_layers} layers")

# %% [markdown] id="c025c"
# Reading the table (the numbers are this run's):
#
# * **Depth by depth.** The left plot is the share of passes whose proposal at each depth survived. A
#   chain loses everything after its first rejection, so each curve falls; how fast it falls is the
#   draft's quality at depth. Medusa's deeper heads guess blind; EAGLE and MTP condition every step on the
#   token drafted before it, the remedy the EAGLE paper argues for.
# * **Tokens per pass is the algorithmic gain**, deterministic here (greedy, fixed prompts). The speed-up
#   also pays for the draft: `draft share` is the part of the decoding time spent drafting, the `c` of
#   section 4 seen from the other side. EAGLE's layer is about a sixth of our 6-layer target, so on this CPU
#   each EAGLE step costs a sizeable part of a target step; on a 32- or 80-layer target the same layer is
#   1/32 or 1/80 of it, which is where the paper's speed-ups live.
# * **MTP is capped at `K + 1` tokens per pass** (asserted): one proposal per module. DeepSeek-V3 ships one
#   module; engines draft further by feeding it its own output, which it was not trained for.
# * **Trained after the fact.** Our EAGLE head and MTP modules were trained for minutes on a CPU with the
#   target frozen; DeepSeek trains its MTP module with the model over the whole pre-training run. The
#   objectives differ too: EAGLE's token loss matches the *target's* distribution, the MTP modules learn
#   the *text's* next tokens (DeepSeek's objective, where the modules are an extra training signal), and
#   a draft is only judged by agreement with the target, which the agreement line above measures.
#
# > **Claim checked: "EAGLE is 3x faster", "MTP gives 1.8x".** Both are measurements of their authors on
# > large GPU-served models, and both are often quoted without their conditions: EAGLE reports a 2.7x–3.5x
# > latency speed-up for LLaMA2-Chat 70B [@li2024eagle]; DeepSeek-V3 reports that its MTP module's
# > second-token prediction is accepted 85–90% of the time and that decoding reaches 1.8 times the tokens
# > per second [@deepseekai2024deepseekv3]. Neither number transfers: the speed-up is `tokens per pass /
# > (g c + verify_cost)` (section 4), and both `c` (a draft layer against a 6-layer target here) and
# > `verify_cost` (a CPU that pays for every verified token) are far from a 70B model's on a GPU. The table
# > above is what the same ideas give on this machine and this model; the tokens per pass are what carries
# > over.

# %% [markdown] id="c026"
# ## 10 · Adaptive draft length
#
# A fixed `g` drafts as far in easy stretches as in hard ones. An adaptive rule stops drafting as soon as
# the draft is unsure (its top probability falls below a threshold): fewer wasted proposals per pass, but
# also fewer tokens per pass. Which wins depends on `c`: the
# cell prints the cost model's speed-up (ideal verification) for each threshold.

# %% id="c027"
c_meas, wasted = r0["c"], []
for thr_ in (None, 0.3, 0.6):
    _, st = speculative_generate(target, draft, prompts[0], GEN_TOKENS, draft_length=8, adaptive=thr_)
    per_pass = st.drafted / st.passes
    print(f"adaptive={thr_}: proposals per pass {per_pass:.2f}, a = {a_tested(st):.2f}, "
          f"tokens per pass {st.emitted / st.passes:.2f}, wasted proposals {st.drafted - st.accepted}; "
          f"cost model at c = {c_meas:.2f}: {st.emitted / st.passes / (per_pass * c_meas + 1):.2f}x")
    wasted.append(st.drafted - st.accepted)
assert wasted[0] > wasted[1] >= wasted[2], wasted

# %% [markdown] id="c027a"
# > **Claim checked: the notes' model labels.** The lecture notes list speculative decoding's variants
# > with a model in brackets: "Distilled Draft Models (GPT-oss)", "Adaptive Token Budget (DeepSeek)",
# > "Tree-based Verification (Qwen-2)", "Multi-stage Pipeline (Llama 3 via vLLM)", and "Claude, GPT-4" as
# > users. Each technique is real and measured in this notebook; the labels are not sources, and the
# > notes give none. What is documented (checked in November 2026):
# >
# > * **A distilled draft for gpt-oss**: the drafts we found published for gpt-oss-120b come from third
# >   parties, e.g. NVIDIA's EAGLE-3 head (Hugging Face, August 2025), a one-layer draft trained on the
# >   target's hidden states: a property of a deployment, not of the model. Distilling a draft from its
# >   target works for any pair (section 6, Module 04).
# > * **Adaptive drafting for DeepSeek**: what DeepSeek-V3 documents is a multi-token-prediction (MTP)
# >   module, trained with the model, that engines run as the draft (vLLM's `mtp` method, SGLang's MTP mode).
# >   Choosing the draft length from the draft's confidence is an engine- or algorithm-side rule that works
# >   for any model (section 10); nothing makes it DeepSeek's. Section 9 trains such modules and drafts with them.
# > * **Tree verification for Qwen-2**: token-tree verification comes from SpecInfer [@miao2024specinfer]
# >   and Medusa [@cai2024medusa] and runs on any decoder (section 8); the notes give no source tying it to
# >   Qwen-2.
# > * **Llama 3 via vLLM**, **Claude, GPT-4**: a serving engine's features, not a model's; and how Claude or
# >   GPT-4 are served is not public, so "used by" cannot be checked.
# >
# > As with "block-based KV cache (Llama 3)" in Module 06: the techniques belong to the inference engine or
# > the training recipe, and work for any decoder.

# %% [markdown] id="c028"
# ## 11 · The outside oracle: transformers' assisted generation
#
# Hugging Face `transformers` implements the same idea as `generate(..., assistant_model=draft)`. Our
# bundled models load there too, so we can check that both implementations produce the same greedy
# tokens.

# %% id="c029"
from course_lib.speculative import hf_assisted_generate

pr = prompts[0]
hf_out, hf_s = hf_assisted_generate("tiny", "tiny-draft", pr, GEN_TOKENS, draft_length=4)
ours, _ = speculative_generate(target, draft, pr, GEN_TOKENS, draft_length=4)
assert torch.equal(hf_out.cpu(), ours), (hf_out, ours)
print(f"transformers assisted generation == ours ({GEN_TOKENS} greedy tokens, {hf_s:.2f} s in transformers)")

# %% [markdown] id="c030"
# > **Claim checked: "Tree of Thoughts is a speculative decoding method."** Lists of speculative decoding
# > variants on the web sometimes include it. It is not: Tree of Thoughts is a *prompting/search* strategy in which a model
# > explores several lines of reasoning and evaluates them; it changes *what* is generated. Speculative
# > decoding changes only *how fast* the target's own distribution is sampled. The tree-shaped relatives
# > of speculative decoding are **tree-based verification** methods such as SpecInfer [@miao2024specinfer]
# > and Medusa [@cai2024medusa] (section 8):
# > several candidate continuations verified in one forward with a tree attention mask, output unchanged.

# %% [markdown] id="c031"
# ## 12 · Step through it yourself
#
# Each **Next step** runs one pass with `accept_step` on the bundled pair: bars of `p` and `q` for the top
# tokens at each proposal (the proposal outlined), the draw `u` against `min(1, p/q)`, then the residual
# or the bonus distribution. Accepted tokens are green, corrected ones orange (after the rejected proposal,
# struck through), bonus tokens blue. Try temperature 0 (greedy verification) and long drafts. The cell
# runs five passes before it shows the widget (`stepper.run(5)`, five clicks with one redraw), so it opens
# partway through a generation, on its last pass; **Reset** goes back to the prompt.

# %% id="c032"
from course_lib.viz.speculative import SpeculativeStepper

stepper = SpeculativeStepper(target, draft, tok, prompt="def ", draft_length=4, temperature=1.0, seed=0)
stepper.run(5)
st = stepper.stats()
assert len(stepper.ids) == len(stepper.prompt_ids) + sum(len(h.result.tokens) for h in stepper.history)
assert st["emitted"] == st["accepted"] + st["passes"]      # each pass: its accepted drafts + 1 token of its own
last = stepper.history[-1].result
print(f"{st['passes']} passes: {st['accepted']} of {st['tested']} tested drafts accepted, {st['emitted']} tokens "
      f"({st['tokens_per_pass']:.2f} per pass); the last pass accepted {last.num_accepted} of "
      f"{stepper.draft_length.value}, then {'a bonus' if last.bonus else 'a corrected'} token")
stepper

# %% [markdown] id="c033"
# ## Summary
#
# * The acceptance rule `min(1, p/q)`, the residual `max(0, p - q)` and the bonus token make speculative
#   decoding **exact**: the output follows the target's distribution (checked by a chi-square test), and
#   at temperature 0 it is the target's greedy output token for token.
# * One pass emits `(1 - a^(g+1)) / (1 - a)` tokens on average; the speed-up is that over `g c + verify_cost`.
#   The GPU idealization `verify_cost = 1` over-predicts on a CPU, where verifying more tokens costs more.
# * The draft matters through `a = sum min(p, q)`: match the target's distribution (distillation), or
#   draft from the input (prompt lookup), or from the target itself (Medusa heads, verified as a tree; an
#   EAGLE layer or MTP modules, which draft from its features one token at a time, each step told the token
#   before it).

# %% [markdown] id="c034"
# ## Further reading
#
# Used in this notebook:
#
# * [@leviathan2023fast]: speculative decoding; the acceptance rule, its proof and the speed-up analysis.
# * [@chen2023accelerating]: speculative sampling, found independently; measured on a 70B model.
# * [@saxena2023prompt]: prompt lookup decoding, drafts copied from the input.
# * [@cai2024medusa]: Medusa heads and their tree verification.
# * [@miao2024specinfer]: token-tree verification with a tree attention mask.
# * [@li2024eagle]: EAGLE, drafting from the target's features with one decoder layer.
# * [@deepseekai2024deepseekv3]: multi-token prediction modules, one per depth, used as the draft.
# * [@gloeckle2024better]: multi-token prediction as a training objective, with independent heads.
#
# To go further:
#
# * [@stern2018blockwise]: blockwise parallel decoding, the draft-and-verify idea before it was exact.
# * [@li2024eagle2]: EAGLE-2, EAGLE's draft grown into a tree shaped by the draft's own confidence.
