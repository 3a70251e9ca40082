"""Decode attention over a mixed cache with INT2 history, codes fed raw to the tensor cores.

The kernel of :func:`oscarkv.kernels.decode.decode_attention` for an INT2 cache whose groups
are at least 64 channels wide (``G >= 64``, ``d / G <= 2``: every Qwen/Llama shape at the
default ``G = min(d, 128)``). Same grid, split-K and merge as the generic kernel there.

Algebra (per token t, group g; ``x̂ = m + s·c`` with codes ``c ∈ {0..3}``)::

    q·k̂_t  = Σ_g s_tg (q_g · c_tg) + Σ_g m_tg Σq_g          scale/zero applied after the dot
    Σ_t p_t v̂_t = Σ_t (p_t s_tg) c_tg  +  Σ_t p_t m_tg       (second term per channel group)

so only the code → float conversion is per element (``_slices``). Codes 0..3 are exact in
every float format, and a code left *in place* in the low byte of an fp16 (exponent bits 0) is
an fp16 subnormal: slice ``i`` of a byte (bits ``2i..2i+1``) masked out of it is the fp16 number
``c · 4^i · 2^-24``. One inline-PTX block turns four code bytes into all four slices: two
``prmt`` spread the bytes into the low bytes of two fp16 pairs, then one ``and`` per pair and
slice (10 instructions per 16 codes; shifting each slice down and widening it cost 15,
``lab/record/benchmarks-log.md`` round 7). The slice units are folded in exactly (powers of two): q's
slice ``i`` is pre-scaled by ``2^(3-2i)`` so every key dot yields ``(q·c) · 2^-21`` and ``2^21``
goes into the key scale; value slice ``i`` accumulates in units of ``4^i · 2^-24``, undone at the
store. Queries and ``p·s`` are fp16 for these dots (fp16 has 3 more mantissa bits than bf16; the
range is ample for rotated queries, ``|q| < 8000``, and probabilities). The BF16 windows use
bf16 dots with ``p`` in each slice's unit so one set of accumulators serves both tiers.

Transposed tiles. Every product is computed with the tokens and channels on the tensor cores'
M and K and the ``REP`` query rows of the KV head on N (``REP_PAD = max(8, REP)``, the mma's
``n = 8``): scores ``[BLOCK_N, R] = codes [BLOCK_N, LG] @ q_i [LG, R]``, outputs
``[LG, R] += codes^T [LG, BLOCK_N] @ (p s) [BLOCK_N, R]``. With 4 query rows per KV head
(Qwen3) an ``M = 16`` tile of query rows was 3/4 padding; on N it is 1/2, which halves the
mma count and the fp32 accumulators (``[LG, 8]`` slices: 8 registers each, was 16), and q
becomes the dot's B operand. The kernel then fits in 168 registers without spills (it used
255 with spills), so ``decode._config`` runs 12 one-warp programs per SM instead of 8
(H100, 2026-11-22, ``lab/record/benchmarks-log.md`` round 6). Online-softmax statistics are per column
(``split_k.softmax_step_t`` reduces over axis 0).

Column order. Byte ``j`` of a token holds, in bits ``2i..2i+1``, element
``(j // LG) G + i LG + j % LG`` (``LG = G / 4``; ``oscarkv.quant.int2``), so slice ``i`` of group
``g`` is a contiguous run of ``LG`` channels: q, the BF16 windows and the accumulators are
split into ``4 · d/G`` tiles ``[LG, .]`` and nothing is permuted. Key codes are loaded as
``[BLOCK_N, LG]`` (tokens × bytes, the A operand with K = bytes, contiguous) and value codes as
``[LG, BLOCK_N]``, so both feed ``tl.dot`` without a ``tl.trans`` and Triton keeps the
conversion in the dot-operand layout (no shared-memory round trip of converted values).
NOTE: the value codes' A operand wants 4 consecutive tokens of one byte column per thread:
Triton reads them from shared memory as single bytes and packs them (64 ``LDS.U8`` and 48
``PRMT`` of ~1000 instructions per tile of 64 tokens in the sm_90 SASS at G = 128).

Pipelining. The INT2 history of a split is walked in full tiles of ``BLOCK_N`` tokens (INT2
lengths are multiples of ``P``, ``P % BLOCK_N == 0``, split shares ``BLOCK_N``-aligned), so its
loads carry no masks and every one — codes, scales and zeros — is a vector copy. The page ids
are read ``CHUNK`` tiles at a time before the tile loop (``split_k.chunk_pages``) and picked out of
registers inside it (``pick_page``): no load in the loop feeds an address, so Triton issues each
tile's copies ``num_stages - 1`` tiles ahead. (With one page-id load per tile inside the loop
it waited for every copy at the top of each iteration: one tile in flight, H100 SASS,
2026-11-22.)

4-bit kinds (the precision ladder, ``KBITS``/``VBITS`` = 4). A 4-bit row is two INT2 planes of the
same channels, ``c = lo + 4·hi``, the high plane ``d / 4`` bytes after the low one
(``oscarkv.quant.int2``), so ``m + s·c = (m + s·lo) + 4s·hi``: the high plane is one more INT2 tile
with scale ``4s`` and zero 0. Keys add ``4 s_k (q · hi)`` to the scores, values add
``hi^T @ (p · 4 s_v)`` to the *same* slice accumulators (``_key_group``, ``_value_group``): no new
registers but one code tile, so the structure, the pipelining and the tile table stay the INT2 ones
and the history bytes per token grow from ``d/2 + 8 d/G`` (INT2) to ``3d/4 + 8 d/G`` (K4V2, K2V4) or
``d + 8 d/G`` (INT4). NOTE: speed not measured on a GPU (no device time when it was written):
``tests/kernels/test_decode.py::test_decode_rungs_gpu`` and a decode bench per rung are what to run
(DESIGN.md §4).

``CONV = 0`` is the interpreter path (fp32 arithmetic, the same slice units); ``CONV = 2`` the inline PTX.

Non-uniform 2-bit levels (``KLEV``/``VLEV``; ``kernels.levels``): a kind with a table takes its slices as levels
``L[c_i]`` in units ``4^i · 2^-6``, looked up by ``prmt`` (``_lut_slice``; 2^18 coarser: the key scale takes
``2^3`` for ``2^21``, the store undoes the values with ``VSHIFT = 18``). Without a table: the uniform SASS.
"""

