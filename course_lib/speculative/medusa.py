"""Medusa heads: speculate with extra heads on the target itself, verify with a tree (Cai et al. 2024).

Instead of a separate draft model, Medusa reads the target's own last hidden state h_t (the one whose
lm_head gives the next token t+1) and adds a few small heads: head k guesses token t+2+k, the token k+1
steps after the next one. Each head is one residual block and a vocabulary projection:

    logits_k = lm_head(h_t + SiLU(W_k h_t + b_k))        W_k [D, D], zero-initialized

With the target frozen and its lm_head shared, a head is only D*D + D parameters (66k for the bundled
target), and at initialization it equals the next-token head, a sensible starting guess. Training
(``train_medusa``, Medusa-1) only needs the target's hidden states, computed once.

Decoding (``MedusaDraft`` in the one generate loop; ``medusa_generate`` returns the full ids, greedy,
exact): every pass builds a candidate tree from the heads' top-k (``tree.build_tree``); ``generate``
verifies all of it in one target forward with a tree attention mask (``verify_tree``), keeps the
accepted path, and hands the hidden state at the path's last node to the next pass. Output = the
target's own greedy tokens, whatever the heads say; good heads only make it faster.

Notation as in the rest of ``course_lib.speculative``: p = target probabilities; the heads play the
draft. Shapes: D hidden size, V vocabulary, Hm number of Medusa heads, N tree nodes.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.generation import generate
from course_lib.models import load
from course_lib.models.corpus import load_split
from course_lib.models.llama import save_safetensors

from .head_training import encode, head_training_parser, target_features, train_heads, training_report
from .tree import DEFAULT_PATHS, check_paths, build_tree, cartesian_paths

__all__ = ["MedusaHeads", "train_medusa", "medusa_accuracy", "MedusaDraft", "medusa_generate", "MedusaStats",
           "load_medusa_heads", "save_medusa_heads", "BUNDLED_HEADS_ROOT"]

BUNDLED_HEADS_ROOT = Path(__file__).resolve().parents[1] / "models" / "bundled"


class ResBlock(nn.Module):
    """h + SiLU(W h + b): starts as the identity (W = 0, b = 0), so the head starts as the lm_head."""

    def __init__(self, dim: int, device=None, dtype=None):
        super().__init__()
        self.linear = nn.Linear(dim, dim, device=device, dtype=dtype)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h):  # [..., D] -> [..., D]
        return h + F.silu(self.linear(h))


class MedusaHeads(nn.Module):
    """Hm heads on the target's final hidden state; head k predicts the token k+1 steps after the next.

    hidden_size, vocab_size: the target's D and V. share_lm_head=True (default) projects with the target's
    frozen lm_head, passed to ``forward``; False gives each head its own [V, D] projection (V*D more
    parameters per head: 0.5M for the bundled target, which is why the bundled heads share).
    device, dtype: where the parameters are created (PyTorch's factory convention; None = the default).
    The heads must sit on the target's device: they read its hidden states.
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int = 3, share_lm_head: bool = True,
                 device=None, dtype=None):
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("vocab_size", vocab_size), ("num_heads", num_heads)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.hidden_size, self.vocab_size, self.num_heads = hidden_size, vocab_size, num_heads
        self.share_lm_head = bool(share_lm_head)
        self.blocks = nn.ModuleList(ResBlock(hidden_size, device=device, dtype=dtype) for _ in range(num_heads))
        self.lm_heads = None if share_lm_head else nn.ModuleList(
            nn.Linear(hidden_size, vocab_size, bias=False, device=device, dtype=dtype) for _ in range(num_heads))

    def config(self) -> dict:
        return {"hidden_size": self.hidden_size, "vocab_size": self.vocab_size, "num_heads": self.num_heads,
                "share_lm_head": self.share_lm_head}

    def check_target(self, target, name: str = "heads"):
        """ValueError unless these heads fit `target` (same D and V)."""
        cfg = target.config
        if cfg.hidden_size != self.hidden_size:
            raise ValueError(f"{name}: hidden_size={self.hidden_size} but the target's hidden size is "
                             f"{cfg.hidden_size}; the heads read the target's hidden states")
        if cfg.vocab_size != self.vocab_size:
            raise ValueError(f"{name}: vocab_size={self.vocab_size} but the target's vocabulary has "
                             f"{cfg.vocab_size} tokens")

    @property
    def device(self) -> torch.device:
        return self.blocks[0].linear.weight.device

    def check_device(self, target, name: str = "heads"):
        """ValueError unless these heads are on the target's device (nothing is moved behind your back)."""
        if self.device != target.device:
            raise ValueError(f"{name} are on {self.device} but the target is on {target.device}: load them with "
                             f"load_medusa_heads(..., device=target.device) or move them with "
                             f"heads.to(target.device)")

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module | torch.Tensor | None = None) -> torch.Tensor:
        """Logits [..., Hm, V] from hidden states [..., D].

        lm_head: the target's lm_head (a module, or its [V, D] weight) when the heads share it.
        """
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden: last dim must be hidden_size={self.hidden_size}, got {tuple(hidden.shape)}")
        hidden = hidden.to(self.blocks[0].linear.weight.dtype)
        x = torch.stack([block(hidden) for block in self.blocks], dim=-2)  # [..., Hm, D]
        if self.lm_heads is not None:
            return torch.stack([head(x[..., k, :]) for k, head in enumerate(self.lm_heads)], dim=-2)
        if lm_head is None:
            raise ValueError("lm_head: these heads share the target's lm_head; pass lm_head=target.lm_head")
        weight = lm_head if isinstance(lm_head, torch.Tensor) else lm_head.weight  # [V, D]
        if weight.shape != (self.vocab_size, self.hidden_size):
            raise ValueError(f"lm_head: expected a [{self.vocab_size}, {self.hidden_size}] projection, got "
                             f"{tuple(weight.shape)}")
        return F.linear(x.to(weight.dtype), weight)  # one matmul for all heads: [..., Hm, D] @ [D, V]


