"""Pipeline parallelism for inference: the layers cut into p stages, one per rank, and a batch cut into m
micro-batches that flow through them (GPipe's schedule, forward only).

    schedule = gpipe_schedule(p=4, m=8)              # the ideal timeline: (stage, micro, start, end)
    bubble_fraction(schedule, p=4)                   # == bubble_formula(4, 8) = (p-1)/(m+p-1) = 3/11
    launch(pipeline_run, 2, args=(spec, 4))          # the real thing on ranks: logits, timeline, bubble

With equal stage times and free communication, stage s starts micro-batch i at time (s + i) and the run
takes (m + p - 1) stage-times, of which each rank is busy m: the idle fraction (the *bubble*) is
(p - 1) / (m + p - 1). More micro-batches shrink it; but each is smaller (less efficient on a GPU).
``pipeline_run`` measures it: each rank records when it starts and ends each micro-batch (one clock:
``time.perf_counter`` is CLOCK_MONOTONIC, shared by processes on one machine).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_lib.attention.rope import rope_cos_sin
from course_lib.validate import integer


def bubble_formula(p: int, m: int) -> float:
    """The ideal pipeline bubble (p - 1) / (m + p - 1) for p stages and m micro-batches."""
    p, m = integer(p, "p", low=1), integer(m, "m", low=1)
    return (p - 1) / (m + p - 1)


def gpipe_schedule(p: int, m: int, stage_time: float | list[float] = 1.0) -> list[tuple[int, int, float, float]]:
    """The forward GPipe timeline: (stage, micro, start, end) for each stage and micro-batch, where a stage
    starts micro-batch i when it has finished i - 1 and the previous stage has finished i (no
    communication time). ``stage_time``: one number, or one per stage (an unbalanced pipeline)."""
    bubble_formula(p, m)
    times = [float(stage_time)] * p if not isinstance(stage_time, (list, tuple)) else [float(t) for t in stage_time]
    if len(times) != p or min(times) <= 0:
        raise ValueError(f"stage_time must be a positive number or {p} positive numbers, got {stage_time!r}")
    end = [[0.0] * m for _ in range(p)]
    out = []
    for s in range(p):
        for i in range(m):
            start = max(end[s][i - 1] if i else 0.0, end[s - 1][i] if s else 0.0)
            end[s][i] = start + times[s]
            out.append((s, i, start, end[s][i]))
    return out


def bubble_fraction(timeline, p: int) -> float:
    """Idle fraction of a timeline of (stage, micro, start, end): 1 - busy / (p * makespan)."""
    if not timeline:
        raise ValueError("timeline is empty")
    t0, t1 = min(t[2] for t in timeline), max(t[3] for t in timeline)
    busy = sum(t[3] - t[2] for t in timeline)
    return 1.0 - busy / (p * (t1 - t0))


def split_layers(num_layers: int, p: int) -> list[range]:
    """Contiguous layer ranges for p stages, as equal as possible (earlier stages get the extra layer)."""
    p = integer(p, "p", low=1, high=num_layers)   # a stage needs a layer
    q, r = divmod(num_layers, p)
    out, a = [], 0
    for s in range(p):
        b = a + q + (1 if s < r else 0)
        out.append(range(a, b))
        a = b
    return out


@torch.no_grad()
def pipeline_run(spec, micro_batches: int, batch: int = 4, seq: int = 8, stage_sleep_s: float = 0.0,
                 seed: int = 0) -> dict:
    """Worker (run with ``launch``): the model's layers split over the ranks, ``batch`` prompts in
    ``micro_batches`` micro-batches. Rank 0 embeds; each rank runs its layers and sends the activations
    [b, T, D] to the next; the last rank applies the norm and the LM head. ``stage_sleep_s`` adds a
    fixed wait per micro-batch per stage (what a GPU kernel costs the CPU: nothing), which makes the
    measured bubble independent of how busy this machine's cores are.

    Returns (the same on every rank): ``max_abs_diff`` of the pipelined logits vs the full model,
    ``timeline`` [(stage, micro, start, end)], ``bubble`` measured and ``formula``."""
    rank, p = dist.get_rank(), dist.get_world_size()
    m = micro_batches
    if batch % m:
        raise ValueError(f"micro_batches={m} must divide batch={batch}")
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    model = spec.build().to(device)
    cfg = model.config
    layers = [model.model.layers[i] for i in split_layers(cfg.num_hidden_layers, p)[rank]]
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(1, cfg.vocab_size, (batch, seq), generator=g, device="cpu").to(device)
    mb = batch // m
    pos = torch.arange(seq, device=device)[None].expand(mb, seq)
    cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, torch.float32)
    timeline, logits, pending = [], [], []
    dist.barrier()
    for i in range(m):
        if rank == 0:
            x = model.model.embed_tokens(ids[i * mb:(i + 1) * mb])                   # [b, T, D]
        else:
            x = torch.empty(mb, seq, cfg.hidden_size, device=device)
            dist.recv(x, src=rank - 1)                                               # wait for stage s-1
        t0 = time.perf_counter()
        for layer in layers:
            x = layer(x, cos, sin)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if stage_sleep_s:
            time.sleep(stage_sleep_s)
        t1 = time.perf_counter()
        timeline.append((rank, i, t0, t1))
        if rank < p - 1:
            pending.append(dist.isend(x.contiguous(), dst=rank + 1))               # do not wait: next micro
        else:
            logits.append(model.lm_head(model.model.norm(x)))
    for h in pending:
        h.wait()
    everyone = [None] * p
    dist.all_gather_object(everyone, timeline)
    timeline = sorted(t for part in everyone for t in part)
    diff = torch.zeros(1, device=device)
    if rank == p - 1:
        diff[0] = (torch.cat(logits) - model(ids)).abs().max()
    dist.broadcast(diff, src=p - 1)
    return {"max_abs_diff": diff.item(), "timeline": timeline, "bubble": bubble_fraction(timeline, p),
            "formula": bubble_formula(p, m), "p": p, "m": m}
