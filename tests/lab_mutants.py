"""Planted wrong answers for the grading round trip (tests/test_grading.py).

Every lab in solutions/ must have an entry here, or `test_every_lab_has_mutants` fails.

Format:

    MUTANTS = {
        "labNN": [
            ("what is wrong, in a few words", {"<grade_id of an answer cell>": "<new source of that cell>", ...},
             ["<the misconception's explanation, as the lab's MISTAKES dict states it>", ...]),
            ...
        ],
    }

A mutant's submission is the student lab (labs/labNN.ipynb) with every answer cell filled with the
instructor's answer (solutions/labNN.ipynb, BEGIN/END SOLUTION lines removed), then the answer cells
named in the dict replaced by the given sources, as a student would type them (no solution
delimiters). Each mutant must score strictly between 0 and full marks: it must fail at least one test,
visible or hidden, and leave at least one exercise right. Good mutants are the mistakes students make
(an off-by-one, 128 instead of 127, a missing transpose, forgetting the bonus token), so the hidden
tests are shown to catch them. Keep them few (one or two per lab): each one is a full autograde of
the lab in CI.

The third element lists the explanations the mutant's feedback page must show: each hidden test that
catches the mistake passes the lab's public ``MISTAKES[...]`` text with the wrong value to
``check_close(..., mistakes={MISTAKES["key"]: wrong_value})`` (course_lib/checks.py), so the
student reads the misconception and the notebook section that explains it, not only the numbers. A mutant
may plant mistakes in several answer cells (one per part), to keep the number of autogrades small.

Example:

    "lab02": [
        ("int8 absmax divides by 128 instead of 127", {"absmax_answer": "def absmax_quantize(x):\\n    ..."},
         ["absmax int8 divides by 127 (the largest code), not 128; see 02 section 2"]),
    ],
"""


