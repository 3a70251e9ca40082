"""Short chunks over long caches: split-K attention of up to a few hundred new tokens over the cached prefix.

A follow-up question on a cached document (or a speculative verify step) is ``c`` = 1..512 new tokens over
``n`` = 32K-100K cached ones. The tile kernel of :mod:`oscarkv.kernels.extend` gives each (sequence, KV head,
query block) one program that walks the whole prefix: ``H · cdiv(c · rep, 64)`` programs (8 for one token on
8 KV heads) cannot fill a GPU, and the staged path of :mod:`oscarkv.kernels.prefill` spends a cuDNN launch
with as few CTAs. Here the keys are split across the GPU as in decode:

    grid = (B * H, NUM_SPLITS, cdiv(max chunk, BLOCK_T))
    rows = BLOCK_T chunk tokens × the REP query heads of KV head h   (row r: token t0 + r // REP_PAD,
           head h·REP + r % REP_PAD; R = BLOCK_T · REP_PAD rows on the N side of every product)
    for the split's share of the BF16 sink + recent tokens:    bf16 dots             } one online softmax,
    for the split's share of the INT2 history, full tiles:     raw codes, fp16 dots  } every row sharing
    the last split (the shortest share) adds the chunk's own K/V, causal            } each tile
    write (acc / l, log2-sum-exp) of the split to Mid_O [T, Hq, S, d], Mid_L [T, Hq, S]
    split_k.merge_splits over each (token, query head)

The tile work is the decode kernel's (:mod:`oscarkv.kernels.decode_int2`, reused function for function):
codes go raw into the tensor cores, scale and zero applied after the dots, every precision rung (K2/K4
keys, V2/V4 values, 2-bit level tables), page ids read ahead, unmasked history tiles. The only change is
the N side of each product: the decode kernel's query heads of one token become (chunk token, query head)
pairs, so one dequantized tile serves ``R`` query rows instead of ``REP``. The numeric function is the
extend kernel's: every cached token visible to every chunk query, the chunk's own K/V (as the caller
gives them) rounded to bf16 for the products; the oracle is ``reference.extend_attention_ref``.

Serves INT2 caches whose groups the decode kernel reads raw (:func:`decode.uses_raw_int2`) and BF16-only
caches (``HAS_INT2`` off, slices of ``min(d, 128)`` channels); :func:`serves` says which.
:func:`prefers_splitk` is the table by shape against the staged and tile paths (``TritonAttention.extend``).

Memory layout (strides explicit, innermost dimension contiguous):
    q            [T, Hq, d]     bf16 or fp32 (fp16/bf16 for the products on the GPU)
    k_new/v_new  [T, H, d]      the chunk's rotated, centered K/V (bf16 or fp32)
    cu_seqlens   [B + 1] int32  chunk b is rows cu_seqlens[b]:cu_seqlens[b + 1]
    pools, tables               the bundles of :mod:`oscarkv.kernels.pools`
    out          [T, Hq, d]     q's dtype
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from oscarkv.cache.paged_layout import LayerKV, PageTables
from oscarkv.kernels.decode import _num_sms, uses_raw_int2
from oscarkv.kernels.decode_int2 import (_bf16_scores, _bf16_values, _bf16_windows, _empty_state, _group_q,
                                         _int2_history, _store_partial)
from oscarkv.kernels.pools import format_args, history_arg, new_arg, new_rows, tables_arg, tier_rows, window_arg
from oscarkv.kernels.split_k import merge_splits, softmax_step_t

LOG2E = 1.4426950408889634
MAX_CHUNK = 64
"""The longest chunk the engine routed here before the staged path cut its keys into spans (the tests still cover it).
NOTE: at 512 tokens over a 20K prefix on an H100 the kernel's error against the oracle was 1.2-1.4x the bf16 bound
of ``tests/kernels/test_chunk_splitk.py``: the accumulation drift of ``decode_int2._add_tile`` (DESIGN.md §4)."""
SPLITK_SHAPES = {"bf16": ((32, 1024),), "int2": ((32, 1024), (64, 16384))}
"""Per cache kind (a prefix with INT2 history or BF16 only), ``(longest chunk, shortest cached prefix)`` pairs: a
chunk at most the first over a prefix at least the second takes this kernel. One H200, 2026-11-29 (``python -m
lab.benchmarks.chunk_attention OUT.json 16,32,64,128,256,512``, CUDA-graph replays, Qwen3-4B/8B attention shape,
``lab/bench_gpu/2026-11-28/s20_call6_h200``), ms a layer, split-K against the staged path with its keys in spans
(``prefill.KEY_SPANS``): 100K INT2 k = 16 / 32 / 64 0.15 / 0.30 / 0.57 against 0.38 / 0.38 / 0.37; BF16 0.27 / 0.44
/ 0.79 against 0.45 / 0.45 / 0.45; 32K INT2 0.06 / 0.11 / 0.20 against 0.15 / 0.15 / 0.14; BF16 0.10 / 0.16 / 0.28
against 0.17 / 0.17 / 0.16. So split-K up to 32 tokens (every speculative verify chunk), the staged path beyond
(``prefill.MIN_CHUNK``), but for INT2 chunks up to 64 over 16K: split-K runs in an extend graph, the staged path
eagerly between piecewise graphs, host-bound at 64 tokens (the first step of a 64-token follow-up on a cached 32K
prompt, as served: 13.4 ms split-K, 28.2 staged; 100K 31.7 and 30.6; ``lab/bench_gpu/2026-11-28/s20_call7_h200``).
Prefixes under 32K were not timed: the 1024 bound is the decode kernel's habit."""


