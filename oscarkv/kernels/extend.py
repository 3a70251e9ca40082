"""Prefill/extend attention: a chunk of new tokens over its cached BF16 + INT2 pages and itself.

Algorithm (flash attention over the layout of :mod:`oscarkv.cache.paged_layout`)::

    grid = (B, H, cdiv(max chunk, BLOCK_T))        one program per (sequence, KV head, query block)
    rows = BLOCK_T query tokens × the REP query heads of KV head h  (row r: token r // REP_PAD,
           head r % REP_PAD), so each K/V tile is read once for the whole GQA group
    for the cached BF16 tokens (sink + recent window), BLOCK_N at a time:   flash step, bf16 dots
    for the cached INT2 history, BLOCK_N at a time:
        codes → m + s·code per group, in registers (one tile at a time, never a dense prefix);
        a 4-bit kind reads its two INT2 planes, code = lo + 4·hi; a 2-bit kind with a level table
        (KLEV/VLEV, ``Int2Pages.levels``) m + s·L[code]
    for the chunk's own K/V (full precision), up to the block's last token:  causal mask
    out = acc / l

The cached tokens are all visible to every chunk query (they precede the chunk); tier order
does not matter (see the layout contract). Prefill is compute bound (many query rows per K/V
tile), so the INT2 tile is dequantized per element here rather than with the decode kernel's
raw-code algebra.

Memory layout (strides explicit, innermost dimension contiguous):
    q          [T, Hq, d]        bf16 or fp32 (rounded to bf16 for the dots on the GPU)
    k_new/v_new [T, H, d]        the chunk's rotated, centered K/V (bf16 or fp32)
    cu_seqlens [B + 1] int32     chunk b is rows cu_seqlens[b]:cu_seqlens[b + 1]
    pools, tables                as in :mod:`oscarkv.kernels.decode`
    out        [T, Hq, d]        q's dtype
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oscarkv.cache.paged_layout import LayerKV, PageTables
from oscarkv.kernels.levels import _levels
from oscarkv.kernels.pools import format_args, history_arg, new_arg, new_rows, tables_arg, tier_rows, window_arg

LOG2E = 1.4426950408889634


@triton.jit
def _step(s, v, m_i, l_i, acc, DT: tl.constexpr):
    """Online-softmax step on log2-domain logits ``s [M, N]`` with values ``v [N, D]``."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    acc = tl.dot(p.to(DT), v.to(DT), acc * alpha[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _dequant(kind, crow, srow, ok, cols, G: tl.constexpr, BITS: tl.constexpr, LEV: tl.constexpr):
    """Low-bit tile ``[N, D]`` of one kind (``kind``: its ``pools`` bundle) in natural channel order: m + s·code
    (fp32); a 4-bit code is ``lo + 4·hi`` from two INT2 planes, the high one ``D / 4`` bytes on
    (``oscarkv.quant.int2``); ``LEV``: m + s·L[code] with the kind's 2-bit table ``(0, l1, l2, 3)``."""
    C, S, Z, _, levels = kind
    L1, L2 = levels
    LG: tl.constexpr = G // 4
    D: tl.constexpr = cols.shape[0]
    within = cols % G
    byte = (cols // G) * LG + within % LG
    shift = (2 * (within // LG)).to(tl.uint8)
    c = (tl.load(C + crow[:, None] + byte[None, :], mask=ok[:, None], other=0) >> shift[None, :]) & 3
    if BITS == 4:
        c += ((tl.load(C + D // 4 + crow[:, None] + byte[None, :], mask=ok[:, None], other=0) >> shift[None, :]) & 3) * 4
    s = tl.load(S + srow[:, None] + (cols // G)[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    z = tl.load(Z + srow[:, None] + (cols // G)[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    return z + s * _levels(c, L1, L2, LEV).to(tl.float32)


@triton.jit
def _bf16_cached(q, window, tier, h, cols, qk_scale, state, P: tl.constexpr, BLOCK_N: tl.constexpr,
                 DT: tl.constexpr):
    """The online softmax ``state = (m_i, l_i, acc)`` over the sequence's cached BF16 tokens (``tier``: its page
    row and token count)."""
    Kb, Vb, strides = window
    sp, sh, st = strides
    table, n = tier
    m_i, l_i, acc = state
    n0 = 0
    while n0 < n:
        toks = n0 + tl.arange(0, BLOCK_N)
        ok = toks < n
        page = tl.load(table + toks // P, mask=ok, other=0).to(tl.int64)
        rows = (page * sp + h * sh + (toks % P) * st)[:, None] + cols[None, :]
        k = tl.load(Kb + rows, mask=ok[:, None], other=0.0).to(DT)
        s = tl.where(ok[None, :], tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_i, l_i, acc = _step(s, tl.load(Vb + rows, mask=ok[:, None], other=0.0), m_i, l_i, acc, DT)
        n0 += BLOCK_N
    return m_i, l_i, acc


@triton.jit
def _int2_cached(q, history, tier, h, cols, qk_scale, state, G: tl.constexpr, P: tl.constexpr,
                 BLOCK_N: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, KLEV: tl.constexpr,
                 VLEV: tl.constexpr, DT: tl.constexpr):
    """The online softmax ``state`` over the sequence's INT2 (or 4-bit) history, dequantized tile by tile
    (``_dequant``)."""
    keys, values, scale_strides = history
    sp, sh, st = scale_strides
    kp, kh, kt = keys[3]
    vp, vh, vt = values[3]
    table, n = tier
    m_i, l_i, acc = state
    n0 = 0
    while n0 < n:
        toks = n0 + tl.arange(0, BLOCK_N)
        ok = toks < n
        page = tl.load(table + toks // P, mask=ok, other=0).to(tl.int64)
        # NOTE: pools.history_rows written out, in the order that compiles best (benchmarks.compile_sm90)
        crow = page * kp + h * kh + (toks % P) * kt
        vrow = page * vp + h * vh + (toks % P) * vt
        srow = page * sp + h * sh + (toks % P) * st
        k = _dequant(keys, crow, srow, ok, cols, G, KBITS, KLEV).to(DT)
        s = tl.where(ok[None, :], tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_i, l_i, acc = _step(s, _dequant(values, vrow, srow, ok, cols, G, VBITS, VLEV), m_i, l_i, acc, DT)
        n0 += BLOCK_N
    return m_i, l_i, acc


@triton.jit
def _chunk_causal(q, new, lo, tok, hi, h, cols, qk_scale, state, BLOCK_N: tl.constexpr, DT: tl.constexpr):
    """The online softmax ``state`` over the chunk's own tokens (``new``: ``pools.new_arg``) up to ``hi``, causal
    (row of query position ``tok``)."""
    Kn, Vn, _, _ = new
    m_i, l_i, acc = state
    n0 = 0
    while n0 < hi:
        toks = n0 + tl.arange(0, BLOCK_N)
        ok = toks < hi
        krow, vrow = new_rows(new, (lo + toks).to(tl.int64), h)
        k = tl.load(Kn + krow[:, None] + cols[None, :], mask=ok[:, None], other=0.0).to(DT)
        vis = ok[None, :] & (toks[None, :] <= tok[:, None])
        s = tl.where(vis, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_i, l_i, acc = _step(s, tl.load(Vn + vrow[:, None] + cols[None, :], mask=ok[:, None], other=0.0), m_i, l_i,
                              acc, DT)
        n0 += BLOCK_N
    return m_i, l_i, acc


@triton.jit
def _extend_kernel(Q, new, window, history, tables, CuSeq, Out, qk_scale,
                   REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr, G: tl.constexpr, P: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, HAS_INT2: tl.constexpr, INTERPRET: tl.constexpr,
                   KBITS: tl.constexpr, VBITS: tl.constexpr, KLEV: tl.constexpr = False, VLEV: tl.constexpr = False):
    """``Q``, ``Out`` = ``(tensor, stride_t, stride_h)``; ``new``: ``pools.new_arg``;
    ``window``, ``history``, ``tables``: the bundles of :mod:`oscarkv.kernels.pools`."""
    # NOTE: INTERPRET: while loops and fp32 dots for Triton's CPU interpreter (see decode.py).
    DT: tl.constexpr = tl.float32 if INTERPRET else tl.bfloat16
    BLOCK_M: tl.constexpr = BLOCK_T * REP_PAD
    b = tl.program_id(0)
    h = tl.program_id(1)
    lo = tl.load(CuSeq + b)
    c = tl.load(CuSeq + b + 1) - lo
    t0 = tl.program_id(2) * BLOCK_T
    if t0 < c:
        r = tl.arange(0, BLOCK_M)
        tok = t0 + r // REP_PAD  # chunk-relative query position
        head = h * REP + r % REP_PAD
        live = (tok < c) & (r % REP_PAD < REP)
        cols = tl.arange(0, D)
        qp = Q[0] + (lo + tok)[:, None].to(tl.int64) * Q[1] + head[:, None] * Q[2] + cols[None, :]
        q = tl.load(qp, mask=live[:, None], other=0.0).to(DT)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        state = _bf16_cached(q, window, tier_rows(tables, b, False), h, cols, qk_scale, (m_i, l_i, acc), P, BLOCK_N,
                             DT)
        if HAS_INT2:
            state = _int2_cached(q, history, tier_rows(tables, b, True), h, cols, qk_scale, state, G, P, BLOCK_N,
                                 KBITS, VBITS, KLEV, VLEV, DT)
        m_i, l_i, acc = _chunk_causal(q, new, lo, tok, tl.minimum(c, t0 + BLOCK_T), h, cols, qk_scale, state,
                                      BLOCK_N, DT)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        op = Out[0] + (lo + tok)[:, None].to(tl.int64) * Out[1] + head[:, None] * Out[2] + cols[None, :]
        tl.store(op, o.to(Out[0].dtype.element_ty), mask=live[:, None])


def _config(device: torch.device, rep_pad: int) -> dict:
    """Tiles: about 64 query rows per program (BLOCK_T tokens × the GQA group)."""
    if device.type != "cuda":
        return dict(BLOCK_T=max(1, 16 // rep_pad), BLOCK_N=16, num_warps=4, num_stages=1)
    return dict(BLOCK_T=max(1, 64 // rep_pad), BLOCK_N=64, num_warps=4, num_stages=2)


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: LayerKV, tables: PageTables,
                     cu_seqlens: torch.Tensor, scale: float, max_chunk: int | None = None) -> torch.Tensor:
    """Attention of each chunk's queries over its cached prefix (all visible) and itself (causal).

    ``q [T, Hq, d]``, ``k_new/v_new [T, H, d]`` rotated and centered, ``cu_seqlens int32 [B + 1]``
    → ``[T, Hq, d]`` in ``q``'s dtype; the oracle is ``reference.extend_attention_ref``.
    ``max_chunk`` (longest chunk) avoids a device sync when the caller knows it."""
    t, hq, d = q.shape
    _, h, p, dk = kv.bf16_k.shape
    bsz = cu_seqlens.numel() - 1
    assert dk == d and hq % h == 0 and d >= 16 and d & (d - 1) == 0, f"bad shapes q {tuple(q.shape)} pool {tuple(kv.bf16_k.shape)}"
    assert k_new.shape == (t, h, d)
    assert q.stride(2) == 1 and kv.bf16_k.stride() == kv.bf16_v.stride() and kv.bf16_k.stride(3) == 1
    assert cu_seqlens.dtype == torch.int32 and tables.bf16_lens.shape[0] == bsz
    int2 = kv.int2_k is not None
    g = kv.int2_k.group if int2 else d
    rep = hq // h
    rep_pad = triton.next_power_of_2(rep)
    cfg = _config(q.device, rep_pad)
    max_chunk = max_chunk or int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    out = torch.empty_like(q)
    grid = (bsz, h, triton.cdiv(max(max_chunk, 1), cfg["BLOCK_T"]))
    _extend_kernel[grid](
        (q, q.stride(0), q.stride(1)), new_arg(k_new, v_new), window_arg(kv), history_arg(kv),
        tables_arg(tables), cu_seqlens, (out, out.stride(0), out.stride(1)), scale * LOG2E,
        REP=rep, REP_PAD=rep_pad, D=d, G=g, P=p, BLOCK_T=cfg["BLOCK_T"], BLOCK_N=cfg["BLOCK_N"], HAS_INT2=int2,
        **format_args(kv), INTERPRET=q.device.type != "cuda", num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out
