"""Knowledge distillation: a small student learns from a large teacher (Module 04).

Losses (all take logits, never probabilities, and work on any leading shape [..., V]):
    kd_loss            forward KL(p_T || q_S) on temperature-softened distributions, times T^2
    reverse_kl_loss    KL(q_S || p_T): mode-seeking, the student may drop some of the teacher's modes
    hard_label_loss    cross entropy on the data's next tokens
    distillation_loss  alpha * KD + (1 - alpha) * CE
    feature_loss       MSE between projected student hidden states and the teacher's (feature-based)
    relation_loss      MSE between pairwise cosine-similarity matrices (relation-based)
Training and metrics:
    distill            one loop for "white_box" (KD on the teacher's logits), "black_box" (cross entropy on
                       text the teacher generated) and "scratch" (cross entropy on the data), same budget
    generate_teacher_corpus   the black-box data: training-text prompts continued by the teacher (sampled)
    acceptance_rate    mean over positions of sum_x min(p_T(x), q_S(x)): speculative sampling's acceptance

    python -m course_lib.distill --scratch      # distil `tiny` into a `tiny-draft`-shaped student on the
                                                # bundled draft's budget (1500 x 16 x 256), and a scratch twin
    python -m course_lib.distill --steps 150    # the reduced budget measured for the notebook (~20 min, 1 thread)
    python -m course_lib.distill --quick        # a half-minute smoke run

White-box, T = 1, alpha = 1 by default: the acceptance rate of a draft is measured at T = 1, and the forward
KL at T = 1 is the divergence whose minimiser is the teacher's own distribution. Writes <out>/tiny-draft
(loadable by course_lib.models.load and transformers), <out>/tiny-draft-scratch when a scratch twin is
trained, and <out>/distill_report.json with held-out bits per byte and acceptance rates.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# sum_x min(p(x), q(x)) = 1 - TV(p, q): the probability that speculative sampling accepts a token drafted
# from q against the target p (Module 08). One definition for the course, in speculative.theory.
from course_lib.speculative.theory import acceptance_rate as expected_acceptance

REDUCTIONS = ("batchmean", "sum", "none")


# --------------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------------
def _check_pair(student_logits, teacher_logits, temperature=1.0, reduction="batchmean"):
    for name, x in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor [..., vocab], got {type(x).__name__}")
        if x.dim() == 0:
            raise ValueError(f"{name} must have a vocabulary dimension, got a scalar")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student_logits and teacher_logits must have the same shape [..., vocab], got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _reduce(per_position: torch.Tensor, reduction: str) -> torch.Tensor:
    """per_position [...] -> mean over positions ("batchmean"), sum, or unchanged ("none")."""
    if reduction == "none":
        return per_position
    return per_position.sum() if reduction == "sum" else per_position.mean()


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 2.0,
            reduction: str = "batchmean") -> torch.Tensor:
    """Forward KL(p_T || q_S) between the softened distributions, times T^2 (Hinton et al., 2015).

    student_logits, teacher_logits: [..., V]. p_T = softmax(teacher / T), q_S = softmax(student / T).
    "batchmean" averages the per-position KL over every leading position (what the math means by the
    KL "per token"); "sum" sums it; "none" returns it per position [...].

    Why T^2: the gradient of KL(softmax(t/T) || softmax(s/T)) with respect to s is (q_S - p_T) / T, and
    for large T the difference q_S - p_T itself shrinks like 1/T, so the gradient scales like 1/T^2.
    Multiplying by T^2 keeps its size roughly independent of T, so changing T does not secretly change
    the learning rate or the balance with the hard-label loss.
    """
    _check_pair(student_logits, teacher_logits, temperature, reduction)
    T = float(temperature)
    log_q = F.log_softmax(student_logits.float() / T, dim=-1)   # [..., V] student log-probs
    log_p = F.log_softmax(teacher_logits.float() / T, dim=-1)   # [..., V] teacher log-probs
    # kl_div(input=log q, target=log p, log_target=True) = sum_x p (log p - log q), elementwise
    kl = F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1)   # [...]
    return _reduce(kl, reduction) * T * T


def seed_kd_loss_buggy(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                       temperature: float = 2.0) -> torch.Tensor:
    """A double-softmax KD loss met in tutorials, reproduced to show its bug: log_softmax of probabilities.

    softmax(student / T) is already a distribution; log_softmax of it treats those probabilities as
    logits in [0, 1], which makes an almost uniform distribution. The loss then measures the teacher's
    distance from uniform, is far from zero when the student equals the teacher, and hardly depends on
    the student at all (its gradient is about V times too small). Do not use; see `kd_loss`.
    """
    _check_pair(student_logits, teacher_logits, temperature)
    T = float(temperature)
    soft_teacher = F.softmax(teacher_logits.float() / T, dim=-1)
    soft_student = F.softmax(student_logits.float() / T, dim=-1)
    flat_s = F.log_softmax(soft_student, dim=-1).reshape(-1, soft_student.shape[-1])   # the bug
    return F.kl_div(flat_s, soft_teacher.reshape(flat_s.shape), reduction="batchmean") * T * T


def reverse_kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
                    reduction: str = "batchmean") -> torch.Tensor:
    """Reverse KL(q_S || p_T) = sum_x q_S log(q_S / p_T), times T^2.

    Mode-seeking: putting student mass where the teacher has almost none costs a lot, leaving out
    teacher mass costs little, so a weak student concentrates on the teacher's main modes (used for
    generative LMs, e.g. MiniLLM). Forward KL is mass-covering instead.
    """
    _check_pair(student_logits, teacher_logits, temperature, reduction)
    T = float(temperature)
    log_q = F.log_softmax(student_logits.float() / T, dim=-1)   # [..., V]
    log_p = F.log_softmax(teacher_logits.float() / T, dim=-1)   # [..., V]
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)               # [...]
    return _reduce(kl, reduction) * T * T


def hard_label_loss(student_logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross entropy (nats) of student_logits [..., V] against integer labels [...]."""
    if not isinstance(student_logits, torch.Tensor) or not student_logits.is_floating_point():
        raise TypeError("student_logits must be a floating-point torch.Tensor [..., vocab]")
    if not isinstance(labels, torch.Tensor) or labels.dtype not in (torch.long, torch.int32):
        raise TypeError("labels must be an integer torch.Tensor [...]")
    if labels.shape != student_logits.shape[:-1]:
        raise ValueError(f"labels must have shape {tuple(student_logits.shape[:-1])} (the logits without the "
                         f"vocabulary dimension), got {tuple(labels.shape)}")
    V = student_logits.shape[-1]
    return F.cross_entropy(student_logits.reshape(-1, V).float(), labels.reshape(-1).long(),
                           ignore_index=ignore_index)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      alpha: float = 0.5, temperature: float = 2.0, kind: str = "forward") -> torch.Tensor:
    """alpha * KD(student, teacher; T) + (1 - alpha) * CE(student, labels).

    kind: "forward" (kd_loss) or "reverse" (reverse_kl_loss). The T^2 inside the KD term keeps the two
    terms on comparable scales whatever T is, so alpha means the same thing at every temperature.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if kind not in ("forward", "reverse"):
        raise ValueError(f"kind must be 'forward' or 'reverse', got {kind!r}")
    kd = (kd_loss if kind == "forward" else reverse_kl_loss)(student_logits, teacher_logits, temperature)
    return alpha * kd + (1.0 - alpha) * hard_label_loss(student_logits, labels)


class FeatureProjector(torch.nn.Module):
    """A learned linear map from the student's hidden size to the teacher's (trained with the student).

    The student is narrower than the teacher, so its hidden states cannot be compared directly;
    FitNets-style feature distillation learns this projection jointly.
    device, dtype: where the weight is created (PyTorch's factory convention); build it on the hidden
    states' device, e.g. ``FeatureProjector(Ds, Dt, device=student_hidden.device)``.
    """

    def __init__(self, student_dim: int, teacher_dim: int, device=None, dtype=None):
        super().__init__()
        for name, v in (("student_dim", student_dim), ("teacher_dim", teacher_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.proj = torch.nn.Linear(student_dim, teacher_dim, bias=False, device=device, dtype=dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [..., Ds] -> [..., Dt]
        return self.proj(h)


def feature_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, projector: FeatureProjector) -> torch.Tensor:
    """Mean squared error between projector(student_hidden) [..., Dt] and teacher_hidden [..., Dt].

    The course model returns the final hidden states (after the last norm) with return_hidden=True.
    """
    if not isinstance(projector, FeatureProjector):
        raise TypeError(f"projector must be a FeatureProjector, got {type(projector).__name__}")
    if student_hidden.shape[:-1] != teacher_hidden.shape[:-1]:
        raise ValueError(f"student_hidden and teacher_hidden must agree on the leading shape, got "
                         f"{tuple(student_hidden.shape)} and {tuple(teacher_hidden.shape)}")
    if student_hidden.shape[-1] != projector.proj.in_features or teacher_hidden.shape[-1] != projector.proj.out_features:
        raise ValueError(f"projector maps {projector.proj.in_features} -> {projector.proj.out_features} but the "
                         f"hidden sizes are {student_hidden.shape[-1]} and {teacher_hidden.shape[-1]}")
    where = projector.proj.weight.device
    if where != student_hidden.device or where != teacher_hidden.device:
        raise ValueError(f"projector is on {where} but the hidden states are on {student_hidden.device} and "
                         f"{teacher_hidden.device}: build it there, FeatureProjector(..., "
                         f"device=student_hidden.device), or move it with projector.to(...)")
    return F.mse_loss(projector(student_hidden.float()), teacher_hidden.float())


def relation_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor) -> torch.Tensor:
    """MSE between the pairwise cosine-similarity matrices of the tokens' representations.

    student_hidden [B, T, Ds], teacher_hidden [B, T, Dt] -> a scalar. Relation-based distillation copies
    how tokens relate to each other, not the features themselves, so no projection is needed: both
    similarity matrices are [B, T, T] whatever the hidden sizes.
    """
    for name, h in (("student_hidden", student_hidden), ("teacher_hidden", teacher_hidden)):
        if not isinstance(h, torch.Tensor) or h.dim() != 3:
            raise ValueError(f"{name} must be a [batch, tokens, dim] tensor")
    if student_hidden.shape[:2] != teacher_hidden.shape[:2]:
        raise ValueError(f"student_hidden and teacher_hidden must have the same [batch, tokens], got "
                         f"{tuple(student_hidden.shape[:2])} and {tuple(teacher_hidden.shape[:2])}")
    s = F.normalize(student_hidden.float(), dim=-1)   # [B, T, Ds] unit rows
    t = F.normalize(teacher_hidden.float(), dim=-1)   # [B, T, Dt]
    return F.mse_loss(s @ s.transpose(1, 2), t @ t.transpose(1, 2))   # [B, T, T] vs [B, T, T]


# --------------------------------------------------------------------------------------------------
# Metrics: how good a draft is this student for this teacher?
# --------------------------------------------------------------------------------------------------
def _windows(ids: list[int], W: int):
    """Non-overlapping windows of W+1 tokens (one token overlap), as score_texts scores them."""
    for s in range(0, len(ids) - 1, W):
        yield ids[s:s + W + 1]


@torch.no_grad()
def acceptance_rates(teacher, student, texts, tokenizer=None, temperatures=(1.0, 0.0), max_len: int | None = None,
                     max_tokens: int | None = None, progress: bool = False) -> dict:
    """{temperature: rate} on held-out text; see `acceptance_rate`. One forward pass of each model."""
    ids_list = _as_id_lists(texts, tokenizer)
    for T in temperatures:
        if isinstance(T, bool) or not isinstance(T, (int, float)) or T < 0:
            raise ValueError(f"temperatures must be numbers >= 0, got {T!r}")
    W = max_len or int(min(teacher.config.max_position_embeddings, student.config.max_position_embeddings))
    device = next(teacher.parameters()).device
    sums = {T: 0.0 for T in temperatures}
    n = 0
    it = ids_list
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(ids_list, desc="acceptance", unit="text")
    for ids in it:
        for chunk in _windows(ids, W):
            if max_tokens is not None and n >= max_tokens:
                break
            x = torch.tensor(chunk[:-1], device=device)[None]          # [1, t]
            lp, lq = teacher(x).float()[0], student(x).float()[0]       # [t, V] each
            for T in temperatures:
                if T == 0:
                    sums[T] += (lp.argmax(-1) == lq.argmax(-1)).sum().item()
                else:
                    sums[T] += expected_acceptance(F.softmax(lp / T, -1), F.softmax(lq / T, -1)).sum().item()
            n += x.shape[1]
    if n == 0:
        raise ValueError("texts must contain at least one token to predict")
    return {T: sums[T] / n for T in temperatures}


def acceptance_rate(teacher, student, texts, temperature: float = 1.0, tokenizer=None,
                    max_len: int | None = None, max_tokens: int | None = None) -> float:
    """Mean over held-out positions of sum_x min(p_T(x), q_S(x)) at `temperature`.

    That is the expected acceptance probability of one drafted token in speculative sampling when
    both models sample at this temperature. temperature=0 gives greedy agreement: the fraction of
    positions where the two argmaxes are equal (greedy speculative decoding accepts exactly those).
    texts: list of strings (with tokenizer; each gets an EOS in front as in bits_per_byte) or a list
    of token-id lists.
    """
    return acceptance_rates(teacher, student, texts, tokenizer, (temperature,), max_len, max_tokens)[temperature]


def _as_id_lists(texts, tokenizer) -> list[list[int]]:
    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, torch.Tensor):
        return [row.tolist() for row in (texts[None] if texts.dim() == 1 else texts)]
    if not isinstance(texts, (list, tuple)) or not texts:
        raise ValueError("texts must be a non-empty list of strings or of token-id lists")
    if isinstance(texts[0], str):
        if tokenizer is None:
            raise ValueError("tokenizer is needed when texts are strings")
        eos = tokenizer.eos_token_id
        return [[eos] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts if t]
    return [list(t) for t in texts]


# --------------------------------------------------------------------------------------------------
# Data and training
# --------------------------------------------------------------------------------------------------
def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """The training stream as course_lib.models.train builds it: EOS, doc, EOS, doc, ... [N]."""
    from course_lib.models.train import encode_stream
    return encode_stream(tokenizer.backend_tokenizer, texts)


@torch.no_grad()
def generate_teacher_corpus(teacher, stream: torch.Tensor, n_sequences: int, seq_len: int, prompt_len: int = 16,
                            temperature: float = 1.0, seed: int = 0, batch_size: int = 256,
                            progress: bool = True) -> torch.Tensor:
    """Black-box data: [n_sequences, seq_len + 1] token ids, each a `prompt_len`-token window of the
    training stream continued by the teacher, sampled at `temperature` with a seeded generator.

    The student never sees the teacher's probabilities, only its text (sequence-level distillation,
    as with an API-only teacher).

    Devices: the prompt windows are drawn on the stream's device and the tokens are sampled on the
    teacher's, each with a generator seeded with `seed` on that device (one generator when both are the
    same device). The corpus is returned on the stream's device (the host, for a host stream).
    """
    from course_lib.kvcache import ContiguousCache
    if not 1 <= prompt_len <= seq_len:
        raise ValueError(f"prompt_len must be in [1, seq_len={seq_len}], got {prompt_len}")
    if not isinstance(n_sequences, int) or n_sequences < 1:
        raise ValueError(f"n_sequences must be a positive int, got {n_sequences!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (sampling), got {temperature!r}")
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
        prompt = torch.stack([stream[i:i + prompt_len] for i in starts[b0:b0 + batch_size].tolist()]).to(device)
        cache, out = ContiguousCache(), [prompt]
        logits = teacher(prompt, cache=cache)[:, -1]                             # [b, V]
        for _ in range(seq_len + 1 - prompt_len):
            probs = F.softmax(logits.float() / temperature, dim=-1)                # [b, V] on the teacher's device
            nxt = torch.multinomial(probs, 1, generator=tok_gen)                 # [b, 1]
            out.append(nxt)
            if sum(o.shape[1] for o in out) == seq_len + 1:
                break
            logits = teacher(nxt, cache=cache)[:, -1]
        rows.append(torch.cat(out, dim=1).to(stream.device))
    return torch.cat(rows)


def new_student(like, seed: int = 0):
    """A freshly initialised course model (float32) with the config of `like` (a model or a LlamaConfig), on
    the device of `like` (the CPU for a config). The weights are drawn on the CPU from `seed` and then
    moved, so a seed gives the same student on every device."""
    from course_lib.models.llama import LlamaConfig, LlamaForCausalLM
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
    the same order as course_lib.models.train (same seed, same AdamW, warmup and cosine schedule).
    texts / stream: the training data (default: the whole training split, tokenized with `tokenizer`).
    history: dict with loss (per step), seconds (cumulative wall time per step), total_seconds, tokens,
    and generation_seconds (black_box).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    for name, v in (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    for who, m in (("student", student), ("teacher", teacher)):   # the models see windows of seq_len tokens
        if m is not None and seq_len > m.config.max_position_embeddings:
            raise ValueError(f"seq_len must be at most the {who}'s context {m.config.max_position_embeddings}, "
                             f"got {seq_len}")
    if stream is None:
        if tokenizer is None:
            raise ValueError("tokenizer is needed to tokenize the training text (or pass stream=)")
        if texts is None:
            from course_lib.models.corpus import load_split
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
        # same schedule as course_lib.models.train: linear warmup, cosine decay to 10%
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
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


# --------------------------------------------------------------------------------------------------
# Entry point: the distilled draft
# --------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("distilled"), help="folder for the student + report")
    ap.add_argument("--steps", type=int, default=None, help="default: the bundled draft's steps")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scratch", action="store_true", help="also train a scratch student on the same budget")
    ap.add_argument("--scratch-dir", type=Path, default=None,
                    help="a scratch student trained elsewhere on the same budget (e.g. in parallel); not retrained")
    ap.add_argument("--heldout-files", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny run for smoke tests")
    ap.add_argument("--continue-from-bundled", dest="cont", action="store_true",
                    help="start both students from the bundled scratch draft instead of a fresh init: "
                         "`--steps` more steps of distillation vs `--steps` more steps of cross entropy "
                         "(the same extra budget); this is how the default `tiny-draft` was made")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0, help="data order (and init) seed")
    ap.add_argument("--install-from", type=Path, default=None,
                    help="install <dir>/tiny-draft (a finished run) as the bundled default draft, with its "
                         "report and a model-card section; trains nothing")
    args = ap.parse_args(argv)
    if args.install_from is not None:
        return install_draft(args.install_from)
    torch.set_num_threads(args.threads)
    import platform
    import shutil
    from course_lib.models import BUNDLED, bundled_path, load
    from course_lib.models.corpus import load_split
    from course_lib.perf.quality import bits_per_byte

    teacher, tok = load("tiny", device="cpu")
    scratch_name = "tiny-draft-scratch" if "tiny-draft-scratch" in BUNDLED else "tiny-draft"
    if args.cont and args.steps is None:
        ap.error("--continue-from-bundled needs --steps (the extra budget)")
    bundled_scratch, _ = load(scratch_name, device="cpu")
    report_path = bundled_path("tiny").parent / "training_report.json"
    base = json.loads(report_path.read_text())
    base = base.get("draft_scratch", base["draft"])
    last = base["stages"][-1] if "stages" in base else base   # a staged run: default to its last windows
    steps = args.steps or base["steps"]
    batch = args.batch or last["batch"]
    seq_len = args.seq_len or last["seq_len"]
    train_texts, heldout = load_split("train"), load_split("heldout", max_files=args.heldout_files)
    if args.quick:
        steps, batch, seq_len = 20, 4, 64
        train_texts, heldout = train_texts[:20], heldout[:2]
    stream = token_stream(tok, train_texts)
    same_budget = ("stages" not in base and (steps, batch, seq_len) == (base["steps"], last["batch"], last["seq_len"])
                   and not args.quick)
    print(f"budget: {steps} steps x {batch} x {seq_len} = {steps * batch * seq_len:,} tokens "
          f"({'the bundled draft' + chr(39) + 's budget' if same_budget else 'reduced'})")
    args.out.mkdir(parents=True, exist_ok=True)
    students = {}
    runs = [("distilled", "white_box")]
    if (args.scratch or not same_budget) and args.scratch_dir is None:
        runs.append(("scratch", "scratch"))
    report = {"device": f"CPU ({platform.processor() or platform.machine()}), {args.threads} threads",
              "torch": torch.__version__, "python": platform.python_version(), "threads": args.threads,
              "steps": steps, "batch": batch, "seq_len": seq_len, "tokens": steps * batch * seq_len,
              "temperature": args.temperature, "alpha": args.alpha, "teacher": "tiny",
              "heldout_files": len(heldout), "heldout_bytes": sum(len(t.encode()) for t in heldout),
              "lr": args.lr, "warmup": args.warmup, "seed": args.seed,
              "init": f"bundled {scratch_name} ({base['steps']} scratch steps)" if args.cont else "fresh"}
    if args.cont:
        runs = [("distilled", "white_box"), ("scratch", "scratch")]   # both continue: same extra budget
    for name, mode in runs:
        if args.cont:
            student, _ = load(scratch_name, device="cpu")
            student.train()
        else:
            student = new_student(bundled_scratch, seed=args.seed)
        student, hist = distill(teacher, student, steps=steps, batch_size=batch, seq_len=seq_len, mode=mode,
                                temperature=args.temperature, alpha=args.alpha, stream=stream, seed=args.seed,
                                lr=args.lr, warmup=args.warmup)
        folder = args.out / ("tiny-draft" if name == "distilled" else
                             "tiny-draft-ce-continued" if args.cont else "tiny-draft-scratch")
        student.save_pretrained(folder)
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(bundled_path("tiny") / f, folder / f)
        students[name] = student
        report[name] = {"mode": mode, "train_seconds": hist["total_seconds"], "final_loss": hist["loss"][-1]}
        print(f"{name}: {hist['total_seconds'] / 60:.1f} min, final loss {hist['loss'][-1]:.3f}")
    if args.scratch_dir is not None:
        for _ in range(360):   # trained in parallel: wait for it (up to an hour)
            if (args.scratch_dir / "model.safetensors").is_file():
                break
            time.sleep(10)
        time.sleep(5)
        students["scratch"], _ = load(str(args.scratch_dir), device="cpu")
        report["scratch"] = {"mode": "scratch", "model": str(args.scratch_dir)}
    bundled_key = "scratch" if "scratch" not in students else "bundled_scratch"
    students[bundled_key] = bundled_scratch
    report[bundled_key] = {"mode": "scratch", "model": f"bundled {scratch_name} (course_lib.models.train)",
                           "steps": base["steps"], "batch": last["batch"], "seq_len": last["seq_len"],
                           "stages": base.get("stages")}
    for name, student in students.items():
        rates = acceptance_rates(teacher, student, heldout, tok, temperatures=(1.0, 0.0), progress=False)
        report[name].update(bits_per_byte=bits_per_byte(student, tok, heldout, progress=False),
                            acceptance_t1=rates[1.0], acceptance_greedy=rates[0.0],
                            parameters=student.num_parameters())
        print(f"{name}: {report[name]['bits_per_byte']:.3f} bits/byte, acceptance T=1 {rates[1.0]:.3f}, "
              f"greedy agreement {rates[0.0]:.3f}")
    report["teacher_bits_per_byte"] = bits_per_byte(teacher, tok, heldout, progress=False)
    (args.out / "distill_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


CARD_SECTION = "## The default draft `tiny-draft`: distilled from `tiny`"


def install_draft(run_dir: Path) -> dict:
    """Make <run_dir>/tiny-draft the bundled default draft, if it beats the scratch draft on acceptance.

    Copies the weights and tokenizer into course_lib/models/bundled/tiny-draft, the run's report to
    bundled/distill_report.json, and (re)writes the model card's distilled-draft section from the report.
    """
    import shutil
    from course_lib.models import bundled_path
    run_dir = Path(run_dir)
    report = json.loads((run_dir / "distill_report.json").read_text())
    new, old = report["distilled"], report.get("bundled_scratch") or report["scratch"]
    if new["acceptance_t1"] <= old["acceptance_t1"]:
        raise ValueError(f"the distilled draft does not win: acceptance {new['acceptance_t1']:.3f} vs the scratch "
                         f"draft's {old['acceptance_t1']:.3f}; nothing installed")
    root = bundled_path("tiny").parent
    dest = root / "tiny-draft"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(run_dir / "tiny-draft", dest)
    (root / "distill_report.json").write_text(json.dumps(report, indent=2) + "\n")
    ctl = report.get("scratch", {})
    rows = [("`tiny-draft` (default): scratch + distillation", new),
            ("`tiny-draft-scratch`: scratch only (the table above)", old)]
    if report.get("init", "fresh") != "fresh" and "bits_per_byte" in ctl:
        rows.append(("control: scratch + the same extra steps of cross entropy", ctl))
    lines = [CARD_SECTION, "",
             f"Made by `python -m course_lib.distill --continue-from-bundled --steps {report['steps']} "
             f"--lr {report['lr']} --warmup {report['warmup']} --seed {report['seed']} --threads {report['threads']}`"
             f" then `--install-from <out>`: the scratch draft, trained {report['steps']} more steps "
             f"({report['steps']} x {report['batch']} x {report['seq_len']} tokens) on forward KL to the target's "
             f"distribution (T = {report['temperature']}, alpha = {report['alpha']}). The acceptance rate is the mean "
             "over held-out positions of sum_x min(p_target(x), q_draft(x)), the probability that speculative "
             "sampling accepts a drafted token; greedy agreement is the same at temperature 0.", "",
             "| draft | held-out bits per byte | acceptance (T = 1) | greedy agreement |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['bits_per_byte']:.3f} | {r['acceptance_t1']:.3f} | {r['acceptance_greedy']:.3f} |"
              for name, r in rows]
    lines += ["", f"- Device: {report['device']}; torch {report['torch']}. Full report: `distill_report.json`.", ""]
    card_path = root / "MODEL_CARD.md"
    card = card_path.read_text()
    card = card.split(CARD_SECTION)[0].rstrip("\n") + "\n\n" + "\n".join(lines)
    card_path.write_text(card)
    print(f"installed {dest} (acceptance {new['acceptance_t1']:.3f} vs {old['acceptance_t1']:.3f})")
    return report


if __name__ == "__main__":
    main()