from __future__ import annotations

import triton
import triton.language as tl

from oscarkv.kernels.levels import _level_slice, _lut_slice
from oscarkv.kernels.split_k import chunk_pages, pick_page, softmax_step_t, split_range, tile


@triton.jit
def _slices(c, CONV: tl.constexpr):
    """The four 2-bit slices of packed uint8 codes ``c`` as ``code · 4^i · 2^-24``, i = 0..3 (fp16
    subnormals; fp32 in the interpreter): four tensors shaped like ``c``."""
    if CONV == 0:
        return ((c & 3).to(tl.float32) * 2.0**-24, ((c >> 2) & 3).to(tl.float32) * 2.0**-22,
                ((c >> 4) & 3).to(tl.float32) * 2.0**-20, ((c >> 6) & 3).to(tl.float32) * 2.0**-18)
    else:
        # NOTE: pack=4: $8 holds four code bytes e0..e3; the two prmt spread them into the low bytes
        # of two fp16 pairs ([e0, 0, e1, 0] and [e2, 0, e3, 0]); slice i is then one and per pair:
        # the bits 2i..2i+1 left in place are the fp16 subnormal code_i · 4^i · 2^-24. Results are
        # grouped by output ($0,$1 slice 0 ... $6,$7 slice 3), each pair holding elements (0,1), (2,3).
        return tl.inline_asm_elementwise(
            "{ .reg .b32 lo, hi; prmt.b32 lo, $8, 0, 0x4140; prmt.b32 hi, $8, 0, 0x4342; "
            "and.b32 $0, lo, 0x00030003; and.b32 $1, hi, 0x00030003; "
            "and.b32 $2, lo, 0x000C000C; and.b32 $3, hi, 0x000C000C; "
            "and.b32 $4, lo, 0x00300030; and.b32 $5, hi, 0x00300030; "
            "and.b32 $6, lo, 0x00C000C0; and.b32 $7, hi, 0x00C000C0; }",
            "=r,=r,=r,=r,=r,=r,=r,=r,r", [c], dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
            is_pure=True, pack=4)


