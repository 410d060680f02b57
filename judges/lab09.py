"""Lab 09's judge: KV blocks, the scheduler's decisions, goodput and the batch-time prediction.

The scheduler is judged on its decisions: each case builds the `SeqView`s in the kernel (the library's class)
and compares the student's `Decision` with the course's `fcfs_schedule` on the same views, here. An edge grid
written out, random states, and whole simulated runs: the simulator runs here with the course's scheduler and
every scheduling round's views are sent to the student's `schedule`. A scheduler that decides as the course's
in every round of a run gives that run's token times exactly (the run is the same), so a run is judged round by
round, and its first wrong decision is the one reported. The prediction is compared with the simulator run here
on the grader's batches of mixed lengths and cost models (built in the kernel as the library's `StepCostModel`).
"""
from course_grading.judging import Judge, call, ref
from course_lib.checks import check_close, check_equal
from course_lib.paged.manager import blocks_needed as ref_blocks
from course_lib.perf.metrics import goodput as ref_goodput
from course_lib.serving import ContinuousBatching, Decision, Request, SeqView, StepCostModel, make_workload, simulate
from course_lib.serving.policies import fcfs_schedule as ref_schedule

judge = Judge(references={
    "blocks_tests": ["course_lib.paged.manager.blocks_needed"],
    "schedule_tests": ["course_lib.serving.policies.fcfs_schedule"],
    "goodput_tests": ["course_lib.perf.metrics.goodput"],
}, kept={"course_lib.paged.manager.blocks_needed": "the simulator (which runs the student's scheduler in the lab) "
                                                   "and the block manager count KV blocks with it"})

COST = StepCostModel()


# ---------------------------------------------------------------------------------------------------
# Part A

@judge.part("blocks_tests", groups={"values": 3, "errors": 1})
def blocks(t):
    grid = [(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] + [(10**18 + 1, 10**9), (10**18, 10**9), (5, 1), (0, 1),
                                                            (1, 300), (299, 300), (301, 300), (2**62 + 1, 2)]
    drawn = []
    for _ in range(200):
        b = t.rng.choice([t.rng.randrange(1, 300), t.rng.randrange(1, 10**9)])
        n = t.rng.choice([t.rng.randrange(0, 10**6), b * t.rng.randrange(0, 1000) + t.rng.choice([-1, 0, 1]),
                          t.rng.randrange(10**15, 10**18)])
        drawn.append((max(0, n), b))
    cases = grid + drawn
    for (n, b), o in zip(cases, t.run([call("blocks_needed", n, b) for n, b in cases])):
        what = f"blocks_needed({n}, {b})"
        with t.case(what, group="values"):
            check_equal(o.get(), ref_blocks(n, b), what)
    bad = [(5, 0), (5, -16), (-1, 16), (2.5, 16), (16.0, 4), (5, 4.0), (5, 1.5)]
    for (n, b), o in zip(bad, t.run([call("blocks_needed", n, b) for n, b in bad])):
        what = f"blocks_needed({n!r}, {b!r})"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what)


# ---------------------------------------------------------------------------------------------------
# Part B

def planted(ignore_blocks=False, skip=False):
    """The course's scheduler with one known misconception planted in its admission."""
    def schedule(waiting, running, free_blocks, block_size, max_batch):
        d = ref_schedule(waiting, running, free_blocks, block_size, max_batch)
        if d.preempt:
            return d
        free, admit = free_blocks, []
        for r in running:
            free -= max(0, ref_blocks(r.need, block_size) - r.blocks)
        for w in waiting:
            nb = ref_blocks(w.need, block_size)
            if len(running) + len(admit) >= max_batch:
                break
            if nb > free and not ignore_blocks:
                if skip:
                    continue
                break
            admit.append(w.rid)
            free -= nb
        return Decision(preempt=list(d.preempt), admit=admit)
    return schedule


PLANTED = {"admit_ignores_blocks": planted(ignore_blocks=True), "fcfs_skip": planted(skip=True)}


