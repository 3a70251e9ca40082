"""Chunks of tens of tokens over long caches: split-K attention with the query rows on the tensor cores' M.

:mod:`oscarkv.kernels.chunk_splitk` puts a chunk's query rows on the N side of every product (the decode kernel's
orientation, right for a handful of rows): q is then the B operand held in registers by every warp, so a program
of 64 rows holds 4 slices x 32 channels x 64 rows of fp16 q per thread group and spills, and its best blocks
are 16 rows (4 tokens of a GQA group of 4). A 64-token follow-up over 100K INT2 tokens then dequantizes each
tile 16 times and took 0.54 ms a layer on an H200 (2026-11-28), 3.5x its tensor-core FLOPs.

Here the rows are the products' M (the flash-attention orientation), ``BLOCK_M = BLOCK_T · REP_PAD`` of them:

    grid = (B * H, NUM_SPLITS, cdiv(max chunk, BLOCK_T))
    scores [M, N]   = Σ_i q_i [M, LG] @ c_i^T [LG, N] · s_k + Σq · m_k     INT2 history, per group
    outputs [M, LG] += (p · s_v) [M, N] @ c_i [N, LG], Σ p m_v              slice i of each group
    BF16 windows and the chunk itself (causal): q [M, d] @ K^T, p @ V_i in the slices' units

so the unpacked codes are the B operand (shared memory, once per tile for all M rows) and every accumulator is
spread over the warps. The numeric function is ``chunk_splitk``'s (the decode kernel's slice units: codes exact
as fp16 subnormals, q's slices pre-scaled, scale and zero after the dots; fp16 ``p · s``), the split-K partials
and the merge the same (``split_k.merge_splits``); the oracle is ``reference.extend_attention_ref``. The windows
and the chunk's own keys come first (one bf16 copy of q), then the history (q's fp16 slices).

Serves uniform 2-bit INT2 history (no level tables, no 4-bit rungs: :func:`serves`) and BF16-only caches;
``chunk_splitk.chunk_attention`` routes chunks here by its table (``_config``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from oscarkv.cache.paged_layout import LayerKV
from oscarkv.kernels.decode_int2 import _slices
from oscarkv.kernels.pools import history_rows, tier_rows, window_rows
from oscarkv.kernels.split_k import chunk_pages, pick_page, split_range, tile


def serves(kv: LayerKV) -> bool:
    """Whether this kernel reads ``kv``'s history: none (BF16 only) or uniform 2-bit keys and values."""
    k2, v2 = kv.int2_k, kv.int2_v
    return k2 is None or (k2.bits == v2.bits == 2 and k2.levels is None and v2.levels is None)


@triton.jit
def _softmax_step(s, m_i, l_i):
    """One online-softmax step on log2-domain logits ``s [M, N]`` (query rows x tokens)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _join4(a, b, c, d):
    """Four slices ``[R, LG]`` as one tile ``[R, 4 LG]`` in one fixed order of the slices' columns (the same for
    q, the codes, the values and the output channels, so every product sums over matching pairs)."""
    return tl.reshape(tl.join(tl.join(a, b), tl.join(c, d)), [a.shape[0], 4 * a.shape[1]])


@triton.jit
def _slots(LG: tl.constexpr):
    """The channel (within a group) and the slice unit ``2^(24-2i)`` of each column of a joined tile: ``[1, 4 LG]``.
    ``_join4`` puts slice ``(0, 2, 1, 3)[k % 4]`` column ``k // 4`` at column ``k`` (computed, not joined: the
    join's register layout would spread to every tile these index)."""
    k = tl.arange(0, 4 * LG)[None, :]
    i = ((k % 4) >> 1) | ((k % 2) << 1)
    return i * LG + k // 4, tl.exp2((24 - 2 * i).to(tl.float32))


