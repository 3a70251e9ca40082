"""Split-K over a paged cache: each split's share of the tokens, and the merge of the splits.

Both decode kernels (:mod:`oscarkv.kernels.decode` and :mod:`oscarkv.kernels.decode_int2`) give
every (sequence, KV head) ``NUM_SPLITS`` programs. :func:`split_range` hands each split a
contiguous, ``BLOCK_N``-aligned share of each tier (:func:`tile`, :func:`chunk_pages` and :func:`pick_page`
walk its pages; :func:`softmax_step_t` is the online-softmax step); each program writes its partial output and
log2-sum-exp to ``Mid_O [B, Hq, S, d]`` / ``Mid_L [B, Hq, S]`` (fp32), and :func:`merge_splits`
merges them with the online-softmax rule: ``out = Σ_s 2^(lse_s − top) o_s / Σ_s 2^(lse_s − top)``.
An empty split has ``lse = -inf`` and weight 0; a sequence with no token outputs zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def split_range(n, split, NUM_SPLITS, BLOCK_N: tl.constexpr):
    """Contiguous, BLOCK_N-aligned share ``[start, end)`` of ``n`` tokens for one split."""
    per = tl.cdiv(tl.cdiv(n, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per
    return start, tl.minimum(n, start + per)


@triton.jit
def softmax_step_t(qkT, m_i, l_i):
    """One online-softmax step on transposed log2-domain logits ``qkT [N, R]`` (tokens x query rows)."""
    m_new = tl.maximum(m_i, tl.max(qkT, 0))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qkT - m_new[None, :])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 0)


@triton.jit
def tile(table, n0, end, P: tl.constexpr, BLOCK_N: tl.constexpr):
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
def chunk_pages(table, c0, c_end, P: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """Page ids ``[CHUNK]`` of the tiles starting at ``c0, c0 + BLOCK_N, ...`` below ``c_end`` (one vector load);
    tiles of several pages (``BLOCK_N > P``): ``[CHUNK, BLOCK_N // P]``, each tile's pages in order."""
    if BLOCK_N > P:
        SPAN: tl.constexpr = BLOCK_N // P
        toks = c0 + tl.arange(0, CHUNK)[:, None] * BLOCK_N + tl.arange(0, SPAN)[None, :] * P
    else:
        toks = c0 + tl.arange(0, CHUNK) * BLOCK_N
    return tl.load(table + toks // P, mask=toks < c_end, other=0)


@triton.jit
def pick_page(pages, c0, n0, P: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """Page id and in-page offsets ``[BLOCK_N]`` of the tile at ``n0`` from its chunk's ``pages``: no load,
    so the tile's addresses are a function of the loop index and Triton can issue its copies stages ahead.
    A tile of several pages (``BLOCK_N > P``) gets a page id per token (each page's ``P`` tokens in a row)."""
    if BLOCK_N > P:  # NOTE: one return after the branches (Triton 3.6 compiles the code after a constexpr if)
        SPAN: tl.constexpr = BLOCK_N // P
        mine = tl.sum(tl.where((tl.arange(0, CHUNK) == (n0 - c0) // BLOCK_N)[:, None], pages, 0), 0)  # [SPAN]
        page = tl.reshape(tl.broadcast_to(mine.to(tl.int64)[:, None], (SPAN, P)), (BLOCK_N,))
        off = tl.arange(0, BLOCK_N) % P
    else:
        page = tl.sum(tl.where(tl.arange(0, CHUNK) == (n0 - c0) // BLOCK_N, pages, 0), 0).to(tl.int64)
        off = tl.multiple_of(n0 % P, BLOCK_N) + tl.arange(0, BLOCK_N)
    return page, off


@triton.jit
def _merge_kernel(MidO, MidL, Out, NUM_SPLITS, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                  stride_b, stride_h, HQ: tl.constexpr, BD: tl.constexpr, SPLITS_PAD: tl.constexpr,
                  BLOCK_S: tl.constexpr):
    """The merge of ``BD`` output columns of one (sequence, query head): grid ``(B * Hq, d / BD)``. Every tile of
    splits is unrolled (``SPLITS_PAD`` constexpr), so the loads of all tiles are independent of the sums and issue
    together. NOTE: one program per row with a loop over tiles of 64 splits (one dependent load each) took 8.9 us
    at 256 splits and 26.4 at 1 024, this 3.3 and 6.7 (H200, 2026-11-27, ``lab/bench_gpu/2026-11-27/few_heads_h200x2/``)."""
    b = tl.program_id(0) // HQ
    hq = tl.program_id(0) % HQ
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    lp = MidL + b * stride_lb + hq * stride_lh
    s = tl.arange(0, SPLITS_PAD)
    top = tl.max(tl.load(lp + s, mask=s < NUM_SPLITS, other=float("-inf")), 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # empty sequence: every weight is 0
    acc = tl.zeros([BD], dtype=tl.float32)
    den = 0.0
    for s0 in tl.static_range(0, SPLITS_PAD, BLOCK_S):
        t = s0 + tl.arange(0, BLOCK_S)
        ok = t < NUM_SPLITS
        w = tl.exp2(tl.load(lp + t, mask=ok, other=float("-inf")) - top)
        o = tl.load(MidO + b * stride_ob + hq * stride_oh + t[:, None] * stride_os + cols[None, :], mask=ok[:, None],
                    other=0.0)
        acc += tl.sum(w[:, None] * o, 0)
        den += tl.sum(w, 0)
    out = acc / tl.where(den > 0, den, 1.0)
    tl.store(Out + b * stride_b + hq * stride_h + cols, out.to(Out.dtype.element_ty))


def merge_splits(mid_o: torch.Tensor, mid_l: torch.Tensor, out: torch.Tensor, num_warps: int = 4,
                 cols: int = 32) -> None:
    """The split-K merge (``_merge_kernel``, ``cols`` output columns a program): per-split outputs
    ``mid_o [B, Hq, S, d]`` fp32 and log2-sum-exps ``mid_l [B, Hq, S]`` → ``out [B, Hq, d]`` (its dtype)."""
    bsz, hq, splits, d = mid_o.shape
    bd, pad = min(cols, d), max(2, triton.next_power_of_2(splits))
    _merge_kernel[(bsz * hq, d // bd)](mid_o, mid_l, out, splits, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
                                       mid_l.stride(0), mid_l.stride(1), out.stride(0), out.stride(1), HQ=hq, BD=bd,
                                       SPLITS_PAD=pad, BLOCK_S=min(128, pad), num_warps=num_warps)
