"""The pool bundles every attention kernel takes: one tuple per tier, built here, read by small helpers.

A kernel argument per pointer and stride grew every signature with every cache format (the decode kernels
took 55 arguments). Instead each tier of :class:`oscarkv.cache.paged_layout.LayerKV` travels as one tuple,
built by one function here and unpacked only by the helpers that read that tier:

    window  = (K, V, (stride_page, stride_head, stride_token))             BF16 sink + recent pools
    new     = (K, V, (K's stride_t, stride_h), (V's))                       a chunk's own keys and values
    history = (keys, values, (scale strides page, head, token))           INT2 / 4-bit pools
        keys, values = (codes, scale, zero, (code strides page, head, token), (l1, l2))
                       (l1, l2): the interior levels of a 2-bit level table (``levels``; 0.0 without one)
    tables  = (bf16_table, bf16_lens, int2_table, int2_lens, bf16_table row stride, int2_table row stride)

The formats' compile-time facts stay ``constexpr`` keyword arguments (:func:`format_args`: ``KBITS``,
``VBITS``, ``KLEV``, ``VLEV``), so a pool without a table or at 2 bits compiles to the kernel it always
did. A new format adds its fields to its own tuple and its own reader (``decode_int2._key_group``,
``extend._dequant``, ...); the kernels that only pass the tuple on do not change. Scales and zeros of
keys and values share their strides (asserted here), so one scale-row offset serves all four.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oscarkv.cache.paged_layout import Int2Pages, LayerKV, PageTables


def rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x`` (``[T, heads, d]``) as the chunk kernels read it: itself when its channels are contiguous (any row and head
    strides, e.g. a view of the projection's output), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def new_arg(k_new: torch.Tensor, v_new: torch.Tensor) -> tuple:
    """``(K, V, (K's stride_t, stride_h), (V's stride_t, stride_h))`` of a chunk's own keys and values ``[T, H, d]``,
    channels contiguous: views of one projection's output (``qkv[:, a:b]``) go in as they are, no copy."""
    assert k_new.shape == v_new.shape and k_new.stride(-1) == v_new.stride(-1) == 1, (
        "k_new/v_new: [T, H, d] of one shape, channels contiguous")
    return k_new, v_new, tuple(k_new.stride()[:2]), tuple(v_new.stride()[:2])


def window_arg(kv: LayerKV) -> tuple:
    """``(K, V, strides)`` of the BF16 pools ``[N, H, P, d]`` (K and V share strides, channels contiguous)."""
    assert kv.bf16_k.dtype == kv.bf16_v.dtype == torch.bfloat16 and kv.bf16_k.stride() == kv.bf16_v.stride()
    assert kv.bf16_k.stride(3) == 1, "BF16 pools: channels must be contiguous"
    return kv.bf16_k, kv.bf16_v, tuple(kv.bf16_k.stride()[:3])


def _kind(pool: Int2Pages) -> tuple:
    levels = (float(pool.levels[1]), float(pool.levels[2])) if pool.levels is not None else (0.0, 0.0)
    assert pool.levels is None or pool.bits == 2, "level tables are for 2-bit codes"
    return pool.codes, pool.scale, pool.zero, tuple(pool.codes.stride()[:3]), levels


def history_arg(kv: LayerKV) -> tuple:
    """``(keys, values, scale strides)`` of the low-bit pools; for a BF16-only cache the BF16 pools stand in
    (never read: the kernels' ``HAS_INT2`` is off)."""
    assert kv.split is None, "a per-head split layer: attend by head ranges (KVPools.parts), or its decode kernel"
    k2, v2 = kv.int2_k, kv.int2_v
    if k2 is None:
        stand_in = (kv.bf16_k, kv.bf16_k, kv.bf16_k, tuple(kv.bf16_k.stride()[:3]), (0.0, 0.0))
        return stand_in, stand_in, tuple(kv.bf16_k.stride()[:3])
    assert k2.codes.dtype == v2.codes.dtype == torch.uint8 and k2.scale.dtype == k2.zero.dtype == torch.float16
    assert k2.group == v2.group and k2.codes.stride(-1) == v2.codes.stride(-1) == 1
    for a, b in ((k2.scale, v2.scale), (k2.scale, k2.zero), (k2.scale, v2.zero)):
        assert a.stride() == b.stride() and a.stride(-1) == 1, "INT2 K/V scales and zeros must share strides"
    return _kind(k2), _kind(v2), tuple(k2.scale.stride()[:3])


def format_args(kv: LayerKV, suffix: str = "") -> dict:
    """The ``constexpr`` facts of the low-bit formats: bits per kind and whether it reads a level table (``suffix``
    on each name: a split decode's second range, ``KBITS2`` ...)."""
    k2, v2 = kv.int2_k, kv.int2_v
    if k2 is None:
        return {f"KBITS{suffix}": 2, f"VBITS{suffix}": 2}
    return {f"KBITS{suffix}": k2.bits, f"VBITS{suffix}": v2.bits, f"KLEV{suffix}": k2.levels is not None,
            f"VLEV{suffix}": v2.levels is not None}


def tables_arg(tables: PageTables) -> tuple:
    """``(bf16_table, bf16_lens, int2_table, int2_lens, bf16 row stride, int2 row stride)``."""
    for t in (tables.bf16_table, tables.bf16_lens, tables.int2_table, tables.int2_lens):
        assert t.dtype == torch.int32 and t.stride(-1) == 1, "tables: int32 [B, ...], contiguous rows"
    return (tables.bf16_table, tables.bf16_lens, tables.int2_table, tables.int2_lens,
            tables.bf16_table.stride(0), tables.int2_table.stride(0))


@triton.jit
def tier_table(tables, b, INT2: tl.constexpr):
    """Sequence ``b``'s page-id row in the BF16 tier, or the INT2 tier (``INT2``)."""
    bf_table, _, in_table, _, stride_bfb, stride_inb = tables
    if INT2:
        return in_table + b * stride_inb
    else:
        return bf_table + b * stride_bfb


@triton.jit
def tier_length(tables, b, INT2: tl.constexpr):
    """Sequence ``b``'s token count in the BF16 tier, or the INT2 tier (``INT2``)."""
    _, bf_lens, _, in_lens, _, _ = tables
    if INT2:
        return tl.load(in_lens + b)
    else:
        return tl.load(bf_lens + b)


@triton.jit
def tier_rows(tables, b, INT2: tl.constexpr):
    """``(tier_table, tier_length)`` of sequence ``b``."""
    return tier_table(tables, b, INT2), tier_length(tables, b, INT2)


@triton.jit
def new_rows(new, tok, h):
    """Offsets of the chunk's rows ``tok`` (int64 token indices) of KV head ``h`` in its own K and V (``new_arg``)."""
    _, _, k_strides, v_strides = new  # NOTE: one level per statement (Triton 3.6)
    kt, kh = k_strides
    vt, vh = v_strides
    return tok * kt + h * kh, tok * vt + h * vh


@triton.jit
def window_rows(window, page, h, off):
    """Element offsets of tokens (``page``, in-page ``off``) of KV head ``h`` in the BF16 pools."""
    sp, sh, st = window[2]
    return page * sp + h * sh + off * st


@triton.jit
def history_rows(history, page, h, off):
    """Offsets of tokens (``page``, ``off``) of KV head ``h`` in the history: key codes, value codes, scales."""
    keys, values, scale_strides = history
    sp, sh, st = scale_strides
    kp, kh, kt = keys[3]
    vp, vh, vt = values[3]
    return page * kp + h * kh + off * kt, page * vp + h * vh + off * vt, page * sp + h * sh + off * st
