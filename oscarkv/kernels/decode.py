"""Decode attention over a batch of mixed paged KV caches (BF16 windows + INT2 history), split-K.

Algorithm (flash-decoding over the layout of :mod:`oscarkv.cache.paged_layout`)::

    grid = (B * H, NUM_SPLITS)                   one program per (sequence, KV head, split)
    q    = the REP = Hq / H query heads of KV head h, rows of a [REP_PAD >= 16, d] tile (bf16)
    for the split's share of the BF16 tokens, BLOCK_N at a time:          (sink + recent pages)
        k, v = bf16 pool rows, gathered through bf16_table                     [BLOCK_N, d]
        online softmax step with s = q @ kᵀ
    for the split's share of the INT2 tokens, BLOCK_N at a time:          (history pages)
        c_k, c_v = uint8 codes [BLOCK_N, d/4] → four 2-bit slices joined into [BLOCK_N, d]
                   (a 4-bit kind: two such planes, c = lo + 4·hi)
        G == d (one group per token, the default):  scale/zero applied *after* the dots
            s   = s_k ⊙ (q @ c_kᵀ) + (Σ_j q_j) ⊗ m_k                    (q·(m + s c) = s q·c + m Σq)
            acc += (p ⊙ s_v) @ c_v ;   acc_m += p @ m_v                 (Σ p (m + s c) per row)
        G < d: c is dequantized per group in registers (m + s c) and used as in the BF16 loop
        a 2-bit level table (KLEV/VLEV; Int2Pages.levels): c → L[c] (tl.where on the scalars l1, l2)
        before either form
    write (acc / l, log2-sum-exp) of the split to Mid_O [B, Hq, NUM_SPLITS, d], Mid_L [B, Hq, NUM_SPLITS]
    then split_k._merge_kernel, grid (B * Hq, d / 32), merges the splits with the same online softmax.

INT2 caches with groups of >= 64 channels (every default shape) go to the raw-code kernel of
:mod:`oscarkv.kernels.decode_int2` (same grid, splits and merge; codes straight into fp16 dots,
one warp per program); this generic kernel serves BF16-only caches and small groups.

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
    q          [B, Hq, d]                 bf16 or fp32 (rounded to bf16 for the dot); rows may be strided
    bf16 pools [N_bf16, H, P, d]          bf16, K and V with identical strides
    INT2 pools codes [N_int2, H, P, d·b/8] uint8 (b = 2, or 4: two INT2 planes; K and V each their own b
                                          and code strides); scale, zero [N_int2, H, P, d/G] fp16
    tables     bf16_table [B, Mb], int2_table [B, Mi] int32; lens [B] int32
    out        [B, Hq, d]                 q's dtype
A sequence with no token (a CUDA-graph padding row) outputs zeros.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from oscarkv.cache.paged_layout import LayerKV, PageTables
from oscarkv.kernels.decode_int2 import _int2_decode_kernel
from oscarkv.kernels.levels import _levels
from oscarkv.kernels.pools import format_args, history_arg, tables_arg, tier_length, tier_table, window_arg
from oscarkv.kernels.split_k import merge_splits, split_range

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
def _bf16_step(n0, q, state, window, table_row, cols, end, h, qk_scale, P: tl.constexpr, BLOCK_N: tl.constexpr):
    """One tile of BF16 tokens for the online softmax ``state = (acc, m_i, l_i)``."""
    K, V, _ = window
    acc, m_i, l_i = state
    toks = n0 + tl.arange(0, BLOCK_N)
    live = toks < end
    page = tl.load(table_row + toks // P, mask=live, other=0)
    sp, sh, st = window[2]
    rows = page.to(tl.int64) * sp + h * sh + (toks % P) * st  # NOTE: window_rows, in the order that compiles best
    k = tl.load(K + rows[:, None] + cols[None, :], mask=live[:, None], other=0.0)
    v = tl.load(V + rows[:, None] + cols[None, :], mask=live[:, None], other=0.0)
    qk = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
    qk = tl.where(live[None, :], qk, float("-inf"))
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    return acc, m_i, l_i


@triton.jit
def _bf16_inner(q, state, window, tables, b, split, NUM_SPLITS, cols, h, qk_scale, P: tl.constexpr,
                BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    """The split's share of sequence ``b``'s BF16 tier."""
    start, end = split_range(tier_length(tables, b, False), split, NUM_SPLITS, BLOCK_N)
    table_row = tier_table(tables, b, False)
    if INTERPRET:  # see _decode_kernel
        n0 = start
        while n0 < end:
            state = _bf16_step(n0, q, state, window, table_row, cols, end, h, qk_scale, P, BLOCK_N)
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            state = _bf16_step(n0, q, state, window, table_row, cols, end, h, qk_scale, P, BLOCK_N)
    return state


@triton.jit
def _codes(kind, row, live, BLOCK_N: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr, LEV: tl.constexpr):
    """Codes ``[BLOCK_N, D]`` (column order 4j + i) of the rows ``row`` of a 2- or 4-bit pool (``kind``: its
    ``pools`` bundle): a 4-bit row is two INT2 planes, ``lo + 4·hi`` (``oscarkv.quant.int2``); with a level
    table (``LEV``) the codes' levels."""
    C, _, _, _, levels = kind
    L1, L2 = levels
    bytes_ = tl.arange(0, D // 4)
    c = _unpack(tl.load(C + row[:, None] + bytes_[None, :], mask=live[:, None], other=0), BLOCK_N, D)
    if BITS == 4:
        c += _unpack(tl.load(C + D // 4 + row[:, None] + bytes_[None, :], mask=live[:, None], other=0), BLOCK_N, D) * 4
    return _levels(c, L1, L2, LEV)


@triton.jit
def _group_params(kind, srow, live, NG: tl.constexpr):
    """Scales and zeros (fp32) of the tile's tokens: ``[BLOCK_N]`` with one group, ``[BLOCK_N, NG]`` else."""
    _, S, Z, _, _ = kind
    if NG == 1:
        s = tl.load(S + srow, mask=live, other=0.0).to(tl.float32)
        z = tl.load(Z + srow, mask=live, other=0.0).to(tl.float32)
    else:
        grp = tl.arange(0, NG)
        s = tl.load(S + srow[:, None] + grp[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        z = tl.load(Z + srow[:, None] + grp[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    return s, z


@triton.jit
def _int2_step(n0, q, q_sum, state, history, table_row, end, h, qk_scale,
               D: tl.constexpr, G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr,
               KBITS: tl.constexpr, VBITS: tl.constexpr, KLEV: tl.constexpr, VLEV: tl.constexpr):
    """One tile of history tokens for the online softmax ``state = (acc, acc_m, m_i, l_i)``."""
    NG: tl.constexpr = D // G
    keys, values, _ = history
    acc, acc_m, m_i, l_i = state
    toks = n0 + tl.arange(0, BLOCK_N)
    live = toks < end
    page = tl.load(table_row + toks // P, mask=live, other=0).to(tl.int64)
    kp, kh, kt = keys[3]
    vp, vh, vt = values[3]
    sp, sh, st = history[2]
    # NOTE: pools.history_rows, written out in the order that compiles best (SASS: benchmarks.compile_sm90)
    crow = page * kp + h * kh + (toks % P) * kt
    vrow = page * vp + h * vh + (toks % P) * vt
    srow = page * sp + h * sh + (toks % P) * st
    ck = _codes(keys, crow, live, BLOCK_N, D, KBITS, KLEV)
    cv = _codes(values, vrow, live, BLOCK_N, D, VBITS, VLEV)
    if NG == 1:
        sk, zk = _group_params(keys, srow, live, NG)
        sv, zv = _group_params(values, srow, live, NG)
        qk = tl.dot(q, tl.trans(ck.to(q.dtype))) * sk[None, :] + q_sum[:, None] * zk[None, :]
    else:
        sk, zk = _group_params(keys, srow, live, NG)
        kd = tl.reshape(ck.to(tl.float32), [BLOCK_N, NG, G]) * sk[:, :, None] + zk[:, :, None]
        qk = tl.dot(q, tl.trans(tl.reshape(kd, [BLOCK_N, D]).to(q.dtype)))
    qk = tl.where(live[None, :], qk * qk_scale, float("-inf"))
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
    acc = acc * alpha[:, None]
    if NG == 1:
        acc += tl.dot((p * sv[None, :]).to(q.dtype), cv.to(q.dtype))
        acc_m = acc_m * alpha + tl.sum(p * zv[None, :], 1)
    else:
        sv, zv = _group_params(values, srow, live, NG)
        vd = tl.reshape(cv.to(tl.float32), [BLOCK_N, NG, G]) * sv[:, :, None] + zv[:, :, None]
        acc += tl.dot(p.to(q.dtype), tl.reshape(vd, [BLOCK_N, D]).to(q.dtype))
    return acc, acc_m, m_i, l_i


@triton.jit
def _int2_inner(q, state, history, tables, b, split, NUM_SPLITS, h, qk_scale,
                D: tl.constexpr, G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr,
                KBITS: tl.constexpr, VBITS: tl.constexpr, KLEV: tl.constexpr, VLEV: tl.constexpr):
    """The split's share of sequence ``b``'s history tier."""
    start, end = split_range(tier_length(tables, b, True), split, NUM_SPLITS, BLOCK_N)
    q_sum = tl.sum(q.to(tl.float32), 1)
    table_row = tier_table(tables, b, True)
    if INTERPRET:  # see _decode_kernel
        n0 = start
        while n0 < end:
            state = _int2_step(n0, q, q_sum, state, history, table_row, end, h, qk_scale, D, G, P, BLOCK_N,
                               KBITS, VBITS, KLEV, VLEV)
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            state = _int2_step(n0, q, q_sum, state, history, table_row, end, h, qk_scale, D, G, P, BLOCK_N,
                               KBITS, VBITS, KLEV, VLEV)
    return state


@triton.jit
def _decode_kernel(Q, window, history, tables, mid, qk_scale, NUM_SPLITS,
                   H: tl.constexpr, REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr,
                   G: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_INT2: tl.constexpr,
                   INTERPRET: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr,
                   KLEV: tl.constexpr = False, VLEV: tl.constexpr = False):
    """Arguments as :func:`oscarkv.kernels.decode_int2._int2_decode_kernel`'s (the bundles of ``pools``)."""
    # NOTE: INTERPRET is set for Triton's CPU interpreter only: its range() cannot take a tensor
    # bound under numpy >= 2.4 (so the loops are while loops there; compiled kernels use range()
    # so Triton pipelines the loads) and its bf16 tl.dot is wrong (so dots run in fp32 there).
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    split = tl.program_id(1)
    rows = tl.arange(0, REP_PAD)
    heads = h * REP + rows
    cols = _perm_cols(D, G, HAS_INT2)
    q = tl.load(Q[0] + b * Q[1] + heads[:, None] * Q[2] + cols[None, :], mask=(rows < REP)[:, None], other=0.0)
    q = q.to(tl.float32 if INTERPRET else tl.bfloat16)  # the dot operand dtype of every tl.dot below
    m_i = tl.full([REP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([REP_PAD], tl.float32)
    acc = tl.zeros([REP_PAD, D], tl.float32)
    acc_m = tl.zeros([REP_PAD], tl.float32)
    acc, m_i, l_i = _bf16_inner(q, (acc, m_i, l_i), window, tables, b, split, NUM_SPLITS, cols,
                                h, qk_scale, P, BLOCK_N, INTERPRET)
    if HAS_INT2:
        acc, acc_m, m_i, l_i = _int2_inner(q, (acc, acc_m, m_i, l_i), history, tables, b, split,
                                           NUM_SPLITS, h, qk_scale, D, G, P, BLOCK_N, INTERPRET, KBITS, VBITS,
                                           KLEV, VLEV)
    seen = l_i > 0
    o = (acc + acc_m[:, None]) / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    live = rows < REP
    MidO, MidL, o_strides, l_strides = mid
    sob, soh, sos = o_strides
    slb, slh = l_strides
    tl.store(MidO + b * sob + heads[:, None] * soh + split * sos + cols[None, :], o, mask=live[:, None])
    tl.store(MidL + b * slb + heads * slh + split, lse, mask=live)


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _config(kind: str, device: torch.device, programs: int) -> dict:
    """Tile and launch parameters keyed by kernel kind and ``programs`` = B * H (before splitting)
    (H100 sweeps, ``lab.benchmarks.sweep`` and ``lab.benchmarks.variants ... bf16``).

    ``raw_int2``: the INT2 kernel of :mod:`oscarkv.kernels.decode_int2` (``CONV`` 2 = inline PTX
    code conversion); ``int2``: the generic kernel with small groups; ``bf16``: BF16-only caches."""
    if device.type != "cuda":
        return dict(BLOCK_N=16, num_warps=4, num_stages=1, CONV=0, CHUNK=4)
    if kind == "bf16" and programs <= 64:
        # NOTE: up to batch 8 at 8 KV heads, 64-token tiles and 3 programs per SM beat 128 and 2
        # by 0.1-1% (100K x 1: 144.9 vs 146.1 us); at batch 32 128-token tiles stay faster (1409
        # vs 1431 us). 135 configs, H100, 2026-11-22, lab/bench_gpu/bf16_sweep_h100_round5.json.
        return dict(BLOCK_N=64, num_warps=4, num_stages=3, PER_SM=3)
    # NOTE: the raw INT2 kernel is latency bound (one tile in flight per program): one warp per
    # program and 8 programs per SM beat 4 warps x 2 per SM by 1.6-2x (H100 sweep, 2026-11-22).
    # With page ids read ahead (split_k.pick_page) and unmasked tiles, the copies of the next tile
    # run during the current one from num_stages 3 on: 3 beats 2/4/5 by 2-8% at 32K-100K x 1-8
    # (H100, 2026-11-22, lab/bench_gpu/variants_h100_run9.json); with one page-id load per tile
    # inside the loop, 2 had been best (sweep_int2_h100_run6.json). Transposed tiles (round 6) fit
    # in 168 registers without spills: 12 programs per SM beat 8 uncapped by 0-14% and 16 at 128
    # registers (which spill) at G = 128 (H100, lab/bench_gpu/round6_int2_h100_call1.json).
    # At 2-4 KV heads a call is mostly fixed cost (H200, 2026-11-27, ``python -m lab.scripts.few_heads_sweep``, 100K):
    # with the column merge (split_k.merge_splits) and the windows on the last splits, 2 KV heads took 16.2 us at
    # 512 splits and 17.1 at 256, 4 KV heads 24.4 at 396 and 21.9 at 256: the cap stays 256 (default_splits).
    # SPAN_PAGES: pages smaller than BLOCK_N (16-token pages of the shipped recipe) read in 64-token tiles of several
    # pages, at SPAN_STAGES stages, rather than tiles of one page (H200, 2026-11-28, ``python -m
    # lab.scripts.page_span_sweep``, 100K, us): batch 1 45.4 -> 41.1 (2-bit keys), 51.9 -> 50.8 (4-bit); batch 8
    # 308 -> 244, 352 -> 300; pages of 64 still lead (34.7, 43.9, 195, 254). 2 stages beat 3 by 1-4% at all four.
    return {"raw_int2": dict(BLOCK_N=64, num_warps=1, num_stages=3, CONV=2, PER_SM=12, CHUNK=32, maxnreg=168,
                             SPAN_PAGES=True, SPAN_STAGES=2),
            "int2": dict(BLOCK_N=64, num_warps=4, num_stages=3, PER_SM=2),
            "bf16": dict(BLOCK_N=128, num_warps=4, num_stages=3, PER_SM=2)}[kind]


def splits_in_one(kv: LayerKV) -> bool:
    """Whether :func:`decode_attention` takes ``kv``'s per-head split in one launch (the raw INT2 kernel's shapes)."""
    return kv.split is not None and uses_raw_int2(kv.bf16_k.shape[3], kv.int2_k.group, kv.bf16_k.shape[2])


def uses_raw_int2(head_dim: int, group: int, page: int) -> bool:
    """Whether the raw-code INT2 kernel serves this shape (groups of >= 64 channels, <= 2 per token;
    pages of a multiple of 16 tokens, so that its tiles of ``gcd(BLOCK_N, P)`` tokens are full)."""
    return group >= 64 and head_dim // group <= 2 and page % 16 == 0


def default_splits(batch: int, kv_heads: int, device: torch.device, per_sm: int = 2, cap: int = 256) -> int:
    """Splits that fill the GPU with one wave of ``per_sm`` resident programs per SM (at most ``cap``).

    One wave: every program streams 1/s of its sequence, so the step takes about one program's
    time; more splits only add merge work (``Mid_O`` grows with s)."""
    return max(1, min(cap, per_sm * _num_sms(device) // (batch * kv_heads)))


def launch_config(kv: LayerKV, batch: int, device: torch.device, config: dict | None = None) -> dict:
    """The tile table's entry :func:`decode_attention` launches for ``batch`` sequences over ``kv`` (``config``
    overrides it): the kernel kind by layout, the split count's ``PER_SM`` and ``MAX_SPLITS``."""
    _, h, p, d = kv.bf16_k.shape
    int2 = kv.int2_k is not None
    raw = int2 and uses_raw_int2(d, kv.int2_k.group, p)
    cfg = {**_config("raw_int2" if raw else "int2" if int2 else "bf16", device, batch * h), **(config or {})}
    if raw and not (cfg.get("SPAN_PAGES") and cfg["BLOCK_N"] % p == 0):
        cfg["BLOCK_N"] = math.gcd(cfg["BLOCK_N"], p)  # NOTE: else tiles of BLOCK_N / P pages (decode_int2)
    elif raw and p < cfg["BLOCK_N"] and "num_stages" not in (config or {}):
        cfg["num_stages"] = cfg.get("SPAN_STAGES", cfg["num_stages"])
    return cfg


def decode_splits(kv: LayerKV, batch: int, device: torch.device, config: dict | None = None) -> int:
    """The split count :func:`decode_attention` gives ``batch`` sequences over ``kv`` (each split sums about
    ``context / splits`` tokens)."""
    return _splits(launch_config(kv, batch, device, config), batch, kv.bf16_k.shape[1], device)


def _splits(cfg: dict, batch: int, kv_heads: int, device: torch.device) -> int:
    return default_splits(batch, kv_heads, device, cfg.get("PER_SM", 2), cfg.get("MAX_SPLITS", 256))


def decode_attention(q: torch.Tensor, kv: LayerKV, tables: PageTables, scale: float, *,
                     num_splits: int | None = None, config: dict | None = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Attention of one query token per sequence over its mixed paged cache.

    ``q [B, Hq, d]`` rotated queries (bf16 or fp32) → ``[B, Hq, d]`` in ``out_dtype`` (default ``q``'s
    dtype; the merge rounds to it). ``config`` overrides the tile table (``BLOCK_N``, ``num_warps``,
    ``num_stages``, the split cap ``MAX_SPLITS``, the merge's ``MERGE_COLS``, ``SPAN_PAGES``; benchmarks only)."""
    bsz, hq, d = q.shape
    _, h, p, dk = kv.bf16_k.shape
    int2 = kv.int2_k is not None
    assert dk == d and hq % h == 0 and d >= 16 and d & (d - 1) == 0, f"bad shapes q {tuple(q.shape)} pool {tuple(kv.bf16_k.shape)}"
    assert q.dtype in (torch.bfloat16, torch.float32) and q.stride(2) == 1, "q must be bf16/fp32 with contiguous head_dim"
    assert all(t.shape[0] == bsz for t in (tables.bf16_table, tables.bf16_lens, tables.int2_table, tables.int2_lens))
    ranges = kv.ranges()
    window, history, tables_ = window_arg(kv), history_arg(ranges[0][2]), tables_arg(tables)
    g = kv.int2_k.group if int2 else d
    for lo, hi, view in ranges if int2 else ():
        for c in (view.int2_k, view.int2_v):
            assert c.codes.shape[1:] == (hi - lo, p, d * c.bits // 8) and c.group == g >= 4
    raw = int2 and uses_raw_int2(d, g, p)
    assert raw or kv.split is None, "a per-head split decodes in one launch with the raw INT2 kernel only (splits_in_one)"
    cfg = launch_config(kv, bsz, q.device, config)
    splits = num_splits or _splits(cfg, bsz, h, q.device)
    rep = hq // h
    mid_o = torch.empty(bsz, hq, splits, d, dtype=torch.float32, device=q.device)
    mid_l = torch.empty(bsz, hq, splits, dtype=torch.float32, device=q.device)
    out = torch.empty(bsz, hq, d, dtype=out_dtype or q.dtype, device=q.device)  # contiguous even for strided q rows
    if raw:
        kernel, extra = _int2_decode_kernel, dict(G=g, CONV=cfg["CONV"], CHUNK=cfg["CHUNK"])
        if kv.split is not None:  # the second head range: its own history bundle and formats
            second = ranges[1][2]
            extra |= dict(history2=history_arg(second), SPLIT_H=kv.split.head, **format_args(second, "2"))
    else:
        kernel, extra = _decode_kernel, dict(G=g, HAS_INT2=int2)
    kernel[(bsz * h, splits)](
        (q, q.stride(0), q.stride(1)), window, history, tables_,
        (mid_o, mid_l, tuple(mid_o.stride()[:3]), tuple(mid_l.stride()[:2])), scale * LOG2E, splits,
        H=h, REP=rep, REP_PAD=cfg.get("REP_PAD", max(8 if raw else 16, triton.next_power_of_2(rep))), D=d, P=p, **extra,
        **format_args(ranges[0][2]), BLOCK_N=cfg["BLOCK_N"], INTERPRET=q.device.type != "cuda", num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}))
    merge_splits(mid_o, mid_l, out, cfg.get("REDUCE_WARPS", 4), cfg.get("MERGE_COLS", 32))
    return out
