"""Decode attention at a tensor-parallel rank's shape: how many splits fill the GPU when a rank holds few KV heads.

At tp 4 a Qwen3-8B rank holds 2 KV heads (8 query heads); ``default_splits`` caps the split count at 256, so
batch 1 launches 512 programs where 12 per SM x 132 SMs fit. This times ``decode_attention`` (kernel and merge,
CUDA-graph replays over caches that exceed L2) at 100K tokens, batch 1, for 8, 4 and 2 KV heads and several
split counts, beside the default and the bytes floor (INT2 history + BF16 windows at the copy bandwidth).

    python -m lab.scripts.splits_sweep [--out FILE]          # a CUDA GPU; ~1 min
"""

from __future__ import annotations

import argparse
import json

import torch

from lab.benchmarks.variants_common import L2_BYTES, graph_us, random_caches, rel_err
from oscarkv.bench.configs import AttentionBench
from oscarkv.kernels.decode import decode_attention, default_splits

SPLITS = (128, 256, 512, 768, 1024)


def history_bytes(ctx: int, kv_heads: int, head_dim: int = 128) -> float:
    """Bytes a step must read: keys and values at 2.25 bits (INT2 codes, a BF16 scale and zero per 128)."""
    return ctx * kv_heads * head_dim * 2 * 2.25 / 8


def point(kv_heads: int, ctx: int = 102400, copy_gbs: float = 4200.0) -> dict:
    cfg = AttentionBench(q_heads=4 * kv_heads, kv_heads=kv_heads)
    scale = cfg.head_dim**-0.5
    q = torch.randn(1, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    nb = history_bytes(ctx, kv_heads)
    caches = random_caches(cfg, ctx, 1, True, 128, max(2, int(-(-4 * L2_BYTES // nb))))
    one = caches[0]
    row = {"kv_heads": kv_heads, "context": ctx, "default_splits": default_splits(1, kv_heads, q.device, 12),
           "history_mb": nb / 1e6, "floor_us": nb / copy_gbs / 1e3, "us": {}, "rel_err": {}}
    for s in SPLITS:
        out = decode_attention(q, one[0], one[1], scale, num_splits=s)
        row["rel_err"][s] = rel_err(q, one[0], one[1], out, scale)
        row["us"][s] = graph_us([lambda c=c, s=s: decode_attention(q, c[0], c[1], scale, num_splits=s) for c in caches])
    row["us"]["default"] = graph_us([lambda c=c: decode_attention(q, c[0], c[1], scale) for c in caches])
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [point(h) for h in (8, 4, 2)]
    print("| KV heads | default splits | floor us | " + " | ".join(f"{s} splits" for s in SPLITS) + " | default |")
    print("|---:|---:|---:|" + "---:|" * (len(SPLITS) + 1))
    for r in rows:
        cells = " | ".join(f"{r['us'][s]:.1f}" for s in (*SPLITS, "default"))
        print(f"| {r['kv_heads']} | {r['default_splits']} | {r['floor_us']:.1f} | {cells} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
