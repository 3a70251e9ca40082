"""Where the INT2 decode kernel's time goes at batch 1: fixed cost, split count, merge, and a copy of the same bytes.

``python -m lab.benchmarks.batch1 OUT_DIR`` (needs CUDA). At batch 1 the INT2 kernel reads 30–56% of
the *asymptotic* copy bandwidth (round 7, ``lab/record/benchmarks-log.md``) while it reaches 80% at batch 8–32,
so the question is what does not scale with the bytes. For each context (Qwen3-8B attention
shape, G = 128, one sequence) it times, as CUDA-graph replays over rotated caches that exceed the
L2 cache (:mod:`lab.benchmarks.variants_common`; at most 64 of them, so below ~3 MB per cache the L2
may serve part of both the kernel's and the copy's reads):

* ``default`` — :func:`~oscarkv.kernels.decode.decode_attention` as the engine calls it;
* ``splits=N`` — the same with ``N`` splits per KV head (the default fills 12 programs per SM);
* ``merge`` — the split-K merge (``_reduce_kernel``) alone, at the default split count;
* ``copy`` — a device-to-device copy that moves the same number of bytes (half read, half
  written), i.e. what a kernel of this size can achieve, launch and ramp included;
* ``copy_big`` — the asymptotic copy bandwidth (GB/s), the reference of the kernel tables.

Prints a table, writes ``batch1.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from oscarkv.bench.attention import AttentionBench, cache_bytes, copy_bandwidth
from lab.benchmarks.variants_common import L2_BYTES, graph_us, random_caches

CONTEXTS = (1024, 8192, 32768, 102400, 131072)
SPLITS = (8, 16, 33, 66, 132, 198, 264, 396)


def _merge_us(cfg: AttentionBench, splits: int) -> float:
    from oscarkv.kernels.split_k import merge_splits

    mids = [(torch.randn(1, cfg.q_heads, splits, cfg.head_dim, device="cuda"),
             torch.randn(1, cfg.q_heads, splits, device="cuda")) for _ in range(8)]
    out = torch.empty(1, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    return graph_us([lambda o=o, l=l: merge_splits(o, l, out) for o, l in mids])


def _copy_us(nbytes: int) -> float:
    half = max(1, nbytes // 4)  # fp16 elements moving nbytes / 2 each way
    n = min(64, max(2, -(-4 * L2_BYTES // (2 * half * 2))))
    bufs = [(torch.empty(half, dtype=torch.float16, device="cuda"), torch.empty(half, dtype=torch.float16, device="cuda"))
            for _ in range(n)]
    return graph_us([lambda s=s, d=d: d.copy_(s) for s, d in bufs])


def batch1(cfg: AttentionBench) -> dict:
    from oscarkv.kernels.decode import decode_attention, default_splits

    scale, rows = cfg.head_dim**-0.5, []
    big = copy_bandwidth()
    for ctx in CONTEXTS:
        nb = cache_bytes(cfg, ctx, 1, True, 128)
        caches = random_caches(cfg, ctx, 1, True, 128, min(64, max(2, -(-4 * L2_BYTES // nb))))
        q = torch.randn(1, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        row = dict(context=ctx, bytes=nb, us={})
        row["us"]["default"] = graph_us([lambda x=x: decode_attention(q, x[0], x[1], scale) for x in caches])
        for s in SPLITS:
            row["us"][f"splits={s}"] = graph_us(
                [lambda x=x, s=s: decode_attention(q, x[0], x[1], scale, num_splits=s) for x in caches])
        row["default_splits"] = default_splits(1, cfg.kv_heads, q.device, 12)
        row["us"]["merge"] = _merge_us(cfg, row["default_splits"])
        row["us"]["copy"] = _copy_us(nb)
        row["pct_copy_big"] = 100 * nb / row["us"]["default"] / 1e3 / big
        row["pct_copy_same"] = 100 * row["us"]["copy"] / row["us"]["default"]
        rows.append(row)
        print("point", json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    return dict(device=torch.cuda.get_device_name(), copy_gbps=big, rows=rows)


def table(res: dict) -> str:
    names = list(res["rows"][0]["us"])
    lines = [f"INT2 decode at batch 1 (G = 128), us; copy_big {res['copy_gbps']:.0f} GB/s",
             "context  MB     " + " ".join(f"{n:>10}" for n in names) + "  %big  %same"]
    for r in res["rows"]:
        lines.append(f"{r['context']:>7} {r['bytes'] / 1e6:6.1f} " + " ".join(f"{r['us'][n]:>10.1f}" for n in names)
                     + f"  {r['pct_copy_big']:4.0f}  {r['pct_copy_same']:5.0f}")
    return "\n".join(lines)


def main(out: Path) -> None:
    res = batch1(AttentionBench())
    (out / "batch1.json").write_text(json.dumps(res, indent=1))
    print(table(res))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
