"""Decode attention over a mixed cache with INT2 history, codes fed raw to the tensor cores.

The kernel of :func:`oscarkv.kernels.decode.decode_attention` for an INT2 cache whose groups
are at least 64 channels wide (``G >= 64``, ``d / G <= 2``: every Qwen/Llama shape at the
default ``G = min(d, 128)``). Same grid, split-K and merge as the generic kernel there.

Algebra (per token t, group g; ``x̂ = m + s·c`` with codes ``c ∈ {0..3}``)::

    q·k̂_t  = Σ_g s_tg (q_g · c_tg) + Σ_g m_tg Σq_g          scale/zero applied after the dot
    Σ_t p_t v̂_t = Σ_t (p_t s_tg) c_tg  +  Σ_t p_t m_tg       (second term per channel group)

so only the code → float conversion is per element. Codes 0..3 are exact in every float
format; the conversion puts a masked code byte into the high byte of an fp16, which is the
fp16 number ``c · 2^-16`` (an fp8-e5m2 → fp16 widening: two ``prmt`` per four codes in inline
PTX, ``CONV = 2``, or Triton's own e5m2 cast, ``CONV = 1``); the factor ``2^16`` is folded
into the key scale and the final output, exactly. Queries and ``p·s`` are fp16 for these
dots (fp16 has 3 more mantissa bits than bf16; the range is ample for rotated queries and
probabilities). The BF16 windows use bf16 dots with ``p · 2^-16`` so one accumulator serves
both tiers.

Column order. Byte ``j`` of a token holds, in bits ``2i..2i+1``, element
``(j // LG) G + i LG + j % LG`` (``LG = G / 4``; ``oscarkv.quant.int2``), so slice ``i`` of group
``g`` is a contiguous run of ``LG`` channels: q, the BF16 windows and the accumulators are
split into ``4 · d/G`` tiles ``[., LG]`` and nothing is permuted. Key codes are loaded as
``[LG, BLOCK_N]`` (bytes × tokens) so that they feed ``tl.dot`` without a transpose, which
lets Triton keep the conversion in the dot-operand layout (no shared-memory round trip of
converted values).

Pipelining. The INT2 history of a split is walked in full tiles of ``BLOCK_N`` tokens (INT2
lengths are multiples of ``P``, ``P % BLOCK_N == 0``, split shares ``BLOCK_N``-aligned), so its
loads carry no masks and every one — codes, scales and zeros — is a vector copy. The page ids
are read ``CHUNK`` tiles at a time before the tile loop (``_chunk_pages``) and picked out of
registers inside it (``_pick``): no load in the loop feeds an address, so Triton issues each
tile's copies ``num_stages - 1`` tiles ahead. (With one page-id load per tile inside the loop
it waited for every copy at the top of each iteration: one tile in flight, H100 SASS,
2026-11-22.)

``CONV = 0`` is the interpreter path (fp32 arithmetic, same ``2^-16`` convention).
"""

from __future__ import annotations

import triton
import triton.language as tl

from oscarkv.kernels.decode import _softmax_step

