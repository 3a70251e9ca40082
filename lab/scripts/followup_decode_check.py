"""Decode after many follow-ups on one cached document (issue 29 diagnostic, one GPU): `bench followup --repeats 6`
timed OSCAR decode steps of 109 ms at 32K (4 ms with 2 repeats). For each number of follow-ups before it (k = 1 and
512, random Qwen3-4B weights, OSCAR, 512-token chunks as served), a decode request of the prefix plus one token:
per engine step its wall ms, the tokens each model launch computed, preemptions and the BF16 pool's use.

    python -m lab.scripts.followup_decode_check --context 32768 --repeats 0,6 --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from oscarkv.bench import e2e
from oscarkv.bench.followup import _ids, cache_prefix, followup_engine, followup_step
from oscarkv.engine.request import SamplingParams


def decode_trace(engine, prefix: list[int], steps: int) -> list[dict]:
    """Each engine step of one decode request (the prefix plus one token): wall ms, launches, pool state."""
    engine.add_request(f"d{time.time()}", prefix + _ids(engine, 1, 99),
                       SamplingParams(max_tokens=steps, ignore_eos=True))
    out = []
    while engine.has_unfinished():
        n, pre = len(engine.runner.launches), engine.scheduler.num_preemptions
        e2e.sync()
        t = time.perf_counter()
        engine.step()
        e2e.sync()
        out.append(dict(ms=1e3 * (time.perf_counter() - t), tokens=[x.tokens for x in engine.runner.launches[n:]],
                        preempted=engine.scheduler.num_preemptions - pre, bf16_used=engine.manager.bf16.num_used,
                        bf16_pages=engine.manager.bf16.num_pages, hits=engine.manager.hit_tokens))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--repeats", default="0,6")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    model, res = e2e.random_model("qwen3-4b"), []
    for reps in map(int, a.repeats.split(",")):
        engine = followup_engine(model, "oscar", 24 << 30, 512, 512)
        prefix = _ids(engine, a.context + 256, a.context)
        cache_prefix(engine, prefix)
        for k in (1, 512):
            for seed in range(reps):
                followup_step(engine, prefix, k, seed, False, True)
        trace = decode_trace(engine, prefix, a.steps)
        slow = [s for s in trace if s["ms"] > 20]
        print(f"repeats {reps}: {len(trace)} steps, median {sorted(s['ms'] for s in trace)[len(trace) // 2]:.2f} ms, "
              f"{len(slow)} over 20 ms; first slow: {slow[:3]}", flush=True)
        res.append(dict(repeats=reps, context=a.context, trace=trace))
        engine.close()
        del engine
        e2e.release()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "followup_decode_check.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
