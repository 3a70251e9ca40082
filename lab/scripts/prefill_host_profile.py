"""Where the host time of a prefill step goes with serve's 512-token chunks (TTFT as served diagnostic, one GPU).

For each KV method: one engine (``bench prefill``'s: random weights, no prefix caching), a warm prompt, a timed
TTFT, then one more under ``cProfile`` (host functions by own time and by cumulative time) with Triton launches
and torch ops counted per step; and a launch micro-benchmark: host µs per call of the write, gather and merge
kernels at the step's shapes, through ``JITFunction.run`` as the engine calls them.

    python -m lab.scripts.prefill_host_profile --shape qwen3-4b --context 32768 --chunk 512 --out DIR
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.bench.prefill import ttft


def host_table(pr: cProfile.Profile, key: str, top: int) -> str:
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(key).print_stats(top)
    return s.getvalue()


def launch_counts(engine, context: int) -> dict:
    """Triton launches by kernel name during one TTFT run (wrapping ``JITFunction.run``)."""
    from triton.runtime.jit import JITFunction

    counts: dict[str, int] = {}
    orig = JITFunction.run

    def run(self, *a, **k):
        counts[self.fn.__name__] = counts.get(self.fn.__name__, 0) + 1
        return orig(self, *a, **k)

    JITFunction.run = run
    try:
        ttft(engine, context, seed=5)
    finally:
        JITFunction.run = orig
    return counts


def one(model, method: str, args) -> dict:
    engine = e2e.build_engine(model, method, int(args.kv_gib * 2**30), 1, args.chunk)
    ttft(engine, 2 * args.chunk + 64, seed=1)
    ttft(engine, args.context, seed=2)
    wall = ttft(engine, args.context, seed=3)
    counts = launch_counts(engine, args.context)
    pr = cProfile.Profile()
    pr.enable()
    prof_wall = ttft(engine, args.context, seed=4)
    pr.disable()
    steps = -(-args.context // args.chunk)
    row = dict(method=method, ttft_s=wall, profiled_s=prof_wall, steps=steps,
               triton_launches_per_step={k: v / steps for k, v in sorted(counts.items(), key=lambda kv: -kv[1])},
               tottime=host_table(pr, "tottime", args.top), cumtime=host_table(pr, "cumulative", args.top))
    engine.close()
    del engine
    e2e.release()
    return row


def micro(reps: int = 200) -> dict:
    """Host µs per launch of small kernels (the GPU work is tiny: the loop measures the launch path)."""
    from oscarkv.kernels.write import store_kv

    out = {}
    k = torch.randn(512, 8, 128, device="cuda", dtype=torch.bfloat16)
    pool = torch.zeros(64, 8, 64, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.arange(512, dtype=torch.int32, device="cuda")
    cases = {"store_kv": lambda: store_kv(k, k, pool, pool, slots),
             "torch_add": lambda: k.add_(0),
             "torch_empty": lambda: torch.empty(512, 8, 128, device="cuda")}
    for name, fn in cases.items():
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        out[name] = host / reps * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--methods", default="bf16,oscar")
    ap.add_argument("--kv-gib", type=float, default=16)
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = e2e.random_model(args.shape)
    rows = [one(model, m, args) for m in args.methods.split(",")]
    res = dict(device=torch.cuda.get_device_name(), shape=args.shape, context=args.context, chunk=args.chunk,
               micro_us=micro(), rows=rows)
    (args.out / "prefill_host_profile.json").write_text(json.dumps(res, indent=1))
    for r in rows:
        print(f"== {r['method']}: TTFT {r['ttft_s']:.3f} s (profiled {r['profiled_s']:.3f}), {r['steps']} steps")
        print("launches/step:", json.dumps({k: round(v, 1) for k, v in r["triton_launches_per_step"].items()}))
        (args.out / f"host_{r['method']}.txt").write_text(r["tottime"] + "\n\n" + r["cumtime"])
    print("micro µs/launch:", json.dumps({k: round(v, 1) for k, v in res["micro_us"].items()}))


if __name__ == "__main__":
    main()