@triton.jit
def _chunk_causal(new, lo, tok, hi, h, qk_scale, q, state, B16: tl.constexpr, G: tl.constexpr,
                  LG: tl.constexpr, NG: tl.constexpr, BLOCK_N: tl.constexpr, R: tl.constexpr,
                  VSHIFT: tl.constexpr):
    """The chunk's own keys ``[0, hi)`` (``new``: ``pools.new_arg``, rows from ``lo``) for the online softmax
    ``state``, causal: row ``r`` (chunk token ``tok[r]``) sees keys ``<= tok[r]``. Every row sees key 0, so no row
    is all ``-inf`` after the first tile."""
    Kn, Vn, _, _ = new
    acc0, acc1, m_i, l_i = state
    n0 = 0
    while n0 < hi:
        toks = n0 + tl.arange(0, BLOCK_N)
        ok = toks < hi
        krow, vrow = new_rows(new, (lo + toks).to(tl.int64), h)
        s = _bf16_scores(Kn, krow[:, None], ok[:, None], q[0][1], LG, tl.zeros([BLOCK_N, R], tl.float32))
        if NG == 2:
            s = _bf16_scores(Kn + G, krow[:, None], ok[:, None], q[1][1], LG, s)
        vis = ok[:, None] & (toks[:, None] <= tok[None, :])
        p, alpha, m_i, l_i = softmax_step_t(tl.where(vis, s * qk_scale, float("-inf")), m_i, l_i)
        acc0 = _bf16_values(Vn, vrow[None, :], ok[None, :], p, acc0, alpha, LG, B16, VSHIFT)
        if NG == 2:
            acc1 = _bf16_values(Vn + G, vrow[None, :], ok[None, :], p, acc1, alpha, LG, B16, VSHIFT)
        n0 += BLOCK_N
    return acc0, acc1, m_i, l_i


