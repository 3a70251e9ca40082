"""What a new prefix length costs the prefill attention (``kernels.prefill._attend_lse``): cuDNN builds a graph per
shape on its first call (a cold 32K prompt on one H200 took 5.5 s the first time and 1.7 s the second, 2026-11-28,
``lab.scripts.tp_prefill_profile``). Per backend (cuDNN, FlashAttention, memory-efficient; each returns the
log-sum-exp the merge needs) and per shape of the stacked prefix call (``q [1, H, rep·c, d]`` over ``k/v [1, H, n, d]``,
Qwen3-4B's 8 KV heads, rep 4): ms of the first call at a new shape (wall, synchronized), then the kernel's ms
(CUDA events, median of 5); the outputs against cuDNN's.

    python -m lab.scripts.sdpa_shapes --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lab.benchmarks.chunk_attention import _eager_ms  # CUDA events, median

OPS = {
    "cudnn": lambda q, k, v, s: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False,
                                                                                   scale=s)[:2],
    "flash": lambda q, k, v, s: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False,
                                                                                   scale=s)[:2],
    "efficient": lambda q, k, v, s: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0,
                                                                                           False, scale=s)[:2],
}


def one(name: str, rows: int, n: int, heads: int = 8, d: int = 128) -> dict:
    g = torch.Generator("cuda").manual_seed(n + rows)
    q, k, v = (torch.randn(1, heads, m, d, device="cuda", dtype=torch.bfloat16, generator=g) for m in (rows, n, n))
    op, scale = OPS[name], d ** -0.5
    torch.cuda.synchronize()
    t = time.perf_counter()
    o, lse = op(q, k, v, scale)
    torch.cuda.synchronize()
    first = 1e3 * (time.perf_counter() - t)
    ref_o, _ = OPS["cudnn"](q, k, v, scale)
    return dict(backend=name, rows=rows, n=n, first_ms=first, kernel_ms=_eager_ms(lambda: op(q, k, v, scale), 5),
                diff=float((o.float() - ref_o.float()).abs().max()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="2048,256")
    ap.add_argument("--ns", default="8192,8704,32768,33280,102400,102912")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    res = []
    for rows in map(int, a.rows.split(",")):
        for n in map(int, a.ns.split(",")):
            for name in OPS:
                try:
                    res.append(one(name, rows, n))
                except Exception as e:  # a backend that refuses a shape says so and the rest go on
                    res.append(dict(backend=name, rows=rows, n=n, error=repr(e)[:120]))
                r = res[-1]
                print(json.dumps(r), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "sdpa_shapes.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=res), indent=1))


if __name__ == "__main__":
    main()
