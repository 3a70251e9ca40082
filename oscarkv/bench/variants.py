"""Decode-kernel variants on one GPU call: correctness at real shapes, then CUDA-graph timings.

``python -m oscarkv.bench.variants OUT_DIR`` (needs CUDA). For each point (context, batch) of
the Qwen3-8B attention shape it times, as CUDA-graph replays over enough rotated caches that
the L2 cache (50 MB on an H100) cannot serve them:

* ``sdpa``   PyTorch ``scaled_dot_product_attention`` on dense BF16 K/V (the peer);
* ``bf16``   :func:`oscarkv.kernels.decode.decode_attention` on an all-BF16 cache;
* ``int2/…`` the same over a mixed cache (G = 128, and G = 64 where listed) with tile variants.

Graph replays remove the Python launch overhead that dominates eager timings at batch 1 (the
engine replays CUDA graphs too); the eager median (``triton.testing.do_bench``) is kept beside
them. Bandwidth = bytes the step must read / time, against a measured device-to-device copy.
Writes ``variants.json`` and prints a table last.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

from oscarkv.bench.attention import AttentionBench, _time_us, cache_bytes, copy_bandwidth

POINTS = ((32768, 1), (102400, 1), (32768, 8), (102400, 8))
INT2_VARIANTS = {  # name -> config override of decode._config("raw_int2"); round 4 (H100) tried and dropped:
    "default": {},   # two KV heads per program, maxnreg 208/192, 2 warps, CHUNK 16 (BENCHMARKS.md)
    "st2": dict(num_stages=2),  # one tile's copies in flight
    "st4": dict(num_stages=4),
}
L2_BYTES = 50 * 2**20
BROKEN: set[str] = set()


def graph_us(fns: list, reps: int = 10) -> float:
    """Median time of one call, replaying a CUDA graph that calls every ``fns`` in turn ``reps`` times."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for f in fns:
                f()
    g.replay()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / (reps * len(fns)))
    del g
    return sorted(times)[len(times) // 2]


def _caches(cfg, ctx, bsz, int2, group, n):
    from oscarkv.kernels.synthetic import random_cache

    return [random_cache([ctx] * bsz, cfg.kv_heads, cfg.head_dim, page=cfg.page_size, group=group, sink=cfg.sink,
                         recent=cfg.recent, int2=int2, device="cuda", seed=ctx + bsz + i) for i in range(n)]


def _rel_err(q, kv, tables, out, scale):
    from oscarkv.kernels.reference import decode_attention_ref

    ref = decode_attention_ref(q.float(), kv, tables, scale)
    return ((out.float() - ref).norm() / ref.norm()).item()


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
            res.append(dict(group=group, variant=name, rel_err=_rel_err(q, kv, tables, out, cfg.head_dim**-0.5),
                            finite=bool(torch.isfinite(out).all())))
            print("check", res[-1], flush=True)
    return res


def time_point(cfg: AttentionBench, ctx: int, bsz: int) -> dict:
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
    caches = _caches(cfg, ctx, bsz, False, None, n)
    fns = [lambda c=c: decode_attention(q, c[0], c[1], scale) for c in caches]
    row["us"]["bf16"] = graph_us(fns)
    row["eager_us"]["bf16"] = _time_us(fns[0])
    row["bytes"]["bf16"] = nb
    del caches, fns
    torch.cuda.empty_cache()
    for group in (128, 64):
        ni = cache_bytes(cfg, ctx, bsz, True, group)
        n = max(2, -(-4 * L2_BYTES // ni))
        caches = _caches(cfg, ctx, bsz, True, group, n)
        variants = INT2_VARIANTS if group == 128 else {"default": {}}
        for name, conf in variants.items():
            if name in BROKEN:
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


def sweep(cfg: AttentionBench, points=((102400, 1), (32768, 8)), group: int = 128, int2_only: bool = True) -> list[dict]:
    """CUDA-graph time of every (BLOCK_N, num_stages, programs per SM, maxnreg) at ``points``; INT2 (and BF16) kernels."""
    import itertools

    from oscarkv.kernels.decode import _num_sms, decode_attention

    scale, sms, res = cfg.head_dim**-0.5, _num_sms(torch.device("cuda")), []
    for ctx, bsz in points:
        q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        for int2 in (True,) if int2_only else (True, False):
            nbytes = cache_bytes(cfg, ctx, bsz, int2, group)
            caches = _caches(cfg, ctx, bsz, int2, group, max(2, -(-4 * L2_BYTES // nbytes)))
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
                                pct_copy=100 * nbytes / us / 1e3 / COPY[0], **conf))
                print("sweep", json.dumps(res[-1]), flush=True)
            del caches
            torch.cuda.empty_cache()
    return res


BF16_POINTS = ((32768, 1), (102400, 1), (131072, 1), (32768, 8), (102400, 8), (32768, 32))


def _bf16_fns(cfg: AttentionBench, ctx: int, bsz: int) -> tuple[list, list, torch.Tensor]:
    """Rotated dense K/V (for SDPA) and paged BF16 caches of one point, plus its query."""
    nb = cache_bytes(cfg, ctx, bsz, False)
    n = max(2, -(-4 * L2_BYTES // nb))
    q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    return _caches(cfg, ctx, bsz, False, None, n), [n], q


def _sdpa_us(cfg: AttentionBench, ctx: int, bsz: int, n: int) -> float:
    q4 = torch.randn(bsz, cfg.q_heads, 1, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    kvs = [[torch.randn(bsz, cfg.kv_heads, ctx, cfg.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
           for _ in range(n)]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    us = graph_us([lambda k=k, v=v: sdpa(q4, k, v, enable_gqa=True) for k, v in kvs])
    del kvs
    torch.cuda.empty_cache()
    return us


def _bf16_time(cfg: AttentionBench, caches, q, conf: dict, per_sm: int) -> float | None:
    from oscarkv.kernels.decode import _num_sms, decode_attention

    splits = max(1, min(256, per_sm * _num_sms(q.device) // (q.shape[0] * cfg.kv_heads)))
    fns = [lambda c=c: decode_attention(q, c[0], c[1], cfg.head_dim**-0.5, config=conf, num_splits=splits)
           for c in caches]
    try:
        return graph_us(fns)
    except Exception as e:  # e.g. out of shared memory: reported, not fatal
        print("bf16 fail", conf, per_sm, repr(e)[:200], flush=True)
        return None


def bf16_sweep(cfg: AttentionBench, top: int = 6) -> dict:
    """BF16 kernel vs SDPA: a coarse grid (BLOCK_N, num_warps, num_stages, programs per SM) at three
    points, then the ``top`` configs (by geometric-mean time over SDPA) and merge widths at every
    point of ``BF16_POINTS``, SDPA timed before and after each point's runs (its spread)."""
    grid = list(itertools.product((32, 64, 128), (2, 4, 8), (2, 3, 4), (1, 2, 3, 4, 8)))
    coarse, ratios = [], {}
    for ctx, bsz in ((32768, 1), (102400, 1), (102400, 8)):
        caches, (n,), q = _bf16_fns(cfg, ctx, bsz)
        ref = _sdpa_us(cfg, ctx, bsz, n)
        for bn, nw, ns, per_sm in grid:
            us = _bf16_time(cfg, caches, q, dict(BLOCK_N=bn, num_warps=nw, num_stages=ns), per_sm)
            coarse.append(dict(context=ctx, batch=bsz, BLOCK_N=bn, num_warps=nw, num_stages=ns, per_sm=per_sm,
                               us=us, sdpa_us=ref))
            print("coarse", json.dumps(coarse[-1]), flush=True)
            key = (bn, nw, ns, per_sm)
            ratios.setdefault(key, []).append(us / ref if us else float("inf"))
        del caches
        torch.cuda.empty_cache()
    score = {k: float(torch.tensor(v).log().mean().exp()) for k, v in ratios.items()}
    best = sorted(score, key=score.get)[:top]
    cands = {"default": ({}, 2)} | {f"bn{k[0]}_w{k[1]}_s{k[2]}_sm{k[3]}": (dict(BLOCK_N=k[0], num_warps=k[1],
                                                                                 num_stages=k[2]), k[3]) for k in best}
    k0 = best[0]
    for rw in (1, 2, 8):
        cands[f"best_rw{rw}"] = (dict(BLOCK_N=k0[0], num_warps=k0[1], num_stages=k0[2], REDUCE_WARPS=rw), k0[3])
    checks = _bf16_checks(cfg, cands)
    rows = []
    for ctx, bsz in BF16_POINTS:
        caches, (n,), q = _bf16_fns(cfg, ctx, bsz)
        row = dict(context=ctx, batch=bsz, bytes=cache_bytes(cfg, ctx, bsz, False), us={})
        row["us"]["sdpa"] = _sdpa_us(cfg, ctx, bsz, n)
        for name, (conf, per_sm) in cands.items():
            row["us"][name] = _bf16_time(cfg, caches, q, conf, per_sm)
        row["us"]["sdpa_again"] = _sdpa_us(cfg, ctx, bsz, n)
        rows.append(row)
        print("final", json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    return dict(coarse=coarse, score={str(k): v for k, v in score.items()}, checks=checks, rows=rows,
                candidates={k: dict(conf=c, per_sm=p) for k, (c, p) in cands.items()})


def _bf16_checks(cfg: AttentionBench, cands: dict) -> list[dict]:
    """Relative error of every candidate vs the fp32 oracle on a BF16 cache of odd lengths (fresh inputs)."""
    from oscarkv.kernels.decode import _num_sms, decode_attention
    from oscarkv.kernels.synthetic import random_cache

    kv, tables = random_cache([32768, 20011, 77], cfg.kv_heads, cfg.head_dim, page=cfg.page_size, int2=False,
                              device="cuda", seed=11)
    q = torch.randn(3, cfg.q_heads, cfg.head_dim, device="cuda").bfloat16()
    res = []
    for name, (conf, per_sm) in cands.items():
        splits = max(1, min(256, per_sm * _num_sms(q.device) // (3 * cfg.kv_heads)))
        out = decode_attention(q, kv, tables, cfg.head_dim**-0.5, config=conf, num_splits=splits)
        res.append(dict(name=name, rel_err=_rel_err(q, kv, tables, out, cfg.head_dim**-0.5),
                        finite=bool(torch.isfinite(out).all())))
        print("check", res[-1], flush=True)
    return res


def bf16_table(res: dict) -> str:
    lines = ["bf16 kernel vs SDPA, us (CUDA graph); ratio = time / sdpa"]
    for r in res["rows"]:
        ref = r["us"]["sdpa"]
        cells = [f"{k}={v:.1f}({v / ref:.3f})" for k, v in r["us"].items() if v]
        lines.append(f"{r['context']:>6}x{r['batch']:<2} " + " ".join(cells))
    return "\n".join(lines)


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


ROUND6_POINTS = ((32768, 1), (102400, 1), (131072, 1), (32768, 8), (102400, 8), (32768, 32))
ROUND6 = {  # INT2 kernel, round 6 (H100): transposed tiles (tokens x query rows) vs the round-5 kernel
    # baseline, run only where oscarkv/bench/int2_round5.py exists (not committed; make it with
    # `git show 449eb7b:oscarkv/kernels/decode_int2.py > oscarkv/bench/int2_round5.py`)
    "r5": dict(REP_PAD=16, maxnreg=None, PER_SM=8, r5=True),
    "T": {},  # the default now: maxnreg 168, 12 programs per SM
    "T_n255_s8": dict(maxnreg=None, PER_SM=8),
    "T_n152_s13": dict(maxnreg=152, PER_SM=13),
    "T_st4": dict(num_stages=4),
    "T_n128_s16": dict(maxnreg=128, PER_SM=16),
}
ROUND6_G64 = ("r5", "T", "T_n128_s16")


class _swap:
    """Runs the round-5 INT2 kernel in place of the current one while active (``conf['r5']``)."""

    def __init__(self, conf: dict):
        self.on, self.conf = conf.get("r5", False), {k: v for k, v in conf.items() if k != "r5"}

    def __enter__(self):
        import oscarkv.kernels.decode_int2 as cur

        self.cur, self.old = cur, cur._int2_decode_kernel
        if self.on:
            from oscarkv.bench.int2_round5 import _int2_decode_kernel

            cur._int2_decode_kernel = _int2_decode_kernel
        return self.conf

    def __exit__(self, *exc):
        self.cur._int2_decode_kernel = self.old


def round6(cfg: AttentionBench, copy: float) -> dict:
    """Checks (fresh inputs, fp32 oracle) and CUDA-graph times of every ``ROUND6`` variant at ``ROUND6_POINTS``."""
    from oscarkv.kernels.decode import decode_attention
    from oscarkv.kernels.synthetic import random_cache

    import importlib
    import importlib.util

    have_r5 = importlib.util.find_spec("oscarkv.bench.int2_round5") is not None
    variants = {k: v for k, v in ROUND6.items() if have_r5 or not v.get("r5")}
    scale, checks, rows = cfg.head_dim**-0.5, [], []
    for group, lens in ((128, [32768, 20011, 4095]), (64, [32768, 9000])):
        kv, tables = random_cache(lens, cfg.kv_heads, cfg.head_dim, page=cfg.page_size, group=group, sink=cfg.sink,
                                  recent=cfg.recent, device="cuda", seed=group + 7)
        q = torch.randn(len(lens), cfg.q_heads, cfg.head_dim, device="cuda").bfloat16()
        for name, conf in variants.items():
            with _swap(conf) as c:
                out = decode_attention(q, kv, tables, scale, config=c)
            checks.append(dict(group=group, variant=name, rel_err=_rel_err(q, kv, tables, out, scale),
                               finite=bool(torch.isfinite(out).all())))
            print("check", checks[-1], flush=True)
    bad = {c["variant"] for c in checks if not (c["finite"] and c["rel_err"] < 5e-3)}
    for ctx, bsz in ROUND6_POINTS:
        q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        row = dict(context=ctx, batch=bsz, us={}, pct={})
        for group in (128, 64):
            nb = cache_bytes(cfg, ctx, bsz, True, group)
            caches = _caches(cfg, ctx, bsz, True, group, max(2, -(-4 * L2_BYTES // nb)))
            for name, conf in variants.items():
                if name in bad or (group == 64 and name not in ROUND6_G64):
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

    mods = [importlib.import_module("oscarkv.bench.int2_round5")] if have_r5 else []
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


COPY = [0.0]


if __name__ == "__main__" and sys.argv[2:] == ["sweep"]:
    out = Path(sys.argv[1])
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    COPY[0] = copy_bandwidth()
    rows = sweep(cfg)
    dump_compiled(out)
    (out / "sweep.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": COPY[0],
                                               "runs": rows}, indent=1))
    for (ctx, bsz, int2, group), grp in itertools.groupby(rows, lambda r: (r["context"], r["batch"], r["int2"], r["group"])):
        best = sorted(grp, key=lambda r: r["us"])[:4]
        print(ctx, bsz, "int2" if int2 else "bf16", group, [(r["BLOCK_N"], r["num_stages"], r["per_sm"], r["maxnreg"],
                                                            round(r["us"], 1), round(r["pct_copy"])) for r in best])
elif __name__ == "__main__" and sys.argv[2:] == ["round6"]:
    out = Path(sys.argv[1])
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    copy = copy_bandwidth()
    res = round6(cfg, copy) | {"device": torch.cuda.get_device_name(), "copy_gbps": copy}
    (out / "round6.json").write_text(json.dumps(res, indent=1))
    print("\n".join(f"{r['kernel']} regs {r['regs']} spills {r['spills']} {r['key'][-90:]}" for r in res["resources"]))
    print(f"copy {copy:.0f} GB/s")
    print(round6_table(res))
elif __name__ == "__main__" and sys.argv[2:] == ["bf16"]:
    out = Path(sys.argv[1])
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    res = bf16_sweep(cfg) | {"device": torch.cuda.get_device_name(), "copy_gbps": copy_bandwidth()}
    (out / "bf16_sweep.json").write_text(json.dumps(res, indent=1))
    print(bf16_table(res))
elif __name__ == "__main__":
    out = Path(sys.argv[1])
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    copy = copy_bandwidth()
    prefill = time_prefill(cfg)
    checks = check(cfg)
    BROKEN.update(n for n in INT2_VARIANTS if not any(c["variant"] == n and c["rel_err"] < 0.05 for c in checks))
    rows = [time_point(cfg, c, b) for c, b in POINTS]
    res = resources()
    (out / "variants.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy,
                                                   "checks": checks, "prefill": prefill, "rows": rows,
                                                   "resources": res}, indent=1))
    print("\n".join(f"regs {r['regs']} spills {r['spills']} {r['key']}" for r in res))
    print(table(rows, copy))