@triton.jit
def _chunk_kernel(Q, new, window, history, tables, CuSeq, mid, qk_scale, NUM_SPLITS,
                  H: tl.constexpr, REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                  P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, CONV: tl.constexpr,
                  CHUNK: tl.constexpr, HAS_INT2: tl.constexpr, INTERPRET: tl.constexpr, KBITS: tl.constexpr,
                  VBITS: tl.constexpr, KLEV: tl.constexpr = False, VLEV: tl.constexpr = False):
    """``Q = (q, stride_t, stride_h)``; ``new``: ``pools.new_arg``; ``window``, ``history``,
    ``tables``: the bundles of :mod:`oscarkv.kernels.pools`; ``mid = (Mid_O, Mid_L, (its strides t, h, s),
    (Mid_L's t, h))``."""
    # NOTE: INTERPRET: while loops and fp32 operands for Triton's CPU interpreter (see decode.py).
    R: tl.constexpr = BLOCK_T * REP_PAD
    VSHIFT: tl.constexpr = 18 if VLEV else 0  # value units with a level table (decode_int2's docstring)
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
        r = tl.arange(0, R)
        tok = t0 + r // REP_PAD  # chunk-relative position of row r
        head = h * REP + r % REP_PAD
        live_rows = (tok < c) & (r % REP_PAD < REP)
        live = live_rows[None, :]
        qp = Q[0] + (lo + tok)[None, :].to(tl.int64) * Q[1] + head[None, :] * Q[2]  # [1, R]
        q0 = _group_q(qp, live, LG, F16, B16)
        if NG == 2:
            q1 = _group_q(qp + G, live, LG, F16, B16)
        else:  # an unused placeholder (NG == 1)
            q1 = q0
        state = _bf16_windows(window, tier_rows(tables, b, False), split, NUM_SPLITS, h, qk_scale, (q0, q1),
                              _empty_state(LG, R), B16, G, LG, NG, P, BLOCK_N, R, VSHIFT)
        if HAS_INT2:
            state = _int2_history(history, tier_rows(tables, b, True), split, NUM_SPLITS, h, qk_scale, (q0, q1),
                                  state, F16, LG, NG, CONV, P, BLOCK_N, CHUNK, INTERPRET, KBITS, VBITS, KLEV, VLEV)
        # the chunk itself rides on the last split (split_k.split_range gives it the shortest share)
        hi = tl.where(split == NUM_SPLITS - 1, tl.minimum(c, t0 + BLOCK_T), 0)
        state = _chunk_causal(new, lo, tok, hi, h, qk_scale, (q0, q1), state, B16, G, LG, NG, BLOCK_N, R, VSHIFT)
        MidO, MidL, o_strides, l_strides = mid
        sot, soh, sos = o_strides
        slt, slh = l_strides
        rows = (lo + tok).to(tl.int64)
        _store_partial(MidO + rows[None, :] * sot + head[None, :] * soh + split * sos,
                       MidL + rows * slt + head * slh + split, live, live_rows, state, G, LG, NG, VSHIFT)


def serves(kv: LayerKV) -> bool:
    """Whether this kernel reads ``kv``'s layout: BF16-only pools, or INT2 groups the raw-code tiles take."""
    _, _, p, d = kv.bf16_k.shape
    if kv.int2_k is None:
        return d >= 64 and p % 16 == 0
    return uses_raw_int2(d, kv.int2_k.group, p)


def prefers_splitk(chunk: int, prefix: int, int2: bool) -> bool:
    """Whether a chunk of ``chunk`` tokens over ``prefix`` cached ones (``int2``: some of them INT2 history)
    takes this kernel (``SPLITK_SHAPES``)."""
    return any(chunk <= c and prefix >= n for c, n in SPLITK_SHAPES["int2" if int2 else "bf16"])


