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

MUTANTS: dict[str, list[tuple[str, dict[str, str], list[str]]]] = {
    "lab04": [
        ("the lecture notes' double softmax: log_softmax of probabilities instead of logits",
         {"kd_answer": '''\
def kd_loss(student_logits, teacher_logits, temperature=2.0):
    T = float(temperature)
    soft_teacher = F.softmax(teacher_logits / T, dim=-1)
    soft_student = F.softmax(student_logits / T, dim=-1)
    V = soft_student.shape[-1]
    return F.kl_div(F.log_softmax(soft_student, dim=-1).reshape(-1, V), soft_teacher.reshape(-1, V),
                    reduction="batchmean") * T * T
'''}),
        ("the KD loss without the T^2 factor",
         {"kd_answer": '''\
def kd_loss(student_logits, teacher_logits, temperature=2.0):
    T = float(temperature)
    log_q = F.log_softmax(student_logits / T, dim=-1)
    log_p = F.log_softmax(teacher_logits / T, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()
'''}),
    ],
    "lab09": [
        ("the scheduler admits waiting requests without checking the free KV blocks (only max_batch)",
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
'''}),
    ],
    "lab08": [
        ("on a rejection the replacement is sampled from p instead of the residual max(0, p - q)", {"accept_answer": '''\
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
'''}),
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
'''}),
    ],
    "lab00": [
        ("TPOT divides by the number of tokens, not the number of gaps (n - 1)", {"metrics": '''\
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
'''}),
    ],
    "lab01": [
        ("a matmul counted as m*n*k FLOPs (multiply-adds, the seed's slip) instead of 2*m*n*k", {"matmul_cost": '''\
def matmul_cost(m, n, k, bytes_per_element):
    flops = m * n * k
    nbytes = bytes_per_element * (m * k + k * n + m * n)
    return flops, nbytes, flops / nbytes
'''}),
    ],
    "lab02": [
        ("int8 absmax scales by 2**(bits-1) = 128 instead of 127", {"absmax": '''\
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
'''}),
    ],
    "lab05": [
        ("the KV memory formula forgets the factor 2 (K and V are both cached)", {"memory_answer": 'def kv_cache_bytes(num_layers, num_kv_heads, head_dim, tokens, batch=1, bytes_per_element=2):\n    """Bytes of the K and V caches of `batch` sequences of `tokens` tokens."""\n    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):\n        if not isinstance(value, int) or value <= 0:\n            raise ValueError(f"{name} must be a positive int, got {value!r}")\n    for name, value in (("tokens", tokens), ("batch", batch)):\n        if not isinstance(value, int) or value < 0:\n            raise ValueError(f"{name} must be a non-negative int, got {value!r}")\n    return int(num_layers * num_kv_heads * head_dim * bytes_per_element * tokens * batch)\n\n\ndef max_sequences(gpu_bytes, weight_bytes, num_layers, num_kv_heads, head_dim, tokens, bytes_per_element=2):\n    """How many sequences of `tokens` tokens fit in gpu_bytes - weight_bytes."""\n    free = gpu_bytes - weight_bytes\n    per_seq = kv_cache_bytes(num_layers, num_kv_heads, head_dim, tokens, 1, bytes_per_element)\n    return max(0, int(free // per_seq)) if per_seq else 0'}),
    ],
    "lab06": [
        ("a new block is allocated one token late (after the last block overflows, not when it is full)", {"blocks_answer": 'class BlockManager:\n    def __init__(self, allocator, block_size):\n        if not isinstance(block_size, int) or block_size < 1:\n            raise PagingError(f"block_size must be a positive int, got {block_size!r}")\n        self.allocator, self.block_size = allocator, block_size\n        self.tables, self.lengths = {}, {}\n\n    def add_sequence(self, seq_id, num_tokens):\n        if seq_id in self.tables:\n            raise PagingError(f"sequence {seq_id!r} already exists")\n        if not isinstance(num_tokens, int) or num_tokens < 1:\n            raise PagingError(f"num_tokens must be an int >= 1, got {num_tokens!r}")\n        need = -(-num_tokens // self.block_size)\n        if need > self.allocator.num_free:\n            raise OutOfBlocks(need, self.allocator.num_free)\n        self.tables[seq_id] = [self.allocator.allocate() for _ in range(need)]\n        self.lengths[seq_id] = num_tokens\n\n    def append_token(self, seq_id):\n        if seq_id not in self.tables:\n            raise PagingError(f"unknown sequence {seq_id!r}")\n        if self.lengths[seq_id] > self.block_size * len(self.tables[seq_id]):\n            if self.allocator.num_free == 0:\n                raise OutOfBlocks(1, 0)\n            self.tables[seq_id].append(self.allocator.allocate())\n        self.lengths[seq_id] += 1\n\n    def free(self, seq_id):\n        if seq_id not in self.tables:\n            raise PagingError(f"unknown sequence {seq_id!r}")\n        for b in reversed(self.tables[seq_id]):\n            self.allocator.free(b)\n        del self.tables[seq_id], self.lengths[seq_id]\n\n    def block_table(self, seq_id):\n        if seq_id not in self.tables:\n            raise PagingError(f"unknown sequence {seq_id!r}")\n        return list(self.tables[seq_id])\n\n    def num_tokens(self, seq_id):\n        if seq_id not in self.tables:\n            raise PagingError(f"unknown sequence {seq_id!r}")\n        return self.lengths[seq_id]'}),
    ],
    "lab07": [
        ("the running sum is not rescaled when the running max grows", {"online_answer": '''\
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
'''}),
        ("causal: future tiles skipped but the diagonal tiles not masked", {"tiled_answer": '''\
def tiled_attention(q, k, v, block_size, causal=False):
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    N, d = q.shape
    out = torch.empty_like(q)
    for i0 in range(0, N, block_size):
        i1 = min(i0 + block_size, N)
        m = torch.full((i1 - i0,), float("-inf"))
        l = torch.zeros(i1 - i0)
        acc = torch.zeros(i1 - i0, d)
        for j0 in range(0, N, block_size):
            if causal and j0 > i1 - 1:
                break
            j1 = min(j0 + block_size, N)
            s = q[i0:i1] @ k[j0:j1].T / math.sqrt(d)
            m_new = torch.maximum(m, s.max(dim=-1).values)
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[:, None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[:, None] * acc + p @ v[j0:j1]
            m = m_new
        out[i0:i1] = acc / l[:, None]
    return out
'''}),
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
'''}),
        ("the dispatch ignores the capacity (no assignment is ever dropped)", {"dispatch": '''\
def moe_dispatch(x, experts, weights, indices, capacity=None):
    N, k = indices.shape
    y = torch.zeros_like(x)
    for e in range(len(experts)):
        tok, slot = (indices == e).nonzero(as_tuple=True)
        if len(tok):
            y.index_add_(0, tok, weights[tok, slot][:, None] * experts[e](x[tok]))
    return y, 0
'''}),
    ],
    "lab11": [
        ("the row-parallel bias b2 added on every rank before the all-reduce (summed world_size times)", {"parallel_mlp": '''\
def parallel_mlp(x, w1, b1, w2, b2, rank, world_size):
    w1_r, b1_r = shard_column(w1, b1, rank, world_size)
    h = F.relu(F.linear(x, w1_r, b1_r))
    y = F.linear(h, shard_row(w2, rank, world_size), b2)
    dist.all_reduce(y)
    return y
'''}),
    ],
    "lab03": [
        ("GPTQ without error feedback: each column rounded on its own (plain RTN)", {"gptq_answer": '''\
def gptq_columns(W, U, scale, zero, bits=4):
    if U.shape != (W.shape[1], W.shape[1]):
        raise ValueError(f"U must have shape ({W.shape[1]}, {W.shape[1]}), got {tuple(U.shape)}")
    W = W.clone().float()
    Q = torch.zeros_like(W)
    for j in range(W.shape[1]):
        Q[:, j:j + 1] = rtn_column(W[:, j:j + 1], scale, zero, bits)
    return Q
'''}),
        ("SmoothQuant scales the weight's output axis (rows) instead of its input columns", {"smooth_answer": '''\
def smooth(x_absmax, W, alpha=0.5):
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    a = x_absmax.float().clamp(min=1e-5)
    w = W.abs().amax(dim=1).float().clamp(min=1e-5)
    s = a.pow(alpha) / w.pow(1 - alpha)
    return s, W * s[:, None]
'''}),
    ],
    "lab12": [
        ("the graph break moved, not removed: the argmax stays a tensor but .tolist() still leaves the graph",
         {"step_answer": '''\
def decode_step(model, tok, cache):
    logits = model(tok, cache=cache)[:, -1, :]
    ids = logits.argmax(dim=-1).tolist()
    return torch.tensor(ids, device=tok.device).unsqueeze(-1)
'''}),
        ("shares computed linearly, (speedup - 1) / (S - 1), instead of on a log scale", {"attribution_answer": '''\
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
'''}),
    ],
}