@triton.jit
def _empty(M: tl.constexpr, LG: tl.constexpr):
    """``(acc0, acc1, m_i, l_i)`` before any token: per group a joined accumulator ``[M, 4 LG]`` and ``Σ p m``."""
    z = tl.zeros([M, 4 * LG], tl.float32)
    r = tl.zeros([M], tl.float32)
    return (z, r), (z, r), tl.full([M], float("-inf"), tl.float32), r


@triton.jit
def _bf16_group_values(V, rows, ok, p, acc, alpha, LG: tl.constexpr, B16: tl.constexpr):
    """One group's accumulators rescaled plus ``p @ v`` in the slices' units (``rows [N, 1]`` at the group's
    channels; ``ok [N, 1]``): the joined columns of v divided by their unit (a power of two)."""
    a, acc_m = acc
    chan, unit = _slots(LG)
    v = tl.load(V + rows + chan, mask=ok, other=0.0).to(tl.float32) / unit
    return tl.dot(p.to(B16), v.to(B16), a * alpha[:, None]), acc_m * alpha


@triton.jit
def _bf16_tile(kv, rows, ok, vis, qb, qk_scale, state, G: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr,
               D: tl.constexpr, B16: tl.constexpr):
    """One tile of bf16 keys and values (``kv = (K, V)``, element offsets ``rows [N]`` of channel 0, ``ok [N]``,
    visibility ``vis [M, N]``) for the online softmax: ``qb [M, d]`` bf16."""
    K, V = kv
    acc0, acc1, m_i, l_i = state
    kt = tl.load(K + rows[None, :] + tl.arange(0, D)[:, None], mask=ok[None, :], other=0.0).to(B16)  # [d, N]
    s = tl.where(vis, tl.dot(qb, kt) * qk_scale, float("-inf"))
    p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
    acc0 = _bf16_group_values(V, rows[:, None], ok[:, None], p, acc0, alpha, LG, B16)
    if NG == 2:
        acc1 = _bf16_group_values(V + G, rows[:, None], ok[:, None], p, acc1, alpha, LG, B16)
    return acc0, acc1, m_i, l_i


@triton.jit
def _bf16_phase(window, new, tier, split, NUM_SPLITS, h, tok, hi, lo, qk_scale, qb, state, G: tl.constexpr,
                LG: tl.constexpr, NG: tl.constexpr, D: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr,
                B16: tl.constexpr):
    """The split's share of the BF16 sink + recent tokens, then the chunk's own keys ``[0, hi)`` (causal: row
    ``r`` sees keys ``<= tok[r]``; ``new = (K, V, (stride_t, stride_h))``, rows from ``lo``)."""
    K, V, _ = window
    table, length = tier
    n0, end = split_range(length, split, NUM_SPLITS, BLOCK_N)
    while n0 < end:
        page, off, ok = tile(table, n0, end, P, BLOCK_N)
        state = _bf16_tile((K, V), window_rows(window, page, h, off), ok, ok[None, :], qb, qk_scale, state,
                           G, LG, NG, D, B16)
        n0 += BLOCK_N
    Kn, Vn, strides = new  # NOTE: one level per statement (Triton 3.6)
    stride_t, stride_h = strides
    n0 = 0
    while n0 < hi:
        toks = n0 + tl.arange(0, BLOCK_N)
        ok = toks < hi
        vis = ok[None, :] & (toks[None, :] <= tok[:, None])
        state = _bf16_tile((Kn, Vn), (lo + toks).to(tl.int64) * stride_t + h * stride_h, ok, vis, qb, qk_scale,
                           state, G, LG, NG, D, B16)
        n0 += BLOCK_N
    return state


@triton.jit
def _q_joined(qp, live, LG: tl.constexpr, F16: tl.constexpr):
    """One group of q (``qp [M, 1]`` at its channels) as the codes' operand: the joined slices ``[M, 4 LG]``, slice
    ``i`` scaled by ``2^(3-2i)`` against the code unit ``4^i · 2^-24`` (``decode_int2._group_q``), and ``Σ q``."""
    chan, unit = _slots(LG)
    h = tl.load(qp + chan, mask=live, other=0.0).to(F16).to(tl.float32)
    return (h * (unit * 2.0**-21)).to(F16), tl.sum(h, 1)


