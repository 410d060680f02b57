"""The bundled models' corpus: the Python standard library's own source, read where it is installed,
and the token stream the models are trained on (``encode_stream``).

Nothing of it is committed. The split is fixed by file name, not by order or randomness: a file is
held out when the first byte of sha1(its path relative to the stdlib root) is below 13 (about 5% of
files). Test suites (``test/``, ``tests/``), ``site-packages`` and ``idlelib`` are left out. Different
Python versions ship slightly different files, so numbers move a little between versions; the model
card says which version it was measured on.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch

EOS = "<|endoftext|>"   # the bundled tokenizer's one special token: document separator, BOS and EOS
EXCLUDED_DIRS = {"test", "tests", "site-packages", "idlelib", "__pycache__", "lib2to3"}
HELD_OUT_BELOW = 13  # sha1 first byte < 13 -> held out (13/256 ~ 5%)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = root or stdlib_root()
    files = [p for p in root.rglob("*.py")
             if not (set(p.relative_to(root).parts[:-1]) & EXCLUDED_DIRS)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_held_out(relpath: str) -> bool:
    return hashlib.sha1(relpath.encode()).digest()[0] < HELD_OUT_BELOW


def load_split(split: str, root: Path | None = None, max_files: int | None = None) -> list[str]:
    """Texts of the 'train' or 'heldout' split, in a fixed order (sorted by path)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    root = root or stdlib_root()
    out = []
    for p in stdlib_files(root):
        if is_held_out(p.relative_to(root).as_posix()) == (split == "heldout"):
            text = p.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                out.append(text)
                if max_files and len(out) >= max_files:
                    break
    return out


def encode_stream(tok, texts: list[str]) -> torch.Tensor:
    """One long token stream of the texts, as the bundled models were trained on it: EOS, doc, EOS, doc, ...

    tok: a `tokenizers.Tokenizer` (a transformers fast tokenizer's `.backend_tokenizer`) that knows EOS.
    Returns int64 [N] on the host; training moves each batch to the model's device."""
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise ValueError(f"tok has no {EOS!r} token: the stream separates documents with it")
    ids = []
    for enc in tok.encode_batch(texts):
        ids.append(eos)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long, device="cpu")
