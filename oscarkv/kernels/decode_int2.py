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
from oscarkv.kernels.pools import history_rows, tier_rows, window_rows
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
def _any_slices(c, levels, CONV: tl.constexpr, LEV: tl.constexpr, DT: tl.constexpr):
    """The four slices of ``c``: codes in units ``4^i · 2^-24`` (``_slices``), or with a level table (``LEV``,
    ``levels = (l1, l2)``) levels in units ``4^i · 2^-6`` (``_level_slice``)."""
    L1, L2 = levels
    if LEV and CONV == 0:
        return (_level_slice(c, L1, L2, 0, DT), _level_slice(c, L1, L2, 1, DT), _level_slice(c, L1, L2, 2, DT),
                _level_slice(c, L1, L2, 3, DT))
    elif LEV:
        return _lut_slice(c, L1, L2, 0), _lut_slice(c, L1, L2, 1), _lut_slice(c, L1, L2, 2), _lut_slice(c, L1, L2, 3)
    else:
        return _slices(c, CONV)


@triton.jit
def _group_scores(ck, qh, levels, CONV: tl.constexpr, LEV: tl.constexpr):
    """Σ_i c_i · q_i for one group: ``ck`` uint8 ``[N, LG]``, ``qh`` the four q_i ``[LG, R]`` pre-scaled by
    ``2^(3-2i)`` (``_group_q``) → fp32 ``[N, R]`` = ``(q · c) · 2^-21`` (``(q · L[c]) · 2^-3`` with a level table)."""
    q0, q1, q2, q3 = qh
    k0, k1, k2, k3 = _any_slices(ck, levels, CONV, LEV, q0.dtype)
    s = tl.dot(k0, q0)
    s = tl.dot(k1, q1, s)
    s = tl.dot(k2, q2, s)
    return tl.dot(k3, q3, s)


@triton.jit
def _group_values(cvT, ps, acc, alpha, levels, CONV: tl.constexpr, LEV: tl.constexpr):
    """Rescale the four slice accumulators ``acc`` ``[LG, R]`` of one group and add ``c_i^T @ ps`` (``cvT`` uint8
    ``[LG, N]``); slice i accumulates in units of ``4^i · 2^-24`` (``4^i · 2^-6`` with a level table;
    ``_store`` undoes it)."""
    a0, a1, a2, a3 = acc
    v0, v1, v2, v3 = _any_slices(cvT, levels, CONV, LEV, ps.dtype)
    a = alpha[None, :]  # NOTE: each tile's products summed apart, added in fp32 (_add_tile)
    return (_add_tile(a0, a, tl.dot(v0, ps)), _add_tile(a1, a, tl.dot(v1, ps)), _add_tile(a2, a, tl.dot(v2, ps)),
            _add_tile(a3, a, tl.dot(v3, ps)))


@triton.jit
def _add_tile(acc, alpha, tile):
    """``acc · alpha + tile`` on the CUDA cores, in fp32: the running output of the code slices leaves the tensor cores.

    NOTE: ``tl.dot(c, ps, acc · alpha)`` chains the accumulator through every tile's MMAs, and summed that way the
    slices' tiny units (fp16 subnormal codes) lose low bits each MMA, toward zero: over a split of 50K INT2 tokens the
    output came out 0.4% short, 6% off the fp32 oracle (H200, 2026-11-28, ``python -m lab.scripts.split_error``,
    ``lab/bench_gpu/2026-11-28/s19_call9_h200/``: 6.2e-2 at 2 splits of 100K, 8.4e-3 at 8 (a k = 64 chunk's; 32 sequences
    decode in 6), 1.8e-3 at 64; summed apart 1.8e-3 at every count, for +0-2% decode and +5-6% chunk kernel time). BF16
    windows (``_bf16_values``) showed no such growth (2.2-2.3e-3 at 2-64 splits) and keep the chained form. ``tl.fma``,
    not ``+``: Triton folds ``dot(a, b) + c`` back into ``dot(a, b, c)`` (a first try read the same errors)."""
    return tl.fma(acc, alpha, tile)


@triton.jit
def _bf16_scores(K, rows, mk, qb, LG: tl.constexpr, s):
    """Add Σ_i k_i · q_i of one group's four slices (``qb``: q's bf16 slices; ``rows [N, 1]`` already point
    at the group)."""
    b0, b1, b2, b3 = qb
    cols = tl.arange(0, LG)[None, :]
    s = tl.dot(tl.load(K + rows + cols, mask=mk, other=0.0).to(b0.dtype), b0, s)
    s = tl.dot(tl.load(K + rows + LG + cols, mask=mk, other=0.0).to(b0.dtype), b1, s)
    s = tl.dot(tl.load(K + rows + 2 * LG + cols, mask=mk, other=0.0).to(b0.dtype), b2, s)
    return tl.dot(tl.load(K + rows + 3 * LG + cols, mask=mk, other=0.0).to(b0.dtype), b3, s)