class Views:
    """The SeqViews of one request to the kernel, each built once (`lib:` SeqView, stored), named by value."""

    def __init__(self):
        self.ops, self.names = [], {}

    def __call__(self, views):
        out = []
        for v in views:
            key = (v.rid, v.arrival_s, v.blocks, v.need)
            if key not in self.names:
                self.names[key] = f"v{len(self.names)}"
                self.ops.append(call("lib:course_lib.serving.policies.SeqView", *key, store=self.names[key],
                                     send=False))
            out.append(ref(self.names[key]))
        return out


def show(views):
    return "[" + ", ".join(f"V({v.rid}, {v.arrival_s:g}, {v.blocks}, {v.need})" for v in views) + "]"


def check_decision(t, got, args, what):
    """The student's Decision against the course's on the same arguments (waiting, running, free, bs, max_batch)."""
    want = ref_schedule(*args)
    t.expect(hasattr(got, "preempt") and hasattr(got, "admit"), f"{what}: expected a Decision, got {got!r}"[:300])
    check_equal(sorted(got.preempt), sorted(want.preempt), f"preempt of {what}")
    check_equal(list(got.admit), want.admit, f"admit of {what}",
                mistakes={t.mistake(k): f(*args).admit for k, f in PLANTED.items()})


def decision_ops(states):
    """One request: the views of every state, then one `schedule` call per state."""
    views, calls = Views(), []
    for waiting, running, free, bs, mb in states:
        calls.append(call("schedule", views(waiting), views(running), free, bs, mb))
    return views.ops + calls, len(views.ops)


def random_state(t):
    bs = t.rng.choice([1, 4, 16])
    running = []
    for k in range(t.rng.randint(0, 6)):
        need = t.rng.randint(1, 80)
        running.append(SeqView(k, 0.1 * k, max(0, ref_blocks(need, bs) - t.rng.choice([0, 0, 1])), need))
    waiting = [SeqView(100 + k, 1.0 + k, 0, t.rng.randint(1, 80)) for k in range(t.rng.randint(0, 5))]
    return waiting, running, t.rng.randint(0, 12), bs, t.rng.randint(1, 8)


def run_rounds(t, n_req):
    """A workload and pool drawn here, run by the simulator with the course's scheduler: its description and the
    arguments of every scheduling round."""
    seed = t.rng.randrange(2**31)
    reqs = make_workload(n_req, rate=t.rng.uniform(5, 60), arrival=t.rng.choice(["poisson", "bursty"]), seed=seed,
                         max_context=512, prompt_median=t.rng.choice([30, 120]), output_median=60)
    peak = max(ref_blocks(r.prompt_tokens + r.output_tokens - 1, 16) for r in reqs)    # the longest request fits
    nb, mb = t.rng.randint(peak, 80), t.rng.choice([4, 16, 64])      # a pool that binds: preemptions, blocked heads
    rounds = []

    def recorder(*args):
        rounds.append(args)
        return ref_schedule(*args)

    res = simulate(reqs, ContinuousBatching(max_batch=mb, scheduler=recorder), cost=COST, num_blocks=nb, block_size=16)
    what = (f"a simulated run (make_workload seed {seed}, {n_req} requests, {nb} blocks of 16, max_batch {mb}, "
            f"{len(res.preemptions)} preemptions)")
    return what, rounds


