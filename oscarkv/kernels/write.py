"""Write path: rotate → center → BF16 → clip → quantize → pack → store, fused (DESIGN.md §2, §4).

Algorithm, one program per (block of BLOCK_T tokens, KV head h)::

    x    = source rows [BLOCK_T, d] (fp32)            new tokens, or the BF16 page being demoted
    if ROTATE:  x = bf16_rne((x - mu[h]) @ R[h])      fp32 dot (IEEE), round-to-nearest-even
    store x as BF16 at the token's BF16 slot           (slot < 0: not stored in that tier)
    if STORE_INT2, per group of G channels (the spec of oscarkv.quant.int2 / quant.clip):
        tau  = floor(c G)-th smallest |x|  (tl.sort);  x = clamp(x, -tau, tau)
        s    = fp16((max - min) / Q),  m = fp16(min)   (Q = 2^BITS - 1; IEEE division, as PyTorch)
        code = clamp(floor((x - m) / s + 0.5), 0, Q),  0 where s == 0
               (LEVELS, a 2-bit level table: v = (x - m) / s + 0.5, code = [v >= B0] + [v >= B1] + [v >= B2]
                with the table's fp32 boundaries, oscarkv.quant.int2.boundaries)
        byte j of the group = c[j] | c[j + G/4] << 2 | c[j + G/2] << 4 | c[j + 3G/4] << 6 with c = code
        (BITS = 2), or two planes c = code & 3 at bytes [0, d/4), c = code >> 2 at [d/4, d/2) (BITS = 4)
        store codes, s, m at the token's INT2 slot

``demote_layers`` runs the demotion of one page list in every layer of the pools at once (the
pools' leading layer dimension flattened into the page dimension): one launch per distinct
clip rank and level table — one for every built-in method — instead of one per layer.

``store_kv`` is the engine's BF16 write of K and V that are already in the stored domain
(``TritonAttention.write``): round to BF16 (nearest even, as ``Tensor.to``) and scatter to the
slots, K and V in one launch, rows read through their strides (views of the fused qkv
projection).

Sources are addressed like pools: row ``t`` lives at ``src_slot[t] // SRC_P`` (page),
``% SRC_P`` (offset), so new tokens ``x [T, H, d]`` are a pool of one-token pages and a
demotion reads BF16 pages directly. Destination slots are flat ``page * P + offset``.

Bit-exactness: from the BF16 rotated values on, every operation is the spec's, in the same
fp32 order (IEEE division via ``div_rn``, fp16 rounding to nearest even), so the INT2 bytes
equal ``TensorCodec.encode`` of the stored BF16 values bit for bit (demotion included). The
rotation itself is an fp32 matmul whose summation order differs from PyTorch's, so a rotated
value may differ from ``rotate_ref`` by an fp32 rounding, i.e. at most one BF16 ulp at a tie.

Memory layout: x ``[T, H, d]`` any float dtype; rotation ``[H, d, d]`` fp32; mean ``[H, d]``
fp32; BF16 pool ``[N, H, P, d]``; INT2 pool codes ``[N, H, P, d/4]`` uint8, scale/zero
``[N, H, P, d/G]`` fp16 (see ``oscarkv.cache.paged_layout``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from oscarkv.cache.paged_layout import Int2Pages, device_tensor
from oscarkv.quant.clip import clip_rank
from oscarkv.quant.codec import TensorCodec
from oscarkv.quant.int2 import boundaries


@triton.jit
def _round_bf16(x):
    """fp32 → the nearest-even BF16 value, kept in fp32 (exact on GPU and in the interpreter)."""
    u = x.to(tl.uint32, bitcast=True)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _pack2(c, BLOCK_T: tl.constexpr, NG: tl.constexpr, L: tl.constexpr, D: tl.constexpr):
    """2-bit codes int32 [BLOCK_T, NG, G] → the INT2 packing [BLOCK_T, D/4] uint8."""
    shift = 2 * tl.arange(0, 4)
    packed = tl.sum(tl.reshape(c, [BLOCK_T, NG, 4, L]) << shift[None, None, :, None], 2)  # [BLOCK_T, NG, L]
    return tl.reshape(packed, [BLOCK_T, D // 4]).to(tl.uint8)


@triton.jit
def _encode_inner(x, B0, B1, B2, BLOCK_T: tl.constexpr, D: tl.constexpr, G: tl.constexpr, CLIP_K: tl.constexpr,
                  BITS: tl.constexpr, LEVELS: tl.constexpr):
    """Rotated fp32 rows [BLOCK_T, D] → packed planes (low, high) [BLOCK_T, D/4] uint8 (the high plane is
    the low one again for BITS = 2), scale, zero [BLOCK_T, D/G] fp32; ``LEVELS``: 2-bit codes against the
    level table's boundaries ``B0 < B1 < B2`` (fp32 scalars)."""
    NG: tl.constexpr = D // G
    L: tl.constexpr = G // 4
    xg = tl.reshape(x, [BLOCK_T, NG, G])
    if CLIP_K < G:
        ranked = tl.sort(tl.abs(xg), 2)
        pick = (tl.arange(0, G) == CLIP_K - 1)[None, None, :]
        tau = tl.sum(tl.where(pick, ranked, 0.0), 2)[:, :, None]
        xg = tl.minimum(tl.maximum(xg, -tau), tau)
    lo = tl.min(xg, 2)
    hi = tl.max(xg, 2)
    QMAX: tl.constexpr = (1 << BITS) - 1
    s = tl.math.div_rn(hi - lo, tl.full(lo.shape, QMAX, tl.float32)).to(tl.float16).to(tl.float32)
    m = lo.to(tl.float16).to(tl.float32)
    pos = (s > 0)[:, :, None]
    y = tl.math.div_rn(xg - m[:, :, None], tl.where(pos, s[:, :, None], 1.0))
    if LEVELS:
        v = y + 0.5
        code = (v >= B0).to(tl.int32) + (v >= B1).to(tl.int32) + (v >= B2).to(tl.int32)
        code = tl.where(pos, code, 0)
    else:
        code = tl.minimum(tl.maximum(tl.floor(y + 0.5), 0.0), QMAX)
        code = tl.where(pos, code, 0.0).to(tl.int32)
    low = _pack2(code & 3, BLOCK_T, NG, L, D)
    high = low
    if BITS == 4:
        high = _pack2(code >> 2, BLOCK_T, NG, L, D)
    return low, high, s, m


