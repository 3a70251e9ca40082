"""Tile sweep for the decode kernel (``python -m lab.benchmarks.sweep OUT.json`` on a GPU).

Times :func:`oscarkv.kernels.decode.decode_attention` over a grid of (BLOCK_N, num_warps,
num_stages, splits) at a few representative (context, batch) points of the Qwen3-8B shape and
writes every time as JSON; the best tiles go into ``oscarkv.kernels.decode._config`` (the raw INT2 kernel: ``lab.benchmarks.variants sweep``).
"""

from __future__ import annotations

import itertools
import json
import sys

import torch

from oscarkv.bench.attention import AttentionBench, _time_us, cache_bytes, copy_bandwidth
from oscarkv.kernels.decode import decode_attention, default_splits
from oscarkv.kernels.synthetic import random_cache

POINTS = ((131072, 1), (32768, 8), (32768, 64))
GRID = dict(BLOCK_N=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3, 4), split_factor=(0.5, 1, 2))


def sweep(cfg: AttentionBench, kinds=(True, False), grid=GRID) -> dict:
    copy = copy_bandwidth()
    res = {"device": torch.cuda.get_device_name(), "copy_gbps": copy, "runs": []}
    for (ctx, bsz), int2 in itertools.product(POINTS, kinds):
        kv, tables = random_cache([ctx] * bsz, cfg.kv_heads, cfg.head_dim, page=cfg.page_size, sink=cfg.sink,
                                  recent=cfg.recent, int2=int2, device="cuda", seed=ctx + bsz)
        q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        nbytes = cache_bytes(cfg, ctx, bsz, int2)
        base = default_splits(bsz, cfg.kv_heads, q.device)
        for bn, nw, ns, sf in itertools.product(*grid.values()):
            conf = dict(BLOCK_N=bn, num_warps=nw, num_stages=ns)
            splits = max(1, int(base * sf))
            try:
                us = _time_us(lambda kv=kv, tables=tables: decode_attention(q, kv, tables, cfg.head_dim**-0.5, num_splits=splits, config=conf))
            except Exception as e:  # out of shared memory etc.
                print("fail", ctx, bsz, int2, conf, splits, repr(e)[:120])
                continue
            res["runs"].append(dict(context=ctx, batch=bsz, int2=int2, splits=splits, us=us,
                                    pct_copy=100 * nbytes / us / 1e3 / copy, **conf))
        best = min((r for r in res["runs"] if r["context"] == ctx and r["batch"] == bsz and r["int2"] == int2),
                   key=lambda r: r["us"])
        print("best", best, flush=True)
        kv = tables = None  # NOTE: frees them (rebound, not del: the timed lambda closes over these names)
        torch.cuda.empty_cache()
    return res


if __name__ == "__main__":
    quick = len(sys.argv) > 2 and sys.argv[2] == "int2"
    out = sweep(AttentionBench(), (True,), dict(BLOCK_N=(32, 64), num_warps=(4, 8), num_stages=(2, 3, 4), split_factor=(1,))) \
        if quick else sweep(AttentionBench())
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
