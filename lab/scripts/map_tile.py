"""A candidate for ``oscarkv.kernels.fused.qk_norm_rope_map`` (fourteenth session): a tile of tokens against the map
as dot products, one launch setting for every token count (so a token's values do not depend on its step's), the
dot's input precision a parameter. Timed against the engine's kernel (tokens one after another a program) at
Qwen3-4B's heads, T = 1, 8, 64, 512; each variant's outputs against the engine's (max |diff|) and its own T = 1
launch (``alone``: 0 = a token's bits independent of T).

The first try, ``ieee`` (fp32 FMA dot) at (64 channels, 16 tokens, 4 warps): 109 µs at 512 tokens (the engine's
114) and 6.9 µs at one token (2.1): not adopted (one H200, 2026-11-28).

    python -m lab.scripts.map_tile --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from lab.scripts.map_sweep import HQ, _inputs, _time_us
from oscarkv.kernels.fused import qk_norm_rope_map


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
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    c = Cos + t[:, None] * stride_c + i[None, :]
    sn = Sin + t[:, None] * stride_c + i[None, :]
    c1, c2 = tl.load(c, mask=ok, other=0.0).to(tl.float32), tl.load(c + HALF, mask=ok, other=0.0).to(tl.float32)
    s1, s2 = tl.load(sn, mask=ok, other=0.0).to(tl.float32), tl.load(sn + HALF, mask=ok, other=0.0).to(tl.float32)
    o1 = (f1 * c1).to(DT).to(tl.float32) + (-f2 * s1).to(DT).to(tl.float32)
    o2 = (f2 * c2).to(DT).to(tl.float32) + (f1 * s2).to(DT).to(tl.float32)
    return o1.to(DT), o2.to(DT)


@triton.jit
def _tile_kernel(X, Wq, Wk, Cos, Sin, eps, MQ, MK, Mean, QO, KO, T, stride_xt, stride_xh, stride_c,
                             stride_qot, stride_kot, NQ: tl.constexpr, REP: tl.constexpr, HALF: tl.constexpr,
                             BJ: tl.constexpr, HAS_NORM: tl.constexpr, HAS_MEAN: tl.constexpr, BM: tl.constexpr,
                             PREC: tl.constexpr):
    row = tl.program_id(1)  # q heads first, then k heads
    t = tl.program_id(0) * BM + tl.arange(0, BM)  # this program's tokens
    j = tl.program_id(2) * BJ + tl.arange(0, BJ)  # and output channels
    D: tl.constexpr = 2 * HALF
    i = tl.arange(0, HALF)
    if row < NQ:
        W, m_ptr, out0, so = Wq, MQ + (row // REP) * D * D, QO + row * D, stride_qot
    else:
        W, m_ptr, out0, so = Wk, MK + (row - NQ) * D * D, KO + (row - NQ) * D, stride_kot
    m = m_ptr + i[:, None] + j[None, :] * D  # [d/2, BJ]: the map's rows j transposed, first half of the columns
    x1, x2 = _norm_rope_rows(X, W, Cos, Sin, eps, t, T, row, stride_xt, stride_xh, stride_c, HALF, HAS_NORM)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    if HAS_MEAN:  # keys only: 0 on q rows
        keep = (row >= NQ).to(tl.float32)
        f1 -= tl.load(Mean + tl.maximum(row - NQ, 0) * D + i)[None, :] * keep
        f2 -= tl.load(Mean + tl.maximum(row - NQ, 0) * D + HALF + i)[None, :] * keep
    # NOTE: fp32 products summed in fp32 (ieee: no tf32), each output from its own row and the map alone
    out = tl.dot(f1, tl.load(m), input_precision=PREC)
    out = tl.dot(f2, tl.load(m + HALF), out, input_precision=PREC)
    tl.store(out0 + t[:, None] * so + j[None, :], out, mask=(t < T)[:, None])


def tile_map(x, num_q, q_weight, k_weight, cos, sin, eps, maps, launch):
    """The candidate kernel, arguments as ``qk_norm_rope_map``'s; ``launch = (channels, tokens, warps, precision)``."""
    T, NH, d = x.shape
    w_q, w_k, k_mean = maps
    H = NH - num_q
    qo = torch.empty(T, num_q, d, dtype=torch.float32, device=x.device)
    ko = torch.empty(T, H, d, dtype=torch.float32, device=x.device)
    bj, bm, warps, prec = launch
    _tile_kernel[(triton.cdiv(T, bm), NH, d // bj)](
        x, q_weight, k_weight, cos, sin, eps, w_q, w_k, k_mean, qo, ko, T, x.stride(0), x.stride(1), cos.stride(0),
        qo.stride(0), ko.stride(0), NQ=num_q, REP=num_q // H, HALF=d // 2, BJ=bj, HAS_NORM=True, HAS_MEAN=True,
        BM=bm, PREC=prec, num_warps=warps)
    return qo, ko


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    g, rows = torch.Generator().manual_seed(0), []
    variants = [(bj, bm, w, p) for p in ("tf32x3", "tf32", "ieee") for bj in (64, 128) for bm in (16, 64)
                for w in (4, 8)]
    for t in (1, 8, 64, 512):
        x, wq, wk, cos, sin, maps = _inputs(t, g)
        args = (x, HQ, wq, wk, cos, sin, 1e-6, maps)
        ref = qk_norm_rope_map(*args)
        rows.append(dict(T=t, launch="engine", us=_time_us(lambda: qk_norm_rope_map(*args))))
        print(f"T {t:4d} {'engine':>24}: {rows[-1]['us']:8.2f} µs", flush=True)
        for v in variants:
            try:
                got = tile_map(*args, v)
                diff = max(float((p - q).abs().max()) for p, q in zip(got, ref))
                one = tile_map(x[:1], HQ, wq, wk, cos[:1], sin[:1], 1e-6, maps, v)
                alone = max(float((p[:1] - q).abs().max()) for p, q in zip(got, one))
                rows.append(dict(T=t, launch=v, us=_time_us(lambda: tile_map(*args, v)), max_diff=diff, alone=alone))
                r = rows[-1]
                print(f"T {t:4d} {str(v):>24}: {r['us']:8.2f} µs  diff {diff:.1e}  alone {alone:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001 (a variant that does not compile: named in the table)
                rows.append(dict(T=t, launch=v, error=str(e)[:120]))
                print(f"T {t:4d} {str(v):>24}: {rows[-1]['error']}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "map_tile.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
