"""Training draft heads on a frozen target: one loop for Medusa's heads, EAGLE's head and the MTP modules.

Every one of them trains the same way (Medusa-1, EAGLE and post-hoc MTP all leave the target unchanged): the
target's final hidden states are computed once for every window of the text (``target_features``), and each
step draws a seeded batch of windows, asks the head's own loss for (loss, parts), and takes an AdamW step
under the course's cosine schedule (``course_lib.schedule.cosine_lr``). A head family brings its loss; the
loop, the features, the command line of the bundled-head trainers and their report are here, once.
"""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Callable

import torch

from course_lib.schedule import cosine_lr


def encode(texts, tokenizer) -> torch.Tensor:
    """One token stream: EOS, doc, EOS, doc, ... (as the bundled models were trained), on the host."""
    eos = tokenizer.eos_token_id
    ids = []
    for t in texts:
        if eos is not None:
            ids.append(eos)
        ids.extend(tokenizer(t, add_special_tokens=False, verbose=False)["input_ids"])
    return torch.tensor(ids, dtype=torch.long, device="cpu")   # host: windows go to the target in target_features


@torch.no_grad()
def target_features(target, stream: torch.Tensor, seq_len: int, batch: int = 8, progress: bool = True,
                    desc: str = "hidden"):
    """Cut `stream` into windows of seq_len and run the frozen target once: hidden [W, L, D] (float32), ids [W, L],
    both on the target's device (the heads train and are scored there, without a host round trip per step)."""
    n = stream.numel() // seq_len
    if n == 0:
        raise ValueError(f"texts: {stream.numel()} tokens is less than one window of seq_len={seq_len}")
    ids = stream[:n * seq_len].view(n, seq_len).to(target.device)
    out = []
    it = range(0, n, batch)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=desc, leave=False)
    for a in it:
        _, h = target(ids[a:a + batch], return_hidden=True)
        out.append(h.float())
    return torch.cat(out), ids


def train_heads(heads: torch.nn.Module, params, loss_fn: Callable, windows: int, steps: int, batch_size: int,
                lr: float, seed: int, device, progress: bool, desc: str, clip: float | None = None) -> dict:
    """The loop: `steps` AdamW steps (no weight decay) on `params` of `heads`, the rate from ``cosine_lr`` (no
    warm-up); each step draws `batch_size` window rows of `windows` with a generator seeded by `seed` on
    `device`, and calls ``loss_fn(rows) -> (loss, parts)`` (parts: floats to record). `clip`: the gradient
    norm bound, if any. Leaves `heads` in train mode; returns {"loss": [...], "parts": [[...] per step]}."""
    heads.train()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator(device=device).manual_seed(seed)
    history = {"loss": [], "parts": []}
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=desc, mininterval=2)
    for step in it:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, lr)
        rows = torch.randint(0, windows, (batch_size,), generator=gen, device=device)
        loss, parts = loss_fn(rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(heads.parameters(), clip)
        opt.step()
        history["loss"].append(loss.item())
        history["parts"].append(parts)
        if progress and step % 20 == 0:
            it.set_postfix(loss=f"{loss.item():.3f}")
    return history


# --------------------------------------------------------------------------------------------------
# The bundled heads' trainers: python -m course_lib.speculative.medusa | .eagle --kind eagle|mtp
# --------------------------------------------------------------------------------------------------
def head_training_parser(description: str, **defaults):
    """The command line the bundled-head trainers share: the target, where to write, how long and on what;
    `defaults` sets each trainer's own (steps, batch_size, lr, threads)."""
    import argparse
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=defaults["steps"])
    ap.add_argument("--train-files", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=300_000)
    ap.add_argument("--heldout-files", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=defaults["batch_size"])
    ap.add_argument("--lr", type=float, default=defaults["lr"])
    ap.add_argument("--threads", type=int, default=defaults["threads"])
    return ap


def training_report(args, hist: dict, heldout_tokens: int, last: int) -> dict:
    """What every bundled head's config records of its training run (the trainer adds its held-out scores)."""
    return {"target": args.model, "train_files": args.train_files, "train_tokens": hist["tokens"],
            "steps": args.steps, "batch_size": args.batch_size, "seq_len": 256, "lr": args.lr,
            "train_seconds": round(hist["seconds"], 1), "threads": args.threads,
            "device": f"CPU ({platform.processor() or platform.machine()}), {args.threads} thread(s)",
            "torch": torch.__version__, "final_loss": sum(hist["loss"][-last:]) / len(hist["loss"][-last:]),
            "heldout_files": args.heldout_files, "heldout_tokens": heldout_tokens}


__all__ = ["encode", "target_features", "train_heads", "head_training_parser", "training_report"]
