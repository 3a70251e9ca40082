"""Decode attention at few KV heads: where its fixed cost goes, and what more splits with a column-parallel merge buy.

At tp 2 and 4 a Qwen3-8B rank holds 4 or 2 KV heads; the INT2 decode kernel then costs ~30 µs a layer at 100K
whatever the split count (``lab/bench_gpu/2026-11-27/splits_h200.json``, from the ``splits_sweep`` this script
replaces), against 3.5-7 µs of bytes. This times, as CUDA-graph replays over
caches that exceed L2 (batch 1 unless stated, INT2 history, the shipped windows):

* the whole call (kernel + merge) for each split count, with the merge of 32 or 64 columns a program
  (``split_k._merge_kernel``; the ``m0`` rows of the 2026-11-27 JSON are the one-program-per-row merge it replaced);
* the merge alone on ``Mid`` tensors of each split count (so kernel ≈ whole − merge);
* a cache with no INT2 history (the windows only): the call's floor of launches, loads and stores;

each beside the bytes floor, with the error against the fp32 oracle.

    python -m lab.scripts.few_heads_sweep [--out FILE]          # a CUDA GPU; ~2 min
"""

from __future__ import annotations

import argparse
import json

import torch

from lab.benchmarks.variants_common import L2_BYTES, graph_us, random_caches, rel_err
from oscarkv.bench.configs import AttentionBench
from oscarkv.kernels.decode import decode_attention, default_splits
from oscarkv.kernels.split_k import merge_splits

SPLITS = (256, 512, 1024, 2048)
MERGES = (32, 64)
SHAPES = ((2, 1), (4, 1), (8, 1), (8, 4))  # (KV heads, batch)


def history_bytes(ctx: int, kv_heads: int, bsz: int, head_dim: int = 128) -> float:
    """Bytes a step must read: keys and values at 2.25 bits (INT2 codes, an fp16 scale and zero per 128)."""
    return bsz * ctx * kv_heads * head_dim * 2 * 2.25 / 8


def merge_us(bsz: int, q_heads: int, splits: int, cols: int) -> float:
    mid_o = torch.randn(bsz, q_heads, splits, 128, device="cuda")
    mid_l = torch.randn(bsz, q_heads, splits, device="cuda")
    out = torch.empty(bsz, q_heads, 128, device="cuda", dtype=torch.bfloat16)
    return graph_us([lambda: merge_splits(mid_o, mid_l, out, 4, cols)])


def point(kv_heads: int, bsz: int, ctx: int = 102400, copy_gbs: float = 4200.0) -> dict:
    cfg = AttentionBench(q_heads=4 * kv_heads, kv_heads=kv_heads)
    scale = cfg.head_dim**-0.5
    q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    nb = history_bytes(ctx, kv_heads, bsz)
    caches = random_caches(cfg, ctx, bsz, True, 128, max(2, int(-(-4 * L2_BYTES // nb))))
    windows = random_caches(cfg, 190, bsz, True, 128, 4)
    one = caches[0]
    row = {"kv_heads": kv_heads, "batch": bsz, "context": ctx, "history_mb": nb / 1e6, "floor_us": nb / copy_gbs / 1e3,
           "default_splits": default_splits(bsz, kv_heads, q.device, 12), "us": {}, "rel_err": {}, "merge_us": {}}

    def call(c, **kw):
        return lambda: decode_attention(q, c[0], c[1], scale, **kw)

    row["us"]["default"] = graph_us([call(c) for c in caches])
    row["us"]["windows_only"] = graph_us([call(c) for c in windows])
    for s in SPLITS:
        for m in MERGES:
            key = f"s{s}_m{m}"
            kw = dict(num_splits=s, config={"MERGE_COLS": m})
            row["rel_err"][key] = rel_err(q, one[0], one[1], call(one, **kw)(), scale)
            row["us"][key] = graph_us([call(c, **kw) for c in caches])
            row["merge_us"][key] = merge_us(bsz, cfg.q_heads, s, m)
        kw = dict(num_splits=s, config={"MERGE_COLS": 32, "num_warps": 2})
        row["us"][f"s{s}_m32_w2"] = graph_us([call(c, **kw) for c in caches])
    best = min((k for k in row["us"] if k.startswith("s")), key=row["us"].get)
    row["best"] = best
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [point(h, b) for h, b in SHAPES]
    keys = ["default", "windows_only"] + [f"s{s}_m{m}" for s in SPLITS for m in MERGES]
    print("| KV heads | batch | floor µs | " + " | ".join(keys) + " | best |")
    print("|---:|---:|---:|" + "---:|" * len(keys) + "---|")
    for r in rows:
        cells = " | ".join(f"{r['us'][k]:.1f}" for k in keys)
        print(f"| {r['kv_heads']} | {r['batch']} | {r['floor_us']:.1f} | {cells} | {r['best']} {r['us'][r['best']]:.1f} |")
    print("merge alone µs:", {f"{r['kv_heads']}x{r['batch']}": {k: round(v, 1) for k, v in r["merge_us"].items()}
                              for r in rows})
    print("max rel err:", max(max(r["rel_err"].values()) for r in rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
