"""Drafting from the target's features: EAGLE's draft head and DeepSeek-V3's multi-token prediction modules.

Medusa (``medusa.py``) guesses tokens 2, 3, 4 ahead from ONE hidden state, each head blind to the tokens
the others chose. EAGLE [Li et al. 2024] drafts autoregressively, one token at a time, but at the level of
the target's *features*: the target's final hidden state f_i (the vector its lm_head turns into the
distribution of token i+1) is more regular than tokens, so ONE decoder layer predicts the next feature
from the previous ones, given the token actually chosen (the token resolves the feature's uncertainty:
f_{i+1} depends on which token came at i+1):

    f^_{i+1} = Layer(FC([e(t_{i+1}) ; f_i]))          f [D] a feature, e the target's embedding, FC 2D -> D
    q(t_{i+2}) = softmax(lm_head(f^_{i+1}))          the target's own frozen lm_head

Drafting g tokens: feed the pairs (f_i, e(t_{i+1})) up to the pending token (true features: the target
computed them), then g - 1 times the predicted feature with the token just drafted. Its one-layer KV
cache holds the pairs; after verification the pairs built on predicted features are dropped, and the
next pass feeds the true features the target computed while verifying (``needs_hidden = "all"``: the
generate loop hands over the target's hidden state at every newly verified position).

DeepSeek-V3's multi-token prediction [DeepSeek-AI 2024] uses the same block, with each input RMS-normed
and a final norm before the shared output head, but as K *sequential modules*, one per depth: module k
reads module k-1's output at position i and the embedding of token i+k, and predicts token i+k+1. DeepSeek
trains them with the model (a cross entropy per depth); drafting with them is speculative decoding whose
chain is at most K long. Here, as in every post-hoc use, the target is frozen and only the modules train.

``FeatureLayer`` is the block; ``EagleHead`` (one, applied recurrently) and ``MTPHeads`` (K, one per depth)
hold them; ``train_feature_heads`` trains either (EAGLE: SmoothL1 on the feature + 0.1 x cross entropy
against the target's own distribution, as the paper; MTP: cross entropy on the text's tokens per depth,
as DeepSeek-V3); ``EagleDraft`` and ``MTPDraft`` are drafts for the one generate loop (greedy, chains).

Shapes: D hidden size, V vocabulary, L window length, n tokens kept so far, K MTP modules.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.kvcache import ContiguousCache
from course_lib.models import load
from course_lib.models.config import LlamaConfig
from course_lib.models.corpus import load_split
from course_lib.models.llama import DecoderLayer, RMSNorm, rope_cos_sin, save_safetensors
from course_lib.validate import integer, number

from .head_training import encode, head_training_parser, target_features, train_heads, training_report
from .medusa import BUNDLED_HEADS_ROOT

__all__ = ["FeatureLayer", "EagleHead", "MTPHeads", "train_feature_heads", "feature_head_accuracy", "EagleDraft",
           "MTPDraft", "save_feature_heads", "load_feature_heads"]


class FeatureLayer(nn.Module):
    """One draft block: fuse a feature [.., D] with a token embedding [.., D] (2D -> D), then one Llama
    decoder layer shaped like the target's (its heads, head_dim, MLP width, RoPE).

    norm_inputs=False: EAGLE's FC on the concatenation, with a bias; the output is a feature the target's
    lm_head reads as it is. True: DeepSeek-V3's MTP module: RMSNorm on each input, a projection without
    bias, and a final RMSNorm on the output (the shared head reads normed states, as the target's does).
    """

    def __init__(self, cfg: LlamaConfig, norm_inputs: bool = False):
        super().__init__()
        D = cfg.hidden_size
        self.norm_inputs = bool(norm_inputs)
        self.cfg = replace(cfg, num_hidden_layers=1)
        self.fc = nn.Linear(2 * D, D, bias=not norm_inputs)
        self.layer = DecoderLayer(self.cfg, 0)
        if norm_inputs:
            self.hnorm, self.enorm = RMSNorm(D, cfg.rms_norm_eps), RMSNorm(D, cfg.rms_norm_eps)
            self.norm = RMSNorm(D, cfg.rms_norm_eps)

    def forward(self, feats: torch.Tensor, emb: torch.Tensor, cache=None, start: int = 0) -> torch.Tensor:
        """feats, emb [B, L, D] (pair i at position start + i, or after what `cache` holds) -> [B, L, D]."""
        B, L, _ = feats.shape
        if cache is not None:
            start = cache.get_seq_length()
        if self.norm_inputs:
            feats, emb = self.hnorm(feats), self.enorm(emb)
        x = self.fc(torch.cat([emb, feats], dim=-1))     # [B, L, D]; [e; f] as EAGLE's and DeepSeek's code
        positions = torch.arange(start, start + L, device=x.device)[None].expand(B, L)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        x = self.layer(x, cos, sin, cache)
        return self.norm(x) if self.norm_inputs else x


class _FeatureHeads(nn.Module):
    """What EAGLE's head and the MTP modules share: the target's config, checks, saving."""
    kind = ""

    def __init__(self, config: LlamaConfig, num_modules: int, norm_inputs: bool, device=None, dtype=None):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be the target's LlamaConfig (target.config), got {type(config).__name__}")
        self.config = config
        self.blocks = nn.ModuleList(FeatureLayer(config, norm_inputs) for _ in range(num_modules))
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    @property
    def device(self) -> torch.device:
        return self.blocks[0].fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks[0].fc.weight.dtype

    def check_target(self, target, name: str = "heads"):
        """ValueError unless these heads were built for `target`'s shape, and on its device."""
        cfg = target.config
        for key in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(cfg, key) != getattr(self.config, key):
                raise ValueError(f"{name}: built for {key}={getattr(self.config, key)}, the target has "
                                 f"{getattr(cfg, key)}; the heads read the target's hidden states")
        if self.device != target.device:
            raise ValueError(f"{name} are on {self.device} but the target is on {target.device}: load them with "
                             f"load_feature_heads(..., device=target.device) or move them with heads.to(target.device)")

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class EagleHead(_FeatureHeads):
    """EAGLE's draft head: one ``FeatureLayer`` (FC + one decoder layer), applied recurrently."""
    kind = "eagle"

    def __init__(self, config: LlamaConfig, device=None, dtype=None):
        super().__init__(config, 1, norm_inputs=False, device=device, dtype=dtype)

    @property
    def layer(self) -> FeatureLayer:
        return self.blocks[0]


class MTPHeads(_FeatureHeads):
    """DeepSeek-V3's multi-token prediction: K sequential ``FeatureLayer``s with normed inputs; module k
    predicts the token k + 1 steps after the next from module k-1's output (module 0 reads the target's)."""
    kind = "mtp"

    def __init__(self, config: LlamaConfig, num_modules: int = 2, device=None, dtype=None):
        super().__init__(config, integer(num_modules, "num_modules", low=1), norm_inputs=True, device=device,
                         dtype=dtype)


# --------------------------------------------------------------------------------------------------
# Training (the target frozen; its features computed once)
# --------------------------------------------------------------------------------------------------
def _losses(heads, embed_w, head_w, feats, ids, token_weight: float):
    """The training loss of one batch and its parts. feats [B, L, D] the target's, ids [B, L] the text."""
    emb = F.embedding(ids, embed_w)                                              # [B, L, D]
    if heads.kind == "eagle":
        # pair i = (f_i, e(t_{i+1})) -> f^_{i+1}; against f_{i+1}, and q against the target's p(t_{i+2})
        pred = heads.layer(feats[:, :-1], emb[:, 1:])                            # [B, L-1, D]
        regression = F.smooth_l1_loss(pred, feats[:, 1:])
        logq = F.log_softmax(F.linear(pred, head_w), -1)                         # [B, L-1, V]
        p = F.softmax(F.linear(feats[:, 1:], head_w), -1)
        classification = -(p * logq).sum(-1).mean()
        return regression + token_weight * classification, [regression.item(), classification.item()]
    # MTP: module k (1-based) at row i reads h^{k-1}_i and e(t_{i+k}) and predicts t_{i+k+1}
    h, parts, L = feats, [], ids.shape[1]
    for k, block in enumerate(heads.blocks, start=1):
        h = block(h[:, :L - k], emb[:, k:])                                      # [B, L-k, D]
        logits = F.linear(h[:, :-1], head_w)                                     # rows with a token k+1 ahead
        parts.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, k + 1:].reshape(-1)))
    return sum(parts) / len(parts), [x.item() for x in parts]


