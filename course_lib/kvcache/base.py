"""The KV cache contract and the two plain caches: a growing one (torch.cat) and a preallocated one.

Shapes: B batch, H query heads, K key/value heads, T new tokens in this call, S tokens returned, Dh head dim.

The contract the course model uses (``course_lib.models.llama``), Hugging Face's plus the queries:

    k_all, v_all = cache.update(k, v, layer, q=q)  # k, v: [B, K, T, Dh] for the T new tokens, after RoPE
                                                   # q: [B, H, T, Dh] their queries, after RoPE (or None)
                                                   # k_all, v_all: [B, K, S, Dh], everything to attend to
    cache.get_seq_length()                         # the position the next token gets

Every cache takes ``q`` and ignores it unless its policy needs it: H2O (``h2o``) scores the keys by the
attention the queries give them. The model calls ``get_seq_length()`` once per forward, before any
layer's ``update``, and then calls ``update`` for layers 0, 1, ..., L-1 in order. Each cache keeps one
state per layer, so layer 0's state tells the length "before this forward". Caches that evict tokens
make a difference between ``get_seq_length()`` (where RoPE puts the next token) and ``stored_length()``
(tokens held).

``KVCache`` is the base class of every cache the model takes, with the defaults subclasses override:

* ``attend(q, k, v, layer, attn_mask)``: what the model calls in each layer. By default
  ``update(k, v, layer, q=q)`` and then attention over what it returns; a cache overrides it to attend
  its own way (the static cache masks its unwritten slots so the shapes never change; a paged cache
  reads its blocks).
* ``positions(T)``: where the next T tokens go, or None (the default): the model continues after
  ``get_seq_length()``. The static cache keeps its position on the device (no host sync).
* ``attn_mask(T)``: a [T, S] mask for the next forward of T tokens, or None for the causal mask.
* ``stored_length(layer)``, ``nbytes()`` (bytes of the tensors it holds).
* ``compact(keep)``: keep only the chosen positions, in order (tree verification keeps the accepted path).
  The contiguous and static caches do; the base refuses with a ``TypeError``.

The model also takes a Hugging Face-style object that has only ``update(k, v, layer)`` and
``get_seq_length()`` (``course_lib.models.llama._as_cache`` wraps it); it is given no queries.
"""
from __future__ import annotations


import torch

from course_lib.attention import attention
from course_lib.validate import integer


def check_kv(k, v, layer, name="update"):
    if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
        raise TypeError(f"{name}: k and v must be torch tensors, got {type(k).__name__} and {type(v).__name__}")
    if k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{name}: k and v must be [batch, kv_heads, seq, head_dim], got shapes "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{name}: k {tuple(k.shape)} and v {tuple(v.shape)} disagree on batch, heads or seq")
    if k.device != v.device or k.dtype != v.dtype:
        raise ValueError(f"{name}: k and v must share device and dtype, got {k.device}/{k.dtype} and "
                         f"{v.device}/{v.dtype}")
    if not isinstance(layer, int) or layer < 0:
        raise ValueError(f"{name}: layer must be a non-negative int, got {layer!r}")


def check_same_stream(old_k, k, layer):
    """New tokens must match the cached batch, heads and head dim of this layer."""
    if old_k.shape[0] != k.shape[0] or old_k.shape[1] != k.shape[1] or old_k.shape[3] != k.shape[3]:
        raise ValueError(f"update: layer {layer} holds [batch={old_k.shape[0]}, kv_heads={old_k.shape[1]}, "
                         f"head_dim={old_k.shape[3]}] but got k of shape {tuple(k.shape)}")
    if old_k.device != k.device or old_k.dtype != k.dtype:
        raise ValueError(f"update: layer {layer} holds {old_k.dtype} on {old_k.device}, got {k.dtype} on {k.device}")


def _check_keep(keep, length: int) -> torch.Tensor:
    """`keep` as a 1-D long tensor of strictly increasing positions in [0, length)."""
    keep = keep.long() if isinstance(keep, torch.Tensor) else torch.as_tensor(keep, dtype=torch.long, device="cpu")
    if keep.dim() != 1 or (keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= length)):
        raise ValueError(f"keep must be a 1-D tensor of positions in [0, {length}), got {keep.tolist()}")
    if keep.numel() > 1 and not bool((keep[1:] > keep[:-1]).all()):
        raise ValueError("keep must be strictly increasing (the kept tokens stay in sequence order)")
    return keep