# --------------------------------------------------------------------------------------------------
# Training (Medusa-1: the target stays frozen)
# --------------------------------------------------------------------------------------------------
def _head_losses(heads, lm_head, hidden, ids):
    """Cross entropy per head; head k at position t predicts ids[t + 2 + k]. hidden [B, L, D], ids [B, L]."""
    logits = heads(hidden, lm_head)  # [B, L, Hm, V]
    losses = []
    for k in range(heads.num_heads):
        shift = k + 2
        lg = logits[:, :-shift, k]                  # positions with a target inside the window
        losses.append(F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), ids[:, shift:].reshape(-1)))
    return losses


def train_medusa(target, texts: list[str], tokenizer, steps: int, num_heads: int = 3, heads: MedusaHeads | None = None,
                 seq_len: int = 256, batch_size: int = 4, lr: float = 1e-3, max_tokens: int | None = None,
                 seed: int = 0, progress: bool = True):
    """Train Medusa heads on `texts` with the target frozen; returns (heads, history).

    The target is left with requires_grad=False (Medusa-1 never changes it). The heads are trained on the
    target's device (given `heads` are moved there) and returned there; the seeded batch order is drawn
    by a generator on that device.

    The target's hidden states are computed once for all windows (it never changes), so each step
    costs only the heads. Loss = sum over heads of the cross entropy of head k against the tokens k+2
    ahead (Medusa weights deeper heads less; a plain sum is enough here). AdamW with a cosine schedule.
    history: {"loss": [...], "parts": [[loss of each head] per step], "tokens": stream length, "seconds": s}.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty list of strings")
    cfg = target.config
    heads = heads if heads is not None else MedusaHeads(cfg.hidden_size, cfg.vocab_size, num_heads,
                                                        device=target.device)
    heads.check_target(target)
    if seq_len <= heads.num_heads + 2:
        raise ValueError(f"seq_len must exceed num_heads + 2 = {heads.num_heads + 2}, got {seq_len}")
    t0 = time.perf_counter()
    target.requires_grad_(False)
    was_training = target.training
    target.eval()
    stream = encode(texts, tokenizer)
    if max_tokens is not None:
        stream = stream[:max_tokens]
    hidden, ids = target_features(target, stream, seq_len, progress=progress)   # [W, L, D], [W, L]
    lm_head = target.lm_head.weight.detach().float().to(hidden.device)  # frozen, shared
    heads.to(hidden.device)

    def loss_fn(rows):
        losses = _head_losses(heads, lm_head, hidden[rows], ids[rows])
        return sum(losses), [x.item() for x in losses]

    history = train_heads(heads, [p for p in heads.parameters() if p.requires_grad], loss_fn, hidden.shape[0],
                          steps, batch_size, lr, seed, hidden.device, progress, desc=f"medusa x{heads.num_heads}")
    history["tokens"] = int(stream.numel())
    heads.eval()
    target.train(was_training)
    history["seconds"] = time.perf_counter() - t0
    return heads, history


@torch.no_grad()
def medusa_accuracy(target, heads: MedusaHeads, texts: list[str], tokenizer, seq_len: int = 256,
                    topk: int = 1, max_tokens: int | None = None, progress: bool = False) -> dict:
    """Top-k accuracy per head on `texts` (hold-out text for an honest number), and of the base head.

    Returns {"base": acc of the target's own next-token head, "heads": [acc of head k, ...], "tokens": n}.
    Head k is right at position t when ids[t + 2 + k] is among its top-k tokens.
    """
    heads.check_target(target)
    heads.check_device(target)
    stream = encode(texts, tokenizer)
    if max_tokens is not None:
        stream = stream[:max_tokens]
    hidden, ids = target_features(target, stream, seq_len, progress=progress, desc="eval")  # [W, L, D], [W, L]
    base_hits, head_hits = 0.0, [0.0] * heads.num_heads
    for a in range(0, hidden.shape[0], 8):      # a few windows at a time: logits are [w, L, Hm, V]
        h, y = hidden[a:a + 8], ids[a:a + 8]                                   # on the target's device
        top = target.lm_head(h.to(target.dtype)).topk(topk, dim=-1).indices[:, :-1]
        base_hits += (top == y[:, 1:, None]).any(-1).float().sum().item()
        logits = heads(h, target.lm_head)
        for k in range(heads.num_heads):
            shift = k + 2
            top = logits[:, :-shift, k].topk(topk, dim=-1).indices
            head_hits[k] += (top == y[:, shift:, None]).any(-1).float().sum().item()
    W, L = ids.shape
    base_acc = base_hits / (W * (L - 1))
    accs = [head_hits[k] / (W * (L - 2 - k)) for k in range(heads.num_heads)]
    return {"base": base_acc, "heads": accs, "tokens": int(stream.numel()), "topk": topk}


# --------------------------------------------------------------------------------------------------
# Saving and loading
# --------------------------------------------------------------------------------------------------
def save_medusa_heads(heads: MedusaHeads, path: str | Path, extra: dict | None = None):
    """Write heads.safetensors and medusa_config.json (plus `extra`, e.g. the training report)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous().cpu() for k, v in heads.state_dict().items()}
    save_safetensors(state, path / "heads.safetensors")
    cfg = {**heads.config(), **(extra or {})}
    (path / "medusa_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_medusa_heads(model_name: str = "tiny", path: str | Path | None = None, device=None) -> MedusaHeads:
    """The bundled Medusa heads for a bundled target (``tiny`` -> models/bundled/tiny-medusa/), or a folder.

    device: where to put them (default: the CPU); pass the target's, ``device=target.device``.
    Raises FileNotFoundError with the command that trains them when the folder is missing.
    """
    from safetensors.torch import load_file
    folder = Path(path) if path is not None else BUNDLED_HEADS_ROOT / f"{model_name}-medusa"
    if not (folder / "heads.safetensors").is_file() or not (folder / "medusa_config.json").is_file():
        raise FileNotFoundError(
            f"no Medusa heads for model_name={model_name!r} in {folder} (expected heads.safetensors and "
            f"medusa_config.json). Train them with `python -m course_lib.speculative.medusa --out {folder}`"
            f" or use train_medusa(...).")
    cfg = json.loads((folder / "medusa_config.json").read_text())
    heads = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"], cfg.get("share_lm_head", True),
                        device=device or "cpu")
    heads.load_state_dict(load_file(str(folder / "heads.safetensors")))   # copies into the heads' device
    heads.info = cfg
    return heads.eval()


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------
@dataclass
class MedusaStats:
    """What a medusa_generate run did.

    passes: target verification forwards (the prefill is not counted). accepted: candidate tokens
    accepted per pass. tokens_per_pass: mean(accepted + 1), the tokens one verification yields.
    head_acceptance[k]: fraction of passes whose accepted path reached depth k+1, i.e. head k's
    candidate was kept (deeper heads can only be kept if the shallower ones were). tree_size: nodes per
    pass with the root (the tree is pruned near the end of the budget). seconds: wall time of the loop.
    """
    passes: int = 0
    accepted: list[int] = field(default_factory=list)
    emitted: int = 0
    tree_size: int = 0
    num_heads: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_pass(self) -> float:
        return sum(a + 1 for a in self.accepted) / max(len(self.accepted), 1)

    @property
    def head_acceptance(self) -> list[float]:
        n = max(len(self.accepted), 1)
        return [sum(a > k for a in self.accepted) / n for k in range(self.num_heads)]


