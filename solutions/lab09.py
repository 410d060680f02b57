# %% [markdown] id="c002"
# # Lab 09 · A continuous-batching scheduler
#
# In this lab you design the heart of a continuous-batching server (Module 09, after Orca's iteration-level
# scheduling [@yu2022orca]): the scheduler that, at
# every engine step, decides which requests run, which new ones start, and which one gives its memory
# back when the KV cache is full. You plug it into the course's serving simulator and compare it with
# the reference; then you predict, from the step-cost model, how long a batch takes, and let the
# simulator measure it.
#
# * **Part A (2 points): KV blocks.** How many blocks a request needs.
# * **Part B (6 points, contract): the scheduler.** You are given what a schedule decision must satisfy
#   (the KV budget, the preemption order, first come first served, `max_batch`); you design the walk.
# * **Part C (2 points): goodput.** Requests per second that met the latency targets.
# * **Part D (2 points): predict a batch's time.** From the step-cost model, before the simulator runs it.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell with fixed examples. When grading, the grader calls your
#   functions on inputs of its own (drawn for you, and a grid of edge cases): it compares your scheduler's
#   decisions with the course's reference scheduler on random states and on every scheduling round of
#   random simulated workloads, so meet the contract exactly.
# * Plain Python only; do not import `fcfs_schedule` or `blocks_needed` from `course_lib`: the grader flags
#   an answer that does, and while it grades, the course's scheduler is not in the library. Everything
#   runs on a CPU in seconds. Total: 14 points, 2 of them a written analysis your instructor grades
#   (Part E).

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math

from course_lib.checks import check_close, check_equal
from course_lib.serving import (ContinuousBatching, Decision, Request, SeqView, StepCostModel, check_invariants,
                                make_workload, simulate)

COST = StepCostModel()          # roughly a 7B model on an A100: seconds per engine step

# Known misconceptions: a test that recognises one names it (public text, pointing to notebook 09)
MISTAKES = {
    "admit_ignores_blocks": "the scheduler admits a waiting request when the batch has room without checking "
                            "that its prefill's KV blocks fit in the free blocks: the KV memory is over-subscribed; "
                            "see notebook 09, section '4. Iteration-level scheduling, KV blocks and preemption'",
    "fcfs_skip": "admission skips over a waiting request that does not fit and admits later, smaller ones: "
                 "first come, first served stops at the first request that does not fit (a long prompt would "
                 "starve); see notebook 09, section '4. Iteration-level scheduling, KV blocks and preemption'",
    "decode_steps": "the prediction counts one decode step per output token, but the prefill step already emits "
                    "the first token: a request of O output tokens takes 1 prefill step and O - 1 decode steps; "
                    "see notebook 09, section '2. What one engine step costs'",
}