def train_feature_heads(target, heads, texts: list[str], tokenizer, steps: int, seq_len: int = 256,
                        batch_size: int = 4, lr: float = 1e-3, token_weight: float = 0.1, max_tokens: int | None = None,
                        seed: int = 0, progress: bool = True):
    """Train an ``EagleHead`` or ``MTPHeads`` on `texts` with the target frozen; returns (heads, history).

    The target's final hidden states are computed once for every window (it never changes). EAGLE's loss:
    SmoothL1(f^, f) + token_weight x cross entropy of its q against the target's own p (the paper's 0.1);
    MTP's: the mean over depths of the cross entropy on the text's tokens (``token_weight`` unused). AdamW,
    cosine schedule, seeded batches drawn on the target's device, where the heads train and stay.
    history: {"loss": [...], "parts": [[...] per step], "tokens": stream length, "seconds": s}.
    """
    if not isinstance(heads, _FeatureHeads):
        raise TypeError(f"heads must be an EagleHead or MTPHeads, got {type(heads).__name__}")
    steps = integer(steps, "steps", low=1)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty list of strings")
    need = len(heads.blocks) + 2
    seq_len = integer(seq_len, "seq_len", low=need + 1)
    token_weight = number(token_weight, "token_weight", low=0.0)
    heads.to(target.device)
    heads.check_target(target)
    t0 = time.perf_counter()
    target.requires_grad_(False)
    was_training = target.training
    target.eval()
    stream = encode(texts, tokenizer)
    if max_tokens is not None:
        stream = stream[:integer(max_tokens, "max_tokens", low=seq_len)]
    feats, ids = target_features(target, stream, seq_len, progress=progress)    # [W, L, D], [W, L]
    embed_w = target.model.embed_tokens.weight.detach().float()
    head_w = target.lm_head.weight.detach().float()
    heads.float()
    history = train_heads(heads, heads.parameters(),
                          lambda rows: _losses(heads, embed_w, head_w, feats[rows], ids[rows], token_weight),
                          feats.shape[0], steps, batch_size, lr, seed, feats.device, progress,
                          desc=f"{heads.kind} x{len(heads.blocks)}", clip=1.0)
    history["tokens"] = int(stream.numel())
    heads.eval()
    target.train(was_training)
    history["seconds"] = time.perf_counter() - t0
    return heads, history


