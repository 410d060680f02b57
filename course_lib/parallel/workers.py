"""Worker functions for ``launch`` (importable, so spawned processes find them): each runs on every rank
of an initialized process group and returns a small picklable result (rank 0's is the one to read).

    launch(tp_check, 2, args=(ModelSpec("tiny"),))      # {"max_abs_diff": ..., "tokens_equal": True, ...}

A ``ModelSpec`` says how every rank builds the *same* full model: a bundled name ("tiny"), or a
``LlamaConfig`` and a seed (random weights, identical on every rank).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_lib.generation import generate
from course_lib.kvcache import ContiguousCache
from course_lib.models import bundled_path
from course_lib.models.config import LlamaConfig
from course_lib.models.llama import LlamaForCausalLM

from .layers import ColumnParallelLinear, RowParallelLinear, parallel_mlp_reference
from .shard import parallelize_dtensor, shard_model


@dataclass(frozen=True)
class ModelSpec:
    """A model every rank can rebuild identically: ``name`` of a bundled model ("tiny"), or ``config`` +
    ``seed`` (random weights)."""
    name: str | None = None
    config: LlamaConfig | None = None
    seed: int = 0

    def build(self) -> LlamaForCausalLM:
        if (self.name is None) == (self.config is None):
            raise ValueError("ModelSpec needs exactly one of name= or config=")
        if self.name is not None:
            # the weights only (load() would also build the tokenizer, seconds of importing transformers)
            return LlamaForCausalLM.from_pretrained(bundled_path(self.name), device="cpu").eval()
        torch.manual_seed(self.seed)
        return LlamaForCausalLM(self.config).eval()

    @property
    def cfg(self) -> LlamaConfig:
        return self.config if self.config is not None else self.build().config


def _prompts(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(1, vocab, (batch, length), generator=g, device="cpu")


def _same_on_all_ranks(x: torch.Tensor) -> bool:
    """Is ``x`` bitwise the same on every rank? (all-gathered and compared on each)"""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return all(torch.equal(p, parts[0]) for p in parts)


def _comm_device() -> torch.device:
    """Where this rank's collectives run: its GPU with NCCL, the CPU with gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


@torch.no_grad()
def tp_check(spec: ModelSpec, batch: int = 2, prompt_len: int = 7, new_tokens: int = 5, dtensor: bool = False,
             seed: int = 0) -> dict:
    """Tensor-parallel logits vs the single-process model on this rank: a full forward on a batch of
    prompts, then greedy cached decoding (a ``ContiguousCache`` per rank holding its KV heads).
    Returns the max |difference| of the logits (forward and decode), whether the generated tokens are
    equal, whether every rank got bitwise the same logits, and (dtensor=True) the same for
    ``parallelize_dtensor``."""
    world, rank = dist.get_world_size(), dist.get_rank()
    device = _comm_device()                                                # the CPU (gloo) or this rank's GPU (NCCL)
    model = spec.build().to(device)
    ids = _prompts(model.config.vocab_size, batch, prompt_len, seed).to(device)
    ref_logits = model(ids)                                                # [B, T, V]
    ref = generate(model, ids, new_tokens, cache=ContiguousCache(), return_logits=True)
    out = {"rank": rank, "world_size": world}
    makers = {"ours": lambda: shard_model(model, world)}
    if dtensor:
        makers["dtensor"] = lambda: parallelize_dtensor(model, world, device_type=device.type)
    for tag, make in makers.items():
        tp = make()
        logits = tp(ids)
        got = generate(tp, ids, new_tokens, cache=ContiguousCache(), return_logits=True)
        out[tag] = {
            "forward_max_abs_diff": (logits - ref_logits).abs().max().item(),
            "decode_max_abs_diff": (got.logits - ref.logits).abs().max().item(),
            "tokens_equal": torch.equal(got.tokens, ref.tokens),
            "same_on_all_ranks": _same_on_all_ranks(logits),
            "local_kv_heads": next(iter(tp.model.layers)).self_attn.kv_heads if tag == "ours" else None,
            "params_per_rank": sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                                   for p in tp.parameters()),
        }
    out["params_full"] = model.num_parameters()
    return out