def _resolve_paths(tree, topk, num_heads):
    if tree is not None and topk is not None:
        raise ValueError("give either tree (a list of top-k paths) or topk (a full Cartesian tree), not both")
    if topk is not None:
        if isinstance(topk, int):
            topk = (topk,) * num_heads
        return cartesian_paths(topk)
    return DEFAULT_PATHS if tree is None else tree


class MedusaDraft:
    """Medusa as a draft for the one generate loop: ``generate(target, ids, n, draft=MedusaDraft(target,
    heads), draft_length=depth)``. Each pass proposes a candidate tree (``build_tree``) from the heads'
    top-k at the target's hidden state where it chose the pending token; ``generate`` verifies the tree
    in one forward with the tree mask (``verify_tree``) and hands back the hidden state at the end of the
    accepted path (``needs_hidden``). The first pass has no hidden state yet: it proposes nothing, so it
    is a plain step over the prompt's last token (what the prefill's last position would give).

    tree: a prefix-closed list of top-k paths (default ``tree.DEFAULT_PATHS``; [] = plain decoding);
    topk: instead, an int or per-depth ints for the full Cartesian tree (int k -> k per head).
    """
    needs_hidden = True

    def __init__(self, target, heads: MedusaHeads, tree=None, topk=None):
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"heads must be MedusaHeads, got {type(heads).__name__}")
        heads.check_target(target, "heads")
        heads.check_device(target, "heads")
        self.paths = check_paths(_resolve_paths(tree, topk, heads.num_heads))
        self.depth = max((len(p) for p in self.paths), default=0)
        if self.depth > heads.num_heads:
            raise ValueError(f"tree: depth {self.depth} needs {self.depth} heads, the heads have {heads.num_heads}")
        self.widths = [1 + max(p[d] for p in self.paths if len(p) > d) for d in range(self.depth)]  # top-k per depth
        self.target, self.heads = target, heads

    def propose(self, seq: torch.Tensor, budget: int, hidden: torch.Tensor | None):
        """seq [n]: the tokens so far (the root is seq[-1]); hidden [D] where the target chose it."""
        if hidden is None:
            return seq[:0]
        # Never speculate past the budget: a pass emits at most depth + 1 tokens.
        paths = [p for p in self.paths if len(p) <= budget]
        head_logits = self.heads(hidden, self.target.lm_head)                 # [Hm, V]
        cands = [head_logits[d].topk(w).indices for d, w in enumerate(self.widths)]
        return build_tree(cands, paths, int(seq[-1]))


