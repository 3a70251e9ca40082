"""PyTorch oracles for the paged attention kernels and the write path (fp32 math, CPU-friendly).

Every Triton kernel in ``oscarkv.kernels`` is tested against one function here. They read the
paged layout of :mod:`oscarkv.cache.paged_layout` (the contract) directly and favour clarity
over speed: one sequence at a time, the cache gathered into a dense fp32 tensor, the INT2 pages
dequantized with :func:`oscarkv.quant.int2.dequantize` and the pool's level table (never a second copy
of the format).

Conventions shared with the kernels:

* Query head ``i`` belongs to KV head ``i // (Hq // Hkv)`` (the ``repeat_kv`` order of HF models).
* Queries arrive already rotated (``q @ R_K`` per KV-head group) and already RoPE'd; ``scale``
  is the softmax scale (usually ``d ** -0.5``). Outputs are fp32, in the rotated, centered
  value domain, exactly as stored.
* Decode attention sees every cached token of its sequence (no mask: the cache holds only the
  past). Extend attention adds the current chunk at full precision, causal inside the chunk.
* Write path (DESIGN.md §4): ``x`` (post-RoPE keys or values, original domain) →
  ``codec.to_rotated`` (center, rotate) → BF16 → optionally ``codec.encode`` (clip, quantize,
  pack) → stored at flat *slots* ``page * P + offset``; a slot ``< 0`` means "not stored in this
  tier". INT2 pages are always encoded from the BF16-rounded rotated values, so demoting a
  recent page later yields the same bytes as encoding the token directly.
"""

from __future__ import annotations

import torch

from oscarkv.cache.paged_layout import Int2Pages, LayerKV, PageTables
from oscarkv.quant.codec import TensorCodec
from oscarkv.quant.int2 import Packed, dequantize