@judge.part("schedule_tests", groups={"decisions": 3, "runs": 2, "errors": 1})
def schedule(t):
    V = SeqView
    grid = [  # (what, waiting, running, free_blocks, block_size, max_batch)
        ("prompts of 10, 40, 5 tokens, 3 free blocks (request 1 needs 3, only 2 are left: stop there)",
         [V(0, 0.0, 0, 10), V(1, 0.1, 0, 40), V(2, 0.2, 0, 5)], [], 3, 16, 8),
        ("max_batch=2 with one request already running", [V(0, 0.0, 0, 10), V(1, 0.1, 0, 10)], [V(5, 0.0, 1, 3)], 9,
         16, 2),
        ("request 7 needs a 2nd block, none is free (preempt the newest, 9; admit nobody in a step that preempted)",
         [V(3, 0.3, 0, 4)], [V(7, 0.0, 1, 17), V(8, 0.1, 2, 20), V(9, 0.2, 1, 5)], 0, 16, 8),
        ("the oldest needs 1 more block and none is free", [], [V(7, 0.0, 1, 17), V(8, 0.1, 1, 33)], 0, 16, 8),
        ("no block is free for a 5-token prompt", [V(1, 0.0, 0, 5)], [V(0, 0.0, 1, 16)], 0, 16, 8),
        ("nothing waits, nothing runs", [], [], 0, 16, 1),
        ("the batch is full (max_batch=2)", [V(4, 1.0, 0, 1)], [V(0, 0.0, 1, 5), V(1, 0.1, 1, 5)], 50, 16, 2),
        ("need on a block boundary: 16 tokens in 1 block, no block free", [V(2, 0.5, 0, 3)], [V(0, 0.0, 1, 16)], 0,
         16, 8),
        ("need 17 in 1 block, exactly 1 block free", [V(2, 0.5, 0, 3)], [V(0, 0.0, 1, 17)], 1, 16, 8),
        ("the oldest needs 3 more blocks: the newest requests give theirs, only as many as needed",
         [], [V(0, 0.0, 1, 64), V(1, 0.1, 1, 10), V(2, 0.2, 1, 3), V(3, 0.3, 1, 7), V(4, 0.4, 1, 2)], 0, 16, 8),
        ("the request that cannot grow is the newest: it is preempted itself", [V(9, 1.0, 0, 1)],
         [V(0, 0.0, 1, 5), V(1, 0.1, 1, 17)], 0, 16, 8),
        ("a middle request cannot grow: the newer ones go, then itself", [],
         [V(0, 0.0, 2, 20), V(1, 0.1, 1, 33), V(2, 0.2, 1, 9)], 0, 16, 8),
        ("block_size=1: every running request grows by a block", [V(5, 1.0, 0, 2)],
         [V(0, 0.0, 3, 4), V(1, 0.1, 5, 6), V(2, 0.2, 1, 2)], 4, 1, 8),
        ("a prompt that needs exactly the free blocks", [V(3, 1.0, 0, 48), V(4, 1.1, 0, 1)], [], 3, 16, 8),
        ("a running request holding more blocks than it needs", [V(3, 1.0, 0, 30)], [V(0, 0.0, 3, 5)], 2, 16, 8),
        ("admission stops at max_batch although more would fit", [V(k, 0.1 * k, 0, 3) for k in range(5)], [], 99,
         16, 3),
        ("a preemption blocks every admission", [V(9, 1.0, 0, 1)], [V(0, 0.0, 1, 16), V(1, 0.1, 1, 17)], 0, 16, 8),
        ("max_batch=1 and a free pool: only the head", [V(7, 0.0, 0, 500), V(8, 0.1, 0, 1)], [], 1000, 16, 1),
        ("a request at the head that does not fit blocks the smaller ones behind it",
         [V(3, 1.0, 0, 100), V(4, 1.1, 0, 1), V(5, 1.2, 0, 2)], [V(0, 0.0, 1, 10)], 4, 16, 8),
    ]
    states = [(w, r, f, bs, mb) for _, w, r, f, bs, mb in grid]
    labels = [f"schedule: {what}" for what, *_ in grid]
    for _ in range(300):
        w, r, f, bs, mb = random_state(t)
        states.append((w, r, f, bs, mb))
        labels.append(f"schedule(waiting={show(w)}, running={show(r)}, free_blocks={f}, block_size={bs}, "
                      f"max_batch={mb})")
    ops, skip = decision_ops(states)
    got = t.run(ops)
    for o in got[:skip]:
        o.get()
    for what, args, o in zip(labels, states, got[skip:]):
        with t.case(what, group="decisions"):
            check_decision(t, o.get(), args, what)
    # whole runs, round by round
    for _ in range(4):
        what, rounds = run_rounds(t, t.rng.randint(20, 50))
        with t.case(what, group="runs"):
            ops, skip = decision_ops(rounds)
            got = t.run(ops)
            for o in got[:skip]:
                o.get()
            for k, (args, o) in enumerate(zip(rounds, got[skip:])):
                w, r, f, bs, mb = args
                check_decision(t, o.get(), args, f"{what}, scheduling round {k + 1} of {len(rounds)}: waiting "
                                                 f"{show(w)}, running {show(r)}, free_blocks={f}")
    for f, bs, mb in ((-1, 16, 8), (3, 0, 8), (3, 16, 0), (-5, 1, 1), (3, -16, 8), (3, 16, -1)):
        what = f"schedule([], [], free_blocks={f}, block_size={bs}, max_batch={mb})"
        with t.case(what, group="errors"):
            t.raises(t.outcome("schedule", [], [], f, bs, mb), "ValueError", what=what)


