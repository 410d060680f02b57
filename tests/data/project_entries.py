"""Project entries (lab13's `build_answer` cell) for tests/test_project.py: honest ones, and the cheats that
fooled the in-process evaluation (issue 41), rebuilt. Each cheat generates no faster than the baseline (the
course's KV-cached loop) by itself (it calls the course's baseline, or falls back to it), so any speed point
it earns came from the trick: the grader must give it none or flag it.

ENTRIES: name -> (source of the build_answer cell, the report's Method line, kind: "honest" or "cheat")
ON_THE_REFERENCE: name -> (source appended to the instructor's build_answer cell, which rebinds its `build`,
the report's Method line, kind)
"""

KV_LOOP = '''
    device = next(model.parameters()).device

    def generate_fn(prompt_ids, max_new_tokens):
        cache = ContiguousCache()
        x, out = prompt_ids.to(device).view(1, -1), []
        for _ in range(max_new_tokens):
            tok = m(x, cache=cache)[0, -1].argmax()
            out.append(tok)
            x = tok.view(1, 1)
        return torch.stack(out).cpu()
'''

ENTRIES = {
    # -- honest -------------------------------------------------------------------------------------
    "lossy_int8": ('''
def build(model):
    """int8 weight-only linears (Module 03) in the course's cached loop: lossy, so declared. On this CPU the
    quantized one-row product is no faster than the float one: correct, and no speed points."""
    from course_lib.capstone import int8_weights
    m = int8_weights(model).eval()
''' + KV_LOOP + '''
    generate_fn.lossy_model = m
    return generate_fn
''', "int8 weight-only linears + KV cache (lossy)", "honest"),

    # -- the cheats of issue 41 -----------------------------------------------------------------------
    "linear_patch": ('''
def build(model):
    """Replaces F.linear so that every multi-token call but its own does extra work: in one process, the
    baseline's prefills would slow down."""
    import torch.nn.functional as F
    real, mine = F.linear, {"on": False}

    def linear(x, w, b=None):
        if not mine["on"] and x.dim() >= 2 and x.shape[-2] > 1:
            for _ in range(4):
                real(x, w, b)
        return real(x, w, b)
    F.linear = linear
    base = baseline_build(model)

    def generate_fn(prompt_ids, max_new_tokens):
        mine["on"] = True
        try:
            return base(prompt_ids, max_new_tokens)
        finally:
            mine["on"] = False
    return generate_fn
''', "faster linears", "cheat"),

    "clock_patch": ('''
def build(model):
    """Patches the timing module's clocks (and time's) to run slow while it is not generating."""
    import time
    import course_lib.perf.timing as timing
    mine = {"on": False}
    real = {k: v for k, v in timing.CLOCKS.items()}
    for k, f in real.items():
        timing.CLOCKS[k] = (lambda f: lambda: f() * (1.0 if mine["on"] else 4.0))(f)
    real_pc = time.perf_counter
    time.perf_counter = lambda: real_pc() * (1.0 if mine["on"] else 4.0)
    base = baseline_build(model)

    def generate_fn(prompt_ids, max_new_tokens):
        mine["on"] = True
        try:
            return base(prompt_ids, max_new_tokens)
        finally:
            mine["on"] = False
    return generate_fn
''', "careful timing", "cheat"),

    "replay": ('''
def build(model):
    """Wraps the model's forward to remember, by prompt, the tokens the baseline generates through it, and
    replays the remembered ones: in one process the baseline does the work and the entry answers at once."""
    real = type(model).forward
    memo, now = {}, {"prompt": None}

    def forward(self, ids, *a, **k):
        logits = real(self, ids, *a, **k)
        if ids.shape[-1] > 1:                    # a prefill: a new prompt begins
            now["prompt"] = tuple(ids.view(-1).tolist())
            memo[now["prompt"]] = []
        if now["prompt"] is not None:
            memo[now["prompt"]].append(logits[0, -1].argmax())
        return logits
    type(model).forward = forward
    base = baseline_build(model)

    def generate_fn(prompt_ids, max_new_tokens):
        hit = memo.get(tuple(prompt_ids.tolist()))
        if hit is not None and len(hit) >= max_new_tokens:
            return torch.stack(hit[:max_new_tokens])
        return base(prompt_ids, max_new_tokens)
    return generate_fn
''', "memoized generation", "cheat"),

    "stack_walk": ('''
def build(model):
    """Walks up the stack for the evaluation's prompt list, answers every prompt now, and then sleeps a
    little per call to look about 6x faster."""
    import inspect
    import time
    base = baseline_build(model)
    answers, t0 = {}, time.perf_counter()
    for frame in inspect.stack():
        for value in list(frame.frame.f_locals.values()):
            if isinstance(value, (list, tuple)) and value and all(isinstance(p, torch.Tensor) and p.dim() == 1
                                                                  for p in value):
                for p in value:
                    answers[tuple(p.tolist())] = base(p, 16)
    per_call = (time.perf_counter() - t0) / max(len(answers), 1) / 6

    def generate_fn(prompt_ids, max_new_tokens):
        hit = answers.get(tuple(prompt_ids.tolist()))
        if hit is not None and max_new_tokens == 16:
            time.sleep(per_call)
            return hit
        return base(prompt_ids, max_new_tokens)
    return generate_fn
''', "precomputed answers", "cheat"),

    "speed_points_patch": ('''
def build(model):
    """Sets the project's scale to give every entry full points."""
    import course_lib.capstone as cap
    cap.speed_points = lambda *a, **k: 6.0
    globals()["speed_points"] = cap.speed_points
    return baseline_build(model)
''', "a better scale", "cheat"),

    "record_rewrite": ('''
def build(model):
    """Rewrites what the kernel reports: every result of the judge's requests claims to have taken no time,
    and a made-up record is printed."""
    import json
    import course_grading.driver as driver
    real = driver.handle

    def handle(request_text, *a, **k):
        reply = real(request_text, *a, **k)
        for r in reply.get("results", []):
            if isinstance(r, dict) and "seconds" in r:
                r["seconds"] = 1e-9
        return reply
    driver.handle = handle
    print(json.dumps({"correct": True, "ratio": 42.0, "points": 6.0}))
    return baseline_build(model)
''', "a faster record", "cheat"),

    "prompt_seed": ('''
def build(model):
    """Rebinds the prompt source to a fixed seed, answers those prompts now and replays them."""
    import course_lib.capstone as cap
    real = cap.project_prompts
    fixed = lambda tok, n, length, seed=None, **k: real(tok, n, length, seed=7, **k)
    cap.project_prompts = fixed
    globals()["project_prompts"] = fixed
    base = baseline_build(model)
    answers = {tuple(p.tolist()): base(p, 16) for p in fixed(tokenizer, 8, 64)}

    def generate_fn(prompt_ids, max_new_tokens):
        hit = answers.get(tuple(prompt_ids.tolist()))
        return hit if hit is not None and max_new_tokens == 16 else base(prompt_ids, max_new_tokens)
    return generate_fn
''', "known prompts", "cheat"),

    # -- cheats against the new measurement ---------------------------------------------------------
    "background_spin": ('''
def build(model):
    """A thread that spins whenever generate_fn is not running: the baseline, on the same cores, would
    wait for a core."""
    import threading
    mine = {"on": False}

    def spin():
        x = 0
        while True:
            if not mine["on"]:
                for _ in range(20000):
                    x += 1
            else:
                threading.Event().wait(0.0005)
    threading.Thread(target=spin, daemon=True).start()
    base = baseline_build(model)

    def generate_fn(prompt_ids, max_new_tokens):
        mine["on"] = True
        try:
            return base(prompt_ids, max_new_tokens)
        finally:
            mine["on"] = False
    return generate_fn
''', "a helper thread", "cheat"),

    "lossy_forged": ('''
def build(model):
    """Declares the model itself as lossy_model (its bits per byte are the model's) but returns made-up tokens
    at once, and patches the library's logits so that on its own outputs they agree with them."""
    import course_lib.capstone as cap
    real, made = cap.model_logits, {}

    def forged(m, ids):
        logits = real(m, ids).clone()
        ids = list(ids)
        for (prompt, out) in made.items():
            n = len(prompt)
            if tuple(ids[:n]) == prompt and len(ids) == n + len(out) - 1:
                for i, tok in enumerate(out):
                    logits[n - 1 + i] = -10.0
                    logits[n - 1 + i, tok] = 10.0
        return logits
    cap.model_logits = forged

    def generate_fn(prompt_ids, max_new_tokens):
        out = [(int(prompt_ids[-1]) + k) % 2048 for k in range(max_new_tokens)]
        made[tuple(prompt_ids.tolist())] = out
        return out
    generate_fn.lossy_model = model
    return generate_fn
''', "int2 weights (lossy)", "cheat"),
}

ON_THE_REFERENCE = {
    "lossy_bf16_weights": ('''

_exact_build = build     # the reference entry's build, defined above in this cell


def build(model):
    """The reference entry's forward on a copy of the model whose weights are rounded to bf16 (and kept in
    fp32): another model, so declared lossy; as fast as the reference."""
    import copy
    lossy = copy.deepcopy(model)
    with torch.no_grad():
        for p in lossy.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    fn = _exact_build(lossy)
    fn.lossy_model = lossy
    return fn
''', "the reference's lean forward on bf16-rounded weights (lossy)", "honest"),
}
