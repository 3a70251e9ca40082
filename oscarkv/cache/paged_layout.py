"""The paged mixed-precision KV layout shared by the engine's pools and the attention kernels.

This module is the contract between ``oscarkv.cache`` (who allocates pages and fills them),
``oscarkv.engine`` (who builds the per-step page tables) and ``oscarkv.kernels`` (who reads
them): it holds only the tensor containers and their invariants, no behaviour.

Geometry (DESIGN.md §3): page size ``P`` tokens, KV heads ``H``, head_dim ``d``, quantization
group ``G``. Every page id addresses the same page in every layer (pools carry a leading
layer dimension), and page 0 of each pool is a scratch page that no sequence owns (CUDA graph
padding rows point their tables at it).

Pools (one per tier kind, all layers):

    BF16 pool   k, v         bfloat16 [L, N_bf16, H, P, d]       rotated and centered values
    INT2 pool   k/v.codes    uint8    [L, N_int2, H, P, d·b // 8]  quant.int2 packing per token
                k/v.scale    float16  [L, N_int2, H, P, d // G]
                k/v.zero     float16  [L, N_int2, H, P, d // G]

The "INT2" pool is the low-bit history tier: ``b`` (``Int2Pages.bits``) is 2, or 4 for a 4-bit
kind of the precision ladder (K4V2, K2V4, INT4), chosen per kind, so K and V codes may differ in
width (and strides). A 4-bit row is two INT2 planes, low bits then high bits (``quant.int2``):
kernels read it as two INT2 rows, the second at byte offset ``d / 4`` with scale ``4s``, zero 0.
A 2-bit kind may carry a non-uniform level table (``Int2Pages.levels``, per layer, from the codec:
``oscarkv.quant.int2``): its readers then take code ``c`` as ``levels[c]`` steps of the scale.
A per-head key allocation splits a layer's history into two head ranges at their own bits (``LayerKV.split``,
:meth:`LayerKV.ranges`); the BF16 pools stay whole.

Pages are head-major (``[H, P, ...]``) so one KV head's page is one contiguous block: a decode
program serving a KV head streams it once.

What is stored: keys ``(k - mu_K) @ R_K`` and values ``(v - mu_V) @ R_V`` per KV head
(``oscarkv.quant.codec.TensorCodec.to_rotated``) rounded to BF16; an INT2 page holds
``TensorCodec.encode`` of those BF16 values (the HF cache's demotion source, so the engine
and ``OscarCache`` store the same bytes). Attention therefore takes the query rotated as
``q @ R_K`` (per KV head group); the centering shifts every logit of one query by the same
amount, which softmax ignores. Outputs are in the rotated, centered value domain: the model
adds ``mu_V @ R_V`` back and maps through ``R_Vᵀ`` (folded into ``o_proj`` by the engine).

Per-sequence tables (:class:`PageTables`, a batch of ``B`` sequences):

* ``bf16_table int32 [B, Mb]``: the sequence's BF16 pages in slot order, **sink pages first,
  then recent-window pages**; ``bf16_lens int32 [B]`` tokens. Invariant: every listed page is
  full except the last one, so the BF16 tokens are exactly the first ``bf16_lens`` slots in
  table order. (Sink length is a multiple of ``P`` — the engine validates ``sink % P == 0`` —
  and the recent window starts on a page boundary.)
* ``int2_table int32 [B, Mi]``: history pages, all full; ``int2_lens int32 [B]`` is a multiple
  of ``P``.
* Unused table entries are 0 (the scratch page) and are never read past the lengths.

Decode attention is permutation invariant over keys (RoPE is already applied and there is no
causal mask inside the cache), so only the set of cached tokens matters, not their order
across tiers. Extend/prefill attention adds the current chunk's own K/V at full precision,
causal within the chunk, every cached token visible to every chunk query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Int2Pages:
    """One tensor kind (K or V) of the low-bit history pool, one layer: ``[N_int2, H, P, ...]``."""

    codes: torch.Tensor  # uint8 [N, H, P, d * bits // 8]: INT2 packing, or two INT2 planes for 4 bits
    scale: torch.Tensor  # float16 [N, H, P, d // G]
    zero: torch.Tensor  # float16 [N, H, P, d // G]
    bits: int = 2
    levels: tuple[float, float, float, float] | None = None  # 2-bit level table (0, l1, l2, 3); None: uniform

    @property
    def group(self) -> int:
        """Quantization group ``G`` implied by the shapes."""
        return self.codes.shape[-1] * 8 // self.bits // self.scale.shape[-1]


@dataclass(frozen=True)
class HeadSplit:
    """The second head range of a layer a per-head allocation splits (``oscarkv.cache.kv_pools.HeadPart``): KV heads
    ``[head, H)`` read their history from these pages (``[N_int2, H - head, P, ...]``, other bits), heads
    ``[0, head)`` from the layer view's own ``int2_k``/``int2_v``."""

    head: int
    int2_k: Int2Pages
    int2_v: Int2Pages