# ---------------------------------------------------------------------------------------------------
# Part C

def expected_goodput(ttfts, tpots, ttft_slo, tpot_slo, duration):
    return sum(1 for a, b in zip(ttfts, tpots) if a <= ttft_slo and b <= tpot_slo) / duration


@judge.part("goodput_tests", groups={"values": 3, "errors": 1})
def goodput(t):
    cases = [([0.5, 1.0, 2.0, 0.1], [0.01, 0.05, 0.01, 0.2], 1.0, 0.05, 2.0),
             ([1.0], [0.05], 1.0, 0.05, 0.5),                    # both limits exactly met
             ([1.0000001], [0.05], 1.0, 0.05, 3.0), ([0.2], [0.0500001], 1.0, 0.05, 3.0),
             ([0.1, 0.2, 0.3], [0.01, 0.01, 0.01], 1.0, 0.05, 7.5), ([], [], 1.0, 0.05, 2.0)]
    for _ in range(50):
        n = t.rng.randint(1, 40)
        a = [t.rng.choice([0.5, 1.0, t.rng.uniform(0, 2)]) for _ in range(n)]
        b = [t.rng.choice([0.05, t.rng.uniform(0, 0.1)]) for _ in range(n)]
        cases.append((a, b, 1.0, 0.05, t.rng.uniform(0.5, 20)))
    got = t.run([call("goodput", *c) for c in cases])
    for c, o in zip(cases, got):
        what = f"goodput({c[0]}, {c[1]}, {c[2]}, {c[3]}, {c[4]!r})"
        with t.case(what, group="values"):
            check_close(o.get(), expected_goodput(*c), what, rtol=1e-9)
    # simulated runs: against the course's goodput of their records
    for _ in range(2):
        seed, ttft_slo, tpot_slo = t.rng.randrange(2**31), t.rng.choice([0.1, 0.3, 1.0]), t.rng.choice([0.01, 0.02])
        res = simulate(make_workload(25, rate=t.rng.uniform(5, 20), seed=seed, max_context=512), ContinuousBatching(16),
                       cost=COST, num_blocks=200)
        span = max(r.finish for r in res.records) - min(r.start for r in res.records)
        what = (f"goodput of a simulated run (make_workload(25, seed={seed}), TTFT <= {ttft_slo} s, TPOT <= "
                f"{tpot_slo} s, over its {span:.4g} s)")
        with t.case(what, group="values"):
            check_close(t.call("goodput", [r.ttft for r in res.records], [r.tpot for r in res.records], ttft_slo,
                               tpot_slo, span), ref_goodput(res, ttft_slo, tpot_slo), what, rtol=1e-9)
    bad = [([1.0], [], 1.0, 1.0, 1.0), ([], [0.1], 1.0, 1.0, 1.0), ([1.0, 2.0], [0.1], 1.0, 1.0, 1.0),
           ([1.0], [1.0], 1.0, 1.0, 0.0), ([1.0], [1.0], 1.0, 1.0, -2.5)]
    for c, o in zip(bad, t.run([call("goodput", *c) for c in bad])):
        what = f"goodput{c}"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what)


# ---------------------------------------------------------------------------------------------------
# Part D

