"""Quantized KV caches: int8/int4 codes with a full-precision window of recent tokens, and multiple tiers.

How the tensors are quantized (asymmetric min-max, the KIVI recipe):
* keys **per channel**: a few channels of K carry large outliers for every token, so each channel gets
  its own scale and zero point, computed over a group of ``group`` tokens;
* values **per token**: V has no such channel structure; each token gets its own scale over its channels.
Per-channel scales need a group of tokens, so the newest tokens wait in a full-precision buffer until a
whole group can be quantized; the buffer also keeps the most recent ``recent`` tokens exact, which is
where most attention goes.

``FP8Cache`` is the other family: every token stored as FP8 E4M3 (``torch.float8_e4m3fn``: 3 mantissa bits,
max 448) times a float32 scale, ``scale = amax / 448``, with no zero point, no groups and no full-precision
buffer (a float grid has constant *relative* error, so no token needs protecting). ``scales="token"``: one
scale per (token, head), computed as the token arrives (Module 03's per-row ``fp8_quantize``);
``scales="head"``: one per (layer, head), fixed from the first update (the prompt) and saturating for later
values outside it, the static, calibrated scale serving engines use (vLLM: one per tensor by default).

``MultiTierCache`` generalizes it: full precision for the newest tokens, then tiers of decreasing bits
(e.g. int8 for the next 128 tokens, int4 for everything older); a group that ages out of a tier is
re-quantized into the next one (and dropped if the last tier is full). ``QuantizedCache`` is the
two-tier case.

Memory: ``nbytes()`` counts what is stored: uint8 codes (two int4 codes per byte), fp16 scales and zero
points, and the full-precision buffer. For speed the cache also keeps a dequantized copy of the
quantized part (what a fused kernel would recompute on the fly in registers); that copy is not counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course_lib.quant.fp8 import FP8_DTYPES, FP8_MAX, fp8_quantize
from course_lib.quant.packing import pack_int4 as _pack_int4, unpack_int4 as _unpack_int4

from course_lib.validate import one_of

from .base import KVCache, check_kv, check_same_stream

SUPPORTED_BITS = (8, 4)


def quantize_minmax(x: torch.Tensor, bits: int, dim: int):
    """Asymmetric quantization with the min and max taken along `dim`.

    Returns (codes uint8, scale fp16, zero fp16) with x ~ codes * scale + zero; scale and zero keep the
    reduced dim with size 1. Codes of 4-bit tensors are not packed here (see ``pack_uint4``).
    """
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    qmax = 2 ** bits - 1
    xf = x.float()
    lo = xf.amin(dim, keepdim=True)
    hi = xf.amax(dim, keepdim=True)
    # Stored in fp16, clamped after the cast: a range under ~5e-7 (a constant channel) would round to a
    # scale of 0, and the NaN codes it makes turn into different garbage on a CPU and on a GPU.
    scale = ((hi - lo) / qmax).half().clamp(min=2.0 ** -24)
    zero = lo.half()
    codes = ((xf - zero.float()) / scale.float()).round().clamp(0, qmax).to(torch.uint8)
    return codes, scale, zero


def dequantize_minmax(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype=torch.float32):
    return (codes.float() * scale.float() + zero.float()).to(dtype)


def pack_uint4(codes: torch.Tensor) -> torch.Tensor:
    """Two unsigned 4-bit codes (0..15, min-max codes) per byte along the last dim, low nibble first:
    Module 02's packer (``course_lib.quant.pack_int4``, signed weight codes) with ``signed=False``."""
    return _pack_int4(codes, signed=False)


