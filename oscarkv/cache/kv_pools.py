"""The KV pool tensors, sized from one memory budget, and their per-layer views.

Role: allocate the tensors of the paged layout (:mod:`oscarkv.cache.paged_layout`, the
contract) once at engine start-up and hand each layer its :class:`LayerKV`. Which page holds
what is decided by :class:`~oscarkv.cache.manager.KVCacheManager`; the attention backend
reads and writes the bytes.

Sizing (:func:`plan_pools`): a BF16 page costs ``2 L H P d`` elements of the window dtype, an
INT2 page ``L H P ((b_K + b_V) d/8 + 8 d/G)`` bytes (``b`` the key and value bits, 2 or 4; under a
per-layer allocation each layer's own, summed: ``PoolGeometry.layer_bits``, and the history pools are
one tensor per kind and bit width, each holding the layers at those bits; under a per-head allocation each
layer's two head ranges, ``HeadPart``, at their own bits, one tensor per kind, bit width and head count). Unless ``EngineConfig.bf16_fraction`` is set, the
BF16 pool gets what ``max_num_seqs`` sequences need for their sink and windows
(``S0 + W + P`` tokens each, plus one partial page) and one step's worth of chunk tokens, plus
``prefix_windows`` more windows with prefix caching (the cached windows hits need); the INT2 pool
gets the rest. ``kv=bf16`` puts the whole budget into BF16 pages.

Sliding-window layers (Gemma 3, :class:`~oscarkv.quant.bpe.SlidingLayers`): the pools above hold
only the global layers (``num_layers`` counts those); the sliding layers get a window pool of their
own (``[L_sliding, N_window, H, P, d]``, the window dtype, :mod:`oscarkv.cache.window`), sized first
for ``max_num_seqs`` windows of ``W + P`` tokens and one step's chunk tokens; the rest of the budget
is split as above. :meth:`KVPools.layer` takes a model layer index and returns the view of the pool
that layer lives in, with the layer's 2-bit level tables (``levels``, from its codecs) on its INT2 views.

Window dtype: ``bfloat16`` for the quantized methods (DESIGN.md §3). For ``kv=bf16`` the pool
holds the model's own dtype — NOTE: a deliberate, backward-compatible widening of the
contract, matching ``OscarCache`` (whose ``bf16`` method stores K/V as given, like
``DynamicCache``), so an fp32 CPU model is compared with transformers without an extra
rounding; on a GPU the model dtype is bfloat16 and the pools are exactly the contract's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from oscarkv.cache.paged_layout import HeadSplit, Int2Pages, LayerKV
from oscarkv.config import EngineConfig
from oscarkv.quant.bpe import SlidingLayers


class HeadPart(NamedTuple):
    """KV heads ``[lo, hi)`` of one pool layer, stored at key and value ``bits``: a per-head key allocation
    (``KVConfig.layer_key_heads``) splits a layer into two such ranges, its heads permuted at load so that each
    range is contiguous (``oscarkv.models.folding.permute_kv_heads``)."""

    lo: int
    hi: int
    bits: tuple[int, int]


@dataclass(frozen=True)
class PoolGeometry:
    """Pool sizes (pages, including the scratch page 0) and what one page costs."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    group: int
    page_size: int
    window_dtype: torch.dtype
    bf16_pages: int
    int2_pages: int  # 0 for kv=bf16
    bits: tuple[int, int] = (2, 2)  # key and value bits of the history pages
    window_layers: int = 0  # sliding-window layers (not in num_layers)
    window_pages: int = 0  # pages of their window pool (0 without sliding layers)
    layer_bits: tuple[tuple[int, int], ...] = ()  # per pool layer (key, value) bits; empty: every layer at `bits`
    layer_parts: tuple[tuple[HeadPart, ...], ...] = ()  # per pool layer its head ranges; empty: one range a layer

    def bits_of(self, i: int) -> tuple[int, int]:
        """Key and value bits of pool layer ``i`` (the main pools' index, sliding layers left out); of its first head
        range when a per-head allocation splits it (:meth:`parts_of`)."""
        return self.parts_of(i)[0].bits

    def parts_of(self, i: int) -> tuple[HeadPart, ...]:
        """Pool layer ``i``'s head ranges and their bits: all heads at one pair of bits, or a per-head split."""
        if self.layer_parts:
            return self.layer_parts[i]
        return (HeadPart(0, self.num_kv_heads, self.layer_bits[i] if self.layer_bits else self.bits),)

    def code_bytes(self) -> tuple[int, int]:
        """Code bytes per token and head of a key, of a value (``d · bits / 8``)."""
        return self.head_dim * self.bits[0] // 8, self.head_dim * self.bits[1] // 8

    def bf16_page_bytes(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.page_size * self.head_dim * self.window_dtype.itemsize

    def window_page_bytes(self) -> int:
        """A window page in every sliding layer, K and V."""
        return 2 * self.window_layers * self.num_kv_heads * self.page_size * self.head_dim * self.window_dtype.itemsize

    def int2_page_bytes(self) -> int:
        """A history page in every layer, K and V: each head range's codes at its own bits, fp16 scale and zero."""
        meta = 2 * 2 * 2 * (self.head_dim // self.group)
        return self.page_size * sum((p.hi - p.lo) * (self.head_dim * sum(p.bits) // 8 + meta)
                                    for i in range(self.num_layers) for p in self.parts_of(i))

    def capacity(self) -> dict[str, int]:
        """Tokens each tier can hold (scratch pages excluded)."""
        return {"bf16_tokens": (self.bf16_pages - 1) * self.page_size,
                "int2_tokens": max(0, self.int2_pages - 1) * self.page_size}

    def bytes_per_token(self) -> dict[str, float]:
        """KV bytes per token per tier (all layers, K and V), from the page costs."""
        return {"bf16": self.bf16_page_bytes() / self.page_size, "int2": self.int2_page_bytes() / self.page_size}


def plan_pools(cfg: EngineConfig, num_layers: int, num_kv_heads: int, head_dim: int, group: int,
               model_dtype: torch.dtype, bits: tuple[int, int] = (2, 2),
               sliding: SlidingLayers | None = None, layer_bits: tuple[tuple[int, int], ...] = (),
               layer_parts: tuple[tuple[HeadPart, ...], ...] = (), page_bytes: int = 0) -> PoolGeometry:
    """Split ``cfg.kv_memory_bytes`` into window, BF16 and INT2 pages (see the module docstring); ``bits``: the
    key and value bits of the history (the codec's); ``num_layers`` counts every layer, ``sliding`` names those
    that keep only a window; ``layer_bits``: a per-layer allocation's bits of each pool layer (empty: uniform);
    ``layer_parts``: a per-head allocation's head ranges of each pool layer (empty: none); ``page_bytes``: a
    history page cost to count INT2 pages by when larger than this geometry's own (tensor-parallel ranks of a
    per-head allocation hold pages of other sizes and must hold as many: the largest rank's)."""
    kv, P = cfg.kv, cfg.kv.page_size
    dtype = model_dtype if kv.method == "bf16" else torch.bfloat16
    n_win_layers = len(sliding.layers) if sliding else 0
    geo = PoolGeometry(num_layers - n_win_layers, num_kv_heads, head_dim, group, P, dtype, 0, 0, bits, n_win_layers,
                       layer_bits=layer_bits, layer_parts=layer_parts)
    n_win = _window_pages(cfg, sliding) if sliding else 0
    budget = cfg.kv_memory_bytes - n_win * geo.window_page_bytes()
    if kv.method == "bf16":
        n_bf16 = budget // geo.bf16_page_bytes()
    elif cfg.bf16_fraction is not None:
        n_bf16 = int(budget * cfg.bf16_fraction) // geo.bf16_page_bytes()
    else:
        window_pages = -(-(kv.sink + kv.recent + P) // P) + 1
        step_pages = -(-cfg.max_num_batched_tokens // P) + cfg.max_num_seqs
        cached = cfg.prefix_windows if cfg.enable_prefix_caching else 0  # room for windows a later hit needs
        n_bf16 = min((cfg.max_num_seqs + cached) * window_pages + step_pages, budget // 2 // geo.bf16_page_bytes())
    int2_page = max(geo.int2_page_bytes(), page_bytes)
    n_int2 = 0 if kv.method == "bf16" else (budget - n_bf16 * geo.bf16_page_bytes()) // int2_page
    if n_bf16 < 2 or (kv.method != "bf16" and n_int2 < 2):
        raise ValueError(f"EngineConfig.kv_memory_bytes={cfg.kv_memory_bytes} is too small: {n_bf16} BF16 and "
                         f"{n_int2} INT2 pages" + (f" after {n_win} window pages" if n_win else ""))
    return replace(geo, bf16_pages=int(n_bf16), int2_pages=int(n_int2), window_pages=n_win)


def _window_pages(cfg: EngineConfig, sliding: SlidingLayers) -> int:
    """Window pages (scratch included) for ``max_num_seqs`` sequences: each holds at most
    ``W + P - 2`` tokens between steps, plus one partial page, plus one step's chunk tokens in all."""
    P = cfg.kv.page_size
    return cfg.max_num_seqs * (-(-(sliding.window + P - 2) // P) + 1) + -(-cfg.max_num_batched_tokens // P) + 1


class KVPools:
    """The pool tensors of every layer (leading layer dimension, see the layout contract)."""

    def __init__(self, geo: PoolGeometry, device: torch.device | str = "cpu", sliding: frozenset[int] = frozenset(),
                 levels: dict[int, tuple] | None = None) -> None:
        """``levels``: model layer → its (key, value) level tables (``None`` each: uniform); absent: all uniform."""
        self.geo, self.sliding, self.levels = geo, sliding, levels or {}
        L, H, P, d = geo.num_layers, geo.num_kv_heads, geo.page_size, geo.head_dim
        self.bf16_k = torch.zeros(L, geo.bf16_pages, H, P, d, dtype=geo.window_dtype, device=device)
        self.bf16_v = torch.zeros_like(self.bf16_k)
        self.int2_k = self.int2_v = None  # every layer's history pages when all share one format (demote_all's pools)
        self._int2_pools: list[dict[tuple[int, int], Int2Pages]] = [{}, {}]  # per kind: (bits, heads) -> their pages
        self._int2_index: dict[tuple[int, int, int], tuple] = {}  # (pool layer, head range, kind) -> (pool, index)
        if geo.int2_pages:
            self._allocate_int2(device)
        assert len(sliding) == geo.window_layers, "one window-pool layer per sliding layer"
        self.win_k = torch.zeros(geo.window_layers, geo.window_pages, H, P, d, dtype=geo.window_dtype, device=device)
        self.win_v = torch.zeros_like(self.win_k)
        layers = range(geo.num_layers + geo.window_layers)
        # model layer -> its index in the main pools or in the window pool
        self._index = {i: n for kind in (False, True) for n, i in enumerate(j for j in layers if (j in sliding) == kind)}

    def _allocate_int2(self, device) -> None:
        """One history pool per kind, bit width and head count, ``[L_b, N, H_b, P, ...]`` over the head ranges at
        those bits (all layers, in one tensor, for a uniform recipe): every head range holds its own bytes, no more."""
        geo = self.geo
        for kind in (0, 1):
            groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
            for i in range(geo.num_layers):
                for j, part in enumerate(geo.parts_of(i)):
                    groups.setdefault((part.bits[kind], part.hi - part.lo), []).append((i, j))
            for (bits, heads), members in groups.items():
                self._int2_pools[kind][bits, heads] = self._int2(len(members), geo.int2_pages, heads, geo.page_size,
                                                                 geo.head_dim, geo.group, bits, device)
                for n, (i, j) in enumerate(members):
                    self._int2_index[i, j, kind] = ((bits, heads), n)
        if all(len(p) == 1 for p in self._int2_pools):
            self.int2_k, self.int2_v = (next(iter(p.values())) for p in self._int2_pools)

    @staticmethod
    def _int2(L: int, n: int, H: int, P: int, d: int, g: int, bits: int, device) -> Int2Pages:
        return Int2Pages(torch.zeros(L, n, H, P, d * bits // 8, dtype=torch.uint8, device=device),
                         torch.zeros(L, n, H, P, d // g, dtype=torch.float16, device=device),
                         torch.zeros(L, n, H, P, d // g, dtype=torch.float16, device=device), bits)

    def layer(self, layer: int) -> LayerKV:
        """Model layer ``layer``'s view: ``[N, H, P, ...]`` tensors sharing storage with the pools (the
        window pool's BF16 pages for a sliding layer). A layer a per-head allocation splits into two head ranges
        gets its whole BF16 pages, its first range's history and the second range as ``split`` (what the write path
        and the decode kernel take; every other route reads :meth:`parts`)."""
        i = self._index[layer]
        if layer in self.sliding:
            return LayerKV(self.win_k[i], self.win_v[i], None, None)
        if not self._int2_index:
            return LayerKV(self.bf16_k[i], self.bf16_v[i], None, None)
        parts = self.parts(layer)
        if len(parts) == 1:
            return parts[0][1]
        (_, first), (second, last) = parts
        return LayerKV(self.bf16_k[i], self.bf16_v[i], first.int2_k, first.int2_v,
                       HeadSplit(second.lo, last.int2_k, last.int2_v))

    def model_layers(self) -> list[int]:
        """Every model layer the pools serve (:meth:`parts` of each: its head ranges, or its window)."""
        return sorted(self._index)

    def parts(self, layer: int) -> list[tuple[HeadPart, LayerKV]]:
        """Model layer ``layer``'s head ranges, each with its view (BF16 pages of its heads, its history pages):
        one range covering every head unless a per-head allocation splits the layer (a sliding layer: its window)."""
        if layer in self.sliding:
            return [(HeadPart(0, self.geo.num_kv_heads, self.geo.bits), self.layer(layer))]
        i = self._index[layer]
        lk, lv = self.levels.get(layer, (None, None))

        def pick(j: int, kind: int, levels) -> Int2Pages:
            key, n = self._int2_index[i, j, kind]
            p = self._int2_pools[kind][key]
            return Int2Pages(p.codes[n], p.scale[n], p.zero[n], p.bits, levels if p.bits == 2 else None)
        out = []
        for j, part in enumerate(self.geo.parts_of(i)):
            k, v = (t[i] if part.hi - part.lo == t.shape[2] else t[i][:, part.lo:part.hi] for t in (self.bf16_k, self.bf16_v))
            hist = (pick(j, 0, lk), pick(j, 1, lv)) if self._int2_index else (None, None)
            out.append((part, LayerKV(k, v, *hist)))
        return out

    def nbytes(self) -> dict[str, int]:
        """Bytes allocated per pool kind."""
        int2 = sum(t.numel() * t.element_size() for pools in self._int2_pools for p in pools.values()
                   for t in (p.codes, p.scale, p.zero))
        out = {"bf16": 2 * self.bf16_k.numel() * self.bf16_k.element_size(), "int2": int2}
        return out | ({"window": 2 * self.win_k.numel() * self.win_k.element_size()} if self.sliding else {})