@triton.jit
def _any_slices(c, L1, L2, CONV: tl.constexpr, LEV: tl.constexpr, DT: tl.constexpr):
    """The four slices of ``c``: codes in units ``4^i · 2^-24`` (``_slices``), or with a level table (``LEV``)
    levels in units ``4^i · 2^-6`` (``_level_slice``)."""
    if LEV and CONV == 0:
        return (_level_slice(c, L1, L2, 0, DT), _level_slice(c, L1, L2, 1, DT), _level_slice(c, L1, L2, 2, DT),
                _level_slice(c, L1, L2, 3, DT))
    elif LEV:
        return _lut_slice(c, L1, L2, 0), _lut_slice(c, L1, L2, 1), _lut_slice(c, L1, L2, 2), _lut_slice(c, L1, L2, 3)
    else:
        return _slices(c, CONV)


@triton.jit
def _group_scores(ck, q0, q1, q2, q3, L1, L2, CONV: tl.constexpr, LEV: tl.constexpr):
    """Σ_i c_i · q_i for one group: ``ck`` uint8 ``[N, LG]``, q_i ``[LG, R]`` pre-scaled by ``2^(3-2i)``
    (``_group_q``) → fp32 ``[N, R]`` = ``(q · c) · 2^-21`` (``(q · L[c]) · 2^-3`` with a level table)."""
    k0, k1, k2, k3 = _any_slices(ck, L1, L2, CONV, LEV, q0.dtype)
    s = tl.dot(k0, q0)
    s = tl.dot(k1, q1, s)
    s = tl.dot(k2, q2, s)
    return tl.dot(k3, q3, s)


@triton.jit
def _group_values(cvT, ps, a0, a1, a2, a3, alpha, L1, L2, CONV: tl.constexpr, LEV: tl.constexpr):
    """Rescale the slice accumulators ``[LG, R]`` of one group and add ``c_i^T @ ps`` (``cvT`` uint8
    ``[LG, N]``); slice i accumulates in units of ``4^i · 2^-24`` (``4^i · 2^-6`` with a level table;
    ``_store`` undoes it)."""
    v0, v1, v2, v3 = _any_slices(cvT, L1, L2, CONV, LEV, ps.dtype)
    a0 = tl.dot(v0, ps, a0 * alpha[None, :])
    a1 = tl.dot(v1, ps, a1 * alpha[None, :])
    a2 = tl.dot(v2, ps, a2 * alpha[None, :])
    a3 = tl.dot(v3, ps, a3 * alpha[None, :])
    return a0, a1, a2, a3


@triton.jit
def _bf16_scores(K, rows, mk, b0, b1, b2, b3, LG: tl.constexpr, s):
    """Add Σ_i k_i · q_i of one group's four slices (``rows [N, 1]`` already point at the group)."""
    cols = tl.arange(0, LG)[None, :]
    s = tl.dot(tl.load(K + rows + cols, mask=mk, other=0.0).to(b0.dtype), b0, s)
    s = tl.dot(tl.load(K + rows + LG + cols, mask=mk, other=0.0).to(b0.dtype), b1, s)
    s = tl.dot(tl.load(K + rows + 2 * LG + cols, mask=mk, other=0.0).to(b0.dtype), b2, s)
    return tl.dot(tl.load(K + rows + 3 * LG + cols, mask=mk, other=0.0).to(b0.dtype), b3, s)


@triton.jit
def _bf16_values(V, rowsT, mkT, p, a0, a1, a2, a3, alpha, LG: tl.constexpr, B16: tl.constexpr, VSHIFT: tl.constexpr):
    """Rescale the four slice accumulators ``[LG, R]`` and add ``v_i^T @ (p · 4^i · 2^(VSHIFT-24))``
    (``rowsT [1, N]``): the units of the INT2 slices (``_group_values``)."""
    cols = tl.arange(0, LG)[:, None]
    a0 = tl.dot(tl.load(V + rowsT + cols, mask=mkT, other=0.0).to(B16), (p * 2.0**(VSHIFT - 24)).to(B16),
                a0 * alpha[None, :])
    a1 = tl.dot(tl.load(V + rowsT + LG + cols, mask=mkT, other=0.0).to(B16), (p * 2.0**(VSHIFT - 22)).to(B16),
                a1 * alpha[None, :])
    a2 = tl.dot(tl.load(V + rowsT + 2 * LG + cols, mask=mkT, other=0.0).to(B16), (p * 2.0**(VSHIFT - 20)).to(B16),
                a2 * alpha[None, :])
    a3 = tl.dot(tl.load(V + rowsT + 3 * LG + cols, mask=mkT, other=0.0).to(B16), (p * 2.0**(VSHIFT - 18)).to(B16),
                a3 * alpha[None, :])
    return a0, a1, a2, a3


