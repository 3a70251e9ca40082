"""Decode attention over a batch of mixed paged KV caches (BF16 windows + INT2 history), split-K.

Algorithm (flash-decoding over the layout of :mod:`oscarkv.cache.paged_layout`)::

    grid = (B * H, NUM_SPLITS)                   one program per (sequence, KV head, split)
    q    = the REP = Hq / H query heads of KV head h, rows of a [REP_PAD >= 16, d] tile (bf16)
    for the split's share of the BF16 tokens, BLOCK_N at a time:          (sink + recent pages)
        k, v = bf16 pool rows, gathered through bf16_table                     [BLOCK_N, d]
        online softmax step with s = q @ kᵀ
    for the split's share of the INT2 tokens, BLOCK_N at a time:          (history pages)
        c_k, c_v = uint8 codes [BLOCK_N, d/4] → four 2-bit slices joined into [BLOCK_N, d]
        G == d (one group per token, the default):  scale/zero applied *after* the dots
            s   = s_k ⊙ (q @ c_kᵀ) + (Σ_j q_j) ⊗ m_k                    (q·(m + s c) = s q·c + m Σq)
            acc += (p ⊙ s_v) @ c_v ;   acc_m += p @ m_v                 (Σ p (m + s c) per row)
        G < d: c is dequantized per group in registers (m + s c) and used as in the BF16 loop
    write (acc / l, log2-sum-exp) of the split to Mid_O [B, Hq, NUM_SPLITS, d], Mid_L [B, Hq, NUM_SPLITS]
    then _reduce_kernel, grid (B * Hq,), merges the splits with the same online softmax.

One program serves all query heads of its KV head (GQA rows are the M dimension of ``tl.dot``)
so every cached byte is read once per step. Each split takes a contiguous share of each tier,
so the BF16 windows and the INT2 history are both spread over all splits.

Column order. Unpacking the INT2 codes with shifts gives column ``4j + i`` = element
``(j // L) G + i L + j % L`` (``L = G/4``, byte ``j`` of the packed token, slice ``i``; see
``oscarkv.quant.int2``). With INT2 in the cache the program works in that permuted column
order throughout (q is loaded permuted, the BF16 windows too, the output is stored
un-permuted), so codes never move between registers; groups stay contiguous in it. A
BF16-only cache (``kv=bf16``) uses the natural order and 16-byte vector loads.

Memory layout (all strides explicit, innermost dimension contiguous):
    q          [B, Hq, d]                 bf16 or fp32 (rounded to bf16 for the dot)
    bf16 pools [N_bf16, H, P, d]          bf16, K and V with identical strides
    INT2 pools codes [N_int2, H, P, d/4] uint8; scale, zero [N_int2, H, P, d/G] fp16
    tables     bf16_table [B, Mb], int2_table [B, Mi] int32; lens [B] int32
    out        [B, Hq, d]                 q's dtype
A sequence with no token (a CUDA-graph padding row) outputs zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oscarkv.cache.paged_layout import LayerKV, PageTables

LOG2E = 1.4426950408889634


@triton.jit
def _perm_cols(D: tl.constexpr, G: tl.constexpr, PERMUTE: tl.constexpr):
    """Element index held by each column of an unpacked code tile (identity without INT2)."""
    cols = tl.arange(0, D)
    if PERMUTE:
        L: tl.constexpr = G // 4
        j = cols // 4
        cols = (j // L) * G + (cols % 4) * L + j % L
    return cols


@triton.jit
def _unpack(c, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """uint8 codes [BLOCK_N, D/4] → codes [BLOCK_N, D] in column order 4j + i (slice i of byte j)."""
    c0 = c & 3
    c1 = (c >> 2) & 3
    c2 = (c >> 4) & 3
    c3 = (c >> 6) & 3
    x = tl.join(tl.join(c0, c2), tl.join(c1, c3))  # [BLOCK_N, D/4, 2, 2]; x[n, j, b, a] = c_{a + 2b}
    return tl.reshape(x, [BLOCK_N, D])


@triton.jit
def _softmax_step(qk, m_i, l_i):
    """One online-softmax step on log2-domain logits ``qk [M, N]``: (p, alpha, m_new, l_new)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _bf16_step(n0, q, acc, m_i, l_i, K, V, table_row, cols, end, h, qk_scale,
               stride_p, stride_h, stride_t, P: tl.constexpr, BLOCK_N: tl.constexpr):
    toks = n0 + tl.arange(0, BLOCK_N)
    live = toks < end
    page = tl.load(table_row + toks // P, mask=live, other=0)
    rows = page.to(tl.int64) * stride_p + h * stride_h + (toks % P) * stride_t
    k = tl.load(K + rows[:, None] + cols[None, :], mask=live[:, None], other=0.0)
    v = tl.load(V + rows[:, None] + cols[None, :], mask=live[:, None], other=0.0)
    qk = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
    qk = tl.where(live[None, :], qk, float("-inf"))
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    return acc, m_i, l_i


@triton.jit
def _bf16_inner(q, acc, m_i, l_i, K, V, table_row, cols, start, end, h, qk_scale,
                stride_p, stride_h, stride_t, P: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    if INTERPRET:  # see _decode_kernel
        n0 = start
        while n0 < end:
            acc, m_i, l_i = _bf16_step(n0, q, acc, m_i, l_i, K, V, table_row, cols, end, h, qk_scale,
                                       stride_p, stride_h, stride_t, P, BLOCK_N)
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            acc, m_i, l_i = _bf16_step(n0, q, acc, m_i, l_i, K, V, table_row, cols, end, h, qk_scale,
                                       stride_p, stride_h, stride_t, P, BLOCK_N)
    return acc, m_i, l_i


@triton.jit
def _int2_step(n0, q, q_sum, acc, acc_m, m_i, l_i, Kc, Ks, Kz, Vc, Vs, Vz, table_row, end, h, qk_scale,
               stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st,
               D: tl.constexpr, G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr):
    NG: tl.constexpr = D // G
    bytes_ = tl.arange(0, D // 4)
    toks = n0 + tl.arange(0, BLOCK_N)
    live = toks < end
    page = tl.load(table_row + toks // P, mask=live, other=0).to(tl.int64)
    crow = page * stride_cp + h * stride_ch + (toks % P) * stride_ct
    srow = page * stride_sp + h * stride_sh + (toks % P) * stride_st
    ck = _unpack(tl.load(Kc + crow[:, None] + bytes_[None, :], mask=live[:, None], other=0), BLOCK_N, D)
    cv = _unpack(tl.load(Vc + crow[:, None] + bytes_[None, :], mask=live[:, None], other=0), BLOCK_N, D)
    if NG == 1:
        sk = tl.load(Ks + srow, mask=live, other=0.0).to(tl.float32)
        zk = tl.load(Kz + srow, mask=live, other=0.0).to(tl.float32)
        sv = tl.load(Vs + srow, mask=live, other=0.0).to(tl.float32)
        zv = tl.load(Vz + srow, mask=live, other=0.0).to(tl.float32)
        qk = tl.dot(q, tl.trans(ck.to(q.dtype))) * sk[None, :] + q_sum[:, None] * zk[None, :]
    else:
        grp = tl.arange(0, NG)
        sk = tl.load(Ks + srow[:, None] + grp[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        zk = tl.load(Kz + srow[:, None] + grp[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        kd = tl.reshape(ck.to(tl.float32), [BLOCK_N, NG, G]) * sk[:, :, None] + zk[:, :, None]
        qk = tl.dot(q, tl.trans(tl.reshape(kd, [BLOCK_N, D]).to(q.dtype)))
    qk = tl.where(live[None, :], qk * qk_scale, float("-inf"))
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
    acc = acc * alpha[:, None]
    if NG == 1:
        acc += tl.dot((p * sv[None, :]).to(q.dtype), cv.to(q.dtype))
        acc_m = acc_m * alpha + tl.sum(p * zv[None, :], 1)
    else:
        sv = tl.load(Vs + srow[:, None] + grp[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        zv = tl.load(Vz + srow[:, None] + grp[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        vd = tl.reshape(cv.to(tl.float32), [BLOCK_N, NG, G]) * sv[:, :, None] + zv[:, :, None]
        acc += tl.dot(p.to(q.dtype), tl.reshape(vd, [BLOCK_N, D]).to(q.dtype))
    return acc, acc_m, m_i, l_i


@triton.jit
def _int2_inner(q, q_sum, acc, acc_m, m_i, l_i, Kc, Ks, Kz, Vc, Vs, Vz, table_row, start, end, h, qk_scale,
                stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st,
                D: tl.constexpr, G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    if INTERPRET:  # see _decode_kernel
        n0 = start
        while n0 < end:
            acc, acc_m, m_i, l_i = _int2_step(n0, q, q_sum, acc, acc_m, m_i, l_i, Kc, Ks, Kz, Vc, Vs, Vz, table_row,
                                              end, h, qk_scale, stride_cp, stride_ch, stride_ct,
                                              stride_sp, stride_sh, stride_st, D, G, P, BLOCK_N)
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            acc, acc_m, m_i, l_i = _int2_step(n0, q, q_sum, acc, acc_m, m_i, l_i, Kc, Ks, Kz, Vc, Vs, Vz, table_row,
                                              end, h, qk_scale, stride_cp, stride_ch, stride_ct,
                                              stride_sp, stride_sh, stride_st, D, G, P, BLOCK_N)
    return acc, acc_m, m_i, l_i


@triton.jit
def _split_range(n, split, NUM_SPLITS, BLOCK_N: tl.constexpr):
    """Contiguous, BLOCK_N-aligned share ``[start, end)`` of ``n`` tokens for one split."""
    per = tl.cdiv(tl.cdiv(n, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per
    return start, tl.minimum(n, start + per)


@triton.jit
def _decode_kernel(Q, Kb, Vb, Kc, Ks, Kz, Vc, Vs, Vz, BfTable, BfLens, InTable, InLens, MidO, MidL,
                   qk_scale, NUM_SPLITS,
                   stride_qb, stride_qh,
                   stride_bp, stride_bh, stride_bt,
                   stride_cp, stride_ch, stride_ct,
                   stride_sp, stride_sh, stride_st,
                   stride_bfb, stride_inb,
                   stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                   H: tl.constexpr, REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr,
                   G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_INT2: tl.constexpr,
                   INTERPRET: tl.constexpr):
    # NOTE: INTERPRET is set for Triton's CPU interpreter only: its range() cannot take a tensor
    # bound under numpy >= 2.4 (so the loops are while loops there; compiled kernels use range()
    # so Triton pipelines the loads) and its bf16 tl.dot is wrong (so dots run in fp32 there).
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    split = tl.program_id(1)
    rows = tl.arange(0, REP_PAD)
    heads = h * REP + rows
    cols = _perm_cols(D, G, HAS_INT2)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + cols[None, :], mask=(rows < REP)[:, None], other=0.0)
    q = q.to(tl.float32 if INTERPRET else tl.bfloat16)  # the dot operand dtype of every tl.dot below
    m_i = tl.full([REP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([REP_PAD], tl.float32)
    acc = tl.zeros([REP_PAD, D], tl.float32)
    acc_m = tl.zeros([REP_PAD], tl.float32)
    start, end = _split_range(tl.load(BfLens + b), split, NUM_SPLITS, BLOCK_N)
    acc, m_i, l_i = _bf16_inner(q, acc, m_i, l_i, Kb, Vb, BfTable + b * stride_bfb, cols, start, end, h, qk_scale,
                                stride_bp, stride_bh, stride_bt, P, BLOCK_N, INTERPRET)
    if HAS_INT2:
        start, end = _split_range(tl.load(InLens + b), split, NUM_SPLITS, BLOCK_N)
        q_sum = tl.sum(q.to(tl.float32), 1)
        acc, acc_m, m_i, l_i = _int2_inner(q, q_sum, acc, acc_m, m_i, l_i, Kc, Ks, Kz, Vc, Vs, Vz,
                                           InTable + b * stride_inb, start, end, h, qk_scale,
                                           stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st,
                                           D, G, P, BLOCK_N, INTERPRET)
    seen = l_i > 0
    o = (acc + acc_m[:, None]) / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    live = rows < REP
    tl.store(MidO + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + cols[None, :], o, mask=live[:, None])
    tl.store(MidL + b * stride_lb + heads * stride_lh + split, lse, mask=live)


# ------------------------------------------------------------------ INT2 with G == d: sliced
@triton.jit
def _code_slice(c, i: tl.constexpr, INTERPRET: tl.constexpr):
    """Slice ``i`` of int16-widened packed codes as ``128 + code`` in the dot dtype.

    NOTE: on the GPU the bits ``0x4300 | code`` are the bf16 number 128 + code, so the codes
    become dot operands with two integer ops and no int→float conversion; the constant 128 is
    removed exactly afterwards (q is bf16, so q·128 = 128 Σq). Used for keys only."""
    x = (c >> (2 * i)) & 3
    if INTERPRET:
        return x.to(tl.float32) + 128.0
    return (x | 0x4300).to(tl.bfloat16, bitcast=True)


@triton.jit
def _sliced_bf16_step(n0, q0, q1, q2, q3, a0, a1, a2, a3, m_i, l_i, K, V, table_row, end, h, qk_scale,
                      stride_p, stride_h, stride_t, L: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr):
    toks = n0 + tl.arange(0, BLOCK_N)
    live = toks < end
    page = tl.load(table_row + toks // P, mask=live, other=0)
    rows = (page.to(tl.int64) * stride_p + h * stride_h + (toks % P) * stride_t)[:, None] + tl.arange(0, L)[None, :]
    mk = live[:, None]
    qk = tl.dot(q0, tl.trans(tl.load(K + rows, mask=mk, other=0.0).to(q0.dtype)))
    qk += tl.dot(q1, tl.trans(tl.load(K + rows + L, mask=mk, other=0.0).to(q0.dtype)))
    qk += tl.dot(q2, tl.trans(tl.load(K + rows + 2 * L, mask=mk, other=0.0).to(q0.dtype)))
    qk += tl.dot(q3, tl.trans(tl.load(K + rows + 3 * L, mask=mk, other=0.0).to(q0.dtype)))
    qk = tl.where(live[None, :], qk * qk_scale, float("-inf"))
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
    p = p.to(q0.dtype)
    a0 = a0 * alpha[:, None] + tl.dot(p, tl.load(V + rows, mask=mk, other=0.0).to(q0.dtype))
    a1 = a1 * alpha[:, None] + tl.dot(p, tl.load(V + rows + L, mask=mk, other=0.0).to(q0.dtype))
    a2 = a2 * alpha[:, None] + tl.dot(p, tl.load(V + rows + 2 * L, mask=mk, other=0.0).to(q0.dtype))
    a3 = a3 * alpha[:, None] + tl.dot(p, tl.load(V + rows + 3 * L, mask=mk, other=0.0).to(q0.dtype))
    return a0, a1, a2, a3, alpha, m_i, l_i


@triton.jit
def _sliced_int2_step(n0, q0, q1, q2, q3, q_sum, a0, a1, a2, a3, m_i, l_i, Kc, Ks, Kz, Vc, Vs, Vz, table_row, end, h,
                      qk_scale, stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st,
                      L: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    toks = n0 + tl.arange(0, BLOCK_N)
    live = toks < end
    page = tl.load(table_row + toks // P, mask=live, other=0).to(tl.int64)
    crow = page * stride_cp + h * stride_ch + (toks % P) * stride_ct
    srow = page * stride_sp + h * stride_sh + (toks % P) * stride_st
    mk = live[:, None]
    ck = tl.load(Kc + crow[:, None] + tl.arange(0, L)[None, :], mask=mk, other=0).to(tl.int16)  # [BLOCK_N, L]
    cv = tl.load(Vc + crow[:, None] + tl.arange(0, L)[None, :], mask=mk, other=0).to(tl.int16)
    sk = tl.load(Ks + srow, mask=live, other=0.0).to(tl.float32)
    zk = tl.load(Kz + srow, mask=live, other=0.0).to(tl.float32)
    sv = tl.load(Vs + srow, mask=live, other=0.0).to(tl.float32)
    zv = tl.load(Vz + srow, mask=live, other=0.0).to(tl.float32)
    qk = tl.dot(q0, tl.trans(_code_slice(ck, 0, INTERPRET)))
    qk += tl.dot(q1, tl.trans(_code_slice(ck, 1, INTERPRET)))
    qk += tl.dot(q2, tl.trans(_code_slice(ck, 2, INTERPRET)))
    qk += tl.dot(q3, tl.trans(_code_slice(ck, 3, INTERPRET)))
    qk = qk * sk[None, :] + q_sum[:, None] * (zk - 128.0 * sk)[None, :]  # q·(m + s c), c = (128 + c) - 128
    qk = tl.where(live[None, :], qk * qk_scale, float("-inf"))
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
    # NOTE: V codes are converted exactly (no +128 offset): the offset made Σ p s (128 + c) ~ 100x
    # larger than the signal and cost accuracy in the tensor cores' fp32 accumulation.
    ps = (p * sv[None, :]).to(q0.dtype)
    a0 = a0 * alpha[:, None] + tl.dot(ps, ((cv & 3).to(tl.float32)).to(q0.dtype))
    a1 = a1 * alpha[:, None] + tl.dot(ps, (((cv >> 2) & 3).to(tl.float32)).to(q0.dtype))
    a2 = a2 * alpha[:, None] + tl.dot(ps, (((cv >> 4) & 3).to(tl.float32)).to(q0.dtype))
    a3 = a3 * alpha[:, None] + tl.dot(ps, (((cv >> 6) & 3).to(tl.float32)).to(q0.dtype))
    corr = tl.sum(p * zv[None, :], 1)  # Σ p m
    return a0, a1, a2, a3, alpha, corr, m_i, l_i


@triton.jit
def _decode_sliced_kernel(Q, Kb, Vb, Kc, Ks, Kz, Vc, Vs, Vz, BfTable, BfLens, InTable, InLens, MidO, MidL,
                          qk_scale, NUM_SPLITS,
                          stride_qb, stride_qh,
                          stride_bp, stride_bh, stride_bt,
                          stride_cp, stride_ch, stride_ct,
                          stride_sp, stride_sh, stride_st,
                          stride_bfb, stride_inb,
                          stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                          H: tl.constexpr, REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr,
                          P: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    """INT2 cache with one group per token (G == d): the four code slices of a token are four
    column blocks of width L = d/4 (element i L + j is slice i of byte j), so q, the BF16
    windows and the accumulators are split into four [., L] tiles and nothing is permuted."""
    L: tl.constexpr = D // 4
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    split = tl.program_id(1)
    rows = tl.arange(0, REP_PAD)
    heads = h * REP + rows
    live = rows < REP
    qp = Q + b * stride_qb + heads[:, None] * stride_qh + tl.arange(0, L)[None, :]
    DOT: tl.constexpr = tl.float32 if INTERPRET else tl.bfloat16
    q0 = tl.load(qp, mask=live[:, None], other=0.0).to(DOT)
    q1 = tl.load(qp + L, mask=live[:, None], other=0.0).to(DOT)
    q2 = tl.load(qp + 2 * L, mask=live[:, None], other=0.0).to(DOT)
    q3 = tl.load(qp + 3 * L, mask=live[:, None], other=0.0).to(DOT)
    q_sum = tl.sum(q0.to(tl.float32) + q1.to(tl.float32) + q2.to(tl.float32) + q3.to(tl.float32), 1)
    m_i = tl.full([REP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([REP_PAD], tl.float32)
    a0 = tl.zeros([REP_PAD, L], tl.float32)
    a1 = tl.zeros([REP_PAD, L], tl.float32)
    a2 = tl.zeros([REP_PAD, L], tl.float32)
    a3 = tl.zeros([REP_PAD, L], tl.float32)
    acc_m = tl.zeros([REP_PAD], tl.float32)
    start, end = _split_range(tl.load(BfLens + b), split, NUM_SPLITS, BLOCK_N)
    bt = BfTable + b * stride_bfb
    if INTERPRET:  # see _decode_kernel
        n0 = start
        while n0 < end:
            a0, a1, a2, a3, alpha, m_i, l_i = _sliced_bf16_step(n0, q0, q1, q2, q3, a0, a1, a2, a3, m_i, l_i, Kb, Vb, bt, end,
                                                                h, qk_scale, stride_bp, stride_bh, stride_bt, L, P, BLOCK_N)
            acc_m = acc_m * alpha
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            a0, a1, a2, a3, alpha, m_i, l_i = _sliced_bf16_step(n0, q0, q1, q2, q3, a0, a1, a2, a3, m_i, l_i, Kb, Vb, bt, end,
                                                                h, qk_scale, stride_bp, stride_bh, stride_bt, L, P, BLOCK_N)
            acc_m = acc_m * alpha
    start, end = _split_range(tl.load(InLens + b), split, NUM_SPLITS, BLOCK_N)
    it = InTable + b * stride_inb
    if INTERPRET:
        n0 = start
        while n0 < end:
            a0, a1, a2, a3, alpha, corr, m_i, l_i = _sliced_int2_step(
                n0, q0, q1, q2, q3, q_sum, a0, a1, a2, a3, m_i, l_i, Kc, Ks, Kz, Vc, Vs, Vz, it, end, h, qk_scale,
                stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st, L, P, BLOCK_N, INTERPRET)
            acc_m = acc_m * alpha + corr
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            a0, a1, a2, a3, alpha, corr, m_i, l_i = _sliced_int2_step(
                n0, q0, q1, q2, q3, q_sum, a0, a1, a2, a3, m_i, l_i, Kc, Ks, Kz, Vc, Vs, Vz, it, end, h, qk_scale,
                stride_cp, stride_ch, stride_ct, stride_sp, stride_sh, stride_st, L, P, BLOCK_N, INTERPRET)
            acc_m = acc_m * alpha + corr
    seen = l_i > 0
    inv = 1.0 / tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    op = MidO + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + tl.arange(0, L)[None, :]
    tl.store(op, (a0 + acc_m[:, None]) * inv[:, None], mask=live[:, None])
    tl.store(op + L, (a1 + acc_m[:, None]) * inv[:, None], mask=live[:, None])
    tl.store(op + 2 * L, (a2 + acc_m[:, None]) * inv[:, None], mask=live[:, None])
    tl.store(op + 3 * L, (a3 + acc_m[:, None]) * inv[:, None], mask=live[:, None])
    tl.store(MidL + b * stride_lb + heads * stride_lh + split, lse, mask=live)


@triton.jit
def _reduce_kernel(MidO, MidL, Out, NUM_SPLITS, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                   stride_b, stride_h, HQ: tl.constexpr, D: tl.constexpr, SPLITS_PAD: tl.constexpr):
    b = tl.program_id(0) // HQ
    hq = tl.program_id(0) % HQ
    s = tl.arange(0, SPLITS_PAD)
    cols = tl.arange(0, D)
    ok = s < NUM_SPLITS
    lse = tl.load(MidL + b * stride_lb + hq * stride_lh + s, mask=ok, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # empty sequence: every weight is 0
    w = tl.exp2(lse - top)
    o = tl.load(MidO + b * stride_ob + hq * stride_oh + s[:, None] * stride_os + cols[None, :], mask=ok[:, None], other=0.0)
    den = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(den > 0, den, 1.0)
    tl.store(Out + b * stride_b + hq * stride_h + cols, out.to(Out.dtype.element_ty))


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _config(head_dim: int, int2: bool, device: torch.device) -> dict:
    """Tile and launch parameters keyed by tier kind (H100 sweep, ``oscarkv.bench.sweep``)."""
    if device.type != "cuda":
        return dict(BLOCK_N=16, num_warps=4, num_stages=1)
    if int2:
        return dict(BLOCK_N=64, num_warps=4, num_stages=3)
    return dict(BLOCK_N=128, num_warps=4, num_stages=3)


def default_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """Splits minimising whole waves of programs per unit of work (two resident programs per SM).

    cost(s) = ceil(B H s / slots) / s + s / 1000: the first term is the time in waves, each
    program doing 1/s of a sequence; the second charges the split merge."""
    slots = 2 * _num_sms(device)
    n = batch * kv_heads
    return min(range(1, 65), key=lambda s: -(-n * s // slots) / s + s / 1000)


def decode_attention(q: torch.Tensor, kv: LayerKV, tables: PageTables, scale: float, *,
                     num_splits: int | None = None, config: dict | None = None) -> torch.Tensor:
    """Attention of one query token per sequence over its mixed paged cache.

    ``q [B, Hq, d]`` rotated queries (bf16 or fp32) → ``[B, Hq, d]`` in ``q``'s dtype. ``config``
    overrides the tile table (``BLOCK_N``, ``num_warps``, ``num_stages``; benchmarks only)."""
    bsz, hq, d = q.shape
    _, h, p, dk = kv.bf16_k.shape
    int2 = kv.int2_k is not None
    assert dk == d and hq % h == 0 and d >= 16 and d & (d - 1) == 0, f"bad shapes q {tuple(q.shape)} pool {tuple(kv.bf16_k.shape)}"
    assert q.dtype in (torch.bfloat16, torch.float32) and q.stride(2) == 1, "q must be bf16/fp32 with contiguous head_dim"
    assert kv.bf16_k.dtype == kv.bf16_v.dtype == torch.bfloat16 and kv.bf16_k.stride() == kv.bf16_v.stride()
    assert kv.bf16_k.stride(3) == 1
    for t in (tables.bf16_table, tables.bf16_lens, tables.int2_table, tables.int2_lens):
        assert t.dtype == torch.int32 and t.shape[0] == bsz and t.stride(-1) == 1, "tables: int32 [B, ...], contiguous rows"
    k2, v2 = kv.int2_k, kv.int2_v
    if int2:
        g = k2.group
        assert k2.codes.dtype == torch.uint8 and k2.scale.dtype == k2.zero.dtype == torch.float16
        assert k2.codes.shape[1:] == (h, p, d // 4) and k2.scale.shape[1:] == (h, p, d // g) and g >= 4
        for a, b in ((k2.codes, v2.codes), (k2.scale, v2.scale), (k2.scale, k2.zero), (k2.scale, v2.zero)):
            assert a.stride() == b.stride() and a.stride(-1) == 1, "INT2 K/V pools must share strides"
    else:
        g = d
        k2 = v2 = type("Empty", (), {"codes": kv.bf16_k, "scale": kv.bf16_k, "zero": kv.bf16_k})()
    cfg = {**_config(d, int2, q.device), **(config or {})}
    splits = num_splits or default_splits(bsz, h, q.device)
    rep = hq // h
    mid_o = torch.empty(bsz, hq, splits, d, dtype=torch.float32, device=q.device)
    mid_l = torch.empty(bsz, hq, splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    sliced = int2 and g == d
    kernel = _decode_sliced_kernel if sliced else _decode_kernel
    extra = dict() if sliced else dict(G=g, HAS_INT2=int2)
    kernel[(bsz * h, splits)](
        q, kv.bf16_k, kv.bf16_v, k2.codes, k2.scale, k2.zero, v2.codes, v2.scale, v2.zero,
        tables.bf16_table, tables.bf16_lens, tables.int2_table, tables.int2_lens, mid_o, mid_l,
        scale * LOG2E, splits,
        q.stride(0), q.stride(1),
        kv.bf16_k.stride(0), kv.bf16_k.stride(1), kv.bf16_k.stride(2),
        k2.codes.stride(0), k2.codes.stride(1), k2.codes.stride(2),
        k2.scale.stride(0), k2.scale.stride(1), k2.scale.stride(2),
        tables.bf16_table.stride(0), tables.int2_table.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_l.stride(0), mid_l.stride(1),
        H=h, REP=rep, REP_PAD=max(16, triton.next_power_of_2(rep)), D=d, P=p, **extra,
        BLOCK_N=cfg["BLOCK_N"], INTERPRET=q.device.type != "cuda", num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    _reduce_kernel[(bsz * hq,)](
        mid_o, mid_l, out, splits, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_l.stride(0), mid_l.stride(1),
        out.stride(0), out.stride(1), HQ=hq, D=d, SPLITS_PAD=max(2, triton.next_power_of_2(splits)), num_warps=4)
    return out