class KVCache:
    """Base class of the caches: subclasses implement ``update`` and ``get_seq_length``; the rest has defaults."""

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int, q: torch.Tensor | None = None):
        """Store this layer's new k, v [B, K, T, Dh]; return all it attends to, [B, K, S, Dh] each.
        q [B, H, T, Dh]: the new tokens' rotated queries, for a cache whose policy reads them (or None)."""
        raise NotImplementedError

    def get_seq_length(self) -> int:
        raise NotImplementedError

    def stored_length(self, layer: int = 0) -> int:
        return self.get_seq_length()

    def nbytes(self) -> int:
        return 0

    def positions(self, num_new: int) -> torch.Tensor | None:
        """Positions of the next `num_new` tokens ([T] or [B, T]), or None: the model continues after
        ``get_seq_length()`` (and checks its context)."""
        return None

    def attn_mask(self, num_new: int, device=None):
        """Mask [T, S] (True = attend) for a forward of `num_new` tokens, or None = the model's causal mask."""
        return None

    def compact(self, keep: torch.Tensor):
        """Keep only the cached positions `keep` ([M] long, strictly increasing), in that order: what tree
        verification does with the accepted path. Only caches whose index is the token's position can;
        the others refuse."""
        raise TypeError(f"{type(self).__name__} cannot compact (keep chosen positions): its slots are not the "
                        f"tokens' positions in order; use a ContiguousCache or StaticCache")

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Store this layer's new k, v [B, K, T, Dh] and attend q [B, H, T, Dh] over all that is held."""
        k_all, v_all = self.update(k, v, layer, q=q)     # [B, K, S, Dh]
        return attention(q, k_all, v_all, attn_mask)     # [B, H, T, Dh]