@triton.jit
def _load_q(qp, live, LG: tl.constexpr, DT: tl.constexpr):
    """The four slices ``[LG, R]`` (channels x query rows) of one group of q (``qp [1, R]``)."""
    cols = tl.arange(0, LG)[:, None]
    return (tl.load(qp + cols, mask=live, other=0.0).to(DT), tl.load(qp + LG + cols, mask=live, other=0.0).to(DT),
            tl.load(qp + 2 * LG + cols, mask=live, other=0.0).to(DT),
            tl.load(qp + 3 * LG + cols, mask=live, other=0.0).to(DT))


@triton.jit
def _group_q(qp, live, LG: tl.constexpr, F16: tl.constexpr, B16: tl.constexpr):
    """One group's q slices for the codes (fp16, slice i scaled by ``2^(3-2i)`` against the slice's
    ``4^i · 2^-24`` code unit: ``_group_scores``) and the windows (bf16), and ``Σ q`` over the group's
    channels per query row (the zero-point term of the scores)."""
    h0, h1, h2, h3 = _load_q(qp, live, LG, F16)
    b0, b1, b2, b3 = _load_q(qp, live, LG, B16)
    h0, h1, h2, h3 = h0.to(tl.float32), h1.to(tl.float32), h2.to(tl.float32), h3.to(tl.float32)
    qs = tl.sum(h0 + h1 + h2 + h3, 0)
    return ((h0 * 8.0).to(F16), (h1 * 2.0).to(F16), (h2 * 0.5).to(F16), (h3 * 0.125).to(F16),
            b0, b1, b2, b3, qs)


@triton.jit
def _empty_state(LG: tl.constexpr, REP_PAD: tl.constexpr):
    """The online softmax before any token: slice accumulators ``[LG, REP_PAD]`` of groups 0 and 1 (zeros),
    ``acc_m``, ``acc_m1`` (Σ p·m per group), ``m_i = -inf``, ``l_i = 0``."""
    z = tl.zeros([LG, REP_PAD], tl.float32)
    r = tl.zeros([REP_PAD], tl.float32)
    return z, z, z, z, z, z, z, z, r, r, tl.full([REP_PAD], float("-inf"), tl.float32), r


@triton.jit
def _store(op, live, a0, a1, a2, a3, acc_m, inv, LG: tl.constexpr, VSHIFT: tl.constexpr):
    """Output of one group: (acc_i · 2^(24-VSHIFT) / 4^i + Σ p m) / l for its four slices ``[LG, R]``."""
    cols = tl.arange(0, LG)[:, None]
    tl.store(op + cols, (a0 * 2.0**(24 - VSHIFT) + acc_m[None, :]) * inv[None, :], mask=live)
    tl.store(op + LG + cols, (a1 * 2.0**(22 - VSHIFT) + acc_m[None, :]) * inv[None, :], mask=live)
    tl.store(op + 2 * LG + cols, (a2 * 2.0**(20 - VSHIFT) + acc_m[None, :]) * inv[None, :], mask=live)
    tl.store(op + 3 * LG + cols, (a3 * 2.0**(18 - VSHIFT) + acc_m[None, :]) * inv[None, :], mask=live)


@triton.jit
def _store_partial(op, lp, live, live_rows, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i,
                   G: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr, VSHIFT: tl.constexpr):
    """The split's normalized output (``op [1, R]`` row pointers) and its log2-sum-exp (``lp [R]``) for
    the merge; a split that saw no token writes zeros and ``-inf``. ``live [1, R]`` and ``live_rows [R]``
    mark the real query rows."""
    seen = l_i > 0
    inv = 1.0 / tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    _store(op, live, a0, a1, a2, a3, acc_m, inv, LG, VSHIFT)
    if NG == 2:
        _store(op + G, live, e0, e1, e2, e3, acc_m1, inv, LG, VSHIFT)
    tl.store(lp, lse, mask=live_rows)


