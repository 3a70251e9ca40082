"""Why a cold prompt takes longer on two GPUs than on one (2026-11-28: a 32K prompt in 512-token chunks, pieces
on, 3.8-4.6 s at tp 2 against 1.3-1.7 s on one H200). Per tensor-parallel size, one engine (BF16 KV, the pieces at
``PIECEWISE_BUCKETS``, NCCL all-reduces): a warm-up prompt, then one cold prompt with every engine step timed
(synchronized: ms per chunk against the chunk's prefix, so a constant cost and one that grows with the prefix read
apart), then rank 0's kernels over one more cold prompt (``rank_profile.kernel_profile``: the GPU's busy time
against the wall; NCCL kernels there include the waits for the slower rank) and every rank's host functions
(the workers' as JSON lines of their own). A second
cold prompt of the same length reads apart what the first long prompt of a process pays once (new shapes).

    python -m lab.scripts.tp_prefill_profile --tps 1,2 --cold 32768 --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

from lab.scripts.fused_maps_check import cold_prefill_ms
from oscarkv.bench import e2e
from oscarkv.bench.followup import _ids
from oscarkv.config import PIECEWISE_BUCKETS, EngineConfig, KVConfig
from oscarkv.engine.rank_profile import kernel_profile
from oscarkv.engine.request import SamplingParams

CHUNK = 512


def step_times(engine, n: int, seed: int) -> list[float]:
    """A fresh ``n``-token prompt: ms of each engine step (synchronized)."""
    engine.add_request(f"steps{seed}", _ids(engine, n, 1000 + seed), SamplingParams(max_tokens=1, ignore_eos=True))
    out = []
    while engine.has_unfinished():
        e2e.sync()
        t = time.perf_counter()
        engine.step()
        e2e.sync()
        out.append(1e3 * (time.perf_counter() - t))
    return out


def profiled(engine, a) -> dict:
    """On a warm engine: one cold prompt step by step, then rank 0's kernels and host over shorter ones."""
    passes = [step_times(engine, a.cold, 2 + i) for i in range(2)]  # the second: every prefix length seen before
    steps, seeds = passes[0], iter(range(10, 20))
    q = len(steps) // 4
    return dict(cold_ms=sum(steps), again_ms=sum(passes[1]), steps=len(steps), step_ms_first_quarter=sum(steps[:q]) / q,
                step_ms_last_quarter=sum(steps[-q:]) / q, again_ms_last_quarter=sum(passes[1][-q:]) / q,
                profiled_wall_ms=cold_prefill_ms(engine, a.profile_tokens, 4),
                kernels=kernel_profile(lambda: cold_prefill_ms(engine, a.profile_tokens, next(seeds)), reps=1, top=16),
                host=_ranks_host(engine, a.profile_tokens, 30), runtime=_ranks_host(engine, a.profile_tokens, 31, True),
                step_ms=passes)


def _ranks_host(engine, tokens: int, seed: int, runtime: bool = False) -> list[dict]:
    """Rank 0's host functions (``runtime``: host operators, where a blocking call shows) over one cold prompt;
    with tensor parallelism every worker's too (each prints a JSON line ``{"rank": r, "host" or "runtime": [...]}``
    when its profile ends)."""
    tp = engine.runner.tp.size > 1
    if tp:
        engine.runner.host_profile(True, runtime)
    prompt = partial(cold_prefill_ms, engine, tokens, seed)
    rows = e2e.runtime_functions(prompt) if runtime else e2e.host_functions(prompt)
    if tp:
        engine.runner.host_profile(False)
    return rows


def measure(tp: int, a) -> dict:
    model = e2e.random_model(a.shape, tp)
    cfg = EngineConfig(KVConfig(a.method), kv_memory_bytes=int(a.kv_gib * 2**30), max_num_seqs=1,
                       max_num_batched_tokens=CHUNK + 1, prefill_chunk=CHUNK, piecewise_graph_buckets=PIECEWISE_BUCKETS,
                       tensor_parallel_size=tp, tensor_parallel_all_reduce="nccl")
    engine = e2e.bench_engine(model, cfg, e2e.random_artifact(model.config) if a.method == "oscar" else None)
    try:
        cold_prefill_ms(engine, 4096, 1)  # warm-up: kernels compiled, pieces captured on every rank
        row = dict(tp=tp, **profiled(engine, a))
    finally:
        engine.close()
        e2e.release()
    row["kernel_busy_ms"] = sum(k["us"] for k in row["kernels"]) / 1e3
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tps", default="1,2")
    ap.add_argument("--cold", type=int, default=32768)
    ap.add_argument("--profile-tokens", type=int, default=8192)
    ap.add_argument("--method", default="bf16", help="bf16 or oscar")
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--kv-gib", type=float, default=16.0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    rows = []
    for tp in map(int, a.tps.split(",")):
        rows.append(measure(tp, a))
        r = rows[-1]
        print(f"== tp {tp}: cold {a.cold} {r['cold_ms']:.0f} ms in {r['steps']} steps (first quarter "
              f"{r['step_ms_first_quarter']:.1f} ms a step, last {r['step_ms_last_quarter']:.1f}); again {r['again_ms']:.0f} "
              f"ms (last quarter {r['again_ms_last_quarter']:.1f}); {a.profile_tokens} "
              f"tokens {r['profiled_wall_ms']:.0f} ms wall, rank 0's kernels {r['kernel_busy_ms']:.0f} ms", flush=True)
        for k in r["kernels"]:
            print(f"   kernel {k['us'] / 1e3:8.2f} ms {k['count']:7.0f}x {k['name']}", flush=True)
        for h in r["host"][:10]:
            print(f"   host {h['us'] / 1e3:8.2f} ms {h['name']}", flush=True)
        for h in r["runtime"]:
            print(f"   runtime {h['us'] / 1e3:8.2f} ms {h['count']:7.0f}x {h['name']}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "tp_prefill_profile.json").write_text(json.dumps(dict(cold=a.cold, rows=rows), indent=1))


if __name__ == "__main__":
    main()
