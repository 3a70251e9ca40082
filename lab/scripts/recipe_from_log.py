"""Re-read an interrupted recipe search: the scores and choices of ``OUT/dev_samples.jsonl``.

``oscarkv calibrate --max-bpe/--tolerance`` logs each development sample's answer NLL and
accuracy per candidate as it is measured; this prints, from however many samples were logged,
every candidate's mean scores and BPE, the choice under each budget given, and the Spearman rank
correlation of the cheaper proxies with the objective (teacher-forced accuracy; the NLL of the
first seed's samples alone).

    python lab/scripts/recipe_from_log.py runs/recipe_dev/dev_samples.jsonl --budgets 4096:3.0,8192:3.0

With ``--rotations DIR --out DIR`` it also writes a copy of the artifact whose manifest holds the
choice under the first budget (``recipe``, what ``calibrate --max-bpe`` writes), for ``serve`` and
``eval --rotations NAME=DIR``.
"""

from __future__ import annotations

import argparse
import json
import re

from oscarkv.config import RUNGS, KVConfig
from pathlib import Path

from oscarkv.eval.objective import DevScore, choose, recipe_record, spearman
from oscarkv.quant.artifact import Artifact
from oscarkv.quant.codec import build_codec

DIMS = (30, 3, 64)
"""The default model's layers, KV heads and head_dim (BPE depends only on the geometry)."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", help="dev_samples.jsonl of a search, or several comma-separated (their samples pooled)")
    p.add_argument("--budgets", default="4096:3.0", help="CONTEXT:MAX_BPE,... (comma-separated)")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--rotations", type=Path, help="the artifact the log's search ran on (to write the choice into)")
    p.add_argument("--out", type=Path, help="where to write the artifact with the first budget's choice")
    p.add_argument("--rule", choices=["nll", "tolerance"], default="nll",
                   help="the choice written: least NLL (--max-bpe), or the cheapest within --tolerance of BF16's accuracy")
    args = p.parse_args()
    rows = [json.loads(line) for path in args.log.split(",") for line in open(path) if line.strip()]
    labels = list(rows[0]["nll"])
    scores = {k: DevScore(sum(r["nll"][k] for r in rows) / len(rows), sum(r["accuracy"][k] for r in rows) / len(rows),
                          tuple(r["nll"][k] for r in rows)) for k in labels}
    codecs = {}
    for k in labels:
        m = re.fullmatch(r"oscar(?:-(\w+))? s=(\d+) r=(\d+)", k)  # oscar-RUNG: a rung of calibrate --rungs
        if m and (m[2] == "0" or m[3] != "0"):  # the engine serves no sink without a recent page
            kb, vb = RUNGS[m[1] or "int2"]
            kv = KVConfig("naive", sink=int(m[2]), recent=int(m[3]), key_bits=kb, value_bits=vb)  # oscar's tiers, bits
            codecs[k] = build_codec(kv if kv.sink or kv.recent else kv.without_windows(), *DIMS)
    contexts = sorted({int(b.split(":")[0]) for b in args.budgets.split(",")})
    seeds = [r["seed"] for r in rows]
    print(f"{len(rows)} development samples (seeds {sorted(set(seeds))})")
    print(f"{'candidate':<20} " + " ".join(f"BPE@{c:<5}" for c in contexts) + "  answer NLL  accuracy")
    for k in labels:
        bpes = " ".join(f"{codecs[k].bpe(c):8.3f}" if k in codecs else f"{'-':>8}" for c in contexts)
        print(f"{k:<20} {bpes}  {scores[k].answer_nll:10.4f}  {100 * scores[k].accuracy:7.1f}%")
    ref = scores.get("bf16")
    for b in args.budgets.split(","):
        ctx, cap = int(b.split(":")[0]), float(b.split(":")[1])
        ok = {k: c for k, c in codecs.items() if c.bpe(ctx) <= cap}
        if ok:
            best = choose({k: scores[k] for k in ok}, ok, ctx)
            tol = choose({k: scores[k] for k in ok}, ok, ctx, ref, args.tolerance)
            print(f"max {cap} BPE at {ctx}: least NLL -> {best} ({ok[best].bpe(ctx):.3f} BPE); "
                  f"cheapest within {args.tolerance:.0%} of the reference's accuracy -> {tol} ({ok[tol].bpe(ctx):.3f} BPE)")
    if args.rotations and args.out:
        write_choice(args, rows, scores, codecs)
    first = [i for i, s in enumerate(seeds) if s == seeds[0]]
    nll = [scores[k].answer_nll for k in labels]
    half = [sum(scores[k].per_sample[i] for i in first) / len(first) for k in labels]
    print(f"Spearman with the objective: teacher-forced accuracy {spearman([-scores[k].accuracy for k in labels], nll):.3f}; "
          f"NLL on seed {seeds[0]} alone ({len(first)} samples) {spearman(half, nll):.3f}")


def write_choice(args, rows: list[dict], scores: dict, codecs: dict) -> None:
    """The artifact at ``args.rotations`` with the first budget's choice (``args.rule``) as its recipe, in ``args.out``."""
    ctx, cap = (float(x) for x in args.budgets.split(",")[0].split(":"))
    ok = {k: c for k, c in codecs.items() if c.bpe(int(ctx)) <= cap}
    tol = args.tolerance if args.rule == "tolerance" else None
    label = choose({k: scores[k] for k in ok}, ok, int(ctx), scores.get("bf16"), tol)
    dev = {"max_bpe": cap, "tolerance": tol, "dev_samples": len(rows), "dev_seeds": sorted({r["seed"] for r in rows}),
           "haystack": "calibration", "log": args.log}
    art = Artifact.load(args.rotations)
    art.manifest["recipe"] = recipe_record(label, {k: scores[k] for k in ok}, ok, int(ctx), dev, scores.get("bf16"))
    art.save(args.out)
    print(f"wrote {args.out}: recipe {label} at {int(ctx)} tokens")


if __name__ == "__main__":
    main()