@torch.no_grad()
def feature_head_accuracy(target, heads, texts: list[str], tokenizer, seq_len: int = 256,
                          max_tokens: int | None = None) -> dict:
    """How often the heads' argmax agrees with the target's own greedy choice, teacher-forced on `texts`.

    EAGLE: at row i (true features up to f_i, true token t_{i+1}), argmax lm_head(f^_{i+1}) vs argmax
    lm_head(f_{i+1}): the first drafted token's agreement. MTP: module k's argmax vs the target's argmax at
    the same position (the target's choice of t_{i+k+1} given the text up to i+k). Returns {"agree": [per
    module], "tokens": n}. Teacher forcing: deeper drafted tokens read predicted inputs and agree less.
    """
    heads.check_target(target)
    stream = encode(texts, tokenizer)
    if max_tokens is not None:
        stream = stream[:max_tokens]
    feats, ids = target_features(target, stream, seq_len, progress=False, desc="eval")
    embed_w = target.model.embed_tokens.weight.to(heads.dtype)
    head_w = target.lm_head.weight.to(heads.dtype)
    hits, total = [0.0] * len(heads.blocks), [0] * len(heads.blocks)
    for a in range(0, feats.shape[0], 8):
        f, y = feats[a:a + 8].to(heads.dtype), ids[a:a + 8]
        best = F.linear(f, head_w).argmax(-1)                                     # [w, L] target's argmax at i
        emb = F.embedding(y, embed_w)
        if heads.kind == "eagle":
            pred = heads.layer(f[:, :-1], emb[:, 1:])
            hits[0] += (F.linear(pred, head_w).argmax(-1) == best[:, 1:]).float().sum().item()
            total[0] += best[:, 1:].numel()
            continue
        h, L = f, y.shape[1]
        for k, block in enumerate(heads.blocks, start=1):
            h = block(h[:, :L - k], emb[:, k:])                                   # row i: token i+k+1
            hits[k - 1] += (F.linear(h, head_w).argmax(-1) == best[:, k:]).float().sum().item()
            total[k - 1] += best[:, k:].numel()
    return {"agree": [h / t for h, t in zip(hits, total)], "tokens": int(stream.numel())}


