"""INT2 decode-kernel variants (round 4's tile overrides) next to BF16 and SDPA, and the INT2 tile sweep.

Role: the default run of ``python -m lab.benchmarks.variants OUT_DIR`` (needs CUDA). For each
point (context, batch) of :data:`POINTS` (Qwen3-8B attention shape) :func:`time_point` times,
as CUDA-graph replays over enough rotated caches that the L2 cache (50 MB on an H100) cannot
serve them (:func:`~lab.benchmarks.variants_common.graph_us`):

* ``sdpa``   PyTorch ``scaled_dot_product_attention`` on dense BF16 K/V (the peer);
* ``bf16``   :func:`oscarkv.kernels.decode.decode_attention` on an all-BF16 cache;
* ``int2/…`` the same over a mixed cache (G = 128, and G = 64 where listed) with the tile
  variants of :data:`INT2_VARIANTS`.

The eager median (``triton.testing.do_bench``) is kept beside the graph times. Bandwidth =
bytes the step must read / time, against a measured device-to-device copy (:func:`table`).
Before timing, :func:`check` compares every variant with the fp32 oracle at real shapes; the
CLI passes the ones that fail to :func:`time_point` as ``skip``.
:func:`time_prefill` times one prefill chunk (the extend kernel); :func:`resources` and
:func:`dump_compiled` report registers, spills and TTGIR of the compiled INT2 kernels.

:func:`sweep` (``... OUT_DIR sweep``) times every (BLOCK_N, num_stages, programs per SM,
maxnreg) of the raw INT2 kernel; its ``pct_copy`` divides by ``copy``, the copy bandwidth
the CLI measures first.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from oscarkv.bench.attention import AttentionBench, _time_us, cache_bytes
from lab.benchmarks.variants_common import L2_BYTES, graph_us, random_caches, rel_err

POINTS = ((32768, 1), (102400, 1), (32768, 8), (102400, 8))
INT2_VARIANTS = {  # name -> config override of decode._config("raw_int2"); round 4 (H100) tried and dropped:
    "default": {},   # two KV heads per program, maxnreg 208/192, 2 warps, CHUNK 16 (lab/record/benchmarks-log.md)
    "st2": dict(num_stages=2),  # one tile's copies in flight
    "st4": dict(num_stages=4),
}


def check(cfg: AttentionBench) -> list[dict]:
    """Relative error of every INT2 variant vs the fp32 oracle at real shapes (fresh inputs)."""
    from oscarkv.kernels.decode import decode_attention
    from oscarkv.kernels.synthetic import random_cache

    res = []
    for group, lens in ((128, [32768, 20011]), (64, [32768, 9000])):
        kv, tables = random_cache(lens, cfg.kv_heads, cfg.head_dim, page=cfg.page_size, group=group, sink=cfg.sink,
                                  recent=cfg.recent, device="cuda", seed=group)
        q = torch.randn(len(lens), cfg.q_heads, cfg.head_dim, device="cuda").bfloat16()
        for name, conf in INT2_VARIANTS.items():
            try:
                out = decode_attention(q, kv, tables, cfg.head_dim**-0.5, config=conf)
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print("check", group, name, "FAILED", repr(e)[:400], flush=True)
                continue
            res.append(dict(group=group, variant=name, rel_err=rel_err(q, kv, tables, out, cfg.head_dim**-0.5),
                            finite=bool(torch.isfinite(out).all())))
            print("check", res[-1], flush=True)
    return res


def time_point(cfg: AttentionBench, ctx: int, bsz: int, skip: frozenset[str] = frozenset()) -> dict:
    from oscarkv.kernels.decode import decode_attention

    scale = cfg.head_dim**-0.5
    row = {"context": ctx, "batch": bsz, "us": {}, "eager_us": {}, "bytes": {}}
    nb = cache_bytes(cfg, ctx, bsz, False)
    n = max(2, -(-4 * L2_BYTES // nb))
    q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    kvs = [[torch.randn(bsz, cfg.kv_heads, ctx, cfg.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
           for _ in range(n)]
    q4 = q[:, :, None]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    row["us"]["sdpa"] = graph_us([lambda k=k, v=v: sdpa(q4, k, v, enable_gqa=True) for k, v in kvs])
    row["bytes"]["sdpa"] = nb
    del kvs
    caches = random_caches(cfg, ctx, bsz, False, None, n)
    fns = [lambda c=c: decode_attention(q, c[0], c[1], scale) for c in caches]
    row["us"]["bf16"] = graph_us(fns)
    row["eager_us"]["bf16"] = _time_us(fns[0])
    row["bytes"]["bf16"] = nb
    del caches, fns
    torch.cuda.empty_cache()
    for group in (128, 64):
        ni = cache_bytes(cfg, ctx, bsz, True, group)
        n = max(2, -(-4 * L2_BYTES // ni))
        caches = random_caches(cfg, ctx, bsz, True, group, n)
        variants = INT2_VARIANTS if group == 128 else {"default": {}}
        for name, conf in variants.items():
            if name in skip:
                continue
            fns = [lambda c=c, conf=conf: decode_attention(q, c[0], c[1], scale, config=conf) for c in caches]
            key = f"int2g{group}/{name}"
            row["us"][key] = graph_us(fns)
            row["bytes"][key] = ni
            if name == "default":
                row["eager_us"][key] = _time_us(fns[0])
        del caches
        torch.cuda.empty_cache()
    print("point", json.dumps(row), flush=True)
    return row


def time_prefill(cfg: AttentionBench, cached: int = 32768, chunk: int = 2048) -> list[dict]:
    """One chunk of ``chunk`` tokens over ``cached`` cached ones (batch 1): eager median, TFLOP/s."""
    from oscarkv.kernels.extend import extend_attention
    from oscarkv.kernels.synthetic import random_cache

    res = []
    q = torch.randn(chunk, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    kn = torch.randn(chunk, cfg.kv_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    vn = torch.randn_like(kn)
    cu = torch.tensor([0, chunk], dtype=torch.int32, device="cuda")
    flops = 4 * cfg.q_heads * cfg.head_dim * chunk * (cached + chunk / 2)
    for int2 in (False, True):
        kv, tables = random_cache([cached], cfg.kv_heads, cfg.head_dim, page=cfg.page_size, sink=cfg.sink,
                                  recent=cfg.recent, int2=int2, device="cuda", seed=5)
        us = _time_us(lambda: extend_attention(q, kn, vn, kv, tables, cu, cfg.head_dim**-0.5, max_chunk=chunk))
        res.append(dict(cached=cached, chunk=chunk, int2=int2, us=us, tflops=flops / us / 1e6))
        print("prefill", res[-1], flush=True)
    k = torch.randn(1, cfg.q_heads, cached + chunk, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    qd = q.transpose(0, 1)[None]
    mask = torch.ones(chunk, cached + chunk, dtype=torch.bool, device="cuda").tril(cached)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    us = _time_us(lambda: sdpa(qd, k, k, attn_mask=mask))
    res.append(dict(cached=cached, chunk=chunk, sdpa_masked_bf16=True, us=us, tflops=flops / us / 1e6))
    print("prefill", res[-1], flush=True)
    return res


def table(rows: list[dict], copy: float) -> str:
    lines = [f"copy {copy:.0f} GB/s; us (CUDA graph) and % of copy; bf16/int2 = bf16 kernel / best int2 G=128"]
    for r in rows:
        cells = [f"{k}={v:.1f}us({100 * r['bytes'][k] / v / 1e3 / copy:.0f}%)" for k, v in r["us"].items()]
        best = min([v for k, v in r["us"].items() if k.startswith("int2g128")] or [float("nan")])
        lines.append(f"{r['context']:>6}x{r['batch']:<2} bf16/int2={r['us']['bf16'] / best:.2f} " + " ".join(cells))
    return "\n".join(lines)


def sweep(cfg: AttentionBench, copy: float, points=((102400, 1), (32768, 8)), group: int = 128,
          int2_only: bool = True) -> list[dict]:
    """CUDA-graph time of every (BLOCK_N, num_stages, programs per SM, maxnreg) at ``points``; INT2 (and BF16) kernels."""
    from oscarkv.kernels.decode import _num_sms, decode_attention

    scale, sms, res = cfg.head_dim**-0.5, _num_sms(torch.device("cuda")), []
    for ctx, bsz in points:
        q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        for int2 in (True,) if int2_only else (True, False):
            nbytes = cache_bytes(cfg, ctx, bsz, int2, group)
            caches = random_caches(cfg, ctx, bsz, int2, group, max(2, -(-4 * L2_BYTES // nbytes)))
            grid = itertools.product((32, 64), (2, 3, 4), (8, 16), (None, 128)) if int2 else \
                itertools.product((64, 128), (3,), (2, 4), (None,))
            for bn, ns, per_sm, nreg in grid:
                splits = max(1, per_sm * sms // (bsz * cfg.kv_heads))
                conf = dict(BLOCK_N=bn, num_warps=1 if int2 else 4, num_stages=ns, maxnreg=nreg,
                            **(dict(CONV=2) if int2 else {}))
                fns = [lambda c=c: decode_attention(q, c[0], c[1], scale, config=conf, num_splits=splits) for c in caches]
                try:
                    us = graph_us(fns)
                except Exception as e:
                    print("sweep fail", conf, splits, repr(e)[:200], flush=True)
                    continue
                res.append(dict(context=ctx, batch=bsz, int2=int2, group=group, splits=splits, per_sm=per_sm, us=us,
                                pct_copy=100 * nbytes / us / 1e3 / copy, **conf))
                print("sweep", json.dumps(res[-1]), flush=True)
            del caches
            torch.cuda.empty_cache()
    return res


def dump_compiled(out: Path) -> None:
    """TTGIR and resource use of every compiled INT2 decode kernel (layouts, registers, spills)."""
    from oscarkv.kernels.decode_int2 import _int2_decode_kernel

    with open(out / "compiled.txt", "w") as f:
        for cache in _int2_decode_kernel.device_caches.values():
            for key, k in cache[0].items():
                f.write(f"==== {key}\nregs {k.n_regs} spills {k.n_spills} shared {k.metadata.shared}\n")
                f.write(k.asm["ttgir"][:60000] + "\n")
                break


def resources() -> list[dict]:
    """Registers and spills of every compiled INT2 decode kernel (its specialization key abridged)."""
    from oscarkv.kernels.decode_int2 import _int2_decode_kernel

    out = []
    for cache in _int2_decode_kernel.device_caches.values():
        for key, k in cache[0].items():
            out.append(dict(regs=k.n_regs, spills=k.n_spills, key=str(key)[-160:]))
    return out
