"""Fused elementwise kernels of the model forward on CUDA: RMSNorm (+ residual), QK-norm + RoPE, SiLU·mul.

Role: :mod:`oscarkv.models.llama` calls these on CUDA tensors instead of its PyTorch
expressions (each of which is 5–10 small kernels: casts, ``pow``, ``mean``, ``rsqrt``, ``cat``
...); at batch 1 a decode step is a chain of such launches, ~2 µs each even inside a CUDA
graph. The CPU keeps the PyTorch expressions, which are the oracles of these kernels.

Numerics follow transformers operation for operation, including every intermediate rounding to
the activation dtype (``to(dtype)`` in the kernel where PyTorch materializes a bf16 tensor), so
only the order of the fp32 sum of squares differs from the oracle:

* ``rms_norm``: ``h = x.float(); h *= rsqrt(mean(h²) + eps); out = w * h.to(dtype)``; with a
  residual ``y``, ``x`` is first ``(x + y)`` rounded to the dtype, and that sum is returned too.
* ``qk_norm_rope_``: per head row of ``d`` channels (q and k heads of one token in one launch,
  in place), the optional RMS QK-norm above, then
  ``x·cos + rotate_half(x)·sin`` with ``rotate_half(x) = cat(-x[d/2:], x[:d/2])`` (each product
  and the sum rounded, as three bf16 tensor ops would be).
* ``silu_mul``: ``silu(g).to(dtype) * u`` on the stacked ``[gate | up]`` projection output.
* ``qk_map``: a decode step's OSCAR maps in one launch (the engine's Triton backend): each query
  head row ``q @ R_K⁻ᵀ`` of its KV head, each key row ``(k - μ_K) @ R_K``, fp32 out — what
  ``LayerStorage.rotate_queries`` and ``TensorCodec.to_rotated`` compute with ~10 PyTorch kernels.
* ``qk_norm_rope_map``: ``qk_norm_rope_`` then ``qk_map`` in one launch (an OSCAR decode step's
  q and k heads straight from the qkv projection): the norm and RoPE are the same code
  (``_norm_rope_inner``, same roundings to the activation dtype), so the result differs from the
  two launches by the fp32 summation order of the map only. Out of place: the qkv rows are read,
  never written — after the maps nothing reads the roped bf16 q and k (the decode step stores
  ``k_s`` and attends with ``q_r``; v is read from the qkv view untouched).

Memory layout: rows contiguous in their last dimension; one program per row (norms, RoPE: one
``(token, head)`` row each, its two halves as two ``[d/2]`` vectors), 1-D blocks for SiLU; for
``qk_map`` and ``qk_norm_rope_map`` one program per ``(token, q or k head, 32 output channels)``,
reading its ``[32, d]`` slice of the head's map, stored output-channel first so the rows are
contiguous (``qk_norm_rope_map``: as two ``[32, d/2]`` halves, against the row's two roped
halves; every program of a row recomputes that row's norm and RoPE, ``d`` elements). From
``TILE_FROM`` tokens ``qk_norm_rope_map`` takes a tile of tokens a program instead: their roped
halves ``[BM, d/2]`` against the map's transposed halves in two tf32x3 dot products.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_row(x, w, N, eps):
    """``w · RMSNorm(x)`` of one row (``x`` in its dtype, masked columns 0; ``w`` fp32) in fp32, rounded as transformers
    rounds the normalized row to the activation dtype before the weight."""
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, 0) / N + eps)
    return w * h.to(x.dtype).to(tl.float32)


@triton.jit
def _rms_norm_kernel(x_rows, y_rows, W, out_rows, res_rows, eps, N, BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
    """Each ``*_rows`` is ``(pointer, row stride)``."""
    X, stride_x = x_rows  # NOTE: one level per statement (Triton 3.6)
    Y, stride_y = y_rows
    Out, stride_o = out_rows
    Res, stride_r = res_rows
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(Res + row * stride_r + cols, x, mask=mask)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + cols, _norm_row(x, w, N, eps).to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _rope(x1, x2, c1, c2, s1, s2):
    """RoPE of a row's (or rows') two halves ``x1, x2`` (the row dtype) with fp32 ``cos, sin`` halves:
    ``x·cos + rotate_half(x)·sin``, each product and the sum rounded to the row dtype as three tensor ops would be."""
    DT: tl.constexpr = x1.dtype
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    o1 = (f1 * c1).to(DT).to(tl.float32) + (-f2 * s1).to(DT).to(tl.float32)
    o2 = (f2 * c2).to(DT).to(tl.float32) + (f1 * s2).to(DT).to(tl.float32)
    return o1.to(DT), o2.to(DT)


@triton.jit
def _norm_rope_inner(xp, W, Cos, Sin, eps, HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    """The head row at ``xp`` after the optional RMS norm (weights ``W``) and RoPE (``Cos, Sin``: this
    token's rows), as its two ``[d/2]`` halves in the row's dtype, rounded as transformers' ops are."""
    i = tl.arange(0, HALF)
    x1 = tl.load(xp + i)  # [d/2] first half
    x2 = tl.load(xp + HALF + i)
    DT: tl.constexpr = x1.dtype
    if HAS_NORM:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        r = tl.rsqrt((tl.sum(f1 * f1, 0) + tl.sum(f2 * f2, 0)) / (2 * HALF) + eps)
        x1 = (tl.load(W + i).to(tl.float32) * (f1 * r).to(DT).to(tl.float32)).to(DT)
        x2 = (tl.load(W + HALF + i).to(tl.float32) * (f2 * r).to(DT).to(tl.float32)).to(DT)
    c1, c2 = tl.load(Cos + i).to(tl.float32), tl.load(Cos + HALF + i).to(tl.float32)
    s1, s2 = tl.load(Sin + i).to(tl.float32), tl.load(Sin + HALF + i).to(tl.float32)
    return _rope(x1, x2, c1, c2, s1, s2)


@triton.jit
def _qk_norm_rope_kernel(X, Wq, Wk, Cos, Sin, eps, stride_xt, stride_xh, stride_c,
                         NH: tl.constexpr, NQ: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    t = tl.program_id(0) // NH
    hd = tl.program_id(0) % NH
    if hd < NQ:  # q heads first, then k heads (W is unused without a norm)
        W = Wq
    else:
        W = Wk
    xp = X + t * stride_xt + hd * stride_xh
    o1, o2 = _norm_rope_inner(xp, W, Cos + t * stride_c, Sin + t * stride_c, eps, HALF, HAS_NORM)
    i = tl.arange(0, HALF)
    tl.store(xp + i, o1)  # in place: this program alone reads and writes its row
    tl.store(xp + HALF + i, o2)


@triton.jit
def _silu_mul_kernel(GU, Out, N, INTER, stride_gu, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    src = GU + (offs // INTER) * stride_gu + offs % INTER  # row t: gate at [t, :I], up at [t, I:]
    g = tl.load(src, mask=mask, other=0.0)
    u = tl.load(src + INTER, mask=mask, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(Out + offs, (s * u).to(g.dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, D]`` (``+ residual [T, D]``) → ``(RMSNorm(sum), sum)`` (the sum is ``x`` without a residual)."""
    assert x.dim() == 2 and x.stride(1) == 1 and weight.shape == (x.shape[1],), f"bad shapes {tuple(x.shape)}"
    T, N = x.shape
    out = torch.empty_like(x)
    res = torch.empty_like(x) if residual is not None else x
    y = residual if residual is not None else x
    assert y.shape == x.shape and y.stride(1) == 1
    _rms_norm_kernel[(T,)]((x, x.stride(0)), (y, y.stride(0)), weight, (out, out.stride(0)), (res, res.stride(0)), eps,
                           N, BLOCK=triton.next_power_of_2(N), HAS_RES=residual is not None,
                           num_warps=4 if N <= 4096 else 8)
    return out, res


def qk_norm_rope_(x: torch.Tensor, num_q: int, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                  cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    """In place on ``x [T, Hq + H, d]`` (q heads, then k heads; rows may be strided, e.g. a view of
    the fused qkv projection): optional RMS norm over ``d`` (``q_weight`` for the first ``num_q``
    heads, ``k_weight`` for the rest), then RoPE with ``cos, sin [T, d]``. Returns ``x``."""
    T, H, d = x.shape
    assert x.stride(2) == 1 and x.stride(1) == d and d % 2 == 0 and (d // 2) & (d // 2 - 1) == 0, \
        f"bad shape {tuple(x.shape)} / strides {x.stride()}"
    assert cos.shape == sin.shape == (T, d) and cos.stride() == sin.stride() and cos.stride(1) == 1
    assert (q_weight is None) == (k_weight is None) and 0 < num_q <= H
    _qk_norm_rope_kernel[(T * H,)](x, q_weight if q_weight is not None else x, k_weight if k_weight is not None else x,
                                   cos, sin, eps, x.stride(0), x.stride(1), cos.stride(0),
                                   NH=H, NQ=num_q, HALF=d // 2, HAS_NORM=q_weight is not None, num_warps=1)
    return x


@triton.jit
def _qk_map_kernel(Q, K, WQ, WK, Mean, QO, KO, stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_kot,
                   NQ: tl.constexpr, REP: tl.constexpr, D: tl.constexpr, BJ: tl.constexpr, HAS_MEAN: tl.constexpr):
    t = tl.program_id(0)
    row = tl.program_id(1)  # q heads first, then k heads
    j = tl.program_id(2) * BJ + tl.arange(0, BJ)  # this program's output channels
    i = tl.arange(0, D)
    if row < NQ:
        x_ptr, w_ptr, out = Q + t * stride_qt + row * stride_qh, WQ + (row // REP) * D * D, QO + t * stride_qot + row * D
    else:
        x_ptr, w_ptr = K + t * stride_kt + (row - NQ) * stride_kh, WK + (row - NQ) * D * D
        out = KO + t * stride_kot + (row - NQ) * D
    x = tl.load(x_ptr + i).to(tl.float32)
    if HAS_MEAN:  # keys only
        x -= tl.load(Mean + tl.maximum(row - NQ, 0) * D + i) * (row >= NQ).to(tl.float32)  # x 0 on q rows
    w = tl.load(w_ptr + j[:, None] * D + i[None, :])  # [BJ, D], rows contiguous
    tl.store(out + j, tl.sum(w * x[None, :], 1))


def qk_map(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
           k_mean: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [T, Hq, d] → W_Q[h] q`` per GQA group and ``k [T, H, d] → W_K[h] (k - k_mean)`` per head, both
    fp32, in one launch. ``w_q, w_k [H, d, d]`` fp32 contiguous, output channel first (``W_Q = R⁻¹``,
    ``W_K = Rᵀ``: ``LayerStorage.decode_maps``); ``k_mean [H, d]`` contiguous or ``None``."""
    T, Hq, d = q.shape
    H = k.shape[1]
    assert k.shape == (T, H, d) and q.stride(2) == k.stride(2) == 1 and Hq % H == 0 and d & (d - 1) == 0, \
        f"bad q {tuple(q.shape)} / k {tuple(k.shape)}"
    assert w_q.shape == w_k.shape == (H, d, d) and w_q.dtype == w_k.dtype == torch.float32
    assert w_q.is_contiguous() and w_k.is_contiguous() and (k_mean is None or k_mean.is_contiguous())
    qo = torch.empty(T, Hq, d, dtype=torch.float32, device=q.device)
    ko = torch.empty(T, H, d, dtype=torch.float32, device=q.device)
    bj = min(d, 32)
    _qk_map_kernel[(T, Hq + H, d // bj)](q, k, w_q, w_k, k_mean if k_mean is not None else ko, qo, ko,
                                        q.stride(0), q.stride(1), k.stride(0), k.stride(1), qo.stride(0),
                                        ko.stride(0), NQ=Hq, REP=Hq // H, D=d, BJ=bj,
                                        HAS_MEAN=k_mean is not None, num_warps=4)
    return qo, ko


@triton.jit
def _map_row(row, Wq, Wk, MQ, MK, QO, KO, stride_qot, stride_kot, NQ: tl.constexpr, REP: tl.constexpr,
             D: tl.constexpr):
    """Head row ``row`` of a map launch (q heads first, then k heads): its norm weights, map, output row and the
    output's token stride."""
    if row < NQ:
        W, m_ptr, out0, so = Wq, MQ + (row // REP) * D * D, QO + row * D, stride_qot
    else:
        W, m_ptr, out0, so = Wk, MK + (row - NQ) * D * D, KO + (row - NQ) * D, stride_kot
    return W, m_ptr, out0, so


@triton.jit
def _key_mean(Mean, row, NQ: tl.constexpr, D: tl.constexpr, i):
    """The key mean of head row ``row`` at channels ``i``; 0 on q rows."""
    return tl.load(Mean + tl.maximum(row - NQ, 0) * D + i) * (row >= NQ).to(tl.float32)


@triton.jit
def _qk_norm_rope_map_kernel(X, Wq, Wk, Cos, Sin, eps, MQ, MK, Mean, QO, KO, T, stride_xt, stride_xh, stride_c,
                             stride_qot, stride_kot, NQ: tl.constexpr, REP: tl.constexpr, HALF: tl.constexpr,
                             BJ: tl.constexpr, HAS_NORM: tl.constexpr, HAS_MEAN: tl.constexpr, BLOCK_T: tl.constexpr):
    row = tl.program_id(1)  # q heads first, then k heads
    j = tl.program_id(2) * BJ + tl.arange(0, BJ)  # this program's output channels
    D: tl.constexpr = 2 * HALF
    i = tl.arange(0, HALF)
    W, m_ptr, out0, so = _map_row(row, Wq, Wk, MQ, MK, QO, KO, stride_qot, stride_kot, NQ, REP, D)
    m = m_ptr + j[:, None] * D + i[None, :]  # [BJ, d/2] of the map's rows j, first half of the columns
    m1, m2 = tl.load(m), tl.load(m + HALF)  # NOTE: once for the program's BLOCK_T tokens (long extend chunks)
    mean1 = tl.zeros([HALF], tl.float32)
    mean2 = tl.zeros([HALF], tl.float32)
    if HAS_MEAN:
        mean1, mean2 = _key_mean(Mean, row, NQ, D, i), _key_mean(Mean, row, NQ, D, HALF + i)
    for tt in range(BLOCK_T):
        t = tl.program_id(0) * BLOCK_T + tt
        if t < T:
            # NOTE: every program of a row recomputes its norm and RoPE (d/BJ of them, a [d] row each)
            x1, x2 = _norm_rope_inner(X + t * stride_xt + row * stride_xh, W, Cos + t * stride_c, Sin + t * stride_c,
                                      eps, HALF, HAS_NORM)
            f1, f2 = x1.to(tl.float32) - mean1, x2.to(tl.float32) - mean2
            tl.store(out0 + t * so + j, tl.sum(m1 * f1[None, :], 1) + tl.sum(m2 * f2[None, :], 1))


@triton.jit
def _norm_rope_rows(X, W, Cos, Sin, eps, t, T, row, stride_xt, stride_xh, stride_c, HALF: tl.constexpr,
                    HAS_NORM: tl.constexpr):
    """:func:`_norm_rope_inner` for the head row ``row`` of the tokens ``t [BM]`` (``t < T`` loaded): their two
    ``[BM, d/2]`` halves, the same roundings, each row's sum of squares over its own elements."""
    i = tl.arange(0, HALF)
    ok = (t < T)[:, None]
    xp = X + t[:, None] * stride_xt + row * stride_xh + i[None, :]
    x1 = tl.load(xp, mask=ok, other=0.0)
    x2 = tl.load(xp + HALF, mask=ok, other=0.0)
    DT: tl.constexpr = x1.dtype
    if HAS_NORM:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        r = tl.rsqrt((tl.sum(f1 * f1, 1) + tl.sum(f2 * f2, 1)) / (2 * HALF) + eps)[:, None]
        x1 = (tl.load(W + i)[None, :].to(tl.float32) * (f1 * r).to(DT).to(tl.float32)).to(DT)
        x2 = (tl.load(W + HALF + i)[None, :].to(tl.float32) * (f2 * r).to(DT).to(tl.float32)).to(DT)
    c = Cos + t[:, None] * stride_c + i[None, :]
    sn = Sin + t[:, None] * stride_c + i[None, :]
    c1, c2 = tl.load(c, mask=ok, other=0.0).to(tl.float32), tl.load(c + HALF, mask=ok, other=0.0).to(tl.float32)
    s1, s2 = tl.load(sn, mask=ok, other=0.0).to(tl.float32), tl.load(sn + HALF, mask=ok, other=0.0).to(tl.float32)
    return _rope(x1, x2, c1, c2, s1, s2)


@triton.jit
def _qk_norm_rope_map_tile_kernel(X, Wq, Wk, Cos, Sin, eps, MQ, MK, Mean, QO, KO, T, stride_xt, stride_xh, stride_c,
                                  stride_qot, stride_kot, NQ: tl.constexpr, REP: tl.constexpr, HALF: tl.constexpr,
                                  BJ: tl.constexpr, HAS_NORM: tl.constexpr, HAS_MEAN: tl.constexpr, BM: tl.constexpr,
                                  PREC: tl.constexpr):
    """:func:`_qk_norm_rope_map_kernel` with ``BM`` tokens a program as a tile: the map as two dot products at input
    precision ``PREC`` (``MAP_PRECISION``; a token's bits depend on the launch setting, not on its step's other
    tokens)."""
    row = tl.program_id(1)  # q heads first, then k heads
    t = tl.program_id(0) * BM + tl.arange(0, BM)  # this program's tokens
    j = tl.program_id(2) * BJ + tl.arange(0, BJ)  # and output channels
    D: tl.constexpr = 2 * HALF
    i = tl.arange(0, HALF)
    W, m_ptr, out0, so = _map_row(row, Wq, Wk, MQ, MK, QO, KO, stride_qot, stride_kot, NQ, REP, D)
    m = m_ptr + i[:, None] + j[None, :] * D  # [d/2, BJ]: the map's rows j transposed, first half of the columns
    x1, x2 = _norm_rope_rows(X, W, Cos, Sin, eps, t, T, row, stride_xt, stride_xh, stride_c, HALF, HAS_NORM)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    if HAS_MEAN:
        f1 -= _key_mean(Mean, row, NQ, D, i)[None, :]
        f2 -= _key_mean(Mean, row, NQ, D, HALF + i)[None, :]
    out = tl.dot(f1, tl.load(m), input_precision=PREC)
    out = tl.dot(f2, tl.load(m + HALF), out, input_precision=PREC)
    tl.store(out0 + t[:, None] * so + j[None, :], out, mask=(t < T)[:, None])


TILE_FROM, MAP_TILE, MAP_PRECISION = 16, (64, 64, 4), "tf32x3"
"""Steps of at least ``TILE_FROM`` tokens map them as tiles (``_qk_norm_rope_map_tile_kernel``: output channels, tokens,
warps a program); fewer (decode batches, verify steps of K < 16: a plain step's and a verify step's tokens alike),
one token at a time (64 output channels a program from 8 tokens, else 32: 8 tokens 5.0 -> 4.1 µs,
``lab/scripts/map_sweep.py``). One H200, Qwen3-4B heads, µs at 1 / 8 / 64 / 512 tokens (``lab/scripts/map_tile.py``,
2026-11-28): one at a time 2.1 / 4.0 / 18.4 / 114 (a 32K follow-up of 512 tokens: 4 ms of its step); tiles
5.8 at 64, 19.6 at 512 (``MAP_PRECISION`` tf32x3, 1.2e-6 off; fp32 FMA dot products, ``ieee``, were as slow as one
token at a time: 109 at 512; tf32 4e-3 off)."""


def qk_norm_rope_map(x: torch.Tensor, num_q: int, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                     cos: torch.Tensor, sin: torch.Tensor, eps: float,
                     maps: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
                     launch: tuple[int, int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`qk_norm_rope_` then :func:`qk_map` in one launch: ``x [T, Hq + H, d]`` (q heads, then k
    heads, un-normed and un-roped; rows may be strided) → fp32 ``(W_Q q, W_K (k - k_mean))``, ``[T, Hq, d]``
    and ``[T, H, d]``. Norm/RoPE arguments as :func:`qk_norm_rope_`'s, ``maps = (w_q, w_k, k_mean)`` as
    :func:`qk_map`'s. Out of place: ``x`` is only read (a decode step reads q and k in the stored domain only).
    Each token's values are the same whatever ``T`` below ``TILE_FROM`` (a program's tokens one after another, each
    as alone) and whatever ``T`` from it (tiles of a fixed size); the two differ by fp32 rounding.
    ``launch``: (output channels, tokens, warps) a program, for ``lab/scripts/map_sweep.py``; None: the default."""
    T, NH, d = x.shape
    w_q, w_k, k_mean = maps
    H = NH - num_q
    assert x.stride(2) == 1 and d % 2 == 0 and (d // 2) & (d // 2 - 1) == 0, \
        f"bad shape {tuple(x.shape)} / strides {x.stride()}: rows of a power-of-two head_dim, contiguous"
    assert 0 < H and num_q % H == 0, f"{num_q} q heads over {H} k heads: not a GQA grouping"
    assert cos.shape == sin.shape == (T, d) and cos.stride() == sin.stride() and cos.stride(1) == 1, \
        f"bad cos/sin {tuple(cos.shape)} / strides {cos.stride()}, {sin.stride()}: want [{T}, {d}], rows contiguous"
    assert (q_weight is None) == (k_weight is None), "QK-norm needs both weights or neither"
    assert q_weight is None or (q_weight.shape == k_weight.shape == (d,) and q_weight.dtype == k_weight.dtype
                                and q_weight.is_contiguous() and k_weight.is_contiguous()), "bad QK-norm weights"
    assert w_q.shape == w_k.shape == (H, d, d) and w_q.dtype == w_k.dtype == torch.float32, \
        f"maps {tuple(w_q.shape)} {w_q.dtype} / {tuple(w_k.shape)} {w_k.dtype}: want fp32 [{H}, {d}, {d}]"
    assert w_q.is_contiguous() and w_k.is_contiguous(), "maps must be contiguous (output channel first)"
    assert k_mean is None or (k_mean.shape == (H, d) and k_mean.dtype == torch.float32 and k_mean.is_contiguous()), \
        "k_mean must be fp32 [H, d] contiguous"
    qo = torch.empty(T, num_q, d, dtype=torch.float32, device=x.device)
    ko = torch.empty(T, H, d, dtype=torch.float32, device=x.device)
    norm = q_weight is not None
    tile = launch is None and T >= TILE_FROM and d >= 64  # NOTE: head_dim 32 (tiny test models) not measured tiled
    bj, bt, warps = MAP_TILE if tile else launch or (min(d, 32 if T < 8 else 64), 1, 4)
    bj = min(bj, d)
    kernel = _qk_norm_rope_map_tile_kernel if tile else _qk_norm_rope_map_kernel
    kernel[(triton.cdiv(T, bt), NH, d // bj)](
        x, q_weight if norm else x, k_weight if norm else x, cos, sin, eps, w_q, w_k,
        k_mean if k_mean is not None else ko, qo, ko, T, x.stride(0), x.stride(1), cos.stride(0), qo.stride(0),
        ko.stride(0), NQ=num_q, REP=num_q // H, HALF=d // 2, BJ=bj, HAS_NORM=norm, HAS_MEAN=k_mean is not None,
        **({"BM": bt, "PREC": MAP_PRECISION} if tile else {"BLOCK_T": bt}), num_warps=warps)
    return qo, ko


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up [T, 2I]`` (gate then up along the last dimension) → ``[T, I]``."""
    T, two_i = gate_up.shape
    assert two_i % 2 == 0 and gate_up.stride(1) == 1, f"bad shape {tuple(gate_up.shape)}"
    inter = two_i // 2
    out = torch.empty(T, inter, dtype=gate_up.dtype, device=gate_up.device)
    n = out.numel()
    _silu_mul_kernel[(triton.cdiv(n, 1024),)](gate_up, out, n, inter, gate_up.stride(0), BLOCK=1024, num_warps=4)
    return out