def simulated_batch_s(B, P, O, cost, scheduler=None):
    """The simulator's makespan of B identical requests arriving at 0 (the reference scheduler by default)."""
    reqs = [Request(i, 0.0, P, O) for i in range(B)]
    pol = ContinuousBatching(max_batch=B) if scheduler is None else ContinuousBatching(max_batch=B, scheduler=scheduler)
    res = simulate(reqs, pol, cost=cost, num_blocks=B * (-(-(P + O) // 16)) + 8, block_size=16)
    return max(r.finish for r in res.records)


# %% [markdown] id="c004"
# ## The simulator and the scheduler hook
#
# The simulator runs an engine in **steps**. In one step every running request that is decoding produces
# one token, and every request that was just admitted is prefilled (its whole prompt is processed) and
# produces its first token. KV memory is cut into blocks of `block_size` tokens.
#
# Before each step the simulator calls **your** function:
#
# ```python
# decision = schedule(waiting, running, free_blocks, block_size, max_batch)
# ```
#
# * `waiting`: a list of `SeqView`s in queue order (the head first);
# * `running`: a list of `SeqView`s in admission order (the oldest first);
# * `free_blocks`: the number of free KV blocks; `max_batch`: the most requests that may run at once.
#
# A `SeqView` has `rid` (the request id), `arrival_s`, `blocks` (the blocks it holds now: 0 for a waiting
# request) and `need`: the number of tokens it must have KV room for **after the next step** (a running
# request that decodes needs its context + 1; a waiting request needs its whole prompt). You return
# `Decision(preempt=[rids], admit=[rids])`; the simulator then frees the blocks of the preempted requests
# (they go back to the **head** of the waiting queue, to be prefilled again later with the tokens they
# already generated: *recompute*), gives every remaining running request the blocks its `need` asks for,
# allocates the blocks of the admitted ones, and runs the step. It also handles completion: a request
# that emitted its last token leaves the batch and its blocks are freed.
#
# ## Part A · KV blocks (2 points)
#
# Implement `blocks_needed(tokens, block_size)`: the number of blocks that hold `tokens` tokens,
# i.e. ceil(tokens / block_size) (0 tokens need 0 blocks). Raise `ValueError` if `block_size` is not a
# positive integer or `tokens` is not an integer >= 0. Use integer arithmetic (no floats: they round
# wrongly for huge numbers).

# %% id="c005" nbgrader={"grade": false, "grade_id": "blocks_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def blocks_needed(tokens, block_size):
    ### BEGIN SOLUTION
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")
    return -(-tokens // block_size)
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "blocks_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_equal([blocks_needed(t, 16) for t in (0, 1, 15, 16, 17, 32, 33)], [0, 1, 1, 1, 2, 2, 3],
            "blocks_needed(t, 16) for t = 0, 1, 15, 16, 17, 32, 33")
check_equal(blocks_needed(10**18 + 1, 10**9), 10**9 + 1, "blocks_needed(10**18 + 1, 10**9) (integer arithmetic)")
for _bad in ((5, 0), (5, -16), (-1, 16), (2.5, 16)):
    try:
        blocks_needed(*_bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"blocks_needed{_bad} should raise ValueError")
print("Part A: visible tests passed")

# %% [markdown] id="c007"
# ## Part B · The scheduler (6 points, contract)
#
# Design `schedule(waiting, running, free_blocks, block_size, max_batch)`, the first-come-first-served
# policy of vLLM's default scheduler [@kwon2023efficient].
#
# **Contract.**
#
# * *Inputs*: `waiting`, a list of `SeqView`s in queue order (head first); `running`, a list of `SeqView`s
#   in admission order (oldest first); `free_blocks` (int >= 0); `block_size` (int >= 1); `max_batch`
#   (int >= 1).
# * *Output*: `Decision(preempt=[rids], admit=[rids])`, `admit` in queue order.
# * *Budget (never exceeded)*: every running request that is not preempted gets the
#   `blocks_needed(r.need, block_size) - r.blocks` more blocks its next token needs (0 if it has them), and
#   every admitted request gets `blocks_needed(w.need, block_size)`; all of them together fit in
#   `free_blocks` plus the blocks the preempted requests give back. A server that over-subscribes its KV
#   memory crashes or corrupts outputs.
# * *Progress and preemption order*: the oldest running requests keep their place; when a running request
#   cannot grow, the **newest** running requests are preempted first, only as many as needed; a request
#   that cannot grow even when it is the newest one left is itself preempted, and the others after it are
#   not looked at (there is nothing younger to take blocks from).
# * *Admission (FCFS)*: no admission in a step that preempted (the preempted requests wait at the head);
#   otherwise admit from the head of `waiting`, in order, while the batch (running requests left +
#   admitted) stays within `max_batch` and the request's blocks fit; **stop at the first request that
#   does not fit**: no later request overtakes it.
# * *Errors*: `ValueError` if `free_blocks < 0`, `block_size < 1` or `max_batch < 1`.
#
# The visible tests below check small decisions by hand and one whole simulation against the reference;
# when grading, the grader compares your decisions with the reference's on an edge grid, hundreds of
# random states and every scheduling round of whole random workloads.
#
# <details><summary>Hint 1: the order of the walk</summary>
#
# 1. **Growth, oldest first.** Walk `running` from the oldest. A request needs
#    `blocks_needed(r.need, block_size) - r.blocks` more blocks (often 0). While there are not enough free
#    blocks for it, preempt the newest running request (the last one not yet preempted): add its rid to
#    `preempt` and its `blocks` to the free count. If the request that needs the blocks is itself the
#    newest one left, preempt it and stop the walk. Otherwise take its blocks from the free count and go on
#    to the next request.
# 2. **Admission, only if nothing was preempted in this step.** Walk `waiting` from the head: admit a
#    request if the batch still has room (running requests left + admitted so far < `max_batch`) and its
#    `blocks_needed(w.need, block_size)` blocks fit in the free count; then subtract them. Stop at the
#    first request that does not fit.
#
# </details>
#
# <details><summary>Hint 2: a data structure</summary>
#
# Keep `run = list(running)` and pop the victims off its end: "the newest running request not yet
# preempted" is then always `run[-1]`, and `len(run)` is the number of running requests left.
#
# </details>

# %% id="c008" nbgrader={"grade": false, "grade_id": "schedule_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def schedule(waiting, running, free_blocks, block_size, max_batch):
    ### BEGIN SOLUTION
    for name, value, low in (("free_blocks", free_blocks, 0), ("block_size", block_size, 1),
                             ("max_batch", max_batch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    run = list(running)
    free = free_blocks
    preempt = []
    i = 0
    while i < len(run):
        r = run[i]
        extra = max(0, blocks_needed(r.need, block_size) - r.blocks)
        while extra > free and len(run) > i + 1:
            victim = run.pop()
            preempt.append(victim.rid)
            free += victim.blocks
        if extra > free:
            run.pop()
            preempt.append(r.rid)
            free += r.blocks
            break
        free -= extra
        i += 1
    admit = []
    if not preempt:
        for w in waiting:
            nb = blocks_needed(w.need, block_size)
            if len(run) + len(admit) >= max_batch or nb > free:
                break
            admit.append(w.rid)
            free -= nb
    return Decision(preempt=preempt, admit=admit)
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "schedule_tests", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
V = SeqView   # SeqView(rid, arrival_s, blocks, need)
# admission: 10 tokens need 1 block, 40 tokens 3; with 3 free blocks 0 is admitted, 1 does not fit, 2 waits behind it
d = schedule([V(0, 0.0, 0, 10), V(1, 0.1, 0, 40), V(2, 0.2, 0, 5)], [], 3, 16, 8)
check_equal((sorted(d.preempt), d.admit), ([], [0]), "(preempt, admit) with 3 free blocks, prompts of 10, 40, 5 "
            "tokens (request 1 needs 3 blocks, only 2 are left: stop there, FCFS)",
            mistakes={MISTAKES["admit_ignores_blocks"]: ([], [0, 1, 2]), MISTAKES["fcfs_skip"]: ([], [0, 2])})
d = schedule([V(0, 0.0, 0, 10), V(1, 0.1, 0, 10)], [V(5, 0.0, 1, 3)], 9, 16, 2)
check_equal(d.admit, [0], "admit with max_batch=2 and one request already running")
# growth: request 7 (16 tokens -> 17) needs a 2nd block, there is none free: the newest (9) is preempted
run = [V(7, 0.0, 1, 17), V(8, 0.1, 2, 20), V(9, 0.2, 1, 5)]
d = schedule([V(3, 0.3, 0, 4)], run, 0, 16, 8)
check_equal((sorted(d.preempt), d.admit), ([9], []), "(preempt, admit): request 7 needs a block, none is free "
            "(preempt the newest, 9; admit nobody in a step that preempted)")
d = schedule([], [V(7, 0.0, 1, 17), V(8, 0.1, 1, 33)], 0, 16, 8)
check_equal(sorted(d.preempt), [8], "preempt when the oldest (7) needs 1 more block and none is free "
            "(the newest, 8, is preempted and its block goes to 7)")
check_equal(schedule([V(1, 0.0, 0, 5)], [V(0, 0.0, 1, 16)], 0, 16, 8).admit, [],
            "admit when no block is free (a 5-token prompt needs 1 block)",
            mistakes={MISTAKES["admit_ignores_blocks"]: [1]})
for _bad in ((-1, 16, 8), (3, 0, 8), (3, 16, 0)):
    try:
        schedule([], [], *_bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"schedule([], [], free_blocks={_bad[0]}, block_size={_bad[1]}, max_batch={_bad[2]}) "
                             "should raise ValueError")
# the whole simulation on a fixed small workload with a scarce KV pool
_reqs = make_workload(40, rate=30.0, seed=9, max_context=512, prompt_median=120, output_median=60)
_pol = ContinuousBatching(max_batch=16, scheduler=schedule)
_mine = simulate(_reqs, _pol, cost=COST, num_blocks=60, block_size=16, strict=False)
check_equal(check_invariants(_mine, _reqs), [], "rules broken by your scheduler on the fixed workload "
            "(60 blocks of 16)")
_ref = simulate(_reqs, ContinuousBatching(max_batch=16), cost=COST, num_blocks=60, block_size=16)
check_equal(len(_mine.preemptions), len(_ref.preemptions), "number of preemptions on the fixed workload")
check_close([r.finish for r in _mine.records], [r.finish for r in _ref.records],
            "finishing times of the 40 requests (s)", rtol=1e-9)
print(f"Part B: visible tests passed ({len(_mine.preemptions)} preemptions, throughput "
      f"{_mine.summary()['throughput_tok_s']:.0f} tok/s)")

# %% [markdown] id="c010"
# ## Part C · Goodput (2 points)
#
# A service promises a **service-level objective**: here, the time to first token must be at most
# `ttft_slo` seconds **and** the mean time per output token at most `tpot_slo` seconds. Implement
# `goodput(ttfts, tpots, ttft_slo, tpot_slo, duration_s)`: the number of requests meeting both limits
# (`<=`), divided by `duration_s`. `ttfts` and `tpots` are equally long lists (one entry per request).
# Raise `ValueError` if their lengths differ or `duration_s` is not positive.

# %% id="c011" nbgrader={"grade": false, "grade_id": "goodput_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def goodput(ttfts, tpots, ttft_slo, tpot_slo, duration_s):
    ### BEGIN SOLUTION
    if len(ttfts) != len(tpots):
        raise ValueError(f"ttfts and tpots must have the same length, got {len(ttfts)} and {len(tpots)}")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be positive, got {duration_s!r}")
    ok = sum(1 for a, b in zip(ttfts, tpots) if a <= ttft_slo and b <= tpot_slo)
    return ok / duration_s
    ### END SOLUTION


# %% id="c012" nbgrader={"grade": true, "grade_id": "goodput_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_close(goodput([0.5, 1.0, 2.0, 0.1], [0.01, 0.05, 0.01, 0.2], 1.0, 0.05, 2.0), 1.0,
            "goodput: 2 of 4 requests meet TTFT <= 1 s and TPOT <= 50 ms (limits included), over 2 s")
for _args in (([1.0], [], 1.0, 1.0, 1.0), ([1.0], [1.0], 1.0, 1.0, 0.0)):
    try:
        goodput(*_args)
    except ValueError:
        pass
    else:
        raise AssertionError(f"goodput{_args} should raise ValueError")
_res = simulate(make_workload(30, rate=10.0, seed=3, max_context=512), ContinuousBatching(16), cost=COST, num_blocks=200)
_span = max(r.finish for r in _res.records) - min(r.start for r in _res.records)
print(f"goodput of a simulated run at TTFT <= 0.2 s, TPOT <= 15 ms: "
      f"{goodput([r.ttft for r in _res.records], [r.tpot for r in _res.records], 0.2, 0.015, _span):.2f} req/s")
print("Part C: visible tests passed")

# %% [markdown] id="c020"
# ## Part D · Predict a batch's time (2 points)
#
# Before you simulate, predict. `B` requests arrive together at time 0, each with a prompt of `P` tokens
# and `O` output tokens; the batch has room for all of them (`max_batch >= B`) and the KV pool is large
# (no preemption). Under continuous batching (your scheduler), what happens is fixed by the step model of
# notebook 09, section 2, `cost.step_time(prefill_tokens, decode_seqs, context_tokens)`:
#
# * the first step admits all `B` requests and prefills their prompts; its attention reads the prompts'
#   own KV (`context_tokens` = all the prompt tokens); it emits every request's **first** token;
# * every later step decodes one token for each of the `B` sequences; a decoding sequence's attention
#   reads its whole KV cache including the token it is adding (`context_tokens` is the sum over the
#   sequences of cached tokens + 1).
#
# Write `predict_batch_s(B, P, O, cost)`: the seconds until the last token of the batch (the makespan),
# using only `cost.step_time`. Raise `ValueError` if `B`, `P` or `O` is not an integer >= 1. The test
# compares it with the simulator on the same inputs (a deterministic model, not a timing); the grader does
# so on batches and cost models of its own.

# %% id="c021" nbgrader={"grade": false, "grade_id": "predict_batch_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_batch_s(B, P, O, cost):
    ### BEGIN SOLUTION
    for name, value in (("B", B), ("P", P), ("O", O)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    t = cost.step_time(B * P, 0, B * P)                 # prefill: every prompt, emits token 1
    for k in range(2, O + 1):                           # token k: each sequence holds P + k - 2, reads P + k - 1
        t += cost.step_time(0, B, B * (P + k - 1))
    return t
    ### END SOLUTION


# %% id="c022" nbgrader={"grade": true, "grade_id": "predict_batch_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def _one_step_per_token(B, P, O, cost):
    """A known wrong prediction: O decode steps after the prefill."""
    return cost.step_time(B * P, 0, B * P) + sum(cost.step_time(0, B, B * (P + k)) for k in range(1, O + 1))


check_close(predict_batch_s(8, 100, 20, COST), simulated_batch_s(8, 100, 20, COST),
            "predict_batch_s(B=8, P=100, O=20, COST) vs the simulator (s)", rtol=1e-9,
            mistakes={MISTAKES["decode_steps"]: _one_step_per_token(8, 100, 20, COST)})
check_close(predict_batch_s(1, 7, 1, COST), COST.step_time(7, 0, 7), "predict_batch_s(1, 7, 1): one prefill step",
            rtol=1e-9, mistakes={MISTAKES["decode_steps"]: _one_step_per_token(1, 7, 1, COST)})
for _bad in ((0, 10, 10), (4, 0, 10), (4, 10, 0), (2.0, 10, 10)):
    try:
        predict_batch_s(*_bad, COST)
    except ValueError:
        pass
    else:
        raise AssertionError(f"predict_batch_s{_bad} should raise ValueError")
print("Part D: visible tests passed")

# %% [markdown] id="c023"
# Now measure it: the simulator runs the batch with **your** scheduler, and the same batch with static
# batching; the throughput follows from the makespan (`B * O` tokens). Then a batch whose requests differ
# in length, where one `(P, O)` no longer describes it: your formula with the longest request's lengths is
# only a bound.

# %% id="c024"
try:
    for _B, _P, _O in ((8, 100, 20), (32, 500, 200)):
        _pred = predict_batch_s(_B, _P, _O, COST)
        _meas = simulated_batch_s(_B, _P, _O, COST, scheduler=schedule)
        print(f"B={_B:3d} P={_P:4d} O={_O:4d}: predicted {_pred * 1e3:8.2f} ms, simulated {_meas * 1e3:8.2f} ms, "
              f"throughput {_B * _O / _meas:7.0f} tok/s")
    _reqs = make_workload(16, rate=1e6, seed=4, max_context=512)
    _res = simulate([Request(r.rid, 0.0, r.prompt_tokens, r.output_tokens) for r in _reqs],
                    ContinuousBatching(max_batch=16, scheduler=schedule), cost=COST, num_blocks=2048)
    _bound = predict_batch_s(16, max(r.prompt_tokens for r in _reqs), max(r.output_tokens for r in _reqs), COST)
    print(f"16 requests of mixed lengths: simulated {max(r.finish for r in _res.records) * 1e3:.1f} ms, "
          f"the formula with the longest prompt and output {_bound * 1e3:.1f} ms (requests that finish early "
          f"leave the batch)")
except NotImplementedError:
    print("finish the exercises first")

# %% [markdown] id="c013"
# ## Going further (not graded)
#
# * Run your scheduler at a few KV budgets and plot throughput and preemptions against the budget.
# * Change the admission rule to keep a *watermark* (admit only if some blocks stay free for the running
#   requests to grow into): fewer preemptions, but a smaller batch. Which gives the better p99 latency?
# * Try `ChunkedPrefill(max_batch, token_budget, scheduler=schedule)`: your scheduler works unchanged.

# %% [markdown] id="cw09p"
# ## Part E · Written analysis: one formula, uniform and mixed batches (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Answer in 100 to 200 words, about the
# output of the cell after Part D (it is skipped while grading):
#
# 1. quote two of your uniform batches' predicted and simulated makespans, and explain why they agree as
#    closely as they do (is this a measurement?);
# 2. for the batch of mixed lengths, quote the simulated makespan and what your formula gives with the longest
#    request's lengths, and explain why the formula is only an upper bound there, and why continuous batching
#    gains more over static batching on that batch than on a uniform one;
# 3. name one thing a real GPU would add that the step model leaves out.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw09" nbgrader={"grade": true, "grade_id": "written_makespan", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer: the numbers in brackets are what a student quotes from their own run.)*
#
# For B = [B1], P = [P1], O = [O1] I predicted [p1] ms and the simulator gave [s1] ms; for [B2, P2, O2], [p2]
# and [s2]. They agree to rounding because the simulator charges each step with the same `cost.step_time` my
# formula calls: one prefill step, then O - 1 decode steps whose context grows by B tokens each. This is an
# identity checked on a deterministic model, not a measurement with noise.
#
# The 16 mixed requests took [s3] ms in the simulator; my formula with the longest prompt and output gives
# [p3] ms. The formula pretends every request is as long as the longest: every decode step carries all B
# sequences with the longest context. In fact the short requests finish and leave, so the later steps decode
# fewer sequences over less context and cost less: the formula is an upper bound. Static batching holds every
# finished request's slot until the batch's longest request ends, and a uniform batch has nothing to reclaim;
# continuous batching admits waiting requests into freed slots, so its gain appears only when lengths differ.
#
# A real GPU adds what the step model does not: the KV pool's limit (preemption and recomputation when it
# fills), kernel launch and Python overhead per step, and the step time's non-linear response to batch size
# once the weights' read stops dominating.

# %% [markdown] id="c025" tags=["answer-key"]
# ### Answer key
#
# * **KV budgets.** 200 requests of `make_workload(200, rate=20, seed=1, max_context=1024)`, `max_batch=64`,
#   blocks of 16 tokens, the default cost model: 64 blocks give 233 tok/s and 109 preemptions, 128 give 502
#   and 114, 256 give 952 and 105, 512 give 1526 and 88, 1024 give 2078 and 42. Throughput grows almost in
#   proportion to the budget while the pool limits the batch (decode steps are memory-bound: a bigger batch
#   costs little more per step), and preemptions fall once the batch stops fighting for blocks. p99 TTFT falls
#   from 136 s to 2.5 s: at 20 req/s the small pools are overloaded and the queue grows for the whole run.
# * **Watermark.** Admit as if `w` blocks fewer were free (growth still uses every block). At 256 blocks on
#   the same workload: `w = 0` gives 105 preemptions, p99 TPOT 23 ms, p99 end-to-end 25.8 s, 952 tok/s;
#   `w = 8`: 53, 14 ms, 25.6 s, 957 tok/s; `w = 16`: 27, 14 ms, 25.7 s, 949 tok/s; `w = 32`: 5, 12 ms,
#   27.6 s, 897 tok/s. A small watermark is the better trade: it halves the recomputation and cuts p99 TPOT
#   (a preempted request stalls, which is what the tail of TPOT measures) at no cost in throughput; a large
#   one leaves blocks idle, the batch shrinks, throughput and p99 end-to-end latency get worse. vLLM's original
#   block manager kept a watermark of 1% of the blocks by default (`watermark=0.01`) for this reason.
# * **ChunkedPrefill.** Your scheduler only sees `waiting`, `running`, `free_blocks` and each request's `need`;
#   chunked prefill changes how many prompt tokens a step processes, not which requests run, so the same
#   function works unchanged. With a budget of 512 tokens per step at 256 blocks: 962 tok/s, p99 TTFT 23.2 s against 23.6 s whole-prompt; the gain
#   is small here because the run is memory-bound by the pool, not stalled by long prefills; it shows in the
#   decode tail (TPOT) when prompts are long next to short outputs.