def medusa_generate(target, heads: MedusaHeads, input_ids: torch.Tensor, max_new_tokens: int, tree=None,
                    topk=None, eos_token_id: int | None = None):
    """Greedy decoding with Medusa heads and tree verification; returns (ids [1, T + n], MedusaStats).

    It is ``generate(target, input_ids, max_new_tokens, draft=MedusaDraft(target, heads, tree, topk))``
    returning the prompt too (on its device): the output equals the target's greedy decoding token for
    token, under generate's context rule. tree / topk: see ``MedusaDraft``.
    """
    draft = MedusaDraft(target, heads, tree, topk)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.long, torch.int32):
        raise TypeError("input_ids must be an integer tensor [1, T] or [T]")
    ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise ValueError(f"input_ids must be one non-empty prompt [1, T], got shape {tuple(input_ids.shape)}")
    out = generate(target, ids, max_new_tokens, eos_token_id=eos_token_id, draft=draft,
                   draft_length=max(draft.depth, 1))
    # The loop's first pass feeds the prompt's last token (no tree yet): the prefill, not a verification.
    per_pass = out.stats.per_pass[1:] if out.stats is not None else []
    stats = MedusaStats(passes=len(per_pass), accepted=list(per_pass), emitted=len(out.tokens),
                        tree_size=1 + len(draft.paths), num_heads=heads.num_heads,
                        seconds=out.stats.total_seconds if out.stats is not None else 0.0)
    return torch.cat([ids, out.tokens[None].to(device=ids.device, dtype=ids.dtype)], dim=1), stats


# --------------------------------------------------------------------------------------------------
# Training the bundled heads: python -m course_lib.speculative.medusa --out <folder>
# --------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = head_training_parser("Train the bundled Medusa heads for the bundled target.", steps=700, batch_size=4,
                               lr=1e-2, threads=1)
    ap.add_argument("--num-heads", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = args.out or BUNDLED_HEADS_ROOT / f"{args.model}-medusa"
    target, tok = load(args.model, device="cpu")
    train = load_split("train", max_files=args.train_files)
    heads, hist = train_medusa(target, train, tok, args.steps, num_heads=args.num_heads, lr=args.lr,
                               batch_size=args.batch_size, max_tokens=args.max_tokens)
    held = load_split("heldout", max_files=args.heldout_files)
    acc1 = medusa_accuracy(target, heads, held, tok, topk=1, progress=True)
    acc3 = medusa_accuracy(target, heads, held, tok, topk=3)
    report = {**training_report(args, hist, acc1["tokens"], last=20),
              "heldout_top1_base": acc1["base"], "heldout_top1_heads": acc1["heads"],
              "heldout_top3_base": acc3["base"], "heldout_top3_heads": acc3["heads"]}
    save_medusa_heads(heads, out, extra={"training": report})
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
