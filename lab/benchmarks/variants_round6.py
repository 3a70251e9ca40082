"""Rounds 6 and 7 of the INT2 decode kernel at several register caps (``... OUT_DIR round6|round7``).

Round 6: transposed tiles; round 7: the code conversion of all four slices
in one PTX block (``decode_int2._slices``) at several register caps.

Role: :func:`round6` checks every variant (:data:`ROUND6`, :data:`ROUND7`) against the fp32 oracle (fresh inputs,
G = 128 and 64, odd lengths), drops the ones that fail, and times the rest as CUDA-graph
replays over rotated caches (:func:`~lab.benchmarks.variants_common.graph_us`) at
:data:`ROUND6_POINTS`, with % of the measured copy bandwidth; it also reports registers and
spills of every compiled INT2 kernel. The result dict is written as ``round6.json``;
:func:`round6_table` prints it.

A variant with ``base=NAME`` runs the kernel of ``lab/benchmarks/NAME.py`` in place of the current
one (:class:`_swap`). The baselines the rounds were measured against — the round-5 kernel
(``git show 449eb7b:oscarkv/kernels/decode_int2.py``) and the round-6 one (``git show
c64b09d:...``) — are near-copies of today's kernel and live only in the history: save one as
``lab/benchmarks/NAME.py`` and add a ``base=NAME`` variant to compare again. Their measured times
stay in ``lab/record/benchmarks-log.md`` ("Round 6", "Round 7") and ``lab/bench_gpu/``.
"""

from __future__ import annotations

import json

import torch

from oscarkv.bench.attention import AttentionBench, cache_bytes
from lab.benchmarks.variants_common import L2_BYTES, graph_us, random_caches, rel_err

ROUND6_POINTS = ((32768, 1), (102400, 1), (131072, 1), (32768, 8), (102400, 8), (32768, 32))
ROUND6 = {  # INT2 kernel, round 6 (H100): transposed tiles (tokens x query rows) and their register caps
    "T": {},  # the default now: maxnreg 168, 12 programs per SM
    "T_n255_s8": dict(maxnreg=None, PER_SM=8),
    "T_n152_s13": dict(maxnreg=152, PER_SM=13),
    "T_st4": dict(num_stages=4),
    "T_n128_s16": dict(maxnreg=128, PER_SM=16),
}
ROUND6_G64 = ("T", "T_n128_s16")
ROUND7 = {  # INT2 kernel, round 7 (H100): four slices per PTX block
    "S": {},  # the default: maxnreg 168, 12 programs per SM
    "S_free": dict(maxnreg=None),  # ptxas picks (168 at G = 128, 255 at G = 64)
    "S_n176_s11": dict(maxnreg=176, PER_SM=11),
    "S_n152_s13": dict(maxnreg=152, PER_SM=13),
    "S_n128_s16": dict(maxnreg=128, PER_SM=16),
}
ROUND7_G64 = ("S", "S_n128_s16")


class _swap:
    """Runs the INT2 kernel of ``benchmarks.<conf['base']>`` in place of the current one while active."""

    def __init__(self, conf: dict):
        self.base, self.conf = conf.get("base"), {k: v for k, v in conf.items() if k != "base"}

    def __enter__(self):
        import importlib
        import oscarkv.kernels.decode_int2 as cur

        self.cur, self.old = cur, cur._int2_decode_kernel
        if self.base:
            cur._int2_decode_kernel = importlib.import_module(f"benchmarks.{self.base}")._int2_decode_kernel
        return self.conf

    def __exit__(self, *exc):
        self.cur._int2_decode_kernel = self.old


def round6(cfg: AttentionBench, copy: float, variants: dict = ROUND6, g64: tuple[str, ...] = ROUND6_G64) -> dict:
    """Checks (fresh inputs, fp32 oracle) and CUDA-graph times of ``variants`` at ``ROUND6_POINTS``
    (at G = 64 only those named in ``g64``)."""
    from oscarkv.kernels.decode import decode_attention
    from oscarkv.kernels.synthetic import random_cache

    import importlib
    import importlib.util

    bases = {v["base"] for v in variants.values() if "base" in v}
    have = {b for b in bases if importlib.util.find_spec(f"benchmarks.{b}") is not None}
    variants = {k: v for k, v in variants.items() if v.get("base", "") in have | {""}}
    scale, checks, rows = cfg.head_dim**-0.5, [], []
    for group, lens in ((128, [32768, 20011, 4095]), (64, [32768, 9000])):
        kv, tables = random_cache(lens, cfg.kv_heads, cfg.head_dim, page=cfg.page_size, group=group, sink=cfg.sink,
                                  recent=cfg.recent, device="cuda", seed=group + 7)
        q = torch.randn(len(lens), cfg.q_heads, cfg.head_dim, device="cuda").bfloat16()
        for name, conf in variants.items():
            with _swap(conf) as c:
                out = decode_attention(q, kv, tables, scale, config=c)
            checks.append(dict(group=group, variant=name, rel_err=rel_err(q, kv, tables, out, scale),
                               finite=bool(torch.isfinite(out).all())))
            print("check", checks[-1], flush=True)
    bad = {c["variant"] for c in checks if not (c["finite"] and c["rel_err"] < 5e-3)}
    for ctx, bsz in ROUND6_POINTS:
        q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        row = dict(context=ctx, batch=bsz, us={}, pct={})
        for group in (128, 64):
            nb = cache_bytes(cfg, ctx, bsz, True, group)
            caches = random_caches(cfg, ctx, bsz, True, group, max(2, -(-4 * L2_BYTES // nb)))
            for name, conf in variants.items():
                if name in bad or (group == 64 and name not in g64):
                    continue
                with _swap(conf) as c:
                    us = graph_us([lambda x=x, c=c: decode_attention(q, x[0], x[1], scale, config=c) for x in caches])
                row["us"][f"g{group}/{name}"] = us
                row["pct"][f"g{group}/{name}"] = 100 * nb / us / 1e3 / copy
            del caches
            torch.cuda.empty_cache()
        rows.append(row)
        print("point", json.dumps(row), flush=True)
    import oscarkv.kernels.decode_int2 as cur

    mods = [importlib.import_module(f"benchmarks.{b}") for b in sorted(have)]
    res = [dict(kernel=m.__name__, regs=k.n_regs, spills=k.n_spills, key=str(key)[-200:])
           for m in mods + [cur] for cache in m._int2_decode_kernel.device_caches.values() for key, k in cache[0].items()]
    return dict(checks=checks, rows=rows, resources=res)


def round6_table(res: dict) -> str:
    names = list(res["rows"][0]["us"])
    lines = ["INT2 kernel, us (CUDA graph), % of copy; " + " | ".join(names)]
    for r in res["rows"]:
        lines.append(f"{r['context']:>6}x{r['batch']:<2} " + " ".join(
            f"{r['us'][k]:.1f}({r['pct'][k]:.0f}%)" if k in r["us"] else "-" for k in names))
    return "\n".join(lines)