def _config(device: torch.device, rows: int, int2: bool) -> dict:
    """Tiles and launch options keyed by the query rows per program ``R = BLOCK_T · REP_PAD`` (``PER_SM``: programs
    per SM the split count aims at).

    Timed on one H100 (2026-11-27, ``python -m lab.scripts.chunk_sweep``, ``lab/results/gpu_prefill_host/
    chunk_sweep.json``: 100K cached tokens, Qwen3-4B/8B attention, every rows × warps × stages × key tile × splits):
    over INT2 history, k = 1 (R = 8): 2 warps, 8 per SM, 0.21 ms per layer (the register-count table before it:
    0.29); k = 8 (R = 32): 2 warps, 3 stages, 4 per SM, 0.26 (0.31); k = 32 and 64 (R = 64): 4 warps, 3 stages,
    32-key tiles, 2 per SM, 0.44 and 0.76 (1.09 and 1.76; the staged path 1.8). NOTE: those were eager calls, host
    time included (~0.2 ms: an eager decode call timed 0.23 there); ``chunk_sweep`` now times CUDA-graph replays. Over BF16 R = 8 and 32 were
    timed there (0.30 and 0.36 ms against 0.39 and 0.44, the same settings win), R = 16, 32 and 64 on an H200 (the
    NOTE below); the register-count table (``lab.benchmarks.compile_sm90 --table OUT.json SASS_DIR chunk``) set the rest."""
    if device.type != "cuda":
        return dict(BLOCK_N=16, num_warps=4, num_stages=1, CONV=0, CHUNK=4, PER_SM=2)
    if int2 and rows <= 16:  # NOTE: CUDA-graph timings, H200, 2026-11-28 (``chunk_sweep --warps 1,2,4 --mults
        # 1,2,4,8,16 --maxnreg 168``, lab/bench_gpu/2026-11-28/csweep_h200x4/): one warp, 8 programs per SM, 3 stages,
        # 64-key tiles: k = 1 0.055 -> 0.038 ms per layer (the decode kernel 0.035), k = 3 0.093 -> 0.048, and k = 9
        # in row blocks of 16 (_rows) 0.179 -> 0.119; a register cap of 168 changed nothing. Longer chunks in blocks
        # of 16 rows (s11_call*_h200x2/csweep17, 33): k = 17 0.354 -> 0.191 (24 splits: ~7 programs per SM), k = 33
        # 0.504 -> 0.444 (16 splits, ~9; 2 stages 0.444, 3 stages 0.450); k = 64 extrapolated, timed by cs64
        return dict(BLOCK_N=64, num_warps=1, num_stages=3, CONV=2, CHUNK=32, PER_SM=8, SPAN_PAGES=False)
    # NOTE: BF16 at R = 64 (9-16 tokens: verify chunks of K = 8-15), CUDA graphs, H200, 2026-11-28 (chunk_sweep --chunks
    # 9,16 --kinds bf16 --rows 16,32,64 --warps 1,2,4 --stages 3 --block-n 64 --mults 1,2,4, lab/bench_gpu/2026-11-28/
    # s18_call8_h200/): 2 warps, 3 stages, 64 splits 0.281 / 0.285 ms a layer against 0.656 / 0.658 with the register
    # table's 8 warps, 16 splits (the staged path 0.36); the Qwen3-4B 100K verify step at K = 8 read 28.1 ms. At 16
    # and 32 rows (K = 2, 4; s18_call13_h200/, 1-2 warps, 16-128 splits): 1 warp, 128 splits 0.193 against 0.219 at 3
    # tokens (the K = 2 step 12.1 -> 10.9 ms), 2 warps, 128 splits 0.216 against 0.232 at 5 (one warp: 13.9 ms)
    warps, per_sm, stages, block_n = {8: (2, 8, 2, 64), 16: (1, 8, 3, 64), 32: (2, 8, 3, 64)}.get(
        rows, (4, 2, 3, 32) if int2 else (2, 4, 3, 64))
    return dict(BLOCK_N=block_n, num_warps=warps, num_stages=stages, CONV=2, CHUNK=32, PER_SM=per_sm,
                SPAN_PAGES=False)  # pages smaller than BLOCK_N in tiles of several (decode._config), off until timed