@triton.jit
def _bf16_values(V, rowsT, mkT, p, acc, alpha, LG: tl.constexpr, B16: tl.constexpr, VSHIFT: tl.constexpr):
    """One group's accumulators ``acc = (slices, Σ p m)`` rescaled, the slices ``[LG, R]`` plus
    ``v_i^T @ (p · 4^i · 2^(VSHIFT-24))`` (``rowsT [1, N]``): the units of the INT2 slices (``_group_values``)."""
    slices, acc_m = acc
    a0, a1, a2, a3 = slices
    cols = tl.arange(0, LG)[:, None]
    a0 = tl.dot(tl.load(V + rowsT + cols, mask=mkT, other=0.0).to(B16), (p * 2.0**(VSHIFT - 24)).to(B16),
                a0 * alpha[None, :])
    a1 = tl.dot(tl.load(V + rowsT + LG + cols, mask=mkT, other=0.0).to(B16), (p * 2.0**(VSHIFT - 22)).to(B16),
                a1 * alpha[None, :])
    a2 = tl.dot(tl.load(V + rowsT + 2 * LG + cols, mask=mkT, other=0.0).to(B16), (p * 2.0**(VSHIFT - 20)).to(B16),
                a2 * alpha[None, :])
    a3 = tl.dot(tl.load(V + rowsT + 3 * LG + cols, mask=mkT, other=0.0).to(B16), (p * 2.0**(VSHIFT - 18)).to(B16),
                a3 * alpha[None, :])
    return (a0, a1, a2, a3), acc_m * alpha


@triton.jit
def _load_q(qp, live, LG: tl.constexpr, DT: tl.constexpr):
    """The four slices ``[LG, R]`` (channels x query rows) of one group of q (``qp [1, R]``)."""
    cols = tl.arange(0, LG)[:, None]
    return (tl.load(qp + cols, mask=live, other=0.0).to(DT), tl.load(qp + LG + cols, mask=live, other=0.0).to(DT),
            tl.load(qp + 2 * LG + cols, mask=live, other=0.0).to(DT),
            tl.load(qp + 3 * LG + cols, mask=live, other=0.0).to(DT))


@triton.jit
def _group_q(qp, live, LG: tl.constexpr, F16: tl.constexpr, B16: tl.constexpr):
    """One group's q as ``(codes' slices, windows' slices, Σ q)``: fp16 slices for the codes (slice i scaled by
    ``2^(3-2i)`` against the slice's ``4^i · 2^-24`` code unit: ``_group_scores``), bf16 slices for the windows,
    and ``Σ q`` over the group's channels per query row (the zero-point term of the scores)."""
    h0, h1, h2, h3 = _load_q(qp, live, LG, F16)
    qb = _load_q(qp, live, LG, B16)
    h0, h1, h2, h3 = h0.to(tl.float32), h1.to(tl.float32), h2.to(tl.float32), h3.to(tl.float32)
    qs = tl.sum(h0 + h1 + h2 + h3, 0)
    return ((h0 * 8.0).to(F16), (h1 * 2.0).to(F16), (h2 * 0.5).to(F16), (h3 * 0.125).to(F16)), qb, qs


@triton.jit
def _empty_state(LG: tl.constexpr, REP_PAD: tl.constexpr):
    """The online softmax before any token: ``(acc0, acc1, m_i, l_i)``, ``acc_g = (slice accumulators
    [LG, REP_PAD] of group g, Σ p·m of group g [REP_PAD])`` at zero, ``m_i = -inf``, ``l_i = 0``."""
    z = tl.zeros([LG, REP_PAD], tl.float32)
    r = tl.zeros([REP_PAD], tl.float32)
    return ((z, z, z, z), r), ((z, z, z, z), r), tl.full([REP_PAD], float("-inf"), tl.float32), r