# --------------------------------------------------------------------------------------------------
# Drafts for the one generate loop
# --------------------------------------------------------------------------------------------------
class _FeatureDraft:
    """The state both drafts share: the target's true features so far, [n - 1, D] for seq[:n]."""
    needs_hidden = "all"

    def __init__(self, target, heads, kind):
        if not isinstance(heads, kind):
            raise TypeError(f"heads must be {kind.__name__}, got {type(heads).__name__}")
        heads.check_target(target)
        self.target, self.heads = target, heads
        self.embed, self.lm_head = target.model.embed_tokens, target.lm_head
        self.reset()

    def reset(self):
        self.feats = None                                                        # [n - 1, D]
        self.caches = [ContiguousCache() for _ in self.heads.blocks]
        self.outs = [None] * len(self.heads.blocks)

    def _take(self, seq: torch.Tensor, hidden) -> int:
        """Append the newly verified features; n = len(seq). The features must cover seq[:n-1] exactly."""
        if hidden is not None:
            hidden = hidden.to(self.heads.dtype).reshape(-1, self.heads.config.hidden_size)
            self.feats = hidden if self.feats is None else torch.cat([self.feats, hidden])
        n, have = seq.numel(), 0 if self.feats is None else self.feats.shape[0]
        if have != n - 1:
            raise RuntimeError(f"{type(self).__name__}: features for {have} positions but {n - 1} verified tokens; "
                               f"use it through generate(..., draft=...), which hands them over")
        return n

    def _token(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h.to(self.lm_head.weight.dtype)).argmax(-1)


class EagleDraft(_FeatureDraft):
    """EAGLE as a draft: ``generate(target, ids, n, draft=EagleDraft(target, head), draft_length=g)``.

    Each pass feeds the true pairs it lacks (the prompt's after the prefill, then the ones verified in
    the last pass) and drafts g tokens recurrently from predicted features; greedy (temperature 0), chains.
    """

    def __init__(self, target, head: EagleHead):
        super().__init__(target, head, EagleHead)

    @torch.no_grad()
    def propose(self, seq: torch.Tensor, budget: int, hidden=None) -> torch.Tensor:
        n = self._take(seq, hidden)
        if budget == 0 or n < 2:
            return seq[:0]
        cache, layer = self.caches[0], self.heads.layer
        done = cache.get_seq_length()                                            # true pairs it holds
        f = self.feats[done:n - 1][None]                                         # [1, m, D] f_done..f_{n-2}
        e = self.embed(seq[done + 1:n])[None].to(f.dtype)                        # [1, m, D] t_{done+1}..t_{n-1}
        h = layer(f, e, cache=cache)[0, -1]                                      # f^_{n-1}
        toks = [self._token(h)]                                                  # t_n
        for _ in range(budget - 1):
            h = layer(h[None, None], self.embed(toks[-1].view(1, 1)).to(h.dtype), cache=cache)[0, -1]
            toks.append(self._token(h))
        cache.crop(n - 1)                      # keep the true pairs only; predicted ones are redone if kept
        return torch.stack(toks)


class MTPDraft(_FeatureDraft):
    """DeepSeek-V3's MTP modules as a draft: module k proposes the k-th token of the chain (at most K per
    pass), reading module k-1's output and the token module k-1 proposed. Greedy (temperature 0), chains.

    Module k's row i needs token i + k: rows up to n - 1 - k use kept tokens and stay in its cache (with
    their outputs, which module k + 1 reads); the rows after them use proposals and are redone next pass.
    """

    def __init__(self, target, heads: MTPHeads):
        super().__init__(target, heads, MTPHeads)

    @torch.no_grad()
    def propose(self, seq: torch.Tensor, budget: int, hidden=None) -> torch.Tensor:
        n = self._take(seq, hidden)
        if budget == 0 or n < 2:
            return seq[:0]
        toks = []
        h = self.feats                                                           # h^0: rows 0..n-2
        for k, block in enumerate(self.heads.blocks[:budget], start=1):
            ext = torch.cat([seq, torch.stack(toks)]) if toks else seq           # t_0..t_{n-2+k}
            cache = self.caches[k - 1]
            done = cache.get_seq_length()                                        # rows it holds (kept tokens)
            out = block(h[done:n - 1][None], self.embed(ext[done + k:n - 1 + k])[None].to(h.dtype), cache=cache)[0]
            prev = self.outs[k - 1]
            h = out if prev is None else torch.cat([prev[:done], out])           # h^k: rows 0..n-2
            toks.append(self._token(h[-1]))                                      # t_{n-1+k}
            keep = max(n - k, 0)                                                 # rows 0..n-1-k read kept tokens
            self.outs[k - 1] = h[:keep]
            cache.crop(min(keep, cache.get_seq_length()))
        return torch.stack(toks)


