"""Decode attention over pages of 16 (the shipped recipe): tiles of one page against tiles of several (``SPAN_PAGES``).

The shipped recipe stores pages of 16 tokens, so the raw INT2 decode kernel walked its history in 16-token tiles
(``BLOCK_N = gcd(64, P)``): at batch 8 the recipe's step read its bytes at 1.58x their floor against INT2's 1.29x
with pages of 64 (H100, 2026-11-28). ``decode._config``'s ``SPAN_PAGES`` (on since 2026-11-28, at 2 stages) reads 32- or 64-token tiles of 2 or 4
pages instead (a page id per token; the history's last ``length % BLOCK_N`` tokens page by page). This times, as
CUDA-graph replays over caches that exceed L2 (Qwen3-8B attention: 8 KV heads, 32 query heads, d = 128, groups of
128; sink 16 and recent 16 as the recipe; 100K tokens; batch 1 and 8; 2-bit and 4-bit keys), each tiling beside
pages of 64 with 64-token tiles and the bytes floor, with the error against the fp32 oracle.

    python -m lab.scripts.page_span_sweep [--out FILE]          # a CUDA GPU; ~2 min
"""

from __future__ import annotations

import argparse
import json

import torch

from lab.benchmarks.variants_common import L2_BYTES, graph_us, rel_err
from oscarkv.kernels.decode import decode_attention
from oscarkv.kernels.synthetic import random_cache

H, HQ, D, CTX = 8, 32, 128, 102400
VARIANTS = {  # name: (page, config)
    "p16_tile16": (16, {"SPAN_PAGES": False}),
    "p16_span32": (16, {"BLOCK_N": 32, "SPAN_PAGES": True, "num_stages": 3}),
    "p16_span64": (16, {"BLOCK_N": 64, "SPAN_PAGES": True, "num_stages": 3}),
    "p16_span64_st2": (16, {"BLOCK_N": 64, "SPAN_PAGES": True, "num_stages": 2}),
    "p16_span64_c16": (16, {"BLOCK_N": 64, "SPAN_PAGES": True, "CHUNK": 16, "num_stages": 3}),
    "p64_tile64": (64, {}),
}


def history_bytes(bsz: int, bits: tuple[int, int]) -> float:
    """Bytes a step reads: codes at ``bits`` plus an fp16 scale and zero per 128 channels, keys and values."""
    return bsz * CTX * H * D * sum(b + 0.25 for b in bits) / 8


def point(bsz: int, bits: tuple[int, int], copy_gbs: float) -> dict:
    q = torch.randn(bsz, HQ, D, device="cuda", dtype=torch.bfloat16)
    nb = history_bytes(bsz, bits)
    n = max(2, int(-(-4 * L2_BYTES // nb)))
    row = dict(batch=bsz, bits=list(bits), context=CTX, history_mb=nb / 1e6, floor_us=nb / copy_gbs / 1e3, us={},
               rel_err={})
    for page in sorted({p for p, _ in VARIANTS.values()}):
        caches = [random_cache([CTX] * bsz, H, D, page=page, group=128, sink=16 if page == 16 else 64,
                               recent=16 if page == 16 else 256, device="cuda", seed=i, bits=bits) for i in range(n)]
        for name, (p, config) in VARIANTS.items():
            if p != page:
                continue
            calls = [lambda c=c, cfg=config: decode_attention(q, c[0], c[1], D**-0.5, config=cfg) for c in caches]
            row["rel_err"][name] = rel_err(q, caches[0][0], caches[0][1], calls[0](), D**-0.5)
            row["us"][name] = graph_us(calls)
        del caches
        torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from oscarkv.bench.attention import copy_bandwidth

    copy_bandwidth()
    gbs = copy_bandwidth()
    rows = [point(b, bits, gbs) for b in (1, 8) for bits in ((2, 2), (4, 2))]
    print(f"copy {gbs:.0f} GB/s; us per call (x floor)")
    for r in rows:
        cells = "  ".join(f"{k} {v:.1f} ({v / r['floor_us']:.2f})" for k, v in r["us"].items())
        print(f"b{r['batch']} k{r['bits'][0]}v{r['bits'][1]} floor {r['floor_us']:.1f}: {cells}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_gbs=gbs, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