@dataclass(frozen=True)
class LayerKV:
    """One layer's view of the pools, as the attention kernels take it."""

    bf16_k: torch.Tensor  # bfloat16 [N_bf16, H, P, d]
    bf16_v: torch.Tensor  # bfloat16 [N_bf16, H, P, d]
    int2_k: Int2Pages | None  # None for a BF16-only cache (kv=bf16)
    int2_v: Int2Pages | None
    split: HeadSplit | None = None
    """A per-head split's second range (then ``int2_k``/``int2_v`` hold only the first range's heads). The decode
    kernel and the staged prefill read such a view whole; the other routes take :meth:`ranges` one by one."""

    def ranges(self) -> list[tuple[int, int, LayerKV]]:
        """``(lo, hi, view)`` of each head range: the whole layer, or a per-head split's two (each view its heads'
        BF16 pages, strided, and its own history)."""
        h = self.bf16_k.shape[1]
        if self.split is None:
            return [(0, h, self)]
        s = self.split.head
        return [(0, s, LayerKV(self.bf16_k[:, :s], self.bf16_v[:, :s], self.int2_k, self.int2_v)),
                (s, h, LayerKV(self.bf16_k[:, s:], self.bf16_v[:, s:], self.split.int2_k, self.split.int2_v))]

    @property
    def page_size(self) -> int:
        return self.bf16_k.shape[2]


@dataclass(frozen=True)
class PageTables:
    """Which pages each sequence of a batch reads (see the module docstring)."""

    bf16_table: torch.Tensor  # int32 [B, Mb]
    bf16_lens: torch.Tensor  # int32 [B]
    int2_table: torch.Tensor  # int32 [B, Mi] (Mi may be 0)
    int2_lens: torch.Tensor  # int32 [B], multiples of P
    host_lens: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    """``(bf16_lens, int2_lens)`` as host ints when the builder has them (the model runner does), so that a
    launcher sizing work by them needs no device sync; ``None``: read from the tensors."""

    def lens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(bf16_lens, int2_lens)`` on the host (``host_lens``, else one read of the tensors)."""
        return self.host_lens or (tuple(self.bf16_lens.tolist()), tuple(self.int2_lens.tolist()))

    def select(self, rows: list[int]) -> PageTables:
        """The tables of sequences ``rows`` only, in that order."""
        idx = device_tensor(rows, self.bf16_table.device, torch.long)
        host = self.host_lens and tuple(tuple(x[r] for r in rows) for x in self.host_lens)
        return PageTables(self.bf16_table[idx], self.bf16_lens[idx], self.int2_table[idx], self.int2_lens[idx], host)


def device_tensor(values: list, device: torch.device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """``values`` as a ``dtype`` device tensor without waiting for the device.

    NOTE: ``torch.tensor(values, device=cuda)`` synchronizes the stream after its copy, which
    would wait for a step still running (the engine overlaps steps, ``LLMEngine.step``); a pinned
    tensor from PyTorch's caching host allocator is not reused before its copy has read it."""
    t = torch.tensor(values, dtype=dtype)
    if device.type != "cuda" or not t.numel():  # nothing to copy: no wait either
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