@triton.jit
def _bf16_windows(Kb, Vb, table, length, split, NUM_SPLITS, h, qk_scale, stride_bp, stride_bh, stride_bt,
                  b0, b1, b2, b3, c0, c1, c2, c3, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i,
                  B16: tl.constexpr, G: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr, P: tl.constexpr,
                  BLOCK_N: tl.constexpr, REP_PAD: tl.constexpr, VSHIFT: tl.constexpr):
    """The split's share of the BF16 sink + recent tokens (masked tiles), for the online softmax: bf16 dots
    with ``p`` in the INT2 slices' units (``_bf16_values``) so one set of accumulators serves both tiers."""
    n0, end = split_range(length, split, NUM_SPLITS, BLOCK_N)
    while n0 < end:
        page, off, ok = tile(table, n0, end, P, BLOCK_N)
        r = page * stride_bp + h * stride_bh + off * stride_bt
        s = _bf16_scores(Kb, r[:, None], ok[:, None], b0, b1, b2, b3, LG, tl.zeros([BLOCK_N, REP_PAD], tl.float32))
        if NG == 2:
            s = _bf16_scores(Kb + G, r[:, None], ok[:, None], c0, c1, c2, c3, LG, s)
        s = tl.where(ok[:, None], s * qk_scale, float("-inf"))
        p, alpha, m_i, l_i = softmax_step_t(s, m_i, l_i)
        a0, a1, a2, a3 = _bf16_values(Vb, r[None, :], ok[None, :], p, a0, a1, a2, a3, alpha, LG, B16, VSHIFT)
        acc_m = acc_m * alpha
        if NG == 2:
            e0, e1, e2, e3 = _bf16_values(Vb + G, r[None, :], ok[None, :], p, e0, e1, e2, e3, alpha, LG, B16, VSHIFT)
            acc_m1 = acc_m1 * alpha
        n0 += BLOCK_N
    return a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i


@triton.jit
def _int2_decode_kernel(Q, Kb, Vb, Kc, Ks, Kz, Vc, Vs, Vz, BfTable, BfLens, InTable, InLens, MidO, MidL,
                        qk_scale, NUM_SPLITS,
                        stride_qb, stride_qh,
                        stride_bp, stride_bh, stride_bt,
                        stride_cp, stride_ch, stride_ct,
                        stride_vp, stride_vh, stride_vt,
                        stride_sp, stride_sh, stride_st,
                        stride_bfb, stride_inb,
                        stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                        H: tl.constexpr, REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr,
                        G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, CONV: tl.constexpr,
                        CHUNK: tl.constexpr, INTERPRET: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr,
                        KL1=0.0, KL2=0.0, VL1=0.0, VL2=0.0, KLEV: tl.constexpr = False, VLEV: tl.constexpr = False):
    # NOTE: the interpreter's range() cannot take tensor bounds under numpy >= 2.4 and its
    # bf16/fp16 dots are wrong, so INTERPRET uses while loops and fp32 operands (see decode.py).
    VSHIFT: tl.constexpr = 18 if VLEV else 0  # value units 2^18 coarser with a level table (module docstring)
    LG: tl.constexpr = G // 4
    NG: tl.constexpr = D // G
    F16: tl.constexpr = tl.float32 if INTERPRET else tl.float16
    B16: tl.constexpr = tl.float32 if INTERPRET else tl.bfloat16
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    split = tl.program_id(1)
    rows = tl.arange(0, REP_PAD)
    heads = h * REP + rows
    live = (rows < REP)[None, :]
    qp = Q + b * stride_qb + heads[None, :] * stride_qh
    # group 0 (and group 1 when NG == 2): q slices in fp16 (codes) and bf16 (windows)
    h0, h1, h2, h3, b0, b1, b2, b3, qs0 = _group_q(qp, live, LG, F16, B16)
    if NG == 2:
        g0, g1, g2, g3, c0, c1, c2, c3, qs1 = _group_q(qp + G, live, LG, F16, B16)
    else:  # unused placeholders (NG == 1)
        g0, g1, g2, g3 = h0, h1, h2, h3
        c0, c1, c2, c3 = b0, b1, b2, b3
        qs1 = qs0
    a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i = _empty_state(LG, REP_PAD)

    # ---- the BF16 windows (sink + recent), then the INT2 history, one online softmax
    a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i = _bf16_windows(
        Kb, Vb, BfTable + b * stride_bfb, tl.load(BfLens + b), split, NUM_SPLITS, h, qk_scale,
        stride_bp, stride_bh, stride_bt, b0, b1, b2, b3, c0, c1, c2, c3,
        a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i, B16, G, LG, NG, P, BLOCK_N, REP_PAD, VSHIFT)

    a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i = _int2_history(
        Kc, Ks, Kz, Vc, Vs, Vz, InTable + b * stride_inb, tl.load(InLens + b), split, NUM_SPLITS, h, qk_scale,
        KL1, KL2, VL1, VL2, stride_cp, stride_ch, stride_ct, stride_vp, stride_vh, stride_vt, stride_sp, stride_sh, stride_st,
        h0, h1, h2, h3, g0, g1, g2, g3, qs0, qs1, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i,
        F16, LG, NG, CONV, P, BLOCK_N, CHUNK, INTERPRET, KBITS, VBITS, KLEV, VLEV)

    _store_partial(MidO + b * stride_ob + heads[None, :] * stride_oh + split * stride_os,
                   MidL + b * stride_lb + heads * stride_lh + split, live, rows < REP,
                   a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i, G, LG, NG, VSHIFT)


