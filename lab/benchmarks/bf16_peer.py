"""The BF16 decode kernel next to its peer, PyTorch's SDPA, and the INT2 kernel, at every kernel-table point.

``python -m lab.benchmarks.bf16_peer OUT_DIR`` (needs CUDA). At each (context, batch) of
:data:`lab.benchmarks.variants_bf16.BF16_POINTS` (Qwen3-8B attention shape) it times, as CUDA-graph
replays over enough rotated caches that L2 cannot serve them (``variants_common.graph_us``):

* ``sdpa`` PyTorch ``scaled_dot_product_attention`` on dense BF16 K/V, before and after the rest;
* ``bf16`` the BF16 kernel with its tile table (``decode._config``), pages in random order;
  ``bf16_r4`` with round 4's tiles (``BLOCK_N`` 128, 2 programs per SM) for comparison;
  ``bf16_sorted`` the table's tiles over consecutive pages (the layout's share of the gap);
* ``int2`` the INT2 kernel (G = 128), random page order.

Writes ``bf16_peer.json`` (with registers and spills of every compiled decode kernel) and
prints a table last.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from oscarkv.bench.attention import AttentionBench, cache_bytes, copy_bandwidth
from lab.benchmarks.variants_bf16 import BF16_POINTS, sdpa_us
from lab.benchmarks.variants_common import L2_BYTES, graph_us


def _time(cfg: AttentionBench, ctx: int, bsz: int, int2: bool, shuffle: bool, r4: bool, q) -> float:
    from oscarkv.kernels.decode import decode_attention, default_splits
    from oscarkv.kernels.synthetic import random_cache

    n = max(2, -(-4 * L2_BYTES // cache_bytes(cfg, ctx, bsz, int2)))
    caches = [random_cache([ctx] * bsz, cfg.kv_heads, cfg.head_dim, page=cfg.page_size, sink=cfg.sink,
                           recent=cfg.recent, int2=int2, device="cuda", seed=ctx + bsz + i, shuffle=shuffle)
              for i in range(n)]
    conf, splits = (dict(BLOCK_N=128), default_splits(bsz, cfg.kv_heads, q.device, 2)) if r4 else (None, None)
    fns = [lambda c=c: decode_attention(q, c[0], c[1], cfg.head_dim**-0.5, config=conf, num_splits=splits)
           for c in caches]
    us = graph_us(fns)
    del caches, fns
    torch.cuda.empty_cache()
    return us


def point(cfg: AttentionBench, ctx: int, bsz: int) -> dict:
    q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    n = max(2, -(-4 * L2_BYTES // cache_bytes(cfg, ctx, bsz, False)))
    row = dict(context=ctx, batch=bsz, us={"sdpa": sdpa_us(cfg, ctx, bsz, n)},
               bytes=dict(bf16=cache_bytes(cfg, ctx, bsz, False), int2=cache_bytes(cfg, ctx, bsz, True)))
    for name, int2, shuffle, r4 in (("bf16", False, True, False), ("bf16_r4", False, True, True),
                                    ("bf16_sorted", False, False, False), ("int2", True, True, False)):
        row["us"][name] = _time(cfg, ctx, bsz, int2, shuffle, r4, q)
    row["us"]["sdpa_again"] = sdpa_us(cfg, ctx, bsz, n)
    print("point", json.dumps(row), flush=True)
    return row


def resources() -> list[dict]:
    from oscarkv.kernels.decode import _decode_kernel
    from oscarkv.kernels.decode_int2 import _int2_decode_kernel

    out = []
    for kern in (_decode_kernel, _int2_decode_kernel):
        for cache in kern.device_caches.values():
            for key, k in cache[0].items():
                out.append(dict(kernel=kern.fn.__name__, regs=k.n_regs, spills=k.n_spills, shared=k.metadata.shared,
                                key=str(key)[-200:]))
    return out


def table(rows: list[dict], copy: float) -> str:
    lines = [f"copy {copy:.0f} GB/s; us (CUDA graph), % of copy; x = time / sdpa"]
    for r in rows:
        ref = r["us"]["sdpa"]
        cells = [f"{k}={v:.1f}({100 * r['bytes'][k.split('_')[0] if not k.startswith('sdpa') else 'bf16'] / v / 1e3 / copy:.0f}%,"
                 f"x{v / ref:.3f})" for k, v in r["us"].items()]
        lines.append(f"{r['context']:>6}x{r['batch']:<2} " + " ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    copy = copy_bandwidth()
    rows = [point(cfg, c, b) for c, b in BF16_POINTS]
    res = resources()
    (out / "bf16_peer.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy,
                                                     "rows": rows, "resources": res}, indent=1))
    print("\n".join(f"{r['kernel']} regs {r['regs']} spills {r['spills']} shared {r['shared']}" for r in res))
    print(table(rows, copy))