class ContiguousCache(KVCache):
    """The plain KV cache: one growing tensor per layer, extended with ``torch.cat`` on the seq axis.

    Simple and exact. Its cost: every append copies the whole layer cache (O(S) per token), and the
    memory grows one token at a time, so a serving engine cannot plan for it (Module 06).
    """

    def __init__(self):
        self.k: list[torch.Tensor] = []  # per layer [B, K, S, Dh]
        self.v: list[torch.Tensor] = []

    def update(self, k, v, layer, q=None):
        check_kv(k, v, layer)
        if layer == len(self.k):            # first tokens for this layer
            self.k.append(k)
            self.v.append(v)
        elif layer < len(self.k):
            check_same_stream(self.k[layer], k, layer)
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)  # [B, K, S + T, Dh]
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        else:
            raise ValueError(f"update: layers must be filled in order 0, 1, ...; got layer {layer} "
                             f"while only {len(self.k)} layers are cached")
        return self.k[layer], self.v[layer]

    def get_seq_length(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def stored_length(self, layer: int = 0) -> int:
        return self.k[layer].shape[2] if layer < len(self.k) else 0

    @property
    def num_layers(self) -> int:
        return len(self.k)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def crop(self, length: int):
        """Keep only the first `length` tokens (rewinding: rejected draft tokens, re-timing a step)."""
        if not isinstance(length, int) or not 0 <= length <= self.get_seq_length():
            raise ValueError(f"length must be an int in [0, {self.get_seq_length()}], got {length!r}")
        self.k = [k[:, :, :length] for k in self.k]
        self.v = [v[:, :, :length] for v in self.v]

    def compact(self, keep: torch.Tensor):
        """Keep only the positions `keep` ([M] long, strictly increasing) of every layer, in that order."""
        keep = _check_keep(keep, self.get_seq_length())
        for layer in range(len(self.k)):
            idx = keep.to(self.k[layer].device)
            self.k[layer] = self.k[layer].index_select(2, idx)  # [B, K, M, Dh]
            self.v[layer] = self.v[layer].index_select(2, idx)
        return self

    def reset(self):
        self.k, self.v = [], []


class StaticCache(KVCache):
    """A preallocated cache: [B, K, max_len, Dh] per layer, written in place at the current position.

    Nothing is reallocated while generating and the tensor shapes never change: what CUDA graphs and
    ``torch.compile`` need (the gpt-fast recipe). The position of the next token is a tensor on the
    cache's device (``pos[layer]``, advanced in place), so a decode step reads no Python int that changes
    per token (no host sync, no recompile), and ``model(token, cache=static_cache)`` compiles once.
    Attention runs over all ``max_len`` slots with a mask that hides the unwritten ones. The price: the
    whole ``max_len`` is reserved up front whether it is used or not, the waste Module 06 measures.

    Buffers are created on the first update of each layer from k's shape, dtype and device, or all at
    once with ``StaticCache.for_model(model, batch, max_len)``. All rows of the batch share a position.
    ``update`` (the plain contract) returns views of the filled part; reading that length is a host sync.
    """

    def __init__(self, max_len: int):
        self.max_len = integer(max_len, "max_len", low=1)
        self.k: list[torch.Tensor] = []    # per layer [B, K, max_len, Dh]
        self.v: list[torch.Tensor] = []
        self.pos: list[torch.Tensor] = []  # per layer: tokens written, a 0-d int64 tensor on the device

    @classmethod
    def for_model(cls, model, batch: int, max_len: int | None = None, dtype=None, device=None):
        cfg = model.config
        max_len = max_len or cfg.max_position_embeddings
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"max_len={max_len} is past the model's context of {cfg.max_position_embeddings}")
        cache = cls(max_len)
        for _ in range(cfg.num_hidden_layers):
            cache._allocate(batch, cfg.num_key_value_heads, cfg.head_dim, dtype or model.dtype,
                            device or model.device)
        return cache

    def _allocate(self, B, K, Dh, dtype, device):
        k = torch.zeros(B, K, self.max_len, Dh, dtype=dtype, device=device)
        v = torch.zeros(B, K, self.max_len, Dh, dtype=dtype, device=device)
        pos = torch.zeros((), dtype=torch.long, device=device)
        if hasattr(torch, "_dynamo"):
            for t in (k, v, pos):     # fixed addresses: CUDA graphs may read and write them in place
                torch._dynamo.mark_static_address(t)
        self.k.append(k)
        self.v.append(v)
        self.pos.append(pos)

    def _write(self, k, v, layer) -> torch.Tensor:
        """Write k, v [B, K, T, Dh] at this layer's position; returns the positions written [T]."""
        B, K, T, Dh = k.shape
        if layer == len(self.k):
            self._allocate(B, K, Dh, k.dtype, k.device)
        elif layer > len(self.k):
            raise ValueError(f"update: layers must be filled in order; got layer {layer} with "
                             f"{len(self.k)} layers allocated")
        idx = self.pos[layer] + torch.arange(T, device=k.device)          # [T] on the device
        self.k[layer].index_copy_(2, idx, k)                               # in place, no reallocation
        self.v[layer].index_copy_(2, idx, v)
        self.pos[layer].add_(T)
        return idx

    def positions(self, num_new: int) -> torch.Tensor:
        """[T] positions of the next `num_new` tokens, on the device (no host sync)."""
        if not self.pos:
            return torch.arange(num_new, device="cpu")   # nothing allocated yet: the first forward starts at 0
        return self.pos[0] + torch.arange(num_new, device=self.pos[0].device)

    def update(self, k, v, layer, q=None):
        check_kv(k, v, layer)
        T = k.shape[2]
        if layer < len(self.k):
            check_same_stream(self.k[layer], k, layer)
        start = self.stored_length(layer)
        if start + T > self.max_len:
            raise ValueError(f"StaticCache is full: {start} tokens cached + {T} new > max_len={self.max_len}")
        self._write(k, v, layer)
        return self.k[layer][:, :, :start + T], self.v[layer][:, :, :start + T]

    def attend(self, q, k, v, layer, attn_mask=None):
        """Write k, v and attend over all max_len slots; slots past each query's position are masked."""
        if attn_mask is not None:    # an explicit mask (a tree) covers the filled part only: the plain way
            return super().attend(q, k, v, layer, attn_mask)
        if not torch.compiler.is_compiling() and layer < len(self.k):
            check_kv(k, v, layer)
            check_same_stream(self.k[layer], k, layer)
        idx = self._write(k, v, layer)                                     # [T]
        keys = torch.arange(self.max_len, device=idx.device)
        mask = keys[None, :] <= idx[:, None]                               # [T, max_len]: causal + unwritten
        return attention(q, self.k[layer], self.v[layer], mask)

    def get_seq_length(self) -> int:
        return int(self.pos[0]) if self.pos else 0

    def stored_length(self, layer: int = 0) -> int:
        return int(self.pos[layer]) if layer < len(self.pos) else 0

    @property
    def lengths(self) -> list[int]:
        """Tokens written per layer (read from the device)."""
        return [int(p) for p in self.pos]

    def nbytes(self) -> int:
        """Bytes reserved (the whole max_len), not only the part in use."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def used_nbytes(self) -> int:
        """Bytes of the filled part only."""
        return sum(2 * k[:, :, :n].numel() * k.element_size() for k, n in zip(self.k, self.lengths))

    def crop(self, length: int):
        """Forget everything after the first `length` tokens (nothing is freed: it is all reserved)."""
        length = integer(length, "length", 0, self.get_seq_length())
        for p in self.pos:
            p.fill_(length)

    def compact(self, keep: torch.Tensor):
        """Keep only the positions `keep` ([M] long, strictly increasing), in that order: the kept rows are
        written to the front of each layer's buffer (in place: the buffers keep their addresses)."""
        keep = _check_keep(keep, self.get_seq_length())
        M = keep.numel()
        for layer in range(len(self.k)):
            idx = keep.to(self.k[layer].device)
            k = self.k[layer].index_select(2, idx)  # [B, K, M, Dh], a copy: the rows may overlap their targets
            v = self.v[layer].index_select(2, idx)
            self.k[layer][:, :, :M] = k
            self.v[layer][:, :, :M] = v
        self.crop(M)
        return self

    def reset(self):
        for p in self.pos:
            p.zero_()