@triton.jit
def _codes(c, i: tl.constexpr, CONV: tl.constexpr):
    """Slice ``i`` of packed uint8 codes → ``code · 2^-16`` (fp16; fp32 in the interpreter)."""
    if CONV == 0:
        return ((c >> (2 * i)) & 3).to(tl.float32) * (1.0 / 65536.0)
    elif CONV == 1:
        return ((c >> (2 * i)) & 3).to(tl.float8e5, bitcast=True).to(tl.float16)
    else:
        # NOTE: pack=4: $2 holds four code bytes, $0/$1 two fp16 each; prmt puts byte k of the
        # masked word into the high byte of fp16 k (low byte 0), i.e. code_k · 2^-16.
        if i == 0:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 t; and.b32 t, $2, 0x03030303; prmt.b32 $0, 0, t, 0x5140; prmt.b32 $1, 0, t, 0x7362; }",
                "=r,=r,r", [c], dtype=tl.float16, is_pure=True, pack=4)
        elif i == 1:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 t; shr.b32 t, $2, 2; and.b32 t, t, 0x03030303; prmt.b32 $0, 0, t, 0x5140; prmt.b32 $1, 0, t, 0x7362; }",
                "=r,=r,r", [c], dtype=tl.float16, is_pure=True, pack=4)
        elif i == 2:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 t; shr.b32 t, $2, 4; and.b32 t, t, 0x03030303; prmt.b32 $0, 0, t, 0x5140; prmt.b32 $1, 0, t, 0x7362; }",
                "=r,=r,r", [c], dtype=tl.float16, is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 t; shr.b32 t, $2, 6; and.b32 t, t, 0x03030303; prmt.b32 $0, 0, t, 0x5140; prmt.b32 $1, 0, t, 0x7362; }",
                "=r,=r,r", [c], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _group_scores(q0, q1, q2, q3, ckT, CONV: tl.constexpr):
    """Σ_i q_i · c_i for one group: q_i ``[M, LG]``, ``ckT`` uint8 ``[LG, N]`` → fp32 ``[M, N]`` (× 2^-16)."""
    s = tl.dot(q0, _codes(ckT, 0, CONV))
    s = tl.dot(q1, _codes(ckT, 1, CONV), s)
    s = tl.dot(q2, _codes(ckT, 2, CONV), s)
    return tl.dot(q3, _codes(ckT, 3, CONV), s)


@triton.jit
def _group_values(ps, cv, a0, a1, a2, a3, alpha, CONV: tl.constexpr):
    """Rescale the four slice accumulators of one group and add ``ps @ c_i`` (``cv`` uint8 ``[N, LG]``)."""
    a0 = tl.dot(ps, _codes(cv, 0, CONV), a0 * alpha[:, None])
    a1 = tl.dot(ps, _codes(cv, 1, CONV), a1 * alpha[:, None])
    a2 = tl.dot(ps, _codes(cv, 2, CONV), a2 * alpha[:, None])
    a3 = tl.dot(ps, _codes(cv, 3, CONV), a3 * alpha[:, None])
    return a0, a1, a2, a3