@triton.jit
def _write_kernel(X, SrcSlots, R, Mu, Bf, BfSlots, Codes, Scale, Zero, InSlots, T, B0, B1, B2,
                  stride_xp, stride_xh, stride_xt, stride_rh, stride_muh,
                  stride_bp, stride_bh, stride_bt, stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st,
                  D: tl.constexpr, G: tl.constexpr, SRC_P: tl.constexpr, P: tl.constexpr, BLOCK_T: tl.constexpr,
                  ROTATE: tl.constexpr, CENTER: tl.constexpr, STORE_BF16: tl.constexpr, STORE_INT2: tl.constexpr,
                  CLIP_K: tl.constexpr, BITS: tl.constexpr, LEVELS: tl.constexpr):
    h = tl.program_id(1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = t < T
    cols = tl.arange(0, D)
    src = tl.load(SrcSlots + t, mask=live, other=0).to(tl.int64)
    xrow = (src // SRC_P) * stride_xp + h * stride_xh + (src % SRC_P) * stride_xt
    x = tl.load(X + xrow[:, None] + cols[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    if ROTATE:
        if CENTER:
            x -= tl.load(Mu + h * stride_muh + cols)[None, :]
        r = tl.load(R + h * stride_rh + cols[:, None] * D + cols[None, :])
        x = _round_bf16(tl.dot(x, r, input_precision="ieee"))
    if STORE_BF16:
        dst = tl.load(BfSlots + t, mask=live, other=-1)
        ok = live & (dst >= 0)
        drow = (dst // P).to(tl.int64) * stride_bp + h * stride_bh + (dst % P) * stride_bt
        tl.store(Bf + drow[:, None] + cols[None, :], x.to(Bf.dtype.element_ty), mask=ok[:, None])
    if STORE_INT2:
        low, high, s, m = _encode_inner(x, B0, B1, B2, BLOCK_T, D, G, CLIP_K, BITS, LEVELS)
        dst = tl.load(InSlots + t, mask=live, other=-1)
        ok = live & (dst >= 0)
        page = (dst // P).to(tl.int64)
        crow = page * stride_cp + h * stride_ch + (dst % P) * stride_ct
        srow = page * stride_sp + h * stride_sh + (dst % P) * stride_st
        tl.store(Codes + crow[:, None] + tl.arange(0, D // 4)[None, :], low, mask=ok[:, None])
        if BITS == 4:
            tl.store(Codes + crow[:, None] + D // 4 + tl.arange(0, D // 4)[None, :], high, mask=ok[:, None])
        grp = tl.arange(0, D // G)
        tl.store(Scale + srow[:, None] + grp[None, :], s.to(tl.float16), mask=ok[:, None])
        tl.store(Zero + srow[:, None] + grp[None, :], m.to(tl.float16), mask=ok[:, None])


@triton.jit
def _store_kv_kernel(K, V, Kp, Vp, Slots, T, stride_kt, stride_kh, stride_vt, stride_vh, stride_p, stride_h, stride_t,
                     D: tl.constexpr, P: tl.constexpr, BLOCK_T: tl.constexpr):
    h = tl.program_id(1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, D)
    dst = tl.load(Slots + t, mask=t < T, other=-1)
    ok = (t < T) & (dst >= 0)
    drow = (dst // P).to(tl.int64) * stride_p + h * stride_h + (dst % P) * stride_t
    if tl.program_id(2) == 0:  # grid axis 2: K, then V
        # NOTE: distinct names per branch: K and V may differ in dtype (an OSCAR decode step passes fp32
        # rotated keys and the bf16 values of the projection), and Triton merges a name set in both branches
        xk = tl.load(K + (t.to(tl.int64) * stride_kt + h * stride_kh)[:, None] + cols[None, :], mask=ok[:, None])
        tl.store(Kp + drow[:, None] + cols[None, :], xk.to(Kp.dtype.element_ty), mask=ok[:, None])
    else:
        xv = tl.load(V + (t.to(tl.int64) * stride_vt + h * stride_vh)[:, None] + cols[None, :], mask=ok[:, None])
        tl.store(Vp + drow[:, None] + cols[None, :], xv.to(Vp.dtype.element_ty), mask=ok[:, None])


def _launch(x, src_slots, src_page: int, codec: TensorCodec, rotate: bool, bf16_pool, bf16_slots, int2_pool, int2_slots):
    n = src_slots.shape[0]
    _, h, p, d = bf16_pool.shape
    dev = bf16_pool.device
    assert x.stride(-1) == 1 and bf16_pool.stride(-1) == 1 and bf16_pool.dtype == torch.bfloat16
    for s in (src_slots, bf16_slots, int2_slots):
        assert s is None or (s.dtype == torch.int32 and s.shape == (n,) and s.is_contiguous() and s.device == dev)
    rot = codec.rotation if rotate and codec.rotation is not None else None
    mu = codec.mean if rotate and codec.mean is not None else None
    for t in (rot, mu):
        assert t is None or (t.dtype == torch.float32 and t.is_contiguous() and t.device == dev), \
            "codec rotation/mean must be fp32, contiguous, on the pools' device"
    assert rot is None or rot.shape == (h, d, d)
    assert mu is None or mu.shape == (h, d)
    store_int2 = int2_pool is not None
    g = codec.group
    if store_int2:
        assert codec.bits == int2_pool.bits and not codec.per_channel and int2_pool.group == g
        assert int2_pool.codes.shape[1:] == (h, p, d * codec.bits // 8)
        assert int2_pool.scale.stride() == int2_pool.zero.stride()
    k = clip_rank(codec.clip, g) if codec.clip is not None else g
    codes = int2_pool.codes if store_int2 else bf16_pool
    scale = int2_pool.scale if store_int2 else bf16_pool
    zero = int2_pool.zero if store_int2 else bf16_pool
    block_t = 16 if dev.type == "cuda" else 8
    levels = store_int2 and codec.levels is not None
    bounds = boundaries(codec.levels) if levels else (0.0, 0.0, 0.0)
    _write_kernel[(triton.cdiv(n, block_t), h)](
        x, src_slots, rot if rot is not None else x, mu if mu is not None else x, bf16_pool,
        bf16_slots if bf16_slots is not None else src_slots, codes, scale, zero,
        int2_slots if int2_slots is not None else src_slots, n, *bounds,
        x.stride(0), x.stride(1), x.stride(2) if src_page > 1 else 0,
        rot.stride(0) if rot is not None else 0, mu.stride(0) if mu is not None else 0,
        *bf16_pool.stride()[:3], *codes.stride()[:3], *scale.stride()[:3],
        D=d, G=g, SRC_P=src_page, P=p, BLOCK_T=block_t, ROTATE=rot is not None, CENTER=mu is not None,
        STORE_BF16=bf16_slots is not None, STORE_INT2=store_int2, CLIP_K=k, BITS=codec.bits or 2, LEVELS=levels,
        num_warps=4)


def write_tokens(x: torch.Tensor, codec: TensorCodec, bf16_pool: torch.Tensor, bf16_slots: torch.Tensor,
                 int2_pool: Int2Pages | None = None, int2_slots: torch.Tensor | None = None) -> None:
    """New tokens ``x [T, H, d]`` (post-RoPE, original domain) into their tiers, in place.

    Same contract as :func:`oscarkv.kernels.reference.write_ref`: slots are int32 ``[T]``,
    ``page * P + offset``, ``-1`` where the token is not stored in that tier."""
    t, h, d = x.shape
    assert bf16_pool.shape[1:] == (h, bf16_pool.shape[2], d), f"x {tuple(x.shape)} vs pool {tuple(bf16_pool.shape)}"
    src = torch.arange(t, dtype=torch.int32, device=x.device)
    _launch(x, src, 1, codec, True, bf16_pool, bf16_slots, int2_pool if int2_slots is not None else None, int2_slots)


def demote_pages(bf16_pool: torch.Tensor, src_pages: torch.Tensor, int2_pool: Int2Pages,
                 dst_pages: torch.Tensor, codec: TensorCodec) -> None:
    """Encode full BF16 pages ``src_pages int32 [n]`` into INT2 pages ``dst_pages int32 [n]``, in place."""
    demote_layers(bf16_pool[None], src_pages, Int2Pages(*(t[None] for t in (int2_pool.codes, int2_pool.scale,
                                                                           int2_pool.zero)), int2_pool.bits), dst_pages, [codec])


def demote_layers(bf16_pools: torch.Tensor, src_pages: torch.Tensor, int2_pools: Int2Pages,
                  dst_pages: torch.Tensor, codecs: Sequence[TensorCodec]) -> None:
    """:func:`demote_pages` in every layer: ``bf16_pools [L, N, H, P, d]``, ``int2_pools`` with
    a leading ``L`` too, ``codecs[l]`` layer ``l``'s. One launch per distinct clip rank and level table."""
    L, n, h, p, d = bf16_pools.shape
    n_int2 = int2_pools.codes.shape[1]
    assert len(codecs) == L and src_pages.shape == dst_pages.shape and src_pages.dtype == dst_pages.dtype == torch.int32
    # NOTE: the BF16 pages may be a head range's strided view (a per-head split, ``KVPools.parts``): read by strides
    assert (L == 1 or bf16_pools.stride(0) == n * bf16_pools.stride(1)) and bf16_pools.stride(-1) == 1
    assert all(t.is_contiguous() and t.shape[0] == L for t in (int2_pools.codes, int2_pools.scale, int2_pools.zero))
    flat_int2 = Int2Pages(*(t.flatten(0, 1) for t in (int2_pools.codes, int2_pools.scale, int2_pools.zero)), int2_pools.bits)
    dev = bf16_pools.device
    offs = torch.arange(p, dtype=torch.int32, device=dev)
    by_rank: dict[tuple, list[int]] = {}
    for i, c in enumerate(codecs):
        by_rank.setdefault((clip_rank(c.clip, c.group) if c.clip is not None else c.group, c.levels), []).append(i)
    for layers in by_rank.values():
        ls = (torch.arange(L, dtype=torch.int32, device=dev) if len(layers) == L
              else device_tensor(layers, dev))[:, None, None]  # [l, 1, 1]
        src = ((ls * n + src_pages[None, :, None]) * p + offs).reshape(-1)  # flat slots of [L N, H, P, d]
        dst = ((ls * n_int2 + dst_pages[None, :, None]) * p + offs).reshape(-1)
        _launch(bf16_pools.flatten(0, 1), src, p, codecs[layers[0]], False, bf16_pools.flatten(0, 1), None,
                flat_int2, dst)


def store_kv(k: torch.Tensor, v: torch.Tensor, bf16_k: torch.Tensor, bf16_v: torch.Tensor, slots: torch.Tensor) -> None:
    """Stored-domain ``k, v [T, H, d]`` (any float dtypes, not necessarily the same; rows may be strided) → BF16
    pools ``[N, H, P, d]`` at flat slots ``int32 [T]`` (``< 0``: skipped), rounded to nearest even."""
    t, h, d = k.shape
    assert v.shape == k.shape and k.stride(2) == v.stride(2) == 1, f"k {tuple(k.shape)} {k.stride()}, v {v.stride()}"
    assert bf16_k.shape[1:] == (h, bf16_k.shape[2], d) and bf16_k.stride() == bf16_v.stride() and bf16_k.stride(3) == 1
    assert bf16_k.dtype == bf16_v.dtype == torch.bfloat16
    assert slots.dtype == torch.int32 and slots.shape == (t,) and slots.is_contiguous()
    block_t = 16 if k.device.type == "cuda" else 8
    _store_kv_kernel[(triton.cdiv(t, block_t), h, 2)](
        k, v, bf16_k, bf16_v, slots, t, k.stride(0), k.stride(1), v.stride(0), v.stride(1), *bf16_k.stride()[:3],
        D=d, P=bf16_k.shape[2], BLOCK_T=block_t, num_warps=4)