# ------------------------------------------------------------------------------ gathering
def _bf16_tokens(pool: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """First ``n`` tokens of the BF16 pages ``table`` of ``pool [N, H, P, d]`` → fp32 ``[H, n, d]``."""
    p = pool.shape[2]
    pages = table[: (n + p - 1) // p].long()
    x = pool[pages].float()  # [n_pages, H, P, d]
    return x.permute(1, 0, 2, 3).reshape(x.shape[1], -1, x.shape[3])[:, :n]


def _int2_tokens(pool: Int2Pages, table: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` tokens (a multiple of P) of INT2 pages ``table`` dequantized → fp32 ``[H, n, d]``."""
    p = pool.codes.shape[2]
    assert n % p == 0, f"INT2 length {n} is not a multiple of the page size {p}"
    pages = table[: n // p].long()
    packed = Packed(pool.codes[pages], pool.scale[pages], pool.zero[pages])
    x = dequantize(packed, pool.bits, pool.group, pool.levels)  # [n_pages, H, P, d]
    return x.permute(1, 0, 2, 3).reshape(x.shape[1], -1, x.shape[3])


def gather_sequence(kv: LayerKV, tables: PageTables, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All cached K and V of sequence ``b`` as fp32 ``[H, n, d]`` (BF16 tokens, then INT2 history).

    The order across tiers is irrelevant to attention (see the layout contract)."""
    nb, ni = int(tables.bf16_lens[b]), int(tables.int2_lens[b])
    ks = [_bf16_tokens(kv.bf16_k, tables.bf16_table[b], nb)]
    vs = [_bf16_tokens(kv.bf16_v, tables.bf16_table[b], nb)]
    if ni:
        assert kv.int2_k is not None and kv.int2_v is not None, "INT2 tokens listed for a BF16-only cache"
        ks.append(_int2_tokens(kv.int2_k, tables.int2_table[b], ni))
        vs.append(_int2_tokens(kv.int2_v, tables.int2_table[b], ni))
    return torch.cat(ks, 1), torch.cat(vs, 1)


# ------------------------------------------------------------------------------ attention
def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """GQA attention: ``q [T, Hq, d]``, ``k/v [H, n, d]``, ``mask bool [T, n]`` (True = visible) → ``[T, Hq, d]``.

    NOTE: fp32 softmax(q·kᵀ·scale)·v through PyTorch's fused attention (query head ``i`` reads
    KV head ``i // (Hq / H)``); on a CPU it is several times faster than the unfused einsum,
    mask and softmax it computes exactly (the long-context evaluation runs through it)."""
    t, hq, d = q.shape
    h = k.shape[0]
    qh = q.float().permute(1, 0, 2)[None]  # [1, Hq, T, d]: 4-D reaches the fused CPU kernel
    kh, vh = k.repeat_interleave(hq // h, 0)[None], v.repeat_interleave(hq // h, 0)[None]  # [1, Hq, n, d]
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out[0].permute(1, 0, 2)


def banded_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                     window: int) -> torch.Tensor:
    """Dense fp32 causal GQA attention of whole sequences (``query [B, Hq, T, d]``, ``key/value [B, H, T, d]``,
    positions from 0) in which query ``p`` reads keys ``p - window < k <= p`` (a sliding-window layer;
    calibration and the decode-faithful evaluation run it) → ``[B, Hq, T, d]``."""
    i = torch.arange(query.shape[2], device=query.device)
    mask = (i[None] <= i[:, None]) & (i[None] > i[:, None] - window)  # [T, T]
    return torch.nn.functional.scaled_dot_product_attention(query.float(), key.float(), value.float(), attn_mask=mask,
                                                            scale=scaling, enable_gqa=True)


def decode_attention_ref(q: torch.Tensor, kv: LayerKV, tables: PageTables, scale: float) -> torch.Tensor:
    """One query token per sequence over its whole mixed cache: ``q [B, Hq, d]`` → fp32 ``[B, Hq, d]``.

    A sequence with no cached token gets a zero output."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        k, v = gather_sequence(kv, tables, b)
        if k.shape[1]:
            out[b] = _attend(q[b : b + 1], k, v, None, scale)[0]
    return out


def extend_attention_ref(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: LayerKV,
                         tables: PageTables, cu_seqlens: torch.Tensor, scale: float,
                         window: int | None = None) -> torch.Tensor:
    """Prefill/extend attention: each chunk sees its cached prefix and itself causally.

    ``q [T, Hq, d]``, ``k_new/v_new [T, H, d]`` (rotated, centered, full precision), chunk ``b``
    is rows ``cu_seqlens[b]:cu_seqlens[b+1]`` → fp32 ``[T, Hq, d]``.

    ``window = W``: a sliding-window layer (``oscarkv.cache.window``): each sequence's cached tokens are
    consecutive positions in table order (BF16 pages only) and its chunk follows them; query ``p`` sees
    key ``k`` only if ``p - W < k <= p``."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b in range(len(cu_seqlens) - 1):
        lo, hi = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        if hi == lo:
            continue
        kc, vc = gather_sequence(kv, tables, b)
        k = torch.cat([kc, k_new[lo:hi].float().transpose(0, 1)], 1)  # [H, n + c, d]
        v = torch.cat([vc, v_new[lo:hi].float().transpose(0, 1)], 1)
        n, c = kc.shape[1], hi - lo
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        mask = torch.cat([torch.ones(c, n, dtype=torch.bool, device=q.device), causal], 1)  # [c, n + c]
        if window is not None:
            key_pos = torch.arange(n + c, device=q.device)  # positions relative to the first cached token
            mask &= key_pos[None] > (n + torch.arange(c, device=q.device))[:, None] - window
        out[lo:hi] = _attend(q[lo:hi], k, v, mask, scale)
    return out


# ------------------------------------------------------------------------------ write path
def rotate_ref(x: torch.Tensor, codec: TensorCodec) -> torch.Tensor:
    """Post-RoPE ``x [T, H, d]`` (original domain) → stored BF16 rotated, centered ``[T, H, d]``."""
    return codec.to_rotated(x).to(torch.bfloat16)


def encode_ref(x_rot: torch.Tensor, codec: TensorCodec) -> Packed:
    """BF16 rotated ``[T, H, d]`` → ``Packed`` (codes ``[T, H, d·bits/8]``, scale/zero ``[T, H, d/G]``)."""
    assert x_rot.dtype == torch.bfloat16, "INT2 pages are encoded from the BF16-rounded rotated values"
    return codec.encode(x_rot.float())


def _split_slots(slots: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    keep = slots >= 0
    s = slots[keep].long()
    return keep, s // page, s % page


def write_ref(x: torch.Tensor, codec: TensorCodec, bf16_pool: torch.Tensor, bf16_slots: torch.Tensor,
              int2_pool: Int2Pages | None = None, int2_slots: torch.Tensor | None = None) -> None:
    """Write path for new tokens, in place: rotate → center → BF16 → (clip → quantize → pack) → store.

    ``x [T, H, d]`` post-RoPE keys or values; ``bf16_pool [N, H, P, d]``; ``bf16_slots int32 [T]``
    flat slots ``page * P + offset`` (``-1``: not stored in BF16); likewise ``int2_slots`` into
    ``int2_pool`` (prompt middles go straight to INT2)."""
    rot = rotate_ref(x, codec)  # [T, H, d]
    keep, pg, off = _split_slots(bf16_slots, bf16_pool.shape[2])
    bf16_pool[pg, :, off] = rot[keep]
    if int2_slots is None:
        return
    assert int2_pool is not None
    keep, pg, off = _split_slots(int2_slots, int2_pool.codes.shape[2])
    packed = encode_ref(rot[keep], codec)
    int2_pool.codes[pg, :, off] = packed.codes
    int2_pool.scale[pg, :, off] = packed.scale
    int2_pool.zero[pg, :, off] = packed.zero


def demote_ref(bf16_pool: torch.Tensor, src_pages: torch.Tensor, int2_pool: Int2Pages,
               dst_pages: torch.Tensor, codec: TensorCodec) -> None:
    """Demotion, in place: encode full BF16 pages ``src_pages [n]`` into INT2 pages ``dst_pages [n]``."""
    src = bf16_pool[src_pages.long()]  # [n, H, P, d] bf16
    packed = encode_ref(src, codec)  # encode works on any leading dims
    dst = dst_pages.long()
    int2_pool.codes[dst] = packed.codes
    int2_pool.scale[dst] = packed.scale
    int2_pool.zero[dst] = packed.zero