@triton.jit
def _codes(C, row, LG: tl.constexpr, CONV: tl.constexpr):
    """A tile's codes of one group (``row [N]`` at its bytes) as the joined slices ``[N, 4 LG]`` (fp16 subnormals
    ``code · 4^i · 2^-24``, ``decode_int2._slices``)."""
    c0, c1, c2, c3 = _slices(tl.load(C + row[:, None] + tl.arange(0, LG)[None, :]), CONV)
    return _join4(c0, c1, c2, c3)


@triton.jit
def _key_scores(keys, crow, srow, qg, CONV: tl.constexpr, LG: tl.constexpr):
    """``s · (q · c) + m Σq`` of one key group over a tile: ``[M, N]`` (``crow [N]`` at the group's bytes)."""
    C, S, Z, _, _ = keys
    qj, qs = qg
    s = tl.dot(qj, tl.trans(_codes(C, crow, LG, CONV)))
    sk = tl.load(S + srow).to(tl.float32) * 2.0**21
    return s * sk[None, :] + qs[:, None] * tl.load(Z + srow).to(tl.float32)[None, :]


@triton.jit
def _code_values(values, vrow, srow, p, alpha, acc, F16: tl.constexpr, CONV: tl.constexpr, LG: tl.constexpr):
    """One value group's accumulators rescaled plus ``(p s) @ c`` and ``Σ p m``."""
    C, S, Z, _, _ = values
    a, acc_m = acc
    ps = (p * tl.load(S + srow).to(tl.float32)[None, :]).to(F16)
    a = tl.dot(ps, _codes(C, vrow, LG, CONV), a * alpha[:, None])
    return a, acc_m * alpha + tl.sum(p * tl.load(Z + srow).to(tl.float32)[None, :], 1)


@triton.jit
def _code_tile(page, off, h, qk_scale, history, q, state, F16: tl.constexpr, LG: tl.constexpr,
               NG: tl.constexpr, CONV: tl.constexpr):
    """One full tile of INT2 tokens (no masks) for the online softmax; ``q = (group 0, group 1)`` joined."""
    keys, values, _ = history
    acc0, acc1, m_i, l_i = state
    crow, vrow, srow = history_rows(history, page, h, off)
    s = _key_scores(keys, crow, srow, q[0], CONV, LG)
    if NG == 2:
        C, S, Z, st, lv = keys
        s += _key_scores((C + LG, S + 1, Z + 1, st, lv), crow, srow, q[1], CONV, LG)
    p, alpha, m_i, l_i = _softmax_step(s * qk_scale, m_i, l_i)
    acc0 = _code_values(values, vrow, srow, p, alpha, acc0, F16, CONV, LG)
    if NG == 2:
        C, S, Z, st, lv = values
        acc1 = _code_values((C + LG, S + 1, Z + 1, st, lv), vrow, srow, p, alpha, acc1, F16, CONV, LG)
    return acc0, acc1, m_i, l_i


@triton.jit
def _code_phase(history, tier, split, NUM_SPLITS, h, qk_scale, q, state, F16: tl.constexpr, LG: tl.constexpr,
                NG: tl.constexpr, CONV: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr,
                CHUNK: tl.constexpr, INTERPRET: tl.constexpr):
    """The split's share of the INT2 history in full tiles, page ids read ``CHUNK`` tiles ahead
    (``decode_int2._int2_history``; tiles within one page)."""
    table, length = tier
    c0, end = split_range(length, split, NUM_SPLITS, BLOCK_N)
    while c0 < end:
        c_end = tl.minimum(end, c0 + CHUNK * BLOCK_N)
        pages = chunk_pages(table, c0, c_end, P, BLOCK_N, CHUNK)
        if INTERPRET:
            n0 = c0
            while n0 < c_end:
                page, off = pick_page(pages, c0, n0, P, BLOCK_N, CHUNK)
                state = _code_tile(page, off, h, qk_scale, history, q, state, F16, LG, NG, CONV)
                n0 += BLOCK_N
        else:
            for n0 in range(c0, c_end, BLOCK_N):
                page, off = pick_page(pages, c0, n0, P, BLOCK_N, CHUNK)
                state = _code_tile(page, off, h, qk_scale, history, q, state, F16, LG, NG, CONV)
        c0 = c_end
    return state


