"""Per-layer key/value codecs: rotate → center → clip → quantize → pack, and back.

A :class:`TensorCodec` is the complete storage rule for one tensor kind (keys or values) of
one layer: its transform ``R [H, d, d]``, mean ``mu [H, d]``, clip ratio, bit width, group and, for
2-bit codes, an optional non-uniform level table (``oscarkv.quant.int2``; ``None``: uniform).
The rotated domain is ``x_rot = (x - mu) @ R`` per KV head; caches store ``x_rot`` (BF16 for
windows, packed low-bit codes for history) and map back with ``x = x_rot @ R⁻¹ + mu``.

``R`` is orthogonal (``R⁻¹ = Rᵀ``) unless the artifact carries an importance scaling (an
extension, ``oscarkv.quant.artifact``): then ``R = S·R₀`` with ``S`` symmetric positive
definite and the codec holds ``inverse = R⁻¹`` explicitly. Attention stays exact because the
query is mapped with :meth:`TensorCodec.query_map` ``= R⁻ᵀ``: ``(q R⁻ᵀ)·(k R) = q·k``.
:func:`build_codec` turns a :class:`~oscarkv.config.KVConfig` (plus, for ``oscar``, a
rotation artifact) into a :class:`KVCodec` — the single code path for every method; caches
(``oscarkv.cache``) and the evaluation harness only call it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from oscarkv.config import KVConfig
from oscarkv.quant.bpe import SlidingLayers, bits_per_element, mixed_bpe, tiers
from oscarkv.quant.clip import clip_groups
from oscarkv.quant.int2 import Levels, Packed, dequantize, normalized, quantize
from oscarkv.quant.rotation import compose


@dataclass(frozen=True)
class TensorCodec:
    """Storage rule for keys or values of one layer: ``bits`` 2 or 4 (``oscarkv.quant.int2``), ``None``
    stores BF16 only."""

    bits: int | None
    group: int
    rotation: torch.Tensor | None = None  # [H, d, d] fp32, the transform R (orthogonal unless `inverse`)
    mean: torch.Tensor | None = None  # [H, d] fp32, original domain
    clip: float | None = None
    per_channel: bool = False  # KIVI keys: quantize each channel over a block of tokens
    inverse: torch.Tensor | None = None  # [H, d, d] fp32, R⁻¹ when R is not orthogonal (None: Rᵀ)
    levels: Levels | None = None  # 2-bit level table (0, l1, l2, 3); None: uniform
    head_bits: tuple[int, ...] = ()  # per KV head its bits (a per-head key allocation); empty: every head at `bits`

    def __post_init__(self) -> None:
        assert self.levels is None or (self.bits == 2 and not self.per_channel), "level tables are for per-token 2-bit codes"
        assert not self.head_bits or (self.bits == 2 and not self.per_channel and set(self.head_bits) <= {2, 4}), \
            "per-head bits refine a per-token 2-bit codec with 4-bit heads"

    def head_parts(self) -> list[tuple[list[int] | None, TensorCodec]]:
        """The codec's KV heads grouped by bits: ``(heads, the uniform codec that stores them)``, 2-bit heads first
        (the layer's clip and levels; 4-bit heads unclipped, uniform: :func:`with_bits`). One part without
        ``head_bits``. NOTE: every rule is per head, so storing each part on its own is the whole codec."""
        if not self.head_bits:
            return [(None, self)]
        base = replace(self, head_bits=())
        return [([h for h, b in enumerate(self.head_bits) if b == bits], with_bits(base, bits))
                for bits in sorted(set(self.head_bits))]

    def permute_heads(self, order: list[int]) -> TensorCodec:
        """The same rule with KV head ``order[j]`` as head ``j`` (rotation, mean, inverse and head bits)."""
        idx = torch.tensor(order)
        moved = {f: getattr(self, f)[idx.to(getattr(self, f).device)] for f in ("rotation", "mean", "inverse")
                 if getattr(self, f) is not None}
        bits = tuple(self.head_bits[j] for j in order) if self.head_bits else ()
        return replace(self, **moved, head_bits=bits)

    def back_map(self) -> torch.Tensor | None:
        """``R⁻¹ [H, d, d]``: rotated domain → original (``None`` without a transform)."""
        if self.rotation is None:
            return None
        return self.inverse if self.inverse is not None else self.rotation.transpose(-1, -2)

    def query_map(self) -> torch.Tensor | None:
        """``R⁻ᵀ [H, d, d]``, the map of a query that reads keys stored with this codec."""
        back = self.back_map()
        return None if back is None else back.transpose(-1, -2)

    def to_rotated(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H, d]`` original domain → fp32 rotated, centered domain."""
        # NOTE: x (bf16) minus the fp32 mean promotes to fp32 exactly: one kernel where x.float() - mean took two
        # (.float() launches nothing then; it only brings an fp64 input down)
        x = (x - self.mean.to(x.device, torch.float32)).float() if self.mean is not None else x.float()
        if self.rotation is not None:  # NOTE: einsum("thd,hde->the") as one batched matmul: the same product
            # without einsum's planning on the host (~0.1 ms a call on an H100 machine); a [T, H, d] view of [H, T, d]
            x = torch.matmul(x.transpose(0, 1), self.rotation.to(x.device)).transpose(0, 1)
        return x

    def from_rotated(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`to_rotated` (fp32)."""
        x = x.float()
        if self.inverse is not None:
            x = torch.einsum("the,hed->thd", x, self.inverse.to(x.device))
        elif self.rotation is not None:
            x = torch.einsum("the,hde->thd", x, self.rotation.to(x.device))
        if self.mean is not None:
            x = x + self.mean.to(x.device)
        return x

    def encode(self, x_rot: torch.Tensor) -> Packed | HeadPacked:
        """Clip and quantize rotated ``[T, H, d]``; per-channel codecs need ``T`` = one token block; per-head bits
        store each bit width's heads on their own (:class:`HeadPacked`)."""
        assert self.bits is not None, "encode() on a BF16 codec"
        if self.head_bits:
            return HeadPacked(tuple(c.encode(x_rot[:, heads]) for heads, c in self.head_parts()))
        if self.per_channel:  # [T, H, d] -> [H, d, T]: groups run along tokens
            return quantize(x_rot.permute(1, 2, 0), self.bits, x_rot.shape[0])
        return quantize(clip_groups(x_rot, self.clip, self.group), self.bits, self.group, self.levels)

    def normalized(self, x_rot: torch.Tensor) -> torch.Tensor:
        """Clipped rotated ``[T, H, d]`` in code units, fp32 ``[T, H, d/G, G]``: what :meth:`encode` rounds
        (``oscarkv.quant.int2.normalized``; the data Lloyd-Max levels are fitted on)."""
        assert not self.head_bits, "normalized() of a uniform codec (levels are fitted before any allocation)"
        return normalized(clip_groups(x_rot, self.clip, self.group), self.bits, self.group)[0]

    def decode(self, p: Packed | HeadPacked) -> torch.Tensor:
        """Packed codes → fp32 rotated ``[T, H, d]``."""
        assert self.bits is not None, "decode() on a BF16 codec"
        if self.head_bits:
            parts = [(heads, c.decode(q)) for (heads, c), q in zip(self.head_parts(), p.parts)]
            out = parts[0][1].new_empty(parts[0][1].shape[0], len(self.head_bits), parts[0][1].shape[2])
            for heads, x in parts:
                out[:, heads] = x
            return out
        if self.per_channel:
            t = p.codes.shape[-1] * 8 // self.bits
            return dequantize(p, self.bits, t).permute(2, 0, 1)
        return dequantize(p, self.bits, self.group, self.levels)

    def fake(self, x: torch.Tensor) -> torch.Tensor:
        """Round trip ``[T, H, d]`` through storage, back in the original domain (fp32)."""
        if self.bits is None:
            return x.float()
        return self.from_rotated(self.decode(self.encode(self.to_rotated(x))))

    def bpe(self, n_low: int, n_bf16: int, page: int) -> float:
        if self.bits is None:
            return 16.0
        if self.head_bits:  # the heads' mean
            return sum(len(h) * c.bpe(n_low, n_bf16, page) for h, c in self.head_parts()) / len(self.head_bits)
        return bits_per_element(n_low, n_bf16, self.bits, page if self.per_channel else self.group)


class HeadPacked(NamedTuple):
    """The codes of a per-head allocation: one :class:`~oscarkv.quant.int2.Packed` per part of
    :meth:`TensorCodec.head_parts` (each ``[T, heads of that part, ...]``)."""

    parts: tuple[Packed, ...]

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)


@dataclass(frozen=True)
class LayerCodec:
    key: TensorCodec
    value: TensorCodec


@dataclass(frozen=True)
class KVCodec:
    """Codecs for every layer plus the tier geometry they are used with."""

    config: KVConfig
    layers: tuple[LayerCodec, ...]
    group: int
    sliding: SlidingLayers | None = None
    """The model's sliding-window layers (a BF16 window each, their codecs unused); ``None``: none."""

    @property
    def quantized(self) -> bool:
        return self.config.method != "bf16"

    def tiers(self, t: int):
        c = self.config
        return tiers(t, c.sink, c.recent, c.page_size)

    def bpe(self, t: int) -> float:
        """Bits per element of a ``t``-token sequence, keys and values averaged, windows included, averaged over
        the layers (a per-layer allocation stores each at its own bits); with sliding layers, the bits every layer holds over the elements it holds (:func:`mixed_bpe`)."""
        tr = self.tiers(t)
        n_bf16 = tr.sink + tr.recent
        skip = self.sliding.layers if self.sliding else frozenset()
        tiered = [layer for i, layer in enumerate(self.layers) if i not in skip]
        P = self.config.page_size
        each = [0.5 * (x.key.bpe(tr.history, n_bf16, P) + x.value.bpe(tr.history, n_bf16, P)) for x in tiered]
        mean = each[0] if len(set(each)) == 1 else sum(each) / len(each)  # NOTE: uniform: one layer's figure exactly
        return mixed_bpe(mean, len(tiered), t, self.sliding, self.config.page_size)


def default_group(head_dim: int, group: int | None) -> int:
    g = group or min(head_dim, 128)
    if head_dim % g:
        raise ValueError(f"group size {g} does not divide head_dim {head_dim}")
    return g


def build_codec(cfg: KVConfig, num_layers: int, num_kv_heads: int, head_dim: int, artifact=None,
                sliding: SlidingLayers | None = None) -> KVCodec:
    """The codec of ``cfg.method``. ``oscar`` requires a matching artifact; others ignore it. ``sliding``:
    the model's sliding-window layers (:meth:`SlidingLayers.from_config`), which keep a BF16 window."""
    g = default_group(head_dim, cfg.group_size)
    if cfg.method == "oscar":
        if artifact is None:
            raise ValueError("kv method 'oscar' needs a rotation artifact (oscarkv calibrate --out DIR, then --rotations DIR)")
        return replace(artifact.codec(cfg, g), sliding=sliding)
    layer = _baseline_layer(cfg, num_kv_heads, head_dim, g)
    check_layer_bits(cfg, num_layers, num_kv_heads)
    layers = (tuple(allocated(cfg, i, layer, num_kv_heads) for i in range(num_layers)) if cfg.allocated
              else (layer,) * num_layers)
    return KVCodec(cfg, layers, g, sliding)


def allocated(cfg: KVConfig, i: int, layer: LayerCodec, num_kv_heads: int) -> LayerCodec:
    """Layer ``i``'s codecs at the bits ``cfg`` allocates it: per layer (``layer_bits``), per key head
    (``key_heads``)."""
    kb, vb = cfg.layer_bits(i)
    key, heads = with_bits(layer.key, kb), cfg.key_heads(i)
    if heads:
        key = replace(key, head_bits=tuple(4 if h in heads else 2 for h in range(num_kv_heads)))
    return LayerCodec(key, with_bits(layer.value, vb))


def check_layer_bits(cfg: KVConfig, num_layers: int, num_kv_heads: int | None = None) -> None:
    """A per-layer allocation (``KVConfig.layer_key_bits``/``layer_value_bits``/``layer_key_heads``) names every
    decoder layer, and a per-head one only heads the model has."""
    for name in ("layer_key_bits", "layer_value_bits", "layer_key_heads"):
        n = len(getattr(cfg, name))
        if n and n != num_layers:
            raise ValueError(f"KVConfig.{name}: {n} values for a model of {num_layers} layers")
    for i, heads in enumerate(cfg.layer_key_heads):
        if num_kv_heads is not None and any(h >= num_kv_heads for h in heads):
            raise ValueError(f"KVConfig.layer_key_heads[{i}]: heads {heads}, but the model has {num_kv_heads} KV heads")


def with_bits(codec: TensorCodec, bits: int) -> TensorCodec:
    """``codec`` storing ``bits``-bit codes. NOTE: 4-bit codes are not clipped and keep uniform levels: clip
    ratios and level tables are fitted for INT2 (``oscarkv.calibrate.solve``), where the rounding step is five
    times coarser."""
    if bits == codec.bits and not (bits == 4 and codec.head_bits):
        return codec
    two = bits == 2
    return replace(codec, bits=bits, clip=codec.clip if two else None, levels=codec.levels if two else None,
                   head_bits=codec.head_bits if two else ())


def _baseline_layer(cfg: KVConfig, heads: int, d: int, g: int) -> LayerCodec:
    method, (kb, vb) = cfg.method, cfg.stored_bits()
    if method == "bf16":
        bf = TensorCodec(None, g)
        return LayerCodec(bf, bf)
    if method in ("int4", "naive"):
        return LayerCodec(TensorCodec(kb, g), TensorCodec(vb, g))
    if method == "quarot":
        h = compose(torch.eye(d).expand(heads, d, d), "h")
        return LayerCodec(TensorCodec(kb, g, rotation=h), TensorCodec(vb, g, rotation=h))
    if method == "kivi":
        return LayerCodec(TensorCodec(2, g, per_channel=True), TensorCodec(2, g))
    raise ValueError(f"unknown method {method!r}")