@triton.jit
def _int2_history(Kc, Ks, Kz, Vc, Vs, Vz, table, length, split, NUM_SPLITS, h, qk_scale, KL1, KL2, VL1, VL2,
                  stride_cp, stride_ch, stride_ct, stride_vp, stride_vh, stride_vt, stride_sp, stride_sh, stride_st,
                  h0, h1, h2, h3, g0, g1, g2, g3, qs0, qs1, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i,
                  F16: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr, CONV: tl.constexpr, P: tl.constexpr,
                  BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, INTERPRET: tl.constexpr, KBITS: tl.constexpr,
                  VBITS: tl.constexpr, KLEV: tl.constexpr, VLEV: tl.constexpr):
    """The split's share of the INT2 history in full tiles (INT2 lengths are multiples of ``P``,
    ``P % BLOCK_N == 0``, split shares ``BLOCK_N``-aligned); page ids read ``CHUNK`` tiles at a time
    ahead of the tile loop (module docstring, "Pipelining")."""
    c0, end = split_range(length, split, NUM_SPLITS, BLOCK_N)
    while c0 < end:
        c_end = tl.minimum(end, c0 + CHUNK * BLOCK_N)
        pages = chunk_pages(table, c0, c_end, P, BLOCK_N, CHUNK)
        if INTERPRET:
            n0 = c0
            while n0 < c_end:
                page, off = pick_page(pages, c0, n0, P, BLOCK_N, CHUNK)
                a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i = _int2_step(
                    page, off, h, qk_scale, KL1, KL2, VL1, VL2, Kc, Ks, Kz, Vc, Vs, Vz,
                    stride_cp, stride_ch, stride_ct, stride_vp, stride_vh, stride_vt, stride_sp, stride_sh, stride_st,
                    h0, h1, h2, h3, g0, g1, g2, g3, qs0, qs1, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1,
                    m_i, l_i, F16, LG, NG, CONV, KBITS, VBITS, KLEV, VLEV)
                n0 += BLOCK_N
        else:
            for n0 in range(c0, c_end, BLOCK_N):
                page, off = pick_page(pages, c0, n0, P, BLOCK_N, CHUNK)
                a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i = _int2_step(
                    page, off, h, qk_scale, KL1, KL2, VL1, VL2, Kc, Ks, Kz, Vc, Vs, Vz,
                    stride_cp, stride_ch, stride_ct, stride_vp, stride_vh, stride_vt, stride_sp, stride_sh, stride_st,
                    h0, h1, h2, h3, g0, g1, g2, g3, qs0, qs1, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1,
                    m_i, l_i, F16, LG, NG, CONV, KBITS, VBITS, KLEV, VLEV)
        c0 = c_end
    return a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i


@triton.jit
def _key_group(Kc, crow, jb, q0, q1, q2, q3, sk, L1, L2, PLANE: tl.constexpr, KBITS: tl.constexpr, CONV: tl.constexpr,
               LEV: tl.constexpr):
    """``s · (q · c)`` of one key group over a tile (``crow [N]`` rows at the group's bytes, ``sk`` its scales
    times ``2^21``); a 4-bit key adds its high plane (``PLANE`` bytes on) at scale ``4 s``."""
    s = _group_scores(tl.load(Kc + crow[:, None] + jb[None, :]), q0, q1, q2, q3, L1, L2, CONV, LEV) * sk[:, None]  # [N, R]
    if KBITS == 4:
        s += _group_scores(tl.load(Kc + PLANE + crow[:, None] + jb[None, :]), q0, q1, q2, q3, L1, L2, CONV,
                           LEV) * (4.0 * sk)[:, None]
    return s