def _solution_with(lab: str, grade_id: str, edits: dict[str, str]) -> str:
    """The instructor's answer cell `grade_id` of solutions/<lab>.ipynb (solution delimiters removed) with each
    `old -> new` edit applied, each `old` found exactly once: a mutant that is one planted mistake in the
    solution, without a second copy of the solution to keep in step with it."""
    import nbformat
    from pathlib import Path
    nb = nbformat.read(Path(__file__).resolve().parents[1] / "solutions" / f"{lab}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    src = "\n".join(ln for ln in cell.source.split("\n") if "BEGIN SOLUTION" not in ln and "END SOLUTION" not in ln)
    for old, new in edits.items():
        if src.count(old) != 1:
            raise ValueError(f"{lab} {grade_id}: the mutant's edit {old!r} matches {src.count(old)} times, not once")
        src = src.replace(old, new)
    return src


MUTANTS: dict[str, list[tuple[str, dict[str, str], list[str]]]] = {
    "lab04": [
        ("the lecture notes' double softmax: log_softmax of probabilities instead of logits",
         {"kd_answer": '''\
def kd_loss(student_logits, teacher_logits, temperature=2.0):
    if student_logits.shape != teacher_logits.shape:
        raise ValueError("student_logits and teacher_logits must have the same shape")
    if not float(temperature) > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    T = float(temperature)
    soft_teacher = F.softmax(teacher_logits / T, dim=-1)
    soft_student = F.softmax(student_logits / T, dim=-1)
    V = soft_student.shape[-1]
    return F.kl_div(F.log_softmax(soft_student, dim=-1).reshape(-1, V), soft_teacher.reshape(-1, V),
                    reduction="batchmean") * T * T
'''},
         ["a softmax was taken twice (log_softmax of probabilities, the lecture notes' bug)"]),
        ("the KD loss without the T^2 factor, and the draft's cost ratio with a tied LM head counted twice",
         {"kd_answer": '''\
def kd_loss(student_logits, teacher_logits, temperature=2.0):
    if student_logits.shape != teacher_logits.shape:
        raise ValueError("student_logits and teacher_logits must have the same shape")
    if not float(temperature) > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    T = float(temperature)
    log_q = F.log_softmax(student_logits / T, dim=-1)
    log_p = F.log_softmax(teacher_logits / T, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()
''',
          "predict_cost": '''\
def predict_cost_ratio(draft_cfg, target_cfg):
    def count(cfg):
        if not isinstance(cfg, LlamaConfig):
            raise TypeError(f"expected a LlamaConfig, got {type(cfg).__name__}")
        D, F_, V, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
        H, K = cfg.num_attention_heads, cfg.num_key_value_heads
        layer = 2 * D * H * Dh + 2 * D * K * Dh + 3 * D * F_ + 2 * D
        return cfg.num_hidden_layers * layer + 2 * V * D + D      # embedding in, LM head out
    return count(draft_cfg) / count(target_cfg)
'''},
         ["the loss lacks the T² factor", "the LM head was counted separately although it is tied"]),
    ],
    "lab09": [
        ("the scheduler admits waiting requests without checking the free KV blocks (only max_batch); the batch "
         "prediction counts O decode steps after the prefill (one too many)",
         {"schedule_answer": '''\
def schedule(waiting, running, free_blocks, block_size, max_batch):
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
            if len(run) + len(admit) >= max_batch:
                break
            admit.append(w.rid)
            free -= blocks_needed(w.need, block_size)
    return Decision(preempt=preempt, admit=admit)
''', "predict_batch_answer": '''\
def predict_batch_s(B, P, O, cost):
    for name, value in (("B", B), ("P", P), ("O", O)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    t = cost.step_time(B * P, 0, B * P)
    for k in range(1, O + 1):
        t += cost.step_time(0, B, B * (P + k))
    return t
'''},
         ["the scheduler admits a waiting request when the batch has room without checking that its prefill's KV "
          "blocks fit in the free blocks: the KV memory is over-subscribed; see notebook 09, section "
          "'4. Iteration-level scheduling, KV blocks and preemption'",
          "the prediction counts one decode step per output token, but the prefill step already emits the first "
          "token: a request of O output tokens takes 1 prefill step and O - 1 decode steps; see notebook 09, "
          "section '2. What one engine step costs'"]),
        ("followed the recipe's 'admit while it fits' without FCFS: a request that does not fit is skipped and "
         "later, smaller ones are admitted",
         {"schedule_answer": '''\
def schedule(waiting, running, free_blocks, block_size, max_batch):
    if free_blocks < 0 or block_size < 1 or max_batch < 1:
        raise ValueError("bad arguments")
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
            if len(run) + len(admit) >= max_batch:
                break
            if nb > free:
                continue
            admit.append(w.rid)
            free -= nb
    return Decision(preempt=preempt, admit=admit)
'''},
         ["admission skips over a waiting request that does not fit and admits later, smaller ones: first come, "
          "first served stops at the first request that does not fit (a long prompt would starve); see notebook "
          "09, section '4. Iteration-level scheduling, KV blocks and preemption'"]),
    ],
    "lab08": [
        ("on a rejection the replacement is sampled from p instead of the residual max(0, p - q); and the "
         "expected tokens per pass count the accepted drafts only (no +1 for the target's token)",
         {"accept_answer": '''\
def accept_step(p, q, draft_tokens, generator=None):
    g = draft_tokens.shape[0]
    p, q = p.double(), q.double()
    out = []
    for i in range(g):
        t = int(draft_tokens[i])
        if q[i, t] <= 0:
            raise ValueError(f"q[{i}, {t}] = 0 but the draft proposed token {t}")
        u = float(torch.rand((), generator=generator))
        if u < min(1.0, float(p[i, t] / q[i, t])):
            out.append(t)
            continue
        out.append(int(torch.multinomial(p[i], 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[g], 1, generator=generator)))
    return out
''', "predict_speedup": '''\
def expected_tokens_per_pass(a, g):
    if not 0 <= a <= 1:
        raise ValueError(f"a must be in [0, 1], got {a}")
    if g < 0:
        raise ValueError(f"g must be >= 0, got {g}")
    return float(sum(a ** k for k in range(1, g + 1)))


def speedup(a, g, c, verify_cost=1.0):
    return expected_tokens_per_pass(a, g) / (g * c + verify_cost)
'''},
         ["on a rejection the replacement was sampled from p[i] instead of the residual normalize(max(0, p[i] - "
          "q[i])): the output then over-weights the tokens the draft likes; see notebook 08, section '2 · The "
          "acceptance rule, and why the output follows the target'",
          "the expected tokens per pass counted only the accepted drafts (a + a^2 + ... + a^g) and forgot the "
          "token every pass gets from the target (the correction or the bonus): add 1; see notebook 08, section "
          "'4 · How much does it buy? The speed-up model'"]),
        ("no bonus token when every draft is accepted", {"accept_answer": '''\
def accept_step(p, q, draft_tokens, generator=None):
    g = draft_tokens.shape[0]
    p, q = p.double(), q.double()
    out = []
    for i in range(g):
        t = int(draft_tokens[i])
        if q[i, t] <= 0:
            raise ValueError(f"q[{i}, {t}] = 0 but the draft proposed token {t}")
        u = float(torch.rand((), generator=generator))
        if u < min(1.0, float(p[i, t] / q[i, t])):
            out.append(t)
            continue
        residual = torch.clamp(p[i] - q[i], min=0)
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    return out
'''},
         ["no bonus token when every draft is accepted: a pass must emit the accepted drafts plus one token of the "
          "target, sampled from p[g] when nothing was rejected; see notebook 08, section '1 · One pass, by hand'"]),
    ],
    "lab00": [
        ("TPOT divides by the number of tokens, not the number of gaps (n - 1); the percentile's position is "
         "q/100 * n instead of q/100 * (n - 1) (Part B, contract)", {"metrics": '''\
def ttft(start, times):
    if len(times) == 0:
        raise ValueError("times is empty")
    return float(times[0]) - float(start)


def e2e_latency(start, times):
    if len(times) == 0:
        raise ValueError("times is empty")
    return float(times[-1]) - float(start)


def tpot(times):
    if len(times) < 2:
        raise ValueError("need at least 2 times")
    return (float(times[-1]) - float(times[0])) / len(times)


def tokens_per_second(start, times):
    return len(times) / e2e_latency(start, times)
''', "percentile": '''\
def percentile(values, q):
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("values is empty")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    r = min(q / 100 * len(v), len(v) - 1)
    i = math.floor(r)
    if i >= len(v) - 1:
        return v[-1]
    return v[i] + (r - i) * (v[i + 1] - v[i])
'''},
         ["TPOT divides by the number of tokens n; there are n - 1 gaps between n tokens, and the first token's "
          "time is already TTFT (see notebook 00, section '4. One generation, measured')",
          "the percentile's position is q/100 * n; with n sorted values the positions run from 0 to n - 1, so it "
          "is q/100 * (n - 1) (see notebook 00, section '6. Many requests: percentiles')"]),
        ("top-p drops the token that crosses p (Part D, contract); the E2E prediction counts n gaps instead of "
         "n - 1 (Part F, the prediction)", {"top_p": '''\
def top_p_filter(logits, p):
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.cumsum(torch.softmax(sorted_logits.float(), dim=-1), dim=-1)
    remove_sorted = cum > p
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
''', "predict_request": '''\
def predict_request(ttft, tpot, n_tokens):
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be an int >= 1, got {n_tokens!r}")
    if ttft < 0 or tpot < 0:
        raise ValueError("ttft and tpot must be >= 0")
    e2e = ttft + n_tokens * tpot
    return e2e, n_tokens / e2e
'''},
         ["top-p drops the token that crosses p (it keeps the tokens whose cumulative probability, their own "
          "included, is at most p); the token that crosses p is kept: a token is kept while the probability "
          "before it is below p (see notebook 00, section '10. Choosing the next token: temperature, top-k and "
          "top-p')",
          "the end-to-end prediction counts n TPOT gaps after the first token; n tokens have n - 1 gaps, so "
          "E2E = TTFT + (n - 1) * TPOT (see notebook 00, section '4. One generation, measured')"]),
    ],
    "lab01": [
        ("a matmul counted as m*n*k FLOPs (multiply-adds, the seed's slip) instead of 2*m*n*k; the critical batch "
         "from the weights-only approximation intensity = 2B/a (exercise 5, contract)", {"matmul_cost": '''\
def matmul_cost(m, n, k, bytes_per_element):
    flops = m * n * k
    nbytes = bytes_per_element * (m * k + k * n + m * n)
    return flops, nbytes, flops / nbytes
''', "critical_batch": '''\
def critical_batch(d_in, d_out, bytes_per_element, peak_flops, bandwidth):
    ridge = peak_flops / bandwidth
    return max(1, math.ceil(ridge * bytes_per_element / 2))
'''},
         ['a matmul counted as m*n*k FLOPs: that is the number of multiply-adds, and each is two floating-point '
          "operations, so 2*m*n*k (see notebook 01, section '2. The simplified tables, reproduced exactly')",
          'the batch comes from the approximation intensity = 2*B / bytes_per_element, which counts only the '
          "weight's bytes; the activations [B, d_in] and outputs [B, d_out] are read and written too, so the "
          "intensity grows more slowly and the batch is larger (see notebook 01, section '7. Batch size and the "
          "ridge point')"]),
        ("the decode step reads the weights once per sequence of the batch (exercise 6, contract, the prediction)",
         {"predict_decode_step": '''\
def predict_decode_step(num_params, bytes_per_param, peak_flops, bandwidth, batch=1, kv_cache_bytes=0):
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    for name, value in (("num_params", num_params), ("bytes_per_param", bytes_per_param),
                        ("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    if not kv_cache_bytes >= 0:
        raise ValueError(f"kv_cache_bytes must be >= 0, got {kv_cache_bytes!r}")
    memory = (num_params * bytes_per_param * batch + kv_cache_bytes) / bandwidth
    return max(memory, 2 * num_params * batch / peak_flops)
'''},
         ['the decode step reads the weights once per sequence (weight bytes x batch); a step reads every '
          "weight once for the whole batch, which is why batching helps (see notebook 01, section '7. Batch "
          "size and the ridge point')"]),
    ],
    "lab02": [
        ("int8 absmax scales by 2**(bits-1) = 128 instead of 127; per-group scales over strided groups "
         "(reshape(rows, group_size, -1)) instead of consecutive values (exercise 3, contract)", {"absmax": '''\
def absmax_quantize(x, bits=8):
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    qmax = 2 ** (bits - 1)
    scale = x.abs().max() / qmax
    if scale == 0:
        return torch.zeros_like(x, dtype=torch.int8), scale
    codes = torch.clamp(torch.round(x / scale), -qmax, qmax - 1).to(torch.int8)
    return codes, scale


def absmax_dequantize(codes, scale):
    return codes.float() * scale
''', "group": '''\
def group_quantize(w, bits, group_size):
    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"group_size={group_size} does not divide the {cols} columns")
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    qmax = 2 ** (bits - 1) - 1
    groups = w.reshape(rows, group_size, cols // group_size)
    scales = groups.abs().amax(dim=1) / qmax
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.clamp(torch.round(groups / safe.unsqueeze(1)), -qmax, qmax)
    return codes.reshape(rows, cols).to(torch.int8), scales


def group_dequantize(codes, scales, group_size):
    rows, cols = codes.shape
    groups = codes.float().reshape(rows, group_size, cols // group_size)
    return (groups * scales.unsqueeze(1)).reshape(rows, cols)
'''},
         ['absmax divides by 2**(bits-1) = 128 for 8 bits; the largest code is qmax = 2**(bits-1) - 1 = 127 '
          "(-128 stays unused so the grid is symmetric), so scale = max|x| / 127 (see notebook 02, section '2. "
          "From floats to integers: absmax and zero-point quantization')",
          'the groups take every (cols // group_size)-th value of a row (reshape(rows, group_size, -1)) instead '
          'of group_size consecutive values (reshape(rows, -1, group_size)); the formats store a scale per run '
          "of consecutive weights (see notebook 02, section '3. Granularity: one scale per tensor, per channel, "
          "or per group')"]),
        ("NF4 codes from torch.bucketize on the levels (the level at or above, not the nearest; exercise 6, "
         "contract); bits per weight without the scales (exercise 7, the prediction)", {"nf4": '''\
def nf4_quantize(x, blocksize=64):
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 1:
        raise ValueError(f"blocksize must be a positive int, got {blocksize!r}")
    if x.numel() % blocksize:
        raise ValueError(f"blocksize={blocksize} does not divide the {x.numel()} elements of x")
    blocks = x.reshape(-1, blocksize).float()
    absmax = blocks.abs().amax(dim=1)
    safe = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    codes = torch.bucketize(blocks / safe[:, None], NF4).clamp(max=15)
    return codes.reshape(x.shape).to(torch.uint8), absmax


def nf4_dequantize(codes, absmax, blocksize=64):
    vals = NF4[codes.long()].reshape(-1, blocksize)
    return (vals * absmax.float()[:, None]).reshape(codes.shape)
''', "predict_bits_per_weight": '''\
def predict_bits_per_weight(bits, group_size=None, scale_bits=16):
    if bits < 1:
        raise ValueError(f"bits must be >= 1, got {bits!r}")
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be None or a positive int, got {group_size!r}")
    return float(bits)
'''},
         ['the NF4 code is the level at or above x / absmax (torch.bucketize / searchsorted on the levels), not '
          'the nearest level; search the midpoints between neighbouring levels, or take the argmin of the '
          "distance (see notebook 02, section '9. NF4: a codebook shaped like the weights')",
          'the bits per weight leave out the scales: each group of group_size weights also stores one scale of '
          "scale_bits bits, scale_bits / group_size bits per weight (see notebook 02, section '7. Memory "
          "arithmetic for 7B and 70B models')"]),
    ],
    "lab05": [
        ("the KV memory formula forgets the factor 2 (K and V are both cached), and get_seq_length counts every "
         "layer's update", {"memory_answer": 'def kv_cache_bytes(num_layers, num_kv_heads, head_dim, tokens, batch=1, bytes_per_element=2):\n    """Bytes of the K and V caches of `batch` sequences of `tokens` tokens."""\n    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):\n        if not isinstance(value, int) or value <= 0:\n            raise ValueError(f"{name} must be a positive int, got {value!r}")\n    for name, value in (("tokens", tokens), ("batch", batch)):\n        if not isinstance(value, int) or value < 0:\n            raise ValueError(f"{name} must be a non-negative int, got {value!r}")\n    return int(num_layers * num_kv_heads * head_dim * bytes_per_element * tokens * batch)\n\n\ndef max_sequences(gpu_bytes, weight_bytes, num_layers, num_kv_heads, head_dim, tokens, bytes_per_element=2):\n    """How many sequences of `tokens` tokens fit in gpu_bytes - weight_bytes."""\n    free = gpu_bytes - weight_bytes\n    per_seq = kv_cache_bytes(num_layers, num_kv_heads, head_dim, tokens, 1, bytes_per_element)\n    return max(0, int(free // per_seq)) if per_seq else 0',
          "cache_answer": '''\
class KVCache:
    def __init__(self):
        self.k, self.v, self.n = [], [], 0

    def update(self, k, v, layer):
        if layer == len(self.k):
            self.k.append(k)
            self.v.append(v)
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        self.n += k.shape[2]
        return self.k[layer], self.v[layer]

    def get_seq_length(self):
        return self.n
'''},
         ["the formula counts the keys only", "get_seq_length() counts every layer's update"]),
        ("the sink cache does not count the new token in its own window (W stored tokens + the new one)",
         {"window_answer": '''\
class SinkKVCache:
    def __init__(self, window, sinks=0):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks must be an int >= 0, got {sinks!r}")
        self.window, self.sinks = window, sinks
        self.k, self.v, self.seen = [], [], []

    def update(self, k, v, layer):
        if layer == len(self.k):
            self.k.append(k[:, :, :0])
            self.v.append(v[:, :, :0])
            self.seen.append(0)
        n = self.k[layer].shape[2]
        s = min(n, self.sinks)
        idx = list(range(s)) + list(range(max(s, n - self.window), n))
        k_all = torch.cat([self.k[layer][:, :, idx], k], dim=2)
        v_all = torch.cat([self.v[layer][:, :, idx], v], dim=2)
        n_sink = min(self.sinks, self.seen[layer] + k.shape[2])
        keep = list(range(n_sink)) + list(range(n_sink, k_all.shape[2]))[-self.window:]
        self.k[layer], self.v[layer] = k_all[:, :, keep], v_all[:, :, keep]
        self.seen[layer] += k.shape[2]
        return k_all, v_all

    def get_seq_length(self):
        return self.seen[0] if self.seen else 0

    def stored_length(self, layer=0):
        return self.k[layer].shape[2] if layer < len(self.k) else 0
'''},
         ["the new token was not counted in its own window"]),
    ],
    "lab06": [
        ("a new block is allocated one token late (after the last block overflows, not when it is full); and "
         "the predicted waste takes block_size / 2 empty slots per sequence",
         {"blocks_answer": 'class BlockManager:\n    def __init__(self, allocator, block_size):\n        if not isinstance(block_size, int) or block_size < 1:\n            raise PagingError(f"block_size must be a positive int, got {block_size!r}")\n        self.allocator, self.block_size = allocator, block_size\n        self.tables, self.lengths = {}, {}\n\n    def add_sequence(self, seq_id, num_tokens):\n        if seq_id in self.tables:\n            raise PagingError(f"sequence {seq_id!r} already exists")\n        if not isinstance(num_tokens, int) or num_tokens < 1:\n            raise PagingError(f"num_tokens must be an int >= 1, got {num_tokens!r}")\n        need = -(-num_tokens // self.block_size)\n        if need > self.allocator.num_free:\n            raise OutOfBlocks(need, self.allocator.num_free)\n        self.tables[seq_id] = [self.allocator.allocate() for _ in range(need)]\n        self.lengths[seq_id] = num_tokens\n\n    def append_token(self, seq_id):\n        if seq_id not in self.tables:\n            raise PagingError(f"unknown sequence {seq_id!r}")\n        if self.lengths[seq_id] > self.block_size * len(self.tables[seq_id]):\n            if self.allocator.num_free == 0:\n                raise OutOfBlocks(1, 0)\n            self.tables[seq_id].append(self.allocator.allocate())\n        self.lengths[seq_id] += 1\n\n    def free(self, seq_id):\n        if seq_id not in self.tables:\n            raise PagingError(f"unknown sequence {seq_id!r}")\n        for b in reversed(self.tables[seq_id]):\n            self.allocator.free(b)\n        del self.tables[seq_id], self.lengths[seq_id]\n\n    def block_table(self, seq_id):\n        if seq_id not in self.tables:\n            raise PagingError(f"unknown sequence {seq_id!r}")\n        return list(self.tables[seq_id])\n\n    def num_tokens(self, seq_id):\n        if seq_id not in self.tables:\n            raise PagingError(f"unknown sequence {seq_id!r}")\n        return self.lengths[seq_id]', "predict_waste": '''\
def predict_paged_waste(mean_len, block_size):
    return (block_size / 2) / (mean_len + block_size / 2)
'''},
         ["a new block was allocated one token late: a sequence of n tokens owns exactly ceil(n / block_size) "
          "blocks, so the append that finds the last block full (the length a multiple of block_size) allocates, "
          "not the one after; see notebook 06, section '2. Blocks, block tables, and running out'",
          "the last block holds 1 to block_size tokens, so on average (block_size - 1) / 2 of its slots are empty, "
          "not block_size / 2; see notebook 06, section 'The block size knob'"]),
        ("paged attention reads the whole last block: the slots past the sequence's length are not masked",
         {"paged_answer": '''\
def paged_attention(q, k_pool, v_pool, block_tables, context_lens):
    if q.dim() != 3 or k_pool.dim() != 4 or k_pool.shape != v_pool.shape or k_pool.shape[3] != q.shape[2]:
        raise ValueError(f"q must be [B, H, d] and k_pool, v_pool the same [num_blocks, Hkv, block_size, d], got "
                         f"{tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    B, H, d = q.shape
    N, Hkv, bs, _ = k_pool.shape
    if H % Hkv:
        raise ValueError(f"query heads H={H} must be a multiple of KV heads Hkv={Hkv}")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or tuple(context_lens.shape) != (B,):
        raise ValueError(f"block_tables must be [B={B}, max_blocks] and context_lens [B={B}], got "
                         f"{tuple(block_tables.shape)}, {tuple(context_lens.shape)}")
    G, max_blocks = H // Hkv, block_tables.shape[1]
    out = torch.zeros_like(q)
    for b in range(B):
        n = int(context_lens[b])
        if not 0 <= n <= max_blocks * bs:
            raise ValueError(f"context_lens[{b}]={n} is outside [0, max_blocks * block_size = {max_blocks * bs}]")
        if n == 0:
            continue                                             # nothing to attend to: a zero row
        used = [int(x) for x in block_tables[b, :-(-n // bs)]]
        if min(used) < 0 or max(used) >= N:
            raise ValueError(f"block_tables[{b}] points outside the pool of {N} blocks: {used}")
        idx = torch.tensor(used)
        k = k_pool[idx].permute(1, 0, 2, 3).reshape(Hkv, -1, d)      # [Hkv, blocks * block_size, d]
        v = v_pool[idx].permute(1, 0, 2, 3).reshape(Hkv, -1, d)
        s = q[b].reshape(Hkv, G, d) @ k.transpose(-1, -2) / math.sqrt(d)    # [Hkv, G, n]
        out[b] = (s.softmax(-1) @ v).reshape(H, d)
    return out
'''},
         ["the slots past a sequence's length in its last block were attended to: a block is filled only up to "
          "context_lens[b], the rest holds stale K/V of earlier owners and must be masked; see notebook 06, "
          "section '3. Attention through a block table'"]),
    ],
    "lab07": [
        ("the running sum is not rescaled when the running max grows; and the causal mask is aligned top-left "
         "(query t sees keys up to t) when there are fewer queries than keys, in the PyTorch loop and in the "
         "Triton kernel",
         {"online_answer": '''\
def online_softmax_update(m, l, piece):
    m_new = torch.maximum(m, piece.max(dim=-1).values)
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    l_new = l + torch.exp(piece - m_safe[:, None]).sum(dim=-1)
    return m_new, l_new


def online_softmax(x, block_size):
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    m = torch.full(x.shape[:-1], float("-inf"))
    l = torch.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block_size):
        m, l = online_softmax_update(m, l, x[:, start:start + block_size])
    return torch.exp(x - m[:, None]) / l[:, None]
''', "tiled_answer": '''\
def tiled_attention(q, k, v, block_q, block_k, causal=False):
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q must be [B, H, Tq, d] and k, v the same [B, Hkv, Tk, d], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    B, H, Tq, d = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != d or Hkv < 1 or H % Hkv:
        raise ValueError(f"k, v must be [B={B}, Hkv, Tk, d={d}] with H={H} a multiple of Hkv, got {tuple(k.shape)}")
    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs Tq <= Tk (the queries are the last Tq positions), got "
                         f"Tq={Tq}, Tk={Tk}")
    G = H // Hkv
    scale = 1.0 / math.sqrt(d)
    qg = q.reshape(B, Hkv, G, Tq, d)                      # the G query heads of one KV head, side by side
    out = torch.empty(B, Hkv, G, Tq, d, dtype=q.dtype)
    offset = 0                                            # query t sees keys up to t
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = qg[:, :, :, i0:i1]
        m = torch.full((B, Hkv, G, i1 - i0), float("-inf"))
        l = torch.zeros(B, Hkv, G, i1 - i0)
        acc = torch.zeros(B, Hkv, G, i1 - i0, d)
        k_end = min(Tk, offset + i1) if causal else Tk    # keys from here on are in every row's future
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Tk)
            s = qi @ k[:, :, None, j0:j1].transpose(-1, -2) * scale          # [B, Hkv, G, rows, cols]
            if causal and j1 - 1 > offset + i0:                              # crosses the diagonal
                rows = torch.arange(i0, i1)[:, None] + offset
                cols = torch.arange(j0, j1)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.max(dim=-1).values)
            alpha = torch.exp(m - m_new)                  # every row sees key 0 first: m_new is finite
            p = torch.exp(s - m_new[..., None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, None, j0:j1]
            m = m_new
        out[:, :, :, i0:i1] = acc / l[..., None]
    return out.reshape(B, H, Tq, d)
''',
    "flash_kernel_answer": _solution_with("lab07", "flash_kernel_answer", {
        "    pos = rows + S - T ": "    pos = rows ",
        "hi = tl.minimum(S, (i + 1) * BLOCK_M + S - T)": "hi = tl.minimum(S, (i + 1) * BLOCK_M)"})},
         ["the running sum l was not rescaled by exp(m_old - m_new) when the running max grew: it adds terms taken "
          "against different maxima; see notebook 07, section '3. Online softmax, step by step'",
          "the causal mask is aligned top-left: with Tq queries after Tk - Tq cached keys, query t sits at position "
          "Tk - Tq + t and sees keys up to Tk - Tq + t (bottom-right alignment), not only keys up to t; see this "
          "lab's Part C and notebook 07, section '4. Tiled exact attention'",
          "your kernel's causal mask is aligned top-left: with T queries after S - T cached keys, query row t sits "
          "at position S - T + t and sees the keys j <= t + S - T (bottom-right, as in Part C), not only j <= t; "
          "the offset S - T belongs in the mask and in the last key tile the loop visits; see this lab's Part C "
          "and notebook 07, section '4. Tiled exact attention'"]),
        ("the accumulator is not rescaled when the running max grows (only the sum l is), in the PyTorch loop and "
         "in the Triton kernel; and the predicted traffic reads K and V once",
         {"tiled_answer": '''\
def tiled_attention(q, k, v, block_q, block_k, causal=False):
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q must be [B, H, Tq, d] and k, v the same [B, Hkv, Tk, d], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    B, H, Tq, d = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != d or Hkv < 1 or H % Hkv:
        raise ValueError(f"k, v must be [B={B}, Hkv, Tk, d={d}] with H={H} a multiple of Hkv, got {tuple(k.shape)}")
    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs Tq <= Tk (the queries are the last Tq positions), got "
                         f"Tq={Tq}, Tk={Tk}")
    G = H // Hkv
    scale = 1.0 / math.sqrt(d)
    qg = q.reshape(B, Hkv, G, Tq, d)                      # the G query heads of one KV head, side by side
    out = torch.empty(B, Hkv, G, Tq, d, dtype=q.dtype)
    offset = Tk - Tq                                      # query t sits at position offset + t
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = qg[:, :, :, i0:i1]
        m = torch.full((B, Hkv, G, i1 - i0), float("-inf"))
        l = torch.zeros(B, Hkv, G, i1 - i0)
        acc = torch.zeros(B, Hkv, G, i1 - i0, d)
        k_end = min(Tk, offset + i1) if causal else Tk    # keys from here on are in every row's future
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Tk)
            s = qi @ k[:, :, None, j0:j1].transpose(-1, -2) * scale          # [B, Hkv, G, rows, cols]
            if causal and j1 - 1 > offset + i0:                              # crosses the diagonal
                rows = torch.arange(i0, i1)[:, None] + offset
                cols = torch.arange(j0, j1)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.max(dim=-1).values)
            alpha = torch.exp(m - m_new)                  # every row sees key 0 first: m_new is finite
            p = torch.exp(s - m_new[..., None])
            l = alpha * l + p.sum(dim=-1)
            acc = acc + p @ v[:, :, None, j0:j1]
            m = m_new
        out[:, :, :, i0:i1] = acc / l[..., None]
    return out.reshape(B, H, Tq, d)
''', "predict_flash_io": '''\
def predict_flash_io(seq_len, head_dim, block_q):
    return 4 * seq_len * head_dim
''',
    "flash_kernel_answer": _solution_with("lab07", "flash_kernel_answer", {
        "acc = acc * alpha[:, None] + tl.dot(": "acc = acc + tl.dot("})},
         ["the running sum l was rescaled when the max grew but the output accumulator was not: acc holds sums of "
          "exp(s - m) v taken against the old max and needs the same factor exp(m_old - m_new) as l; see notebook "
          "07, section '4. Tiled exact attention'",
          "the traffic counts K and V once: with query tiles outside, every query tile reads all of K and V again, "
          "so they are read ceil(N / block_q) times; see notebook 07, section '2. Counting the bytes: the IO model'",
          "your kernel rescales the running sum l when the running max grows but not the accumulator acc: acc holds "
          "sums of exp(s - m_old) v and needs the same factor exp(m_old - m_new) before the new tile's p @ v is "
          "added; see notebook 07, sections '3. Online softmax, step by step' and '5. A Triton kernel'"]),
    ],
    "lab10": [
        ("Wanda scored by the weight only (|W|, no activation norm): plain magnitude 2:4", {"wanda": '''\
def wanda_24_mask(W, X):
    out_f, in_f = W.shape
    if in_f % 4:
        raise ValueError(f"in_features must be a multiple of 4, got {in_f}")
    if X.dim() != 2 or X.shape[1] != in_f:
        raise ValueError(f"X must be [tokens, {in_f}], got {tuple(X.shape)}")
    groups = W.abs().reshape(out_f, in_f // 4, 4)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(-1, groups.topk(2, dim=-1).indices, True)
    return keep.reshape(out_f, in_f)
'''},
         ["the mask ranks the weights by |W| alone: Wanda's score is |W[i, j]| times the L2 norm of input feature j "
          "over the calibration tokens, so a small weight on a loud feature can matter more than a large weight on "
          "a quiet one; see notebook 10, section '2. Wanda and the 2:4 pattern'"]),
        ("the dispatch ignores the capacity (no assignment is ever dropped); the prediction pools the capacity "
         "over the experts", {"dispatch": '''\
def moe_dispatch(x, experts, weights, indices, capacity=None):
    N, k = indices.shape
    y = torch.zeros_like(x)
    for e in range(len(experts)):
        tok, slot = (indices == e).nonzero(as_tuple=True)
        if len(tok):
            y.index_add_(0, tok, weights[tok, slot][:, None] * experts[e](x[tok]))
    return y, 0
''', "predict_dropped": '''\
def predict_dropped(loads, N, k, capacity_factor):
    loads = [int(x) for x in loads]
    if any(x < 0 for x in loads) or sum(loads) != N * k:
        raise ValueError("bad loads")
    cap = expert_capacity(N, len(loads), k, capacity_factor)
    return max(0, N * k - len(loads) * cap)
'''},
         ["the dispatch never drops an assignment: an expert that already holds `capacity` assignments must drop "
          "the next ones (first choices are placed before second choices); see notebook 10, section "
          "'5. Mixture of experts'",
          "the capacity is pooled over the experts (max(0, N*k - E*capacity)): it is per expert, an idle slot of "
          "one expert cannot take another expert's token, so the dropped count is the sum over experts of "
          "max(0, load - capacity); see notebook 10, section '5. Mixture of experts'"]),
    ],
    "lab11": [
        ("the row-parallel bias b2 added on every rank before the all-reduce (summed world_size times); the "
         "bubble predicted as idle over busy time, (p - 1) / m", {"parallel_mlp": '''\
def parallel_mlp(x, w1, b1, w2, b2, rank, world_size):
    w1_r, b1_r = shard_column(w1, b1, rank, world_size)
    h = F.relu(F.linear(x, w1_r, b1_r))
    y = F.linear(h, shard_row(w2, rank, world_size), b2)
    dist.all_reduce(y)
    return y
''', "predict_bubble": '''\
def predict_bubble(p, m):
    if not isinstance(p, int) or not isinstance(m, int) or p < 1 or m < 1:
        raise ValueError("p and m must be integers >= 1")
    return (p - 1) / m
'''},
         ["the row-parallel bias b2 is added on every rank before the all-reduce, which sums it world_size times: "
          "add it once, after the sum; see notebook 11, section '1 · Two ways to split a linear layer'",
          "the bubble is the idle share of the whole run, (p - 1) / (m + p - 1): the run takes m + p - 1 "
          "stage-times and each rank is busy for m of them; (p - 1) / m is idle time over busy time; see notebook "
          "11, section '6 · Pipeline parallelism and its bubble'"]),
    ],
    "lab03": [
        ("GPTQ spreads the error with the full inverse's entries [H^-1]_jj, [H^-1]_jk (the notes' formula), and "
         "SmoothQuant divides the weight by s like the activations",
         {"gptq_answer": '''\
def gptq(W, H, bits=4, group_size=None, percdamp=0.01):
    n_in = W.shape[1]
    if not isinstance(H, torch.Tensor) or H.shape != (n_in, n_in):
        raise ValueError(f"H must have shape ({n_in}, {n_in})")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int in 2..8, got {bits!r}")
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be None or an int >= 1, got {group_size!r}")
    if not 0 <= percdamp < 1:
        raise ValueError(f"percdamp must be in [0, 1), got {percdamp!r}")
    g = group_size or n_in
    H = H.float() + percdamp * torch.diag(H.float()).mean() * torch.eye(n_in)
    Hinv = torch.linalg.inv(H)
    W = W.clone().float()
    Q = torch.zeros_like(W)
    for j in range(n_in):
        if j % g == 0:
            scale, zero = grid(W[:, j:j + g], bits)
        q = rtn_column(W[:, j:j + 1], scale, zero, bits)
        err = (W[:, j:j + 1] - q) / Hinv[j, j]
        W[:, j + 1:] -= err @ Hinv[j:j + 1, j + 1:]
        Q[:, j:j + 1] = q
    return Q
''',
          "smooth_answer": '''\
def smooth(x_absmax, W, alpha=0.5):
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    a = x_absmax.float().clamp(min=1e-5)
    w = W.abs().amax(dim=0).float().clamp(min=1e-5)
    s = a.pow(alpha) / w.pow(1 - alpha)
    return s, W / s[None, :]
'''},
         ["the error was spread with the entries of the full inverse H^-1",
          "the weight was divided by s, like the activations"]),
        ("GPTQ without error feedback: each column rounded on its own (plain RTN on the group grids)",
         {"gptq_answer": '''\
def gptq(W, H, bits=4, group_size=None, percdamp=0.01):
    n_in = W.shape[1]
    if not isinstance(H, torch.Tensor) or H.shape != (n_in, n_in):
        raise ValueError(f"H must have shape ({n_in}, {n_in})")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int in 2..8, got {bits!r}")
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be None or an int >= 1, got {group_size!r}")
    if not 0 <= percdamp < 1:
        raise ValueError(f"percdamp must be in [0, 1), got {percdamp!r}")
    g = group_size or n_in
    W = W.clone().float()
    Q = torch.zeros_like(W)
    for j in range(n_in):
        if j % g == 0:
            scale, zero = grid(W[:, j:j + g], bits)
        Q[:, j:j + 1] = rtn_column(W[:, j:j + 1], scale, zero, bits)
    return Q
'''},
         ["each column was rounded on its own (plain round-to-nearest)"]),
    ],
    "lab12": [
        ("the graph break moved, not removed: the argmax stays a tensor but .tolist() still leaves the graph",
         {"step_answer": '''\
def decode_step(model, tok, cache):
    logits = model(tok, cache=cache)[:, -1, :]
    ids = logits.argmax(dim=-1).tolist()
    return torch.tensor(ids, device=tok.device).unsqueeze(-1)
'''},
         ["a conversion of a tensor to Python values (.tolist(), int(), .item(), .cpu().numpy()) needs the value on "
          "the host, so dynamo ends the graph there wherever in the function it happens: moving it is not removing "
          "it, stay in tensors up to the result; see notebook 12, section '2. Graph breaks'"]),
        ("shares computed linearly, (speedup - 1) / (S - 1), instead of on a log scale; the roofline's memory and "
         "compute times added instead of their max", {"attribution_answer": '''\
def attribution(timings, price_per_hour):
    timings = list(timings)
    if not timings:
        raise ValueError("timings must not be empty")
    if not price_per_hour >= 0:
        raise ValueError("price_per_hour must be >= 0")
    for name, tps in timings:
        if not (isinstance(tps, (int, float)) and math.isfinite(tps) and tps > 0):
            raise ValueError(f"bad tokens/s for {name}")
    total = timings[-1][1] / timings[0][1]
    rows, prev = [], None
    for name, tps in timings:
        speedup = 1.0 if prev is None else tps / prev
        share = 0.0 if prev is None or total == 1 else (speedup - 1) / (total - 1)
        rows.append({"step": name, "tokens_per_s": tps, "speedup": speedup, "share": share,
                     "usd_per_1M": price_per_hour / (tps * 3600) * 1e6})
        prev = tps
    return rows
''', "predict_step_answer": '''\
def predict_decode_step_s(params, bytes_per_param, batch, kv_bytes, bandwidth, peak_flops):
    if not (params > 0 and bytes_per_param > 0 and bandwidth > 0 and peak_flops > 0):
        raise ValueError("params, bytes_per_param, bandwidth and peak_flops must be positive")
    if not isinstance(batch, int) or batch < 1 or kv_bytes < 0:
        raise ValueError("batch must be an int >= 1 and kv_bytes >= 0")
    return (params * bytes_per_param + kv_bytes) / bandwidth + 2 * params * batch / peak_flops
'''},
         ["speed-ups multiply, so each step's share is taken on a log scale, log(speedup) / log(S); linear shares "
          "(speedup - 1) / (S - 1) do not add up to 1; see notebook 12, section '6. The capstone: every "
          "optimization on one model'",
          "the roofline's time is the larger of the memory time and the compute time (the device reads and "
          "computes at the same time), not their sum; see notebook 01, section '5. Rooflines: T4, L4, A100, H100, "
          "H200 and this machine'"]),
    ],
    "lab13": [
        ("the project's KV cache made once in build and kept from one call to the next (the next prompt attends "
         "to the previous one's keys and values): fast, but its tokens differ, so no speed points; Part B right",
         {"build_answer": '''\
def build(model):
    device = next(model.parameters()).device
    cache = ContiguousCache()

    def generate_fn(prompt_ids, max_new_tokens):
        x, out = prompt_ids.to(device).view(1, -1), []
        for _ in range(max_new_tokens):
            tok = model(x, cache=cache)[0, -1].argmax()
            out.append(tok)
            x = tok.view(1, 1)
        return torch.stack(out).cpu()
    return generate_fn
'''},
         ["generate_fn kept per-prompt state (a KV cache holding the last prompt's keys and values) from one call "
          "to the next, so the next prompt attends to the previous one: keep between calls only what depends on "
          "the model alone (weights, compiled code, buffers you reset), make a fresh cache per prompt; see "
          "notebook 05, section '2. A KV cache from scratch'"]),
    ],
}
