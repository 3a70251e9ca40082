"""Launch configurations of the split-K chunk kernel at 100K cached tokens (issue 29 diagnostic, one GPU).

``chunk_splitk._config`` was set from register counts, never timed. This times ``chunk_attention`` over a 100K-token
cache (BF16-only and INT2; Qwen3-4B/8B attention: 32 query heads, 8 KV heads, d = 128, page 64, G = 128) for chunks
of k = 1..256 tokens under every (query rows per program, warps, pipeline stages, key tile) and several split counts,
beside the staged path (``prefill_attention``) and the default configuration; each best configuration's relative
error against the staged path is checked. Milliseconds per layer on the GPU (``chunk_attention._ms``: calls replayed from a
CUDA graph); the 2026-11-27 run timed eager calls, whose ~0.2 ms of host time per call hid the kernels at small k.

    python -m lab.scripts.chunk_sweep --out DIR [--chunks 1,8,16,32,64,128,256] [--warps 1,2,4 --mults 1,2,4,8,16
                                                 --maxnreg 168 --context 32768]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from lab.benchmarks.chunk_attention import _ms as ms

HQ, H, D, CTX = 32, 8, 128, 102400
MAX_ERR = 0.03
"""Relative error against the staged path above which a configuration is reported wrong (correct ones read 2-9e-3)."""


def sweep(kv, tables, k: int, warps_: tuple[int, ...] = (2, 4, 8), mults: tuple[int, ...] = (1, 2, 4, 8),
          regs: tuple[int | None, ...] = (None,), rows_: tuple[int, ...] = (8, 16, 32, 64),
          tiles: tuple[tuple[int, ...], tuple[int, ...]] = ((2, 3), (32, 64))) -> dict:
    from oscarkv.kernels import chunk_splitk
    from oscarkv.kernels.decode import _num_sms
    from oscarkv.kernels.prefill import prefill_attention

    gen = torch.Generator(device="cuda").manual_seed(k)
    q, kn, vn = (torch.randn(k, n, D, generator=gen, device="cuda").bfloat16() for n in (HQ, H, H))
    cu, scale, lens = torch.tensor([0, k], dtype=torch.int32, device="cuda"), D**-0.5, tables.lens()
    staged = lambda: prefill_attention(q, kn, vn, kv, tables, 0, (lens[0][0], lens[1][0]), scale)  # noqa: E731
    ref = staged().float()
    row = dict(k=k, staged=ms(staged, 5), default=ms(lambda: chunk_splitk.chunk_attention(q, kn, vn, kv, tables, cu,
                                                                                             scale, k)))
    sms, rep_pad, best = _num_sms(q.device), 4, []
    for rows, warps, stages, bn, reg in itertools.product(rows_, warps_, *tiles, regs):
        if rows < rep_pad or rows > max(8, 4 * rep_pad * k) or (rows == 8 and k > 2):
            continue
        grid_t = -(-k // (rows // rep_pad))
        base = max(1, sms // (H * grid_t))
        for mult in mults:
            splits = min(1024, base * mult)
            cfg = dict(ROWS=rows, num_warps=warps, num_stages=stages, BLOCK_N=bn, CONV=2, CHUNK=32, PER_SM=1,
                       **({"maxnreg": reg} if reg else {}))
            fn = lambda: chunk_splitk.chunk_attention(q, kn, vn, kv, tables, cu, scale, k,  # noqa: E731
                                                     num_splits=splits, config=cfg)
            try:
                err = float((fn().float() - ref).norm() / ref.norm())
                t = ms(fn, 5)
            except Exception as e:  # NOTE: a configuration that does not compile (registers, shared memory)
                best.append(dict(cfg=cfg, splits=splits, error=f"{type(e).__name__}: {e}"[:120]))
                continue
            best.append(dict(cfg=cfg, splits=splits, ms=t, err=err))
    # NOTE: a configuration whose output is off is not a candidate (few splits: long MMA chains, split_error)
    ok = sorted((b for b in best if "ms" in b and b["err"] < MAX_ERR), key=lambda b: b["ms"])
    top = ok[0]
    out = chunk_splitk.chunk_attention(q, kn, vn, kv, tables, cu, scale, k, num_splits=top["splits"],
                                       config=top["cfg"]).float()
    row.update(best=top, top5=ok[:5], errors=sum("error" in b for b in best), wrong=[b for b in best if b.get("err", 0) >= MAX_ERR],
               best_err=float((out - ref).norm() / ref.norm()))
    return row


def main() -> None:
    from oscarkv.kernels.synthetic import random_cache

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--chunks", default="1,8,16,32,64,128,256")
    ap.add_argument("--kinds", default="int2,bf16")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--mults", default="1,2,4,8", help="split counts: multiples of SMs / (KV heads x row blocks)")
    ap.add_argument("--maxnreg", default="", help="register caps to try beside none (e.g. 168)")
    ap.add_argument("--rows", default="8,16,32,64", help="query rows per program (chunk tokens x the padded GQA group)")
    ap.add_argument("--context", type=int, default=CTX, help="cached tokens")
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--block-n", default="32,64", help="key tiles")
    args = ap.parse_args()
    grid = (tuple(map(int, args.warps.split(","))), tuple(map(int, args.mults.split(","))),
            (None, *(int(x) for x in args.maxnreg.split(",") if x)), tuple(map(int, args.rows.split(","))),
            (tuple(map(int, args.stages.split(","))), tuple(map(int, args.block_n.split(",")))))
    args.out.mkdir(parents=True, exist_ok=True)
    res = dict(device=torch.cuda.get_device_name(), ctx=args.context, rows=[])
    print(f"{'kv':>5} {'k':>4} {'staged':>8} {'default':>8} {'best':>8}  best config (ms/layer)")
    for kind in args.kinds.split(","):
        kv, tables = random_cache([args.context], H, D, page=64, group=128, sink=64, recent=256, int2=kind == "int2",
                                  device="cuda", shuffle=False)
        for k in map(int, args.chunks.split(",")):
            r = dict(kv=kind, **sweep(kv, tables, k, *grid))
            res["rows"].append(r)
            b = r["best"]
            print(f"{kind:>5} {k:>4} {r['staged']:8.3f} {r['default']:8.3f} {b['ms']:8.3f}  rows {b['cfg']['ROWS']} "
                  f"warps {b['cfg']['num_warps']} stages {b['cfg']['num_stages']} BLOCK_N {b['cfg']['BLOCK_N']} "
                  f"splits {b['splits']}  err {r['best_err']:.2e}", flush=True)
            (args.out / "chunk_sweep.json").write_text(json.dumps(res, indent=1))
        del kv, tables
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
