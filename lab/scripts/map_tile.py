"""The tile kernel of ``oscarkv.kernels.fused.qk_norm_rope_map`` (fourteenth session; adopted from 16 tokens): a tile
of tokens against the map as dot products, one launch setting for every token count (so a token's values do not depend
on its step's), here at every launch setting and dot input precision. Timed against the engine's kernel (tokens one after another a program) at
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

from lab.scripts.map_sweep import HQ, _inputs, _time_us
from oscarkv.kernels.fused import _qk_norm_rope_map_tile_kernel as _tile_kernel
from oscarkv.kernels.fused import qk_norm_rope_map


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
