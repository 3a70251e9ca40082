"""Piecewise graphs under tensor parallelism on GPUs (``oscarkv.engine.piecewise``: tested on the CPU with gloo ranks,
never captured on GPUs; the engine's default leaves them off there): per KV method, one engine at ``--tp`` with the
pieces off and one with bucket 512 (NCCL all-reduces; one engine at a time). Each caches a prompt, then: follow-ups
of 512 tokens on it (ms, median of the last 2 of 3, checked whole), a cold prompt in 512-token chunks (ms: TTFT as
served) and the greedy tokens and log-probs of 8 tokens after a 300-token follow-up (both variants' must agree up to
the padding's rounding). The pieces are captured at the first step that needs them (an untimed follow-up).

    python -m lab.scripts.pieces_tp_check --tp 2 --context 32768 --methods bf16,oscar --out DIR [--host]

At tp 2 the cold 32K prompt took 3.8 s where one GPU takes 1.3-1.7 s (2026-11-28): ``--host`` shows rank 0's share.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path

from lab.scripts.fused_maps_check import cold_prefill_ms
from oscarkv.bench import e2e
from oscarkv.bench.followup import _ids, cache_prefix, followup_step
from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.request import SamplingParams

BUCKET = 512


def _engine(model, method: str, tp: int, pieces: tuple[int, ...], kv_bytes: int):
    cfg = EngineConfig(KVConfig(method), kv_memory_bytes=kv_bytes, max_num_seqs=1, max_num_batched_tokens=BUCKET + 1,
                       prefill_chunk=BUCKET, enable_prefix_caching=True, piecewise_graph_buckets=pieces,
                       tensor_parallel_size=tp, tensor_parallel_all_reduce="nccl")
    return e2e.bench_engine(model, cfg, e2e.random_artifact(model.config) if method == "oscar" else None)


def _generate(engine, ids: list[int]) -> tuple[list[int], list[float]]:
    engine.add_request("gen", ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True))
    out = None
    while engine.has_unfinished():
        out = next((o for o in engine.step() if o.finished), out)
    return list(out.token_ids), [float(p) for p in out.logprobs]


def measure(engine, prefix: list[int], cold: int, host: bool) -> dict:
    followup_step(engine, prefix, BUCKET, 7)  # untimed: captures the pieces on every rank
    got = [followup_step(engine, prefix, BUCKET, 100 + s)["step_s"] for s in range(3)]
    row = dict(k512_ms=1e3 * statistics.median(got[1:]), cold_ms=cold_prefill_ms(engine, cold, 300))
    row["tokens"], row["logprobs"] = _generate(engine, prefix + _ids(engine, 300, 400))
    if host:  # rank 0's host during one more cold prompt (waits on the other rank show as NCCL / pipe waits)
        row["host"] = e2e.host_functions(lambda: cold_prefill_ms(engine, cold, 301))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--cold", type=int, default=32768)
    ap.add_argument("--methods", default="bf16,oscar")
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--kv-gib", type=float, default=16.0)
    ap.add_argument("--host", action="store_true", help="also cProfile rank 0 over one more cold prompt")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    model, rows = e2e.random_model(a.shape, a.tp), []
    for method in a.methods.split(","):
        for variant, pieces in (("eager", ()), ("pieces", (BUCKET,))):
            engine = _engine(copy.deepcopy(model), method, a.tp, pieces, int(a.kv_gib * 2**30))  # NOTE: a fresh
            # model each: an OSCAR engine folds its value maps into the model it is given
            try:
                prefix = _ids(engine, a.context + BUCKET // 2, a.context)
                cache_prefix(engine, prefix)
                rows.append(dict(method=method, variant=variant, tp=a.tp, **measure(engine, prefix, a.cold, a.host)))
            finally:
                engine.close()
                del engine
                e2e.release()
            print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("logprobs", "host")}), flush=True)
            for f in rows[-1].get("host", [])[:8]:
                print(f"   host {f}", flush=True)
        eager, pieces = rows[-2], rows[-1]
        diff = max(abs(p - q) for p, q in zip(eager["logprobs"], pieces["logprobs"]))
        print(f"== {method} tp {a.tp}: tokens equal {eager['tokens'] == pieces['tokens']}, log-prob diff {diff:.3g}; "
              f"k = 512 {eager['k512_ms']:.1f} -> {pieces['k512_ms']:.1f} ms, cold {a.cold} "
              f"{eager['cold_ms']:.0f} -> {pieces['cold_ms']:.0f} ms", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "pieces_tp_check.json").write_text(json.dumps(dict(context=a.context, cold=a.cold, rows=rows), indent=1))


if __name__ == "__main__":
    main()
