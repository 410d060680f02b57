"""Models of the course: the from-scratch Llama decoder, the bundled offline pair, and a registry.

    from course_lib.models import load
    model, tok = load("tiny")          # bundled target, always offline
    draft, _ = load("tiny-draft")      # bundled draft (distilled from tiny), same tokenizer
    model, tok = load("smollm2-135m")  # hub model when the network is there, else the bundled one

Names (case-insensitive):
    tiny, tiny-draft-scratch            bundled, trained from scratch by `python -m course_lib.training.train`
    tiny-draft                          bundled default draft: tiny-draft-scratch distilled from tiny
                                        (`python -m course_lib.training.distill_draft`, Module 04)
    smollm2-135m, smollm2-360m, smollm2-1.7b   HuggingFaceTB/SmolLM2-*, need the network (or the HF cache)
    any local folder                    with config.json + *.safetensors (+ tokenizer files)
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from course_lib.env import device as best_device
from course_lib.env import offline

from .config import (BUNDLED, BUNDLED_ROOT, PRESETS, LlamaConfig, as_config, decode_reads, flops_per_token, preset,
                     preset_names)
from .llama import LlamaForCausalLM, causal_lm_loss

HUB = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B",
}
# The bundled model that stands in for a hub model when there is no network.
OFFLINE_STAND_IN = {"smollm2-135m": "tiny-draft", "smollm2-360m": "tiny", "smollm2-1.7b": "tiny"}


def names() -> list[str]:
    return [*BUNDLED, *HUB]


def bundled_path(name: str = "tiny") -> Path:
    """Folder of a bundled model: usable by `transformers.AutoModelForCausalLM.from_pretrained`."""
    key = name.lower()
    if key not in BUNDLED:
        raise ValueError(f"name must be one of the bundled models {list(BUNDLED)}, got {name!r}")
    return BUNDLED_ROOT / BUNDLED[key]


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


def _hub_folder(repo_id: str) -> Path:
    """Download (or find in the local HF cache) a hub model; raises when it cannot."""
    from huggingface_hub import snapshot_download
    return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"],
                                  local_files_only=offline()))


def load(name: str = "tiny", device: str | torch.device | None = None, dtype: torch.dtype = torch.float32,
         verbose: bool = True):
    """(model, tokenizer) for a registry name or a local folder; the model is in eval mode.

    A hub name that cannot be fetched (no network, or COURSE_OFFLINE=1) falls back to a bundled
    model with a one-line notice, never a traceback.
    """
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"name must be a model name or a folder path, got {type(name).__name__}")
    device = best_device() if device is None else torch.device(device)
    key = str(name).lower()
    resolved = key
    if key in BUNDLED:
        folder = bundled_path(key)
    elif key in HUB:
        try:
            folder = _hub_folder(HUB[key])
        except Exception as e:  # no network, offline mode, missing package: use the bundled stand-in
            stand_in = OFFLINE_STAND_IN[key]
            if verbose:
                print(f"[course_lib] {HUB[key]} is not available offline ({type(e).__name__}); "
                      f"using the bundled '{stand_in}' model instead.")
            folder, resolved = bundled_path(stand_in), stand_in
    elif Path(name).is_dir():
        folder = Path(name)
    else:
        raise ValueError(f"unknown model {name!r}: expected one of {names()} or a local model folder")
    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype, device=device)
    model.name = resolved if key in BUNDLED or key in HUB else str(folder)
    model.path = folder
    return model, load_tokenizer(folder)


__all__ = ["LlamaConfig", "LlamaForCausalLM", "load", "load_tokenizer", "bundled_path", "names",
           "causal_lm_loss", "flops_per_token", "decode_reads", "BUNDLED", "HUB", "PRESETS", "preset", "preset_names",
           "as_config"]
