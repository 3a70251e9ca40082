"""The fused QK-norm + RoPE + OSCAR input maps (``oscarkv.kernels.fused.qk_norm_rope_map``) at Qwen3-4B's heads:
µs per launch (CUDA graph of 50 launches) for output channels / tokens / warps a program, against the default, at
T = 1, 8, 64, 512 tokens; every variant's outputs against the default's (max |diff|: 0 means the same bits).

Run: ``python -m lab.scripts.map_sweep --out DIR`` (one GPU). The 512-token map took 139 µs a layer of a 32K
follow-up's step (one H200, 2026-11-28) where BF16's QK-norm + RoPE took 14. Since then steps of 16 tokens or
more map tiles of tokens (``fused.TILE_FROM``, ``lab/scripts/map_tile.py``); the variants here are the other kernel's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from oscarkv.kernels.fused import qk_norm_rope_map

HQ, H, D = 32, 8, 128
REPS = 50


def _inputs(t: int, g: torch.Generator):
    dev = "cuda"
    x = torch.randn(t, HQ + H, D, generator=g).to(dev, torch.bfloat16)
    wq, wk = (1 + 0.1 * torch.randn(D, generator=g)).to(dev, torch.bfloat16), (1 + 0.1 * torch.randn(D, generator=g)).to(dev, torch.bfloat16)
    ang = torch.rand(t, D // 2, generator=g) * 6.28
    cos, sin = (torch.cat([f(ang)] * 2, -1).to(dev, torch.bfloat16) for f in (torch.cos, torch.sin))
    maps = (torch.randn(H, D, D, generator=g).to(dev) / D ** 0.5, torch.randn(H, D, D, generator=g).to(dev) / D ** 0.5,
            torch.randn(H, D, generator=g).to(dev))
    return x, wq, wk, cos, sin, maps


def _time_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / REPS)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    g, rows = torch.Generator().manual_seed(0), []
    for t in (1, 8, 64, 512):
        x, wq, wk, cos, sin, maps = _inputs(t, g)
        call = lambda launch: qk_norm_rope_map(x, HQ, wq, wk, cos, sin, 1e-6, maps, launch)  # noqa: E731
        ref = call(None)
        variants = [(bj, bt, w) for bj in (32, 64, 128) for bt in (1, 4, 8, 16, 32)
                    if bt <= max(1, t // 8) for w in (4, 8)]
        for v in [None, *variants]:
            try:
                got = call(v)
                diff = max(float((p - q).abs().max()) for p, q in zip(got, ref))
                rows.append(dict(T=t, launch=v or "default", us=_time_us(lambda: call(v)), max_diff=diff))
            except Exception as e:  # noqa: BLE001 (a variant that does not compile: named in the table)
                rows.append(dict(T=t, launch=v, error=str(e)[:120]))
            r = rows[-1]
            print(f"T {t:4d} {str(r['launch']):>14}: " + (f"{r['us']:8.2f} µs  diff {r['max_diff']:.1e}" if "us" in r
                                                         else r["error"]), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "map_sweep.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