def _rows(device: torch.device, max_chunk: int, rep_pad: int, int2: bool) -> int:
    """Query rows per program: the whole chunk's rows up to 64 (16 in the interpreter, and for every chunk over
    INT2 history: 9 to 33 tokens in blocks of 4 beat one block of 16 or more, _config), at least the mma's 8."""
    cap = 64 if device.type == "cuda" and not int2 else 16
    return max(8, min(cap, triton.next_power_of_2(max_chunk) * rep_pad), rep_pad)


def chunk_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: LayerKV, tables: PageTables,
                    cu_seqlens: torch.Tensor, scale: float, max_chunk: int, *, num_splits: int | None = None,
                    config: dict | None = None) -> torch.Tensor:
    """Attention of each chunk's queries over its cached prefix (all visible) and itself (causal), split-K.

    ``q [T, Hq, d]``, ``k_new/v_new [T, H, d]`` rotated and centered, ``cu_seqlens int32 [B + 1]``, ``max_chunk``
    the longest chunk → ``[T, Hq, d]`` in ``q``'s dtype; the oracle is ``reference.extend_attention_ref``.
    ``num_splits`` / ``config`` override the splits and the tile table (``ROWS``: query rows per program, a power
    of two >= 8 and >= the padded GQA group; tests and benchmarks)."""
    t, hq, d = q.shape
    _, h, p, dk = kv.bf16_k.shape
    bsz = cu_seqlens.numel() - 1
    assert serves(kv), "chunk_attention: a layout the raw-code tiles do not read (see serves)"
    assert dk == d and hq % h == 0 and d & (d - 1) == 0, f"bad shapes q {tuple(q.shape)} pool {tuple(kv.bf16_k.shape)}"
    assert q.dtype in (torch.bfloat16, torch.float32) and q.stride(2) == 1, "q: bf16/fp32, contiguous head_dim"
    assert k_new.shape == (t, h, d)
    assert cu_seqlens.dtype == torch.int32 and tables.bf16_lens.shape[0] == bsz and 0 < max_chunk
    int2 = kv.int2_k is not None
    rep = hq // h
    rep_pad = triton.next_power_of_2(rep)
    rows = (config or {}).get("ROWS") or _rows(q.device, max_chunk, rep_pad, int2)
    cfg = {**_config(q.device, rows, int2), **(config or {})}
    if not (cfg.get("SPAN_PAGES") and cfg["BLOCK_N"] % p == 0):  # else tiles of several pages (decode_int2)
        cfg["BLOCK_N"] = math.gcd(cfg["BLOCK_N"], p)
    grid_t = triton.cdiv(max_chunk, rows // rep_pad)
    splits = num_splits or max(1, min(256, cfg["PER_SM"] * _num_sms(q.device) // (bsz * h * grid_t)))
    mid_o = torch.empty(t, hq, splits, d, dtype=torch.float32, device=q.device)
    mid_l = torch.empty(t, hq, splits, dtype=torch.float32, device=q.device)
    out = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    _chunk_kernel[(bsz * h, splits, grid_t)](
        (q, q.stride(0), q.stride(1)), new_arg(k_new, v_new), window_arg(kv), history_arg(kv),
        tables_arg(tables), cu_seqlens, (mid_o, mid_l, tuple(mid_o.stride()[:3]), tuple(mid_l.stride()[:2])),
        scale * LOG2E, splits, H=h, REP=rep, REP_PAD=rep_pad, D=d, G=kv.int2_k.group if int2 else min(d, 128), P=p,
        BLOCK_T=rows // rep_pad, BLOCK_N=cfg["BLOCK_N"], CONV=cfg["CONV"], CHUNK=cfg["CHUNK"], HAS_INT2=int2,
        **format_args(kv), INTERPRET=q.device.type != "cuda", num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}))
    merge_splits(mid_o, mid_l, out)
    return out