@triton.jit
def _store(op, live, acc, inv, LG: tl.constexpr, VSHIFT: tl.constexpr):
    """Output of one group: (acc_i · 2^(24-VSHIFT) / 4^i + Σ p m) / l for its four slices ``[LG, R]``."""
    slices, acc_m = acc
    a0, a1, a2, a3 = slices
    cols = tl.arange(0, LG)[:, None]
    tl.store(op + cols, (a0 * 2.0**(24 - VSHIFT) + acc_m[None, :]) * inv[None, :], mask=live)
    tl.store(op + LG + cols, (a1 * 2.0**(22 - VSHIFT) + acc_m[None, :]) * inv[None, :], mask=live)
    tl.store(op + 2 * LG + cols, (a2 * 2.0**(20 - VSHIFT) + acc_m[None, :]) * inv[None, :], mask=live)
    tl.store(op + 3 * LG + cols, (a3 * 2.0**(18 - VSHIFT) + acc_m[None, :]) * inv[None, :], mask=live)


@triton.jit
def _store_partial(op, lp, live, live_rows, state, G: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr,
                   VSHIFT: tl.constexpr):
    """The split's normalized output (``op [1, R]`` row pointers) and its log2-sum-exp (``lp [R]``) for
    the merge; a split that saw no token writes zeros and ``-inf``. ``live [1, R]`` and ``live_rows [R]``
    mark the real query rows."""
    acc0, acc1, m_i, l_i = state
    seen = l_i > 0
    inv = 1.0 / tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    _store(op, live, acc0, inv, LG, VSHIFT)
    if NG == 2:
        _store(op + G, live, acc1, inv, LG, VSHIFT)
    tl.store(lp, lse, mask=live_rows)


@triton.jit
def _bf16_windows(window, tier, split, NUM_SPLITS, h, qk_scale, q, state,
                  B16: tl.constexpr, G: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr, P: tl.constexpr,
                  BLOCK_N: tl.constexpr, REP_PAD: tl.constexpr, VSHIFT: tl.constexpr):
    """The split's share of the BF16 sink + recent tokens (``tier``: page row and length; masked tiles), for the
    online softmax ``state``: bf16 dots with ``p`` in the INT2 slices' units (``_bf16_values``) so one set of
    accumulators serves both tiers. ``q = (group 0, group 1)`` as ``_group_q`` gives them."""
    K, V, _ = window
    table, length = tier
    acc0, acc1, m_i, l_i = state
    n0, end = split_range(length, split, NUM_SPLITS, BLOCK_N)
    while n0 < end:
        page, off, ok = tile(table, n0, end, P, BLOCK_N)
        r = window_rows(window, page, h, off)
        s = _bf16_scores(K, r[:, None], ok[:, None], q[0][1], LG, tl.zeros([BLOCK_N, REP_PAD], tl.float32))
        if NG == 2:
            s = _bf16_scores(K + G, r[:, None], ok[:, None], q[1][1], LG, s)
        s = tl.where(ok[:, None], s * qk_scale, float("-inf"))
        p, alpha, m_i, l_i = softmax_step_t(s, m_i, l_i)
        acc0 = _bf16_values(V, r[None, :], ok[None, :], p, acc0, alpha, LG, B16, VSHIFT)
        if NG == 2:
            acc1 = _bf16_values(V + G, r[None, :], ok[None, :], p, acc1, alpha, LG, B16, VSHIFT)
        n0 += BLOCK_N
    return acc0, acc1, m_i, l_i