@torch.no_grad()
def linear_pair_check(d_in: int, d_hidden: int, d_out: int, batch: int = 3, seed: int = 0) -> dict:
    """Column-parallel then row-parallel linear (with biases) vs the unsharded pair, and the same with the
    bias added on every rank (the classic bug) to show it is off by (p - 1) * bias."""
    world, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator(device="cpu").manual_seed(seed)
    lin1, lin2 = torch.nn.Linear(d_in, d_hidden), torch.nn.Linear(d_hidden, d_out)
    for p in (*lin1.parameters(), *lin2.parameters()):
        p.copy_(torch.randn(p.shape, generator=g, device="cpu"))
    x = torch.randn(batch, 4, d_in, generator=g, device="cpu")
    ref = lin2(torch.relu(lin1(x)))
    col, row = ColumnParallelLinear.from_linear(lin1, rank, world), RowParallelLinear.from_linear(lin2, rank, world)
    y = row(torch.relu(col(x)))
    wrong = torch.nn.functional.linear(torch.relu(col(x)), row.weight, row.bias)   # bias on every rank...
    dist.all_reduce(wrong)                                                          # ...then summed p times
    mlp = parallel_mlp_reference(x, lin1.weight, lin1.bias, lin2.weight, lin2.bias, rank, world)
    return {"max_abs_diff": (y - ref).abs().max().item(), "mlp_max_abs_diff": (mlp - ref).abs().max().item(),
            "bias_every_rank_error": (wrong - ref - (world - 1) * lin2.bias).abs().max().item(),
            "bias_every_rank_off_by": (wrong - ref).abs().max().item(),
            "shard_shapes": (tuple(col.weight.shape), tuple(row.weight.shape))}


@torch.no_grad()
def tp_timing(spec: ModelSpec, batch: int = 1, prompt_len: int = 16, new_tokens: int = 16, repeats: int = 3,
              allreduce_repeats: int = 50) -> dict:
    """Seconds per decode step of the sharded model (the median of ``repeats`` greedy runs, timed with a
    barrier around each), and the measured all-reduce latency of one [batch, 1, D] float32 activation.
    On the CPU with gloo; on GPU r with NCCL (``launch(..., backend="nccl")``)."""
    world = dist.get_world_size()
    device = _comm_device()
    model = spec.build().to(device)
    tp = shard_model(model, world) if world > 1 else model
    ids = _prompts(model.config.vocab_size, batch, prompt_len, 0).to(device)
    generate(tp, ids, 2, cache=ContiguousCache())                            # warm-up
    per_step = []
    for _ in range(repeats):
        dist.barrier()
        out = generate(tp, ids, new_tokens, cache=ContiguousCache())
        per_step.append(out.trace.tpot)
    x = torch.zeros(batch, 1, model.config.hidden_size, device=device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(allreduce_repeats):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ar = (time.perf_counter() - t0) / allreduce_repeats
    per_step.sort()
    return {"world_size": world, "step_s": per_step[len(per_step) // 2], "allreduce_s": ar,
            "layers": model.config.num_hidden_layers}


def failing_worker(bad_rank: int = 1, hang_rank: int | None = None) -> str:
    """For tests and the notebook: ``bad_rank`` raises; ``hang_rank`` waits in a collective that its peers
    never join (the process group's timeout ends it). Others do one all-reduce."""
    rank = dist.get_rank()
    if rank == bad_rank:
        raise ValueError(f"rank {rank} was told to fail")
    if rank == hang_rank:
        dist.all_reduce(torch.ones(1, device=_comm_device()))   # the others never call this one: gloo's timeout raises
        return "unreachable"
    if hang_rank is not None:
        time.sleep(60)                       # stay out of the collective
    dist.all_reduce(torch.ones(1, device=_comm_device()))
    return "ok"


def sequence(steps) -> list:
    """Run several workers one after the other in the same process group (one launch, one start-up):
    ``steps`` is a list of (function, args, kwargs); returns their results in order."""
    return [fn(*args, **(kwargs or {})) for fn, args, kwargs in steps]


def torchrun_demo() -> dict:
    """What ``torchrun -m course_lib.parallel.launch course_lib.parallel.workers:torchrun_demo`` runs: an
    all-reduce of (rank + 1) and the TP logits check on the bundled model, under torchrun's group."""
    x = torch.tensor([float(dist.get_rank() + 1)], device=_comm_device())
    dist.all_reduce(x)
    res = tp_check(TINY_SPEC, batch=2, prompt_len=4, new_tokens=2)
    return {"world_size": dist.get_world_size(), "allreduce_sum": x.item(),
            "tp_max_abs_diff": max(res["ours"]["forward_max_abs_diff"], res["ours"]["decode_max_abs_diff"])}


TINY_SPEC = ModelSpec("tiny")
