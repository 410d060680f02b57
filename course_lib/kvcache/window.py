"""Caches that keep a bounded number of tokens: a sliding window, and attention sinks + a window.

Definitions used everywhere in the course (the off-by-one that bites most implementations):

* ``window = W``: a query attends to at most W non-sink tokens, *itself included* (the convention of
  Mistral's and Hugging Face's sliding-window masks). After every ``update`` the cache holds exactly
  ``min(tokens seen, sinks + W)`` tokens: the first ``sinks`` tokens ever seen and the W most recent.
* ``sinks = s``: the first s tokens of the sequence are never evicted (StreamingLLM, "attention sinks":
  trained models park a lot of attention on the first tokens; dropping them hurts).

RoPE and positions. The model rotates each key by its position *before* it reaches the cache. Two choices:

* ``reposition=False`` (default for ``SlidingWindowCache``): keys keep the absolute position they were
  rotated at. A query at position p sees a key at position j with the true distance p - j. This is what
  a model *trained* with sliding windows (Mistral) expects, but positions keep growing: our bundled model
  refuses positions past its 512-token context.
* ``reposition=True`` (default for ``SinkCache``): positions are *inside the cache*. The cache stores keys
  **without** rotation (it undoes the model's rotation once, on arrival) and rotates them at their cache
  index every time it returns them: sinks at 0..s-1, the window right after, the new tokens last. Positions
  never exceed sinks + W + T - 1, so generation can run forever with a bounded cache (StreamingLLM's
  recipe). The model must pick the new tokens' positions from ``get_seq_length()`` (its default);
  passing other ``positions`` to the model breaks the undo-rotation.

Storing un-rotated keys means each key is rotated exactly twice (undo, then at its current index), so
errors do not accumulate the way repeated rotate-by-minus-one does.

For a forward of T > 1 tokens (prefill) the window needs a banded mask, not the model's default causal
mask: ``cache.attn_mask(T)`` returns it; ``course_lib.generation.generate`` and ``stream_score`` pass
it to the model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.attention.rope import apply_rope, rope_cos_sin

from .base import KVCache, check_kv, check_same_stream


def rotate_keys(k: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate keys [B, K, S, Dh] by the RoPE angles of positions [S] (negative positions rotate back).

    RoPE rotates each pair of channels (i, i + Dh/2) by the angle p * theta^(-2i/Dh); rotations
    compose by adding angles, so rotating by -p undoes a rotation by p.
    """
    cos, sin = rope_cos_sin(positions.to(k.device)[None], k.shape[-1], theta, k.dtype)  # [1, S, Dh]
    return apply_rope(k, cos, sin)


@dataclass
class _WindowState:
    k: torch.Tensor        # [B, K, n, Dh] (un-rotated when repositioning)
    v: torch.Tensor        # [B, K, n, Dh]
    pos: torch.Tensor      # [n] RoPE position of each stored token (absolute mode only)
    seen: int = 0          # tokens ever added


class SlidingWindowCache(KVCache):
    """Keep the first `sinks` tokens and the `window` most recent ones (see the module docstring)."""

    def __init__(self, window: int, sinks: int = 0, reposition: bool = False, rope_theta: float = 10000.0):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks must be an int >= 0, got {sinks!r}")
        self.window, self.sinks, self.reposition, self.theta = window, sinks, bool(reposition), float(rope_theta)
        self.layers: list[_WindowState] = []

    # --- bookkeeping -------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.sinks + self.window

    def _drop(self, n: int) -> int:
        """Stored non-sink tokens too old for the next query: it may see W - 1 of them plus itself."""
        return max(0, n - min(n, self.sinks) - (self.window - 1))

    def _positions_before(self, st: _WindowState, T: int):
        """(indices of stored tokens to attend to, their positions, positions of the T new tokens)."""
        n = st.k.shape[2]
        s_, d = min(n, self.sinks), self._drop(n)
        dev = st.k.device
        idx = torch.cat([torch.arange(s_, device=dev), torch.arange(s_ + d, n, device=dev)])
        if self.reposition:
            start = n - d
            old_pos = torch.arange(start, device=dev)
        else:
            start = st.seen
            old_pos = st.pos[idx]
        new_pos = torch.arange(start, start + T, device=dev)
        return idx, old_pos, new_pos

    def get_seq_length(self) -> int:
        if not self.layers:
            return 0
        st = self.layers[0]
        if self.reposition:
            n = st.k.shape[2]
            return n - self._drop(n)
        return st.seen

    def stored_length(self, layer: int = 0) -> int:
        return self.layers[layer].k.shape[2] if layer < len(self.layers) else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for st in self.layers for t in (st.k, st.v))

    def _mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        q, j = q_pos[:, None], k_pos[None, :]
        return (j <= q) & ((j < self.sinks) | (q - j < self.window))  # [T, S]

    def attn_mask(self, num_new: int, device=None):
        """Banded causal mask [T, S] for the next forward of `num_new` tokens (sinks always visible)."""
        if not self.layers:
            pos = torch.arange(num_new, device=device)
            return self._mask(pos, pos)
        st = self.layers[0]
        _, old_pos, new_pos = self._positions_before(st, num_new)
        return self._mask(new_pos, torch.cat([old_pos, new_pos])).to(device or st.k.device)

    # --- the contract ------------------------------------------------------------------------------
    def update(self, k, v, layer, q=None):
        check_kv(k, v, layer)
        if layer == len(self.layers):
            self.layers.append(_WindowState(k[:, :, :0], v[:, :, :0],
                                            torch.zeros(0, dtype=torch.long, device=k.device)))
        elif layer > len(self.layers):
            raise ValueError(f"update: layers must be filled in order; got layer {layer} with "
                             f"{len(self.layers)} cached")
        st = self.layers[layer]
        check_same_stream(st.k, k, layer)
        T = k.shape[2]
        idx, old_pos, new_pos = self._positions_before(st, T)
        if self.reposition:
            k_store_new = rotate_keys(k, -new_pos, self.theta)       # undo the model's rotation
            k_cat = torch.cat([st.k[:, :, idx], k_store_new], dim=2)  # un-rotated, [B, K, L, Dh]
            pos = torch.cat([old_pos, new_pos])                       # 0 .. L-1
            k_ret = rotate_keys(k_cat, pos, self.theta)               # rotated at cache positions
        else:
            k_cat = torch.cat([st.k[:, :, idx], k], dim=2)
            pos = torch.cat([old_pos, new_pos])
            k_ret = k_cat
        v_cat = torch.cat([st.v[:, :, idx], v], dim=2)
        # What stays: every sink, and the last `window` non-sink tokens.
        sink = pos < self.sinks
        keep = torch.cat([sink.nonzero().flatten(), (~sink).nonzero().flatten()[-self.window:]])
        st.k, st.v = k_cat[:, :, keep], v_cat[:, :, keep]
        st.pos = pos[keep] if not self.reposition else st.pos[:0]
        st.seen += T
        return k_ret, v_cat

    def reset(self):
        self.layers = []


class SinkCache(SlidingWindowCache):
    """StreamingLLM: `sinks` first tokens + a `window` of recent ones, positions inside the cache."""

    def __init__(self, window: int, sinks: int = 4, reposition: bool = True, rope_theta: float = 10000.0):
        super().__init__(window, sinks=sinks, reposition=reposition, rope_theta=rope_theta)