def unpack_uint4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_uint4``: uint8 codes 0..15, twice as many along the last dim."""
    return _unpack_int4(packed, signed=False).to(torch.uint8)


@dataclass
class QuantBlock:
    """A group of tokens of one layer, quantized: keys per channel, values per token."""
    bits: int
    k_codes: torch.Tensor   # [B, K, G, Dh] uint8 (int4: [B, K, G, Dh/2] packed)
    k_scale: torch.Tensor   # [B, K, 1, Dh] fp16
    k_zero: torch.Tensor
    v_codes: torch.Tensor   # [B, K, G, Dh] uint8 (int4: packed)
    v_scale: torch.Tensor   # [B, K, G, 1] fp16
    v_zero: torch.Tensor
    dtype: torch.dtype

    @classmethod
    def from_kv(cls, k: torch.Tensor, v: torch.Tensor, bits: int) -> "QuantBlock":
        kc, ks, kz = quantize_minmax(k, bits, dim=2)   # over tokens: one scale per channel
        vc, vs, vz = quantize_minmax(v, bits, dim=3)   # over channels: one scale per token
        if bits == 4:
            kc, vc = pack_uint4(kc), pack_uint4(vc)
        return cls(bits, kc, ks, kz, vc, vs, vz, k.dtype)

    @property
    def num_tokens(self) -> int:
        return self.k_codes.shape[2]

    def dequantize(self):
        kc, vc = self.k_codes, self.v_codes
        if self.bits == 4:
            kc, vc = unpack_uint4(kc), unpack_uint4(vc)
        return (dequantize_minmax(kc, self.k_scale, self.k_zero, self.dtype),
                dequantize_minmax(vc, self.v_scale, self.v_zero, self.dtype))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k_codes, self.k_scale, self.k_zero,
                                                          self.v_codes, self.v_scale, self.v_zero))


@dataclass
class _Tier:
    capacity: int | None    # tokens; None = unbounded
    bits: int
    blocks: list = field(default_factory=list)
    k_deq: torch.Tensor | None = None   # dequantized copy of all blocks (oldest first), not counted
    v_deq: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return sum(b.num_tokens for b in self.blocks)

    def refresh(self, like: torch.Tensor):
        if self.blocks:
            ks, vs = zip(*(b.dequantize() for b in self.blocks))
            self.k_deq, self.v_deq = torch.cat(ks, dim=2), torch.cat(vs, dim=2)
        else:
            self.k_deq, self.v_deq = like[:, :, :0], like[:, :, :0]


@dataclass
class _TierState:
    k: torch.Tensor           # full-precision buffer [B, K, n_fp, Dh]
    v: torch.Tensor
    tiers: list               # newest tier first
    seen: int = 0
    dropped: int = 0


class MultiTierCache(KVCache):
    """Recent tokens in full precision, older ones in quantized tiers of decreasing precision.

    recent: at least this many newest tokens stay full precision.
    tiers: ((capacity_tokens, bits), ...) newest first; capacity None = unbounded (only the last tier);
        a last tier with a capacity drops its oldest groups when full (eviction).
    group: tokens quantized together (the per-channel key scales are computed over a group).
    """

    def __init__(self, recent: int = 64, tiers=((128, 8), (None, 4)), group: int = 16):
        if not isinstance(recent, int) or recent < 0:
            raise ValueError(f"recent must be an int >= 0, got {recent!r}")
        if not isinstance(group, int) or group < 1:
            raise ValueError(f"group must be an int >= 1, got {group!r}")
        tiers = tuple(tuple(t) for t in tiers)
        if not tiers:
            raise ValueError("tiers must name at least one quantized tier, e.g. ((None, 8),)")
        for i, (cap, bits) in enumerate(tiers):
            if bits not in SUPPORTED_BITS:
                raise ValueError(f"tiers[{i}]: bits must be one of {SUPPORTED_BITS}, got {bits!r}")
            if cap is None and i != len(tiers) - 1:
                raise ValueError(f"tiers[{i}]: only the last tier may be unbounded (capacity None)")
            if cap is not None and (not isinstance(cap, int) or cap < group or cap % group):
                raise ValueError(f"tiers[{i}]: capacity must be a multiple of group={group}, got {cap!r}")
        self.recent, self.tier_spec, self.group = recent, tiers, group
        self.layers: list[_TierState] = []

    def get_seq_length(self) -> int:
        return self.layers[0].seen if self.layers else 0

    def stored_length(self, layer: int = 0) -> int:
        if layer >= len(self.layers):
            return 0
        st = self.layers[layer]
        return st.k.shape[2] + sum(t.num_tokens for t in st.tiers)

    def nbytes(self) -> int:
        total = 0
        for st in self.layers:
            total += st.k.numel() * st.k.element_size() + st.v.numel() * st.v.element_size()
            total += sum(b.nbytes() for t in st.tiers for b in t.blocks)
        return total

    def tier_lengths(self, layer: int = 0) -> list[int]:
        """Tokens per tier, [full precision, tier 0, tier 1, ...]."""
        st = self.layers[layer]
        return [st.k.shape[2]] + [t.num_tokens for t in st.tiers]

    def update(self, k, v, layer, q=None):
        check_kv(k, v, layer)
        if k.shape[-1] % 2:
            raise ValueError(f"update: head_dim must be even for int4 packing, got {k.shape[-1]}")
        if layer == len(self.layers):
            tiers = [_Tier(cap, bits) for cap, bits in self.tier_spec]
            for t in tiers:
                t.refresh(k)
            self.layers.append(_TierState(k[:, :, :0], v[:, :, :0], tiers))
        elif layer > len(self.layers):
            raise ValueError(f"update: layers must be filled in order; got layer {layer}")
        st = self.layers[layer]
        check_same_stream(st.k, k, layer)
        st.k = torch.cat([st.k, k], dim=2)
        st.v = torch.cat([st.v, v], dim=2)
        # Attend to everything held, oldest first: last tier ... first tier, then full precision.
        k_all = torch.cat([t.k_deq for t in reversed(st.tiers)] + [st.k], dim=2)
        v_all = torch.cat([t.v_deq for t in reversed(st.tiers)] + [st.v], dim=2)
        st.seen += k.shape[2]
        self._demote(st)
        return k_all, v_all

    def _demote(self, st: _TierState):
        G = self.group
        changed = set()
        while st.k.shape[2] >= self.recent + G:             # oldest full-precision group -> tier 0
            st.tiers[0].blocks.append(QuantBlock.from_kv(st.k[:, :, :G], st.v[:, :, :G], st.tiers[0].bits))
            st.k, st.v = st.k[:, :, G:], st.v[:, :, G:]
            changed.add(0)
        for i, tier in enumerate(st.tiers):
            while tier.capacity is not None and tier.num_tokens > tier.capacity:
                block = tier.blocks.pop(0)                    # oldest group of this tier
                changed.add(i)
                if i + 1 < len(st.tiers):
                    k_old, v_old = block.dequantize()
                    st.tiers[i + 1].blocks.append(QuantBlock.from_kv(k_old, v_old, st.tiers[i + 1].bits))
                    changed.add(i + 1)
                else:
                    st.dropped += block.num_tokens
        for i in changed:
            st.tiers[i].refresh(st.k)

    def reset(self):
        self.layers = []


class QuantizedCache(MultiTierCache):
    """int8 or int4 KV cache (keys per channel, values per token) with a full-precision recent buffer."""

    def __init__(self, bits: int = 8, residual: int = 32, group: int = 32):
        if bits not in SUPPORTED_BITS:
            raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
        super().__init__(recent=residual, tiers=((None, bits),), group=group)
        self.bits = bits


FP8_SCALES = ("token", "head")


def fp8_kv_quantize(x: torch.Tensor, scale: torch.Tensor | None = None):
    """x [B, K, T, Dh] -> (E4M3 data [B, K, T, Dh], float32 scale). Without `scale`: one per (token, head),
    amax / 448 over the Dh channels (an all-zero row gets scale 1); with `scale` (broadcastable, e.g.
    [1, K, 1, 1]): that scale, and values past 448 x scale saturate to +-448 x scale (never inf or NaN)."""
    if scale is None:
        q = fp8_quantize(x, "e4m3", "row")                 # rows of the [-1, Dh] view: (b, head, token)
        return q.data, q.scale.reshape(*x.shape[:-1], 1)
    data = (x.float() / scale).clamp(-FP8_MAX["e4m3"], FP8_MAX["e4m3"]).to(FP8_DTYPES["e4m3"])
    return data, scale


def fp8_kv_dequantize(data: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (data.float() * scale).to(dtype)


@dataclass
class _FP8Layer:
    k: torch.Tensor          # [B, K, S, Dh] float8_e4m3fn
    v: torch.Tensor
    k_scale: torch.Tensor    # float32: [B, K, S, 1] per token, [1, K, 1, 1] per head
    v_scale: torch.Tensor
    k_deq: torch.Tensor      # dequantized copy in the input dtype (what a kernel would recompute), not counted
    v_deq: torch.Tensor


class FP8Cache(KVCache):
    """Keys and values stored as FP8 E4M3 with float32 scales (amax / 448): one byte per element plus
    the scales. scales: "token" (one per token and KV head, from that token's channels) or "head" (one
    per layer and KV head, from the first update of the layer, then fixed; later values saturate)."""

    def __init__(self, scales: str = "token"):
        self.scales = one_of(scales, "scales", FP8_SCALES)
        if FP8_DTYPES["e4m3"] is None:
            raise RuntimeError(f"this torch ({torch.__version__}) has no float8_e4m3fn dtype")
        self.layers: list[_FP8Layer] = []

    def get_seq_length(self) -> int:
        return self.layers[0].k.shape[2] if self.layers else 0

    def stored_length(self, layer: int = 0) -> int:
        return self.layers[layer].k.shape[2] if layer < len(self.layers) else 0

    def nbytes(self) -> int:
        """FP8 data (1 byte per element) plus the float32 scales; the dequantized copy is not counted."""
        return sum(t.numel() * t.element_size() for st in self.layers for t in (st.k, st.v, st.k_scale, st.v_scale))

    def _head_scale(self, x: torch.Tensor) -> torch.Tensor:
        amax = x.float().abs().amax(dim=(0, 2, 3), keepdim=True)           # [1, K, 1, 1]
        return torch.where(amax > 0, amax / FP8_MAX["e4m3"], torch.ones_like(amax))

    def update(self, k, v, layer, q=None):
        check_kv(k, v, layer)
        if layer > len(self.layers):
            raise ValueError(f"update: layers must be filled in order; got layer {layer}")
        first = layer == len(self.layers)
        if not first:
            check_same_stream(self.layers[layer].k_deq, k, layer)
        if self.scales == "token":
            (kd, ks), (vd, vs) = fp8_kv_quantize(k), fp8_kv_quantize(v)
        else:
            st = None if first else self.layers[layer]
            (kd, ks) = fp8_kv_quantize(k, self._head_scale(k) if first else st.k_scale)
            (vd, vs) = fp8_kv_quantize(v, self._head_scale(v) if first else st.v_scale)
        k_hat, v_hat = fp8_kv_dequantize(kd, ks, k.dtype), fp8_kv_dequantize(vd, vs, v.dtype)
        if first:
            self.layers.append(_FP8Layer(kd, vd, ks, vs, k_hat, v_hat))
        else:
            st = self.layers[layer]
            st.k, st.v = torch.cat([st.k, kd], dim=2), torch.cat([st.v, vd], dim=2)
            if self.scales == "token":
                st.k_scale, st.v_scale = torch.cat([st.k_scale, ks], dim=2), torch.cat([st.v_scale, vs], dim=2)
            st.k_deq, st.v_deq = torch.cat([st.k_deq, k_hat], dim=2), torch.cat([st.v_deq, v_hat], dim=2)
        st = self.layers[layer]
        return st.k_deq, st.v_deq

    def reset(self):
        self.layers = []