@triton.jit
def _int2_decode_kernel(Q, window, history, tables, mid, qk_scale, NUM_SPLITS,
                        H: tl.constexpr, REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr,
                        G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, CONV: tl.constexpr,
                        CHUNK: tl.constexpr, INTERPRET: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr,
                        KLEV: tl.constexpr = False, VLEV: tl.constexpr = False, history2=None, SPLIT_H: tl.constexpr = 0,
                        KBITS2: tl.constexpr = 2, VBITS2: tl.constexpr = 2, KLEV2: tl.constexpr = False,
                        VLEV2: tl.constexpr = False):
    """``Q = (q, stride_b, stride_h)``; ``window``, ``history``, ``tables``: the bundles of
    :mod:`oscarkv.kernels.pools`; ``mid = (Mid_O, Mid_L, (its strides b, h, s), (Mid_L's b, h))``. A per-head split
    (``SPLIT_H`` > 0, ``LayerKV.split``): KV heads from ``SPLIT_H`` on read their history from ``history2`` (its own
    bits ``KBITS2``..., head ``h - SPLIT_H`` there); one launch, one wave of programs for the whole layer."""
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
    qp = Q[0] + b * Q[1] + heads[None, :] * Q[2]
    q0 = _group_q(qp, live, LG, F16, B16)
    if NG == 2:
        q1 = _group_q(qp + G, live, LG, F16, B16)
    else:  # an unused placeholder (NG == 1)
        q1 = q0
    state = _empty_state(LG, REP_PAD)
    # ---- the BF16 windows (sink + recent), then the INT2 history, one online softmax
    # NOTE: the windows' shares go to the splits in reverse: the last splits hold the history's remainder (or none:
    # shares are BLOCK_N-aligned, so 512 splits of 100K leave 112 empty), the first ones full shares
    state = _bf16_windows(window, tier_rows(tables, b, False), NUM_SPLITS - 1 - split, NUM_SPLITS, h, qk_scale, (q0, q1), state,
                          B16, G, LG, NG, P, BLOCK_N, REP_PAD, VSHIFT)
    tier = tier_rows(tables, b, True)
    if SPLIT_H == 0:  # NOTE: a compile-time branch: without a split, history2 (None) is never compiled
        state = _int2_history(history, tier, split, NUM_SPLITS, h, qk_scale, (q0, q1), state,
                              F16, LG, NG, CONV, P, BLOCK_N, CHUNK, INTERPRET, KBITS, VBITS, KLEV, VLEV)
    elif h < SPLIT_H:
        state = _int2_history(history, tier, split, NUM_SPLITS, h, qk_scale, (q0, q1), state,
                              F16, LG, NG, CONV, P, BLOCK_N, CHUNK, INTERPRET, KBITS, VBITS, KLEV, VLEV)
    else:
        state = _int2_history(history2, tier, split, NUM_SPLITS, h - SPLIT_H, qk_scale, (q0, q1), state,
                              F16, LG, NG, CONV, P, BLOCK_N, CHUNK, INTERPRET, KBITS2, VBITS2, KLEV2, VLEV2)
    MidO, MidL, o_strides, l_strides = mid
    sob, soh, sos = o_strides
    slb, slh = l_strides
    _store_partial(MidO + b * sob + heads[None, :] * soh + split * sos, MidL + b * slb + heads * slh + split,
                   live, rows < REP, state, G, LG, NG, VSHIFT)