def simulated_batch(requests, cost):
    """The simulator's (makespan, mean latency) of these (prompt, output) requests arriving at 0, all admitted
    at once (the course's scheduler), no preemption."""
    reqs = [Request(i, 0.0, P, O) for i, (P, O) in enumerate(requests)]
    res = simulate(reqs, ContinuousBatching(max_batch=len(reqs)), cost=cost,
                   num_blocks=sum(-(-(P + O) // 16) for P, O in requests) + 8, block_size=16)
    finish = [r.finish for r in res.records]
    return max(finish), sum(finish) / len(finish)


def stepped(requests, cost, extra_step=False, keep_finished=False):
    """The known wrong predictions, step by step: `extra_step` decodes a token the prefill already emitted (O
    decode steps); `keep_finished` keeps every request in every step until the longest is done (the finish
    times stay each request's own)."""
    prompts = sum(P for P, _ in requests)
    t = cost.step_time(prompts, 0, prompts)
    finish, last = {1: t}, max(O for _, O in requests) + (1 if extra_step else 0)
    for k in range(2, last + 1):
        live = [P for P, O in requests if keep_finished or O + (1 if extra_step else 0) >= k]
        t += cost.step_time(0, len(live), sum(P + k - 1 - (1 if extra_step else 0) for P in live))
        finish[k] = t
    return t, sum(finish[O + (1 if extra_step else 0)] for _, O in requests) / len(requests)


def draw_requests(t):
    """1 to 24 requests: the same length for all, a chat mix (long prompts, short answers), or anything."""
    n = t.rng.randint(1, 24)
    kind = t.rng.choice(["same", "chat", "any"])
    if kind == "same":
        return [(t.rng.randint(1, 300), t.rng.randint(1, 60))] * n
    if kind == "chat":
        return [(t.rng.randint(50, 400), t.rng.randint(1, 12)) for _ in range(n)]
    return [(t.rng.randint(1, 300), t.rng.randint(1, 60)) for _ in range(n)]


COST_FIELDS = ("fixed_s", "per_token_s", "per_seq_s", "per_context_token_s", "compute_s_per_token", "overhead_s")


@judge.part("predict_batch_tests", groups={"values": 3, "errors": 1})
def predict_batch(t):
    costs = {"default": {}, "compute-bound prefill": {"compute_s_per_token": 1e-3},
             "per-token and per-sequence terms": {"per_token_s": 2e-6, "per_seq_s": 5e-5, "overhead_s": 0.0}}
    # edge grid: one request of one token, identical requests (the batch never shrinks), one long answer among
    # one-token ones, the longest output on the shortest prompt, a compute-bound prefill
    grid = [([(7, 1)], "default"), ([(1, 2)], "default"), ([(100, 20)] * 8, "default"),
            ([(300, 1)] * 5 + [(10, 40)], "default"), ([(100, 20), (400, 3), (30, 64), (250, 1)], "default"),
            ([(500, 60)], "compute-bound prefill"), ([(64, 3)] * 8 + [(64, 30)] * 8, "compute-bound prefill"),
            ([(33, 17), (5, 2), (200, 1)], "per-token and per-sequence terms"),
            ([(1, 1), (1, 60), (300, 30)], "per-token and per-sequence terms")]
    cases = [(reqs, name, costs[name]) for reqs, name in grid]
    for k in range(20):
        fields = {"fixed_s": t.rng.uniform(1e-3, 2e-2), "per_token_s": t.rng.choice([0.0, t.rng.uniform(0, 1e-5)]),
                  "per_seq_s": t.rng.choice([0.0, t.rng.uniform(0, 1e-4)]),
                  "per_context_token_s": t.rng.uniform(0, 1e-6), "compute_s_per_token": t.rng.uniform(0, 1e-4),
                  "overhead_s": t.rng.uniform(0, 2e-3)}
        cases.append((draw_requests(t), f"drawn cost model {k + 1}", fields))
    ops = []
    for reqs, name, fields in cases:
        ops += [call("lib:course_lib.serving.simulator.StepCostModel", **fields, store="cost", send=False),
                call("predict_batch_s", reqs, ref("cost"))]
    got = t.run(ops)
    for k, (reqs, name, fields) in enumerate(cases):
        cost = StepCostModel(**fields)
        shown = ", ".join(f"{n}={v:.4g}" for n, v in fields.items())
        what = f"predict_batch_s({reqs}, StepCostModel({shown})) ({name}) vs the simulator"
        with t.case(what, group="values"):
            got[2 * k].get()
            out = got[2 * k + 1].get()
            t.expect(isinstance(out, (tuple, list)) and len(out) == 2,
                     f"{what}: expected a pair (makespan_s, mean_latency_s), got {out!r}"[:400])
            span, mean = simulated_batch(reqs, cost)
            extra, kept = stepped(reqs, cost, extra_step=True), stepped(reqs, cost, keep_finished=True)
            check_close(out[0], span, f"{what}: the makespan (s)", rtol=1e-9,
                        mistakes={t.mistake("decode_steps"): extra[0], t.mistake("batch_never_shrinks"): kept[0]})
            check_close(out[1], mean, f"{what}: the mean latency (s)", rtol=1e-9,
                        mistakes={t.mistake("latency_is_makespan"): span, t.mistake("decode_steps"): extra[1],
                                  t.mistake("batch_never_shrinks"): kept[1]})
    bad = [[], [(0, 10)], [(10, 0)], [(2.0, 10)], [(10, 2.5)], [(10, 2), (-1, 10)], [(4, True)]]
    ops = [call("lib:course_lib.serving.simulator.StepCostModel", store="cost", send=False)]
    ops += [call("predict_batch_s", reqs, ref("cost")) for reqs in bad]
    got = t.run(ops)
    for reqs, o in zip(bad, got[1:]):
        what = f"predict_batch_s({reqs}, StepCostModel())"
        with t.case(what, group="errors"):
            t.raises(o, "ValueError", what=what + " (at least one request; lengths integers >= 1)")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    fcfs = ("            if len(run) + len(admit) >= max_batch or nb > free:\n"
            "                break\n")
    return [
        ("the scheduler admits waiting requests without checking the free KV blocks (only max_batch), and does not "
         "check its arguments; the batch prediction counts O decode steps after the prefill (one too many)",
         {"schedule_answer": solution_with("lab09", "schedule_answer", {
             fcfs: "            if len(run) + len(admit) >= max_batch:\n                break\n",
             "        if isinstance(value, bool) or not isinstance(value, int) or value < low:\n"
             "            raise ValueError(f\"{name} must be an integer >= {low}, got {value!r}\")\n":
             "        pass\n"}),
          "predict_batch_answer": solution_with("lab09", "predict_batch_answer", {
              "        live = [P for P, O in requests if O >= k]         "
              "# each holds P + k - 2 tokens, reads P + k - 1\n"
              "        t += cost.step_time(0, len(live), sum(P + k - 1 for P in live))":
              "        live = [P for P, O in requests if O + 1 >= k]\n"
              "        t += cost.step_time(0, len(live), sum(P + k - 2 for P in live))",
              "    for k in range(2, max(O for _, O in requests) + 1):":
              "    for k in range(2, max(O for _, O in requests) + 2):",
              "    return t, sum(finish[O] for _, O in requests) / len(requests)":
              "    return t, sum(finish[O + 1] for _, O in requests) / len(requests)"})},
         ["admit_ignores_blocks", "decode_steps"]),
        ("the batch never shrinks: every request decodes (and is read) until the longest is done",
         {"predict_batch_answer": solution_with("lab09", "predict_batch_answer", {
             "        live = [P for P, O in requests if O >= k]": "        live = [P for P, O in requests]"})},
         ["batch_never_shrinks"]),
        ("every request's latency taken as the batch's makespan",
         {"predict_batch_answer": solution_with("lab09", "predict_batch_answer", {
             "    return t, sum(finish[O] for _, O in requests) / len(requests)": "    return t, t"})},
         ["latency_is_makespan"]),
        ("followed the recipe's 'admit while it fits' without FCFS: a request that does not fit is skipped and "
         "later, smaller ones are admitted",
         {"schedule_answer": solution_with("lab09", "schedule_answer", {
             fcfs: "            if len(run) + len(admit) >= max_batch:\n                break\n"
                   "            if nb > free:\n                continue\n"})},
         ["fcfs_skip"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_makespan": {"points": 2, "rubric": [
        (1, "quotes their own predicted and simulated makespans for the two batches and explains the "
            "agreement as the same deterministic step model (not a noisy measurement)"),
        (1, "explains why the longest-request formula over-estimates a mixed batch (requests finish; fewer, "
            "shorter decode steps) and why continuous batching gains more there than on a uniform batch; "
            "names something a real GPU adds"),
    ]},
}
