"""BF16 decode-kernel config sweep against its peer, PyTorch's SDPA (``... OUT_DIR bf16``).

Role: :func:`bf16_sweep` times the BF16 kernel (:func:`oscarkv.kernels.decode.decode_attention`
on an all-BF16 cache) as CUDA-graph replays over rotated caches
(:func:`~lab.benchmarks.variants_common.graph_us`): first a coarse grid (BLOCK_N, num_warps,
num_stages, programs per SM) at three points, scored by the geometric mean of time over SDPA;
then the best few configs and reduce-kernel widths (``REDUCE_WARPS``) at every point of
:data:`BF16_POINTS`, SDPA timed before and after each point's runs (its spread). Every
candidate is checked against the fp32 oracle first (:func:`_bf16_checks`). The result dict is
written as ``bf16_sweep.json``; :func:`bf16_table` prints it. :data:`BF16_POINTS` and
:func:`sdpa_us` are also used by ``lab.benchmarks.bf16_peer``.
"""

from __future__ import annotations

import itertools
import json

import torch

from oscarkv.bench.attention import AttentionBench, cache_bytes
from lab.benchmarks.variants_common import L2_BYTES, graph_us, random_caches, rel_err

BF16_POINTS = ((32768, 1), (102400, 1), (131072, 1), (32768, 8), (102400, 8), (32768, 32))


def _bf16_fns(cfg: AttentionBench, ctx: int, bsz: int) -> tuple[list, list, torch.Tensor]:
    """Rotated dense K/V (for SDPA) and paged BF16 caches of one point, plus its query."""
    nb = cache_bytes(cfg, ctx, bsz, False)
    n = max(2, -(-4 * L2_BYTES // nb))
    q = torch.randn(bsz, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    return random_caches(cfg, ctx, bsz, False, None, n), [n], q


def sdpa_us(cfg: AttentionBench, ctx: int, bsz: int, n: int) -> float:
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
        ref = sdpa_us(cfg, ctx, bsz, n)
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
        row["us"]["sdpa"] = sdpa_us(cfg, ctx, bsz, n)
        for name, (conf, per_sm) in cands.items():
            row["us"][name] = _bf16_time(cfg, caches, q, conf, per_sm)
        row["us"]["sdpa_again"] = sdpa_us(cfg, ctx, bsz, n)
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
        res.append(dict(name=name, rel_err=rel_err(q, kv, tables, out, cfg.head_dim**-0.5),
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