# --------------------------------------------------------------------------------------------------
# Saving and loading (fp16 on disk: half the bytes; loaded as float32 unless dtype= says otherwise)
# --------------------------------------------------------------------------------------------------
def save_feature_heads(heads, path: str | Path, extra: dict | None = None):
    """Write heads.safetensors (fp16) and feature_config.json (kind, modules, the target's config, `extra`)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().half().contiguous().cpu() for k, v in heads.state_dict().items()}
    save_safetensors(state, path / "heads.safetensors")
    cfg = {"kind": heads.kind, "num_modules": len(heads.blocks), "target_config": heads.config.to_hf(),
           **(extra or {})}
    (path / "feature_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_feature_heads(kind: str = "eagle", model_name: str = "tiny", path: str | Path | None = None, device=None,
                       dtype: torch.dtype = torch.float32):
    """The bundled EAGLE head or MTP modules for a bundled target (``tiny`` -> models/bundled/tiny-eagle/ or
    tiny-mtp/), or a folder. Raises FileNotFoundError with the command that trains them when it is missing."""
    from safetensors.torch import load_file
    if kind not in ("eagle", "mtp"):
        raise ValueError(f"kind must be 'eagle' or 'mtp', got {kind!r}")
    folder = Path(path) if path is not None else BUNDLED_HEADS_ROOT / f"{model_name}-{kind}"
    if not (folder / "heads.safetensors").is_file() or not (folder / "feature_config.json").is_file():
        raise FileNotFoundError(
            f"no {kind} heads for model_name={model_name!r} in {folder} (expected heads.safetensors and "
            f"feature_config.json). Train them with `python -m course_lib.speculative.eagle --kind {kind} "
            f"--out {folder}` or use train_feature_heads(...).")
    cfg = json.loads((folder / "feature_config.json").read_text())
    if cfg.get("kind") != kind:
        raise ValueError(f"{folder} holds {cfg.get('kind')!r} heads, not {kind!r}")
    config = LlamaConfig.from_hf(cfg["target_config"])
    heads = EagleHead(config) if kind == "eagle" else MTPHeads(config, cfg["num_modules"])
    heads.load_state_dict({k: v.float() for k, v in load_file(str(folder / "heads.safetensors")).items()})
    heads.info = cfg
    return heads.to(device=device or "cpu", dtype=dtype).eval()


# --------------------------------------------------------------------------------------------------
# Training the bundled heads: python -m course_lib.speculative.eagle --kind eagle|mtp [--out <folder>]
# --------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = head_training_parser("Train the bundled EAGLE head or MTP modules for the bundled target.", steps=1500,
                               batch_size=8, lr=1e-3, threads=2)
    ap.add_argument("--kind", choices=("eagle", "mtp"), default="eagle")
    ap.add_argument("--num-modules", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = args.out or BUNDLED_HEADS_ROOT / f"{args.model}-{args.kind}"
    target, tok = load(args.model, device="cpu")
    heads = EagleHead(target.config) if args.kind == "eagle" else MTPHeads(target.config, args.num_modules)
    train = load_split("train", max_files=args.train_files)
    heads, hist = train_feature_heads(target, heads, train, tok, args.steps, batch_size=args.batch_size, lr=args.lr,
                                      max_tokens=args.max_tokens)
    heads.half().float()                        # what the fp16 file will hold: report the accuracy of that
    held = load_split("heldout", max_files=args.heldout_files)
    acc = feature_head_accuracy(target, heads, held, tok)
    report = {**training_report(args, hist, acc["tokens"], last=50), "parameters": heads.num_parameters(),
              "heldout_agreement_with_target_greedy": acc["agree"]}
    save_feature_heads(heads, out, extra={"training": report})
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