@triton.jit
def _int2_history(history, tier, split, NUM_SPLITS, h, qk_scale, q, state,
                  F16: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr, CONV: tl.constexpr, P: tl.constexpr,
                  BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, INTERPRET: tl.constexpr, KBITS: tl.constexpr,
                  VBITS: tl.constexpr, KLEV: tl.constexpr, VLEV: tl.constexpr):
    """The split's share of the INT2 history in full tiles (INT2 lengths are multiples of ``P``,
    ``P % BLOCK_N == 0``, split shares ``BLOCK_N``-aligned); page ids read ``CHUNK`` tiles at a time
    ahead of the tile loop (module docstring, "Pipelining"). Tiles of several pages (``BLOCK_N`` a multiple of
    ``P``, small pages): full tiles as well, then the history's last ``length % BLOCK_N`` tokens one page a tile."""
    table, length = tier
    c0, end = split_range(length, split, NUM_SPLITS, BLOCK_N)
    tail = end
    if BLOCK_N > P:  # tiles of several pages: the history's last ``length % BLOCK_N`` tokens go page by page below
        tail = c0 + tl.maximum(end - c0, 0) // BLOCK_N * BLOCK_N
    while c0 < tail:
        c_end = tl.minimum(tail, c0 + CHUNK * BLOCK_N)
        pages = chunk_pages(table, c0, c_end, P, BLOCK_N, CHUNK)
        if INTERPRET:
            n0 = c0
            while n0 < c_end:
                page, off = pick_page(pages, c0, n0, P, BLOCK_N, CHUNK)
                state = _int2_step(page, off, h, qk_scale, history, q, state,
                                   F16, LG, NG, CONV, KBITS, VBITS, KLEV, VLEV)
                n0 += BLOCK_N
        else:
            for n0 in range(c0, c_end, BLOCK_N):
                page, off = pick_page(pages, c0, n0, P, BLOCK_N, CHUNK)
                state = _int2_step(page, off, h, qk_scale, history, q, state,
                                   F16, LG, NG, CONV, KBITS, VBITS, KLEV, VLEV)
        c0 = c_end
    if BLOCK_N > P:
        n0 = tail
        while n0 < end:
            page = tl.load(table + n0 // P).to(tl.int64)
            state = _int2_step(page, tl.arange(0, P), h, qk_scale, history, q, state,
                               F16, LG, NG, CONV, KBITS, VBITS, KLEV, VLEV)
            n0 += P
    return state


@triton.jit
def _next_group(kind, LG: tl.constexpr):
    """A history kind's bundle (``pools``) moved to the token's next channel group: ``LG`` code bytes and one
    scale/zero on."""
    C, S, Z, strides, levels = kind
    return C + LG, S + 1, Z + 1, strides, levels


@triton.jit
def _key_group(keys, crow, srow, jb, qg, PLANE: tl.constexpr, KBITS: tl.constexpr, CONV: tl.constexpr,
               LEV: tl.constexpr):
    """Scores ``s · (q · c) + m Σq`` of one key group over a tile (``crow [N]`` rows at the group's bytes,
    ``srow`` its scale rows; ``qg`` as ``_group_q`` gives it); a 4-bit key adds its high plane (``PLANE``
    bytes on) at scale ``4 s``."""
    C, S, Z, _, levels = keys
    qh, _, qs = qg
    KSHIFT: tl.constexpr = 18 if LEV else 0  # key slices 2^18 coarser with a level table (module docstring)
    sk = tl.load(S + srow).to(tl.float32) * 2.0**(21 - KSHIFT)
    zk = tl.load(Z + srow).to(tl.float32)
    s = _group_scores(tl.load(C + crow[:, None] + jb[None, :]), qh, levels, CONV, LEV) * sk[:, None]  # [N, R]
    if KBITS == 4:
        s += _group_scores(tl.load(C + PLANE + crow[:, None] + jb[None, :]), qh, levels, CONV, LEV) * (4.0 * sk)[:, None]
    return s + zk[:, None] * qs[None, :]


@triton.jit
def _value_group(values, vrow, srow, jb, p, alpha, acc, F16: tl.constexpr, PLANE: tl.constexpr,
                 VBITS: tl.constexpr, CONV: tl.constexpr, LEV: tl.constexpr):
    """One value group's accumulators ``acc = (slices, Σ p m)`` rescaled, plus ``c^T @ (p s)`` and ``p · m``;
    a 4-bit value adds its high plane (``PLANE`` bytes on) with ``p · 4s``."""
    C, S, Z, _, levels = values
    sl, acc_m = acc
    sv = tl.load(S + srow).to(tl.float32)
    zv = tl.load(Z + srow).to(tl.float32)
    sl = _group_values(tl.load(C + vrow[None, :] + jb[:, None]), (p * sv[:, None]).to(F16),  # [LG, N]
                       sl, alpha, levels, CONV, LEV)
    if VBITS == 4:
        one = tl.full(alpha.shape, 1.0, tl.float32)
        sl = _group_values(tl.load(C + PLANE + vrow[None, :] + jb[:, None]), (p * (4.0 * sv)[:, None]).to(F16),
                           sl, one, levels, CONV, LEV)
    return sl, acc_m * alpha + tl.sum(p * zv[:, None], 0)


@triton.jit
def _int2_step(page, off, h, qk_scale, history, q, state,
               F16: tl.constexpr, LG: tl.constexpr, NG: tl.constexpr, CONV: tl.constexpr,
               KBITS: tl.constexpr, VBITS: tl.constexpr, KLEV: tl.constexpr, VLEV: tl.constexpr):
    """One full tile of INT2 tokens (page ``page``, in-page offsets ``off``) for the online softmax
    (see the module docstring). No masks: every load is a vector copy Triton can pipeline. A 4-bit kind
    (``KBITS``/``VBITS`` = 4) is two INT2 planes, the high one ``PLANE = d / 4`` bytes on, read as a second
    INT2 tile of the same channels with scale ``4s`` and zero 0 (``oscarkv.quant.int2``)."""
    PLANE: tl.constexpr = LG * NG
    keys, values, _ = history
    acc0, acc1, m_i, l_i = state
    crow, vrow, srow = history_rows(history, page, h, off)
    jb = tl.arange(0, LG)
    s = _key_group(keys, crow, srow, jb, q[0], PLANE, KBITS, CONV, KLEV)
    if NG == 2:
        s += _key_group(_next_group(keys, LG), crow, srow, jb, q[1], PLANE, KBITS, CONV, KLEV)
    p, alpha, m_i, l_i = softmax_step_t(s * qk_scale, m_i, l_i)
    acc0 = _value_group(values, vrow, srow, jb, p, alpha, acc0, F16, PLANE, VBITS, CONV, VLEV)
    if NG == 2:
        acc1 = _value_group(_next_group(values, LG), vrow, srow, jb, p, alpha, acc1, F16, PLANE, VBITS, CONV, VLEV)
    return acc0, acc1, m_i, l_i
