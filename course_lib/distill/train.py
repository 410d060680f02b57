"""Distillation training: one loop for a white-box, a black-box and a scratch student on the same budget.

    distill                   "white_box" (KD on the teacher's logits), "black_box" (cross entropy on text
                              the teacher generated) or "scratch" (cross entropy on the data)
    generate_teacher_corpus   the black-box data: training-text prompts continued by the teacher (sampled)
    token_stream              the training stream as the bundled models were trained on it
    new_student               a fresh model with another model's shape

The CLI that distils the bundled default draft is `python -m course_lib.training.distill_draft`.
"""
from __future__ import annotations

import time

import torch

from course_lib.generation import generate
from course_lib.models.corpus import encode_stream, load_split
from course_lib.models.config import LlamaConfig
from course_lib.models.llama import LlamaForCausalLM
from course_lib.schedule import cosine_lr
from course_lib.validate import integer, number

from .losses import FeatureProjector, feature_loss, hard_label_loss, kd_loss, reverse_kl_loss


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """The training stream as course_lib.training.train builds it: EOS, doc, EOS, doc, ... [N] on the host.

    tokenizer: a transformers fast tokenizer (what `course_lib.models.load` returns)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"tokenizer must be a transformers fast tokenizer (with .backend_tokenizer), "
                        f"got {type(tokenizer).__name__}")
    return encode_stream(backend, texts)


@torch.no_grad()
def generate_teacher_corpus(teacher, stream: torch.Tensor, n_sequences: int, seq_len: int, prompt_len: int = 16,
                            temperature: float = 1.0, seed: int = 0, batch_size: int = 256,
                            progress: bool = True) -> torch.Tensor:
    """Black-box data: [n_sequences, seq_len + 1] token ids, each a `prompt_len`-token window of the
    training stream continued by the teacher, sampled at `temperature` with a seeded generator.

    The student never sees the teacher's probabilities, only its text (sequence-level distillation,
    as with an API-only teacher). The text is written by the course's one generate loop
    (`course_lib.generation.generate`, KV cache on), `batch_size` prompts per call.

    Devices: the prompt windows are drawn on the stream's device and the tokens are sampled on the
    teacher's, each with a generator seeded with `seed` on that device (one generator when both are the
    same device). The corpus is returned on the stream's device (the host, for a host stream).
    """
    seq_len = integer(seq_len, "seq_len", low=1)
    prompt_len = integer(prompt_len, "prompt_len", 1, seq_len)
    n_sequences, batch_size = integer(n_sequences, "n_sequences", low=1), integer(batch_size, "batch_size", low=1)
    number(temperature, "temperature", 0, low_open=True, finite=False)   # sampling's
    if not isinstance(stream, torch.Tensor) or stream.dim() != 1 or stream.numel() <= prompt_len:
        raise ValueError(f"stream must be a 1-D token-id tensor longer than prompt_len={prompt_len}")
    device = next(teacher.parameters()).device
    gen = torch.Generator(device=stream.device).manual_seed(seed)                          # prompt windows
    tok_gen = gen if device == stream.device else torch.Generator(device=device).manual_seed(seed)  # tokens
    starts = torch.randint(0, stream.numel() - prompt_len, (n_sequences,), generator=gen, device=stream.device)
    rows = []
    batches = range(0, n_sequences, batch_size)
    if progress:
        from tqdm.auto import tqdm
        batches = tqdm(batches, desc="teacher writes", unit="batch")
    for b0 in batches:
        prompts = torch.stack([stream[i:i + prompt_len] for i in starts[b0:b0 + batch_size].tolist()])  # [b, P]
        new = generate(teacher, prompts, seq_len + 1 - prompt_len, temperature=temperature,
                       generator=tok_gen, cache="contiguous").tokens                # [b, L + 1 - P] ([n] if b = 1)
        rows.append(torch.cat([prompts, new.reshape(len(prompts), -1).to(stream.device)], dim=1))   # [b, L + 1]
    return torch.cat(rows)                                                                 # [N, L + 1]


def new_student(like, seed: int = 0):
    """A freshly initialised course model (float32) with the config of `like` (a model or a LlamaConfig), on
    the device of `like` (the CPU for a config). The weights are drawn on the CPU from `seed` and then
    moved, so a seed gives the same student on every device."""
    cfg = like if isinstance(like, LlamaConfig) else like.config
    device = torch.device("cpu") if isinstance(like, LlamaConfig) else next(like.parameters()).device
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = LlamaForCausalLM(cfg)
    return model.to(device)


MODES = ("white_box", "black_box", "scratch")


def distill(teacher, student, tokenizer=None, steps: int = 100, batch_size: int = 16, seq_len: int = 256,
            mode: str = "white_box", temperature: float = 1.0, alpha: float = 1.0, lr: float = 3e-3,
            feature_weight: float = 0.0, seed: int = 0, progress: bool = True, texts: list[str] | None = None,
            stream: torch.Tensor | None = None, kind: str = "forward", warmup: int | None = None,
            weight_decay: float = 0.1, corpus: torch.Tensor | None = None, prompt_len: int = 16):
    """Train `student` (in place) for `steps` steps of batch_size x seq_len tokens; returns (student, history).

    mode="white_box": loss = alpha * KD(student, teacher logits; temperature) + (1 - alpha) * CE on the
        training text (+ feature_weight * feature_loss on final hidden states, with a learned projector).
    mode="black_box": plain cross entropy on text the teacher generated from training-text prompts
        (`generate_teacher_corpus`, steps x batch_size sequences; the prompt tokens are not targets).
    mode="scratch": plain cross entropy on the training text.
    All three see the same number of token positions and, for white_box and scratch, the same windows in
    the same order as course_lib.training.train (same seed, same AdamW, warmup and cosine schedule).
    texts / stream: the training data (default: the whole training split, tokenized with `tokenizer`).
    history: dict with loss (per step), seconds (cumulative wall time per step), total_seconds, tokens,
    and generation_seconds (black_box).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    steps, batch_size = integer(steps, "steps", low=1), integer(batch_size, "batch_size", low=1)
    seq_len = integer(seq_len, "seq_len", low=1)
    for who, m in (("student", student), ("teacher", teacher)):   # the models see windows of seq_len tokens
        if m is not None and seq_len > m.config.max_position_embeddings:
            raise ValueError(f"seq_len must be at most the {who}'s context {m.config.max_position_embeddings}, "
                             f"got {seq_len}")
    if stream is None:
        if tokenizer is None:
            raise ValueError("tokenizer is needed to tokenize the training text (or pass stream=)")
        if texts is None:
            texts = load_split("train")
        stream = token_stream(tokenizer, texts)
    if stream.numel() <= seq_len + 1:
        raise ValueError(f"the training stream has {stream.numel()} tokens, fewer than seq_len + 1")
    teacher.eval()
    device = next(student.parameters()).device
    history = {"mode": mode, "loss": [], "seconds": [], "tokens": steps * batch_size * seq_len,
               "generation_seconds": 0.0}
    if mode == "black_box" and corpus is None:
        t0 = time.perf_counter()
        corpus = generate_teacher_corpus(teacher, stream, steps * batch_size, seq_len, prompt_len=prompt_len,
                                         seed=seed, progress=progress)
        history["generation_seconds"] = time.perf_counter() - t0
    if mode == "black_box" and (corpus.dim() != 2 or corpus.shape[0] < steps * batch_size
                                or corpus.shape[1] != seq_len + 1):
        raise ValueError(f"corpus must be [>= steps * batch_size = {steps * batch_size}, seq_len + 1 = {seq_len + 1}] "
                         f"token ids, got {tuple(corpus.shape)}")

    projector = None
    params = list(student.parameters())
    if mode == "white_box" and feature_weight > 0:
        projector = FeatureProjector(student.config.hidden_size, teacher.config.hidden_size, device=device)
        params += list(projector.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    warmup = min(100, max(1, steps // 10)) if warmup is None else warmup
    gen = torch.Generator(device=stream.device).manual_seed(seed)     # the windows: drawn where the stream is
    n = stream.numel() - seq_len - 1
    student.train()
    bar = range(steps)
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(bar, desc=f"distill ({mode})", mininterval=2)
    t0 = time.perf_counter()
    for step in bar:
        for g in opt.param_groups:                     # the schedule of course_lib.training.train
            g["lr"] = cosine_lr(step, steps, lr, warmup)
        if mode == "black_box":
            x = corpus[step * batch_size:(step + 1) * batch_size].to(device)          # [B, L+1]
            targets = x[:, 1:].clone()
            targets[:, :prompt_len - 1] = -100                                         # prompt: context only
        else:
            starts = torch.randint(0, n, (batch_size,), generator=gen, device=stream.device)
            x = torch.stack([stream[i:i + seq_len + 1] for i in starts.tolist()]).to(device)   # [B, L+1]
            targets = x[:, 1:]
        inp = x[:, :-1]                                                                # [B, L]
        if mode == "white_box":
            with torch.no_grad():
                t_logits, t_hidden = teacher(inp, return_hidden=True)                  # [B, L, V], [B, L, Dt]
            s_logits, s_hidden = student(inp, return_hidden=True)                      # [B, L, V], [B, L, Ds]
            loss = alpha * (kd_loss if kind == "forward" else reverse_kl_loss)(s_logits, t_logits, temperature)
            if alpha < 1:
                loss = loss + (1 - alpha) * hard_label_loss(s_logits, targets)
            if projector is not None:
                loss = loss + feature_weight * feature_loss(s_hidden, t_hidden, projector)
        else:
            loss = hard_label_loss(student(inp), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history["loss"].append(loss.item())
        history["seconds"].append(time.perf_counter() - t0)
        if progress and step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    history["total_seconds"] = time.perf_counter() - t0
    return student.eval(), history