@triton.jit
def _tile(table, n0, end, P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Page id(s), in-page offsets ``[BLOCK_N]`` and validity of the tile of tokens ``n0 + [0, BLOCK_N)``.

    NOTE: tiles start at multiples of ``BLOCK_N`` (split shares are ``BLOCK_N``-aligned), so with
    ``P % BLOCK_N == 0`` a tile lies in one page: one scalar page-id load instead of a gather, and
    offsets ``n0 % P + arange`` (a multiple of ``BLOCK_N`` plus a range) that Triton sees as
    contiguous and aligned (vector loads, no address chain through a per-token page id)."""
    toks = n0 + tl.arange(0, BLOCK_N)
    ok = toks < end
    if P % BLOCK_N == 0:
        page = tl.load(table + n0 // P).to(tl.int64)
        off = tl.multiple_of(n0 % P, BLOCK_N) + tl.arange(0, BLOCK_N)
    else:
        page = tl.load(table + toks // P, mask=ok, other=0).to(tl.int64)
        off = toks % P
    return page, off, ok


@triton.jit
def _chunk_pages(table, c0, c_end, P: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """Page ids ``[CHUNK]`` of the tiles starting at ``c0, c0 + BLOCK_N, ...`` below ``c_end`` (one vector load)."""
    toks = c0 + tl.arange(0, CHUNK) * BLOCK_N
    return tl.load(table + toks // P, mask=toks < c_end, other=0)


@triton.jit
def _pick(pages, c0, n0, P: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """Page id and in-page offsets ``[BLOCK_N]`` of the tile at ``n0`` from its chunk's ``pages``: no load,
    so the tile's addresses are a function of the loop index and Triton can issue its copies stages ahead."""
    page = tl.sum(tl.where(tl.arange(0, CHUNK) == (n0 - c0) // BLOCK_N, pages, 0), 0).to(tl.int64)
    return page, tl.multiple_of(n0 % P, BLOCK_N) + tl.arange(0, BLOCK_N)


@triton.jit
def _bf16_scores(K, rows, mk, b0, b1, b2, b3, LG: tl.constexpr, s):
    """Add Σ_i q_i · k_i of one group's four slices (``rows`` already point at the group)."""
    cols = tl.arange(0, LG)[None, :]
    s = tl.dot(b0, tl.trans(tl.load(K + rows + cols, mask=mk, other=0.0).to(b0.dtype)), s)
    s = tl.dot(b1, tl.trans(tl.load(K + rows + LG + cols, mask=mk, other=0.0).to(b0.dtype)), s)
    s = tl.dot(b2, tl.trans(tl.load(K + rows + 2 * LG + cols, mask=mk, other=0.0).to(b0.dtype)), s)
    return tl.dot(b3, tl.trans(tl.load(K + rows + 3 * LG + cols, mask=mk, other=0.0).to(b0.dtype)), s)


@triton.jit
def _bf16_values(V, rows, mk, p, a0, a1, a2, a3, alpha, LG: tl.constexpr):
    cols = tl.arange(0, LG)[None, :]
    a0 = tl.dot(p, tl.load(V + rows + cols, mask=mk, other=0.0).to(p.dtype), a0 * alpha[:, None])
    a1 = tl.dot(p, tl.load(V + rows + LG + cols, mask=mk, other=0.0).to(p.dtype), a1 * alpha[:, None])
    a2 = tl.dot(p, tl.load(V + rows + 2 * LG + cols, mask=mk, other=0.0).to(p.dtype), a2 * alpha[:, None])
    a3 = tl.dot(p, tl.load(V + rows + 3 * LG + cols, mask=mk, other=0.0).to(p.dtype), a3 * alpha[:, None])
    return a0, a1, a2, a3


@triton.jit
def _load_q(qp, live, LG: tl.constexpr, DT: tl.constexpr):
    cols = tl.arange(0, LG)[None, :]
    return (tl.load(qp + cols, mask=live, other=0.0).to(DT), tl.load(qp + LG + cols, mask=live, other=0.0).to(DT),
            tl.load(qp + 2 * LG + cols, mask=live, other=0.0).to(DT),
            tl.load(qp + 3 * LG + cols, mask=live, other=0.0).to(DT))


@triton.jit
def _store(op, live, a0, a1, a2, a3, acc_m, inv, LG: tl.constexpr):
    """Output of one group: (acc · 2^16 + Σ p m) / l for its four slices."""
    cols = tl.arange(0, LG)[None, :]
    tl.store(op + cols, (a0 * 65536.0 + acc_m[:, None]) * inv[:, None], mask=live)
    tl.store(op + LG + cols, (a1 * 65536.0 + acc_m[:, None]) * inv[:, None], mask=live)
    tl.store(op + 2 * LG + cols, (a2 * 65536.0 + acc_m[:, None]) * inv[:, None], mask=live)
    tl.store(op + 3 * LG + cols, (a3 * 65536.0 + acc_m[:, None]) * inv[:, None], mask=live)


@triton.jit
def _int2_decode_kernel(Q, Kb, Vb, Kc, Ks, Kz, Vc, Vs, Vz, BfTable, BfLens, InTable, InLens, MidO, MidL,
                        qk_scale, NUM_SPLITS,
                        stride_qb, stride_qh,
                        stride_bp, stride_bh, stride_bt,
                        stride_cp, stride_ch, stride_ct,
                        stride_sp, stride_sh, stride_st,
                        stride_bfb, stride_inb,
                        stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                        H: tl.constexpr, REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr,
                        G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, CONV: tl.constexpr,
                        CHUNK: tl.constexpr, INTERPRET: tl.constexpr):
    # NOTE: the interpreter's range() cannot take tensor bounds under numpy >= 2.4 and its
    # bf16/fp16 dots are wrong, so INTERPRET uses while loops and fp32 operands (see decode.py).
    LG: tl.constexpr = G // 4
    NG: tl.constexpr = D // G
    F16: tl.constexpr = tl.float32 if INTERPRET else tl.float16
    B16: tl.constexpr = tl.float32 if INTERPRET else tl.bfloat16
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    split = tl.program_id(1)
    rows = tl.arange(0, REP_PAD)
    heads = h * REP + rows
    live = (rows < REP)[:, None]
    qp = Q + b * stride_qb + heads[:, None] * stride_qh
    # group 0 (and group 1 when NG == 2): q slices in fp16 (codes) and bf16 (windows)
    h0, h1, h2, h3 = _load_q(qp, live, LG, F16)
    b0, b1, b2, b3 = _load_q(qp, live, LG, B16)
    qs0 = tl.sum(h0.to(tl.float32) + h1.to(tl.float32) + h2.to(tl.float32) + h3.to(tl.float32), 1)
    a0 = tl.zeros([REP_PAD, LG], tl.float32)
    a1 = tl.zeros([REP_PAD, LG], tl.float32)
    a2 = tl.zeros([REP_PAD, LG], tl.float32)
    a3 = tl.zeros([REP_PAD, LG], tl.float32)
    if NG == 2:
        g0, g1, g2, g3 = _load_q(qp + G, live, LG, F16)
        c0, c1, c2, c3 = _load_q(qp + G, live, LG, B16)
        qs1 = tl.sum(g0.to(tl.float32) + g1.to(tl.float32) + g2.to(tl.float32) + g3.to(tl.float32), 1)
    else:  # unused placeholders (NG == 1)
        g0, g1, g2, g3 = h0, h1, h2, h3
        c0, c1, c2, c3 = b0, b1, b2, b3
        qs1 = qs0
    e0 = tl.zeros([REP_PAD, LG], tl.float32)
    e1 = tl.zeros([REP_PAD, LG], tl.float32)
    e2 = tl.zeros([REP_PAD, LG], tl.float32)
    e3 = tl.zeros([REP_PAD, LG], tl.float32)
    m_i = tl.full([REP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([REP_PAD], tl.float32)
    acc_m = tl.zeros([REP_PAD], tl.float32)
    acc_m1 = tl.zeros([REP_PAD], tl.float32)

    # ---- BF16 windows (sink + recent)
    n = tl.load(BfLens + b)
    per = tl.cdiv(tl.cdiv(n, NUM_SPLITS), BLOCK_N) * BLOCK_N
    n0 = split * per
    end = tl.minimum(n, n0 + per)
    table = BfTable + b * stride_bfb
    while n0 < end:
        page, off, ok = _tile(table, n0, end, P, BLOCK_N)
        r = (page * stride_bp + h * stride_bh + off * stride_bt)[:, None]
        mk = ok[:, None]
        s = _bf16_scores(Kb, r, mk, b0, b1, b2, b3, LG, tl.zeros([REP_PAD, BLOCK_N], tl.float32))
        if NG == 2:
            s = _bf16_scores(Kb + G, r, mk, c0, c1, c2, c3, LG, s)
        s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
        pb = (p * (1.0 / 65536.0)).to(B16)
        a0, a1, a2, a3 = _bf16_values(Vb, r, mk, pb, a0, a1, a2, a3, alpha, LG)
        acc_m = acc_m * alpha
        if NG == 2:
            e0, e1, e2, e3 = _bf16_values(Vb + G, r, mk, pb, e0, e1, e2, e3, alpha, LG)
            acc_m1 = acc_m1 * alpha
        n0 += BLOCK_N

    # ---- INT2 history: full tiles (INT2 lengths are multiples of P, P % BLOCK_N == 0, split shares
    # BLOCK_N-aligned); page ids read CHUNK tiles at a time ahead of the tile loop
    n = tl.load(InLens + b)
    per = tl.cdiv(tl.cdiv(n, NUM_SPLITS), BLOCK_N) * BLOCK_N
    c0 = split * per
    end = tl.minimum(n, c0 + per)
    table = InTable + b * stride_inb
    while c0 < end:
        c_end = tl.minimum(end, c0 + CHUNK * BLOCK_N)
        pages = _chunk_pages(table, c0, c_end, P, BLOCK_N, CHUNK)
        if INTERPRET:
            n0 = c0
            while n0 < c_end:
                page, off = _pick(pages, c0, n0, P, BLOCK_N, CHUNK)
                a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i = _int2_step(
                    page, off, h, qk_scale, Kc, Ks, Kz, Vc, Vs, Vz,
                    stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st,
                    h0, h1, h2, h3, g0, g1, g2, g3, qs0, qs1, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1,
                    m_i, l_i, F16, LG, NG, CONV)
                n0 += BLOCK_N
        else:
            for n0 in range(c0, c_end, BLOCK_N):
                page, off = _pick(pages, c0, n0, P, BLOCK_N, CHUNK)
                a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i = _int2_step(
                    page, off, h, qk_scale, Kc, Ks, Kz, Vc, Vs, Vz,
                    stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st,
                    h0, h1, h2, h3, g0, g1, g2, g3, qs0, qs1, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1,
                    m_i, l_i, F16, LG, NG, CONV)
        c0 = c_end

    seen = l_i > 0
    inv = 1.0 / tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    op = MidO + b * stride_ob + heads[:, None] * stride_oh + split * stride_os
    _store(op, live, a0, a1, a2, a3, acc_m, inv, LG)
    if NG == 2:
        _store(op + G, live, e0, e1, e2, e3, acc_m1, inv, LG)
    tl.store(MidL + b * stride_lb + heads * stride_lh + split, lse, mask=rows < REP)


@triton.jit
def _int2_step(page, off, h, qk_scale, Kc, Ks, Kz, Vc, Vs, Vz,
               stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st,
               h0, h1, h2, h3, g0, g1, g2, g3, qs0, qs1, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i,
               F16: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr, CONV: tl.constexpr):
    """One full tile of INT2 tokens (page ``page``, in-page offsets ``off``) for the online softmax
    (see the module docstring). No masks: every load is a vector copy Triton can pipeline."""
    crow = page * stride_cp + h * stride_ch + off * stride_ct
    srow = page * stride_sp + h * stride_sh + off * stride_st
    jb = tl.arange(0, LG)
    ckT = tl.load(Kc + crow[None, :] + jb[:, None])  # [LG, N] bytes x tokens
    sk = tl.load(Ks + srow).to(tl.float32) * 65536.0
    zk = tl.load(Kz + srow).to(tl.float32)
    s = _group_scores(h0, h1, h2, h3, ckT, CONV) * sk[None, :] + qs0[:, None] * zk[None, :]
    if NG == 2:
        ckT1 = tl.load(Kc + LG + crow[None, :] + jb[:, None])
        sk1 = tl.load(Ks + 1 + srow).to(tl.float32) * 65536.0
        zk1 = tl.load(Kz + 1 + srow).to(tl.float32)
        s += _group_scores(g0, g1, g2, g3, ckT1, CONV) * sk1[None, :] + qs1[:, None] * zk1[None, :]
    p, alpha, m_i, l_i = _softmax_step(s * qk_scale, m_i, l_i)
    cv = tl.load(Vc + crow[:, None] + jb[None, :])  # [N, LG]
    sv = tl.load(Vs + srow).to(tl.float32)
    zv = tl.load(Vz + srow).to(tl.float32)
    a0, a1, a2, a3 = _group_values((p * sv[None, :]).to(F16), cv, a0, a1, a2, a3, alpha, CONV)
    acc_m = acc_m * alpha + tl.sum(p * zv[None, :], 1)
    if NG == 2:
        cv1 = tl.load(Vc + LG + crow[:, None] + jb[None, :])
        sv1 = tl.load(Vs + 1 + srow).to(tl.float32)
        zv1 = tl.load(Vz + 1 + srow).to(tl.float32)
        e0, e1, e2, e3 = _group_values((p * sv1[None, :]).to(F16), cv1, e0, e1, e2, e3, alpha, CONV)
        acc_m1 = acc_m1 * alpha + tl.sum(p * zv1[None, :], 1)
    return a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i
