"""Piecewise graphs against eager long extend steps (``oscarkv.engine.piecewise``, one GPU): per KV method, one
engine whose runner holds the pieces of ``--buckets`` (``piecewise_graph_buckets``, default 512), switched off and on between
measurements, so both variants share the engine, its cached prompt and its memory. Follow-ups of k tokens on a
cached prompt (median of the last 2 of 3, ms, as ``bench followup --prefill-chunk 512 --resume-turns``: the whole
prompt a hit, one launch of k tokens, else it raises) and a cold
prompt prefilled in 512-token chunks (ms: TTFT as served); the variants interleaved ``--reps`` times (drift shows).
The pieces are captured when the engine is built; one untimed follow-up warms the eager path.

    python -m lab.scripts.pieces_check --context 32768 --ks 128,512 --cold 32768 --methods bf16,oscar --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from lab.scripts.fused_maps_check import cold_prefill_ms
from oscarkv.bench import e2e
from oscarkv.bench.followup import _ids, cache_prefix, followup_engine, followup_step

BUCKET = 512


def measure(engine, prefix: list[int], ks: list[int], cold: int, seed: int) -> dict:
    """Follow-ups of each k (ms) and a cold prompt of ``cold`` tokens (ms) on ``engine`` as it is now."""
    row = {}
    for i, k in enumerate(ks):  # NOTE: fresh tokens for every follow-up (a repeated one would hit the prefix cache)
        got = [followup_step(engine, prefix, k, seed + 10 * i + s)["step_s"] for s in range(3)]
        row[f"k{k}_ms"] = 1e3 * statistics.median(got[1:])
    row["cold_ms"] = cold_prefill_ms(engine, cold, seed)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--methods", default="bf16,oscar")
    ap.add_argument("--ks", default="128,512")
    ap.add_argument("--cold", type=int, default=32768)
    ap.add_argument("--buckets", default="512", help="piecewise_graph_buckets (comma-separated token counts)")
    ap.add_argument("--reps", type=int, default=2, help="rounds over the variants (drift between them shows)")
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--kv-gib", type=float, default=24.0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    model, rows, ks = e2e.random_model(a.shape), [], [int(k) for k in a.ks.split(",")]
    for method in a.methods.split(","):
        buckets = tuple(int(b) for b in a.buckets.split(","))
        engine = followup_engine(model, method, int(a.kv_gib * 2**30), BUCKET, BUCKET, pieces=buckets)
        runner = engine.runner.inner  # the bench's runner wraps the engine's ModelRunner
        pieces = runner.piecewise
        prefix = _ids(engine, a.context + BUCKET // 2, a.context)
        cache_prefix(engine, prefix)
        followup_step(engine, prefix, BUCKET, 7, False, True)  # untimed
        for rep in range(a.reps):
            for variant in ("eager", "pieces"):
                runner.piecewise = pieces if variant == "pieces" else None
                seed = 1000 * rep + (500 if variant == "pieces" else 100)  # every prompt its own
                rows.append(dict(method=method, variant=variant, rep=rep, **measure(engine, prefix, ks, a.cold, seed)))
                print(json.dumps(rows[-1]), flush=True)
        engine.close()
        del engine
        e2e.release()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "pieces_check.json").write_text(json.dumps(dict(context=a.context, cold=a.cold, rows=rows), indent=1))


if __name__ == "__main__":
    main()