@triton.jit
def _store_group(op, live, acc, inv, LG: tl.constexpr):
    """One group's output ``(acc · unit + Σ p m) / l`` (``op [M, 1]`` at its channels)."""
    a, acc_m = acc
    chan, unit = _slots(LG)
    tl.store(op + chan, (a * unit + acc_m[:, None]) * inv[:, None], mask=live)


@triton.jit
def _wide_kernel(Q, new, window, history, tables, CuSeq, mid, qk_scale, NUM_SPLITS,
                 H: tl.constexpr, REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                 P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, CONV: tl.constexpr,
                 CHUNK: tl.constexpr, HAS_INT2: tl.constexpr, INTERPRET: tl.constexpr):
    """The arguments of ``chunk_splitk._chunk_kernel`` (the same bundles and grid), rows on M."""
    M: tl.constexpr = BLOCK_T * REP_PAD
    LG: tl.constexpr = G // 4
    NG: tl.constexpr = D // G
    F16: tl.constexpr = tl.float32 if INTERPRET else tl.float16
    B16: tl.constexpr = tl.float32 if INTERPRET else tl.bfloat16
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    split = tl.program_id(1)
    t0 = tl.program_id(2) * BLOCK_T
    lo = tl.load(CuSeq + b)
    c = tl.load(CuSeq + b + 1) - lo
    if t0 < c:
        r = tl.arange(0, M)
        tok = t0 + r // REP_PAD  # chunk-relative position of row r
        head = h * REP + r % REP_PAD
        live_rows = (tok < c) & (r % REP_PAD < REP)
        live = live_rows[:, None]
        qp = Q[0] + (lo + tok)[:, None].to(tl.int64) * Q[1] + head[:, None] * Q[2]  # [M, 1]
        qb = tl.load(qp + tl.arange(0, D)[None, :], mask=live, other=0.0).to(B16)
        # the chunk itself rides on the last split (split_k.split_range gives it the shortest share)
        hi = tl.where(split == NUM_SPLITS - 1, tl.minimum(c, t0 + BLOCK_T), 0)
        state = _bf16_phase(window, new, tier_rows(tables, b, False), split, NUM_SPLITS, h, tok, hi, lo, qk_scale,
                            qb, _empty(M, LG), G, LG, NG, D, P, BLOCK_N, B16)
        if HAS_INT2:
            q0 = _q_joined(qp, live, LG, F16)
            if NG == 2:
                q1 = _q_joined(qp + G, live, LG, F16)
            else:  # an unused placeholder (NG == 1)
                q1 = q0
            state = _code_phase(history, tier_rows(tables, b, True), split, NUM_SPLITS, h, qk_scale, (q0, q1),
                                state, F16, LG, NG, CONV, P, BLOCK_N, CHUNK, INTERPRET)
        acc0, acc1, m_i, l_i = state
        MidO, MidL, o_strides, l_strides = mid
        sot, soh, sos = o_strides
        slt, slh = l_strides
        rows = (lo + tok).to(tl.int64)
        seen = l_i > 0
        inv = 1.0 / tl.where(seen, l_i, 1.0)
        op = MidO + rows[:, None] * sot + head[:, None] * soh + split * sos
        _store_group(op, live, acc0, inv, LG)
        if NG == 2:
            _store_group(op + G, live, acc1, inv, LG)
        tl.store(MidL + rows * slt + head * slh + split,
                 tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf")), mask=live_rows)