@triton.jit
def _value_group(Vc, vrow, jb, p, sv, a0, a1, a2, a3, alpha, L1, L2, F16: tl.constexpr, PLANE: tl.constexpr,
                 VBITS: tl.constexpr, CONV: tl.constexpr, LEV: tl.constexpr):
    """Rescale one value group's slice accumulators and add ``c^T @ (p s)``; a 4-bit value adds its high
    plane (``PLANE`` bytes on) with ``p · 4s``."""
    a0, a1, a2, a3 = _group_values(tl.load(Vc + vrow[None, :] + jb[:, None]), (p * sv[:, None]).to(F16),  # [LG, N]
                                   a0, a1, a2, a3, alpha, L1, L2, CONV, LEV)
    if VBITS == 4:
        one = tl.full(alpha.shape, 1.0, tl.float32)
        a0, a1, a2, a3 = _group_values(tl.load(Vc + PLANE + vrow[None, :] + jb[:, None]),
                                       (p * (4.0 * sv)[:, None]).to(F16), a0, a1, a2, a3, one, L1, L2, CONV, LEV)
    return a0, a1, a2, a3


@triton.jit
def _int2_step(page, off, h, qk_scale, KL1, KL2, VL1, VL2, Kc, Ks, Kz, Vc, Vs, Vz,
               stride_cp, stride_ch, stride_ct, stride_vp, stride_vh, stride_vt, stride_sp, stride_sh, stride_st,
               h0, h1, h2, h3, g0, g1, g2, g3, qs0, qs1, a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i,
               F16: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr, CONV: tl.constexpr,
               KBITS: tl.constexpr, VBITS: tl.constexpr, KLEV: tl.constexpr, VLEV: tl.constexpr):
    """One full tile of INT2 tokens (page ``page``, in-page offsets ``off``) for the online softmax
    (see the module docstring). No masks: every load is a vector copy Triton can pipeline. A 4-bit kind
    (``KBITS``/``VBITS`` = 4) is two INT2 planes, the high one ``PLANE = d / 4`` bytes on, read as a second
    INT2 tile of the same channels with scale ``4s`` and zero 0 (``oscarkv.quant.int2``)."""
    PLANE: tl.constexpr = LG * NG
    crow = page * stride_cp + h * stride_ch + off * stride_ct
    vrow = page * stride_vp + h * stride_vh + off * stride_vt
    srow = page * stride_sp + h * stride_sh + off * stride_st
    jb = tl.arange(0, LG)
    KSHIFT: tl.constexpr = 18 if KLEV else 0  # key slices 2^18 coarser with a level table (module docstring)
    sk = tl.load(Ks + srow).to(tl.float32) * 2.0**(21 - KSHIFT)
    zk = tl.load(Kz + srow).to(tl.float32)
    s = _key_group(Kc, crow, jb, h0, h1, h2, h3, sk, KL1, KL2, PLANE, KBITS, CONV, KLEV) + zk[:, None] * qs0[None, :]
    if NG == 2:
        sk1 = tl.load(Ks + 1 + srow).to(tl.float32) * 2.0**(21 - KSHIFT)
        zk1 = tl.load(Kz + 1 + srow).to(tl.float32)
        s += _key_group(Kc + LG, crow, jb, g0, g1, g2, g3, sk1, KL1, KL2, PLANE, KBITS, CONV, KLEV) + zk1[:, None] * qs1[None, :]
    p, alpha, m_i, l_i = softmax_step_t(s * qk_scale, m_i, l_i)
    sv = tl.load(Vs + srow).to(tl.float32)
    zv = tl.load(Vz + srow).to(tl.float32)
    a0, a1, a2, a3 = _value_group(Vc, vrow, jb, p, sv, a0, a1, a2, a3, alpha, VL1, VL2, F16, PLANE, VBITS, CONV, VLEV)
    acc_m = acc_m * alpha + tl.sum(p * zv[:, None], 0)
    if NG == 2:
        sv1 = tl.load(Vs + 1 + srow).to(tl.float32)
        zv1 = tl.load(Vz + 1 + srow).to(tl.float32)
        e0, e1, e2, e3 = _value_group(Vc + LG, vrow, jb, p, sv1, e0, e1, e2, e3, alpha, VL1, VL2, F16, PLANE, VBITS, CONV,
                                      VLEV)
        acc_m1 = acc_m1 * alpha + tl.sum(p * zv1[:, None], 0)
    return a0, a1, a2, a3, e0, e1, e2, e3, acc_m, acc_m1, m_i, l_i
