"""Few stacked query rows over many staged keys with the keys split across the GPU (issue 29, k = 16-512 over 100K):
the staged path's prefix call (``kernels.prefill._prefix_lse``, ``q [1, H, R, d]`` over ``k/v [1, H, n, d]``) runs
one CTA per 128 rows and head, so 256 rows over 100K keys fill 16 of 132 SMs (cuDNN 1.21 ms, FlashAttention 0.42,
FLOPs 0.16 at 682 TFLOP/s). Here the keys are cut into ``S`` equal spans taken as the batch (a strided view of the
workspace, queries repeated), each span's ``(o, lse)`` merged by log-sum-exp. Per backend, rows, keys and ``S``:
ms of the call, ms with the merge (torch, an upper bound), and the merged output's largest difference from the
unsplit call's (one GPU, CUDA events, median of 7).

    python -m lab.scripts.ksplit_sdpa --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from lab.benchmarks.chunk_attention import _eager_ms
from lab.scripts.sdpa_shapes import OPS


def split_call(op, q, k, v, s: int, scale: float):
    """``op`` over the keys cut into ``s`` spans as its batch: ``(o [s, H, R, d], lse [s, H, R])``."""
    _, h, n, d = k.shape
    ks, vs = (x.view(h, s, n // s, d).transpose(0, 1) for x in (k, v))
    o, lse = op(q.expand(s, -1, -1, -1).contiguous(), ks, vs, scale)
    return o, lse.reshape(o.shape[:3])


def merged(o, lse):
    w = torch.softmax(lse.float(), 0)
    return (w[..., None] * o.float()).sum(0, keepdim=True)


def one(name: str, rows: int, n: int, s: int, heads: int = 8, d: int = 128) -> dict:
    g = torch.Generator("cuda").manual_seed(n + rows)
    q, k, v = (torch.randn(1, heads, m, d, device="cuda", dtype=torch.bfloat16, generator=g) for m in (rows, n, n))
    op, scale = OPS[name], d ** -0.5
    ref = OPS["cudnn"](q, k, v, scale)[0].float()
    o, lse = split_call(op, q, k, v, s, scale)
    diff = float((merged(o, lse) - ref).abs().max())
    call = _eager_ms(lambda: split_call(op, q, k, v, s, scale), 7)
    total = _eager_ms(lambda: merged(*split_call(op, q, k, v, s, scale)), 7)
    flops = 4 * heads * rows * n * d / 682e12 * 1e3
    return dict(backend=name, rows=rows, n=n, splits=s, ms=call, with_merge_ms=total, flops_ms=flops, diff=diff)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="64,256,1024,2048")
    ap.add_argument("--ns", default="102400,32768")
    ap.add_argument("--splits", default="1,2,4,8,16,32")
    ap.add_argument("--backends", default="cudnn,flash")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    res = []
    for n in map(int, a.ns.split(",")):
        for rows in map(int, a.rows.split(",")):
            for name in a.backends.split(","):
                for s in map(int, a.splits.split(",")):
                    try:
                        res.append(one(name, rows, n, s))
                    except Exception as e:  # a backend that refuses a shape says so and the rest go on
                        res.append(dict(backend=name, rows=rows, n=n, splits=s, error=repr(e)[:160]))
                    r = res[-1]
                    print(f"{name:6} rows {rows:5} n {n:6} S {s:3}: " + (
                        f"{r['ms']:.3f} ms, +merge {r['with_merge_ms']:.3f} (FLOPs {r['flops_ms']:.3f}), diff "
                        f"{r['diff']:.1e}" if "ms" in r else r["error"]), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ksplit_sdpa.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=res), indent=1))


if __name__ == "__main__":
    main()
