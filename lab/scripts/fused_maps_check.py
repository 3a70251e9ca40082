"""Long extend steps through the fused input maps (issue 29 diagnostic, one GPU): an OSCAR follow-up of 512 tokens
on a cached 32K prompt is host-bound (~27 ms of kernels, 51 ms of wall; BF16 36) and launches ~27 kernels a layer
more than BF16, several of them the unfused maps (QK-norm + RoPE, the query's bf16 GEMM and its two reshapes, the
key's fp32 map). ``TritonAttention.fused_extend_tokens`` bounds the chunks that take the one-launch
``qk_norm_rope_map`` instead. Per KV method and bound: follow-ups of k tokens on the cached prompt (median of the
last 2 of 3, ms, as ``bench followup --prefill-chunk 512``) and a cold prompt prefilled in 512-token chunks (ms, TTFT
as served); the configurations interleaved ``--reps`` times (drift between them shows).

    python -m lab.scripts.fused_maps_check --context 32768 --bounds 16,512 --methods bf16,oscar --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from oscarkv.bench import e2e
from oscarkv.bench.followup import _ids, cache_prefix, followup_engine, followup_step
from oscarkv.engine.request import SamplingParams


def cold_prefill_ms(engine, n: int, seed: int) -> float:
    """A fresh ``n``-token prompt (no prefix hit), every 512-token chunk through the model: wall ms."""
    e2e.sync()
    t = time.perf_counter()
    engine.add_request(f"cold{seed}", _ids(engine, n, 1000 + seed), SamplingParams(max_tokens=1, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    e2e.sync()
    return 1e3 * (time.perf_counter() - t)


def configs(methods: list[str], bounds: list[int]) -> list[tuple[str, int | None]]:
    """(method, bound) pairs: bf16 has no maps (one row), oscar one row per bound."""
    return [(m, b) for m in methods for b in ((None,) if m == "bf16" else bounds)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--bounds", default="16,512")
    ap.add_argument("--methods", default="oscar")
    ap.add_argument("--ks", default="64,512")
    ap.add_argument("--cold", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=2, help="rounds over the configurations (drift between them shows)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    model, rows = e2e.random_model("qwen3-4b"), []
    engines = {m: followup_engine(model, m, 24 << 30, 512, 512) for m in a.methods.split(",")}
    prefix = _ids(next(iter(engines.values())), a.context + 256, a.context)
    for engine in engines.values():
        cache_prefix(engine, prefix)
    for rep in range(a.reps):
        for method, bound in configs(list(engines), [int(b) for b in a.bounds.split(",")]):
            engine = engines[method]
            if bound is not None:
                engine.runner.backend.fused_extend_tokens = bound
            row = dict(method=method, bound=bound, rep=rep)
            for k in map(int, a.ks.split(",")):
                got = [followup_step(engine, prefix, k, 100 * rep + s, False, True)["step_s"] for s in range(3)]
                row[f"k{k}_ms"] = 1e3 * statistics.median(got[1:])
            row["cold_ms"] = cold_prefill_ms(engine, a.cold, 10 * rep + (bound or 0))
            rows.append(row)
            print(json.dumps(row), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "fused_maps_check.json").write_text(json.dumps(dict(context=a.context, cold=a.cold, rows=rows), indent=1))


if __name__ == "__main__":
    main()
