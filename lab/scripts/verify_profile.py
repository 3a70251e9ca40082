"""Where a speculative verify step's time goes (issue 29 diagnostic, one GPU): per KV method, one ``context``-token
request on an engine with n-gram speculation, random weights at a real shape; timed engine steps at K = 0 (plain
decode) and each K of forced drafts (``bench.speculative.verify_cost``'s setting: every step verifies 1 + K rows,
clear of demotions), then the same steps under ``torch.profiler`` (kernels, µs per step, launches per step) and under
``cProfile`` (the host functions with the most own time per step). ``--shape smollm2-135m --context 6144``: the served
default model's steps (its geometry, random weights), where the host's share decides what speculation gains.

    python -m lab.scripts.verify_profile --shape qwen3-4b --context 102400 --ks 2,8 --out DIR
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from oscarkv.bench import e2e
from oscarkv.bench.speculative import ForcedDrafter, clear_span, timed_rows
from oscarkv.config import SpeculativeConfig
from oscarkv.engine.rank_profile import kernel_profile


def rows(engine, ctx: int, ks: list[int], steps: int) -> list[dict]:
    e2e.add_prompts(engine, 1, ctx, 16 + (len(ks) + 1) * (3 * steps + 2 + engine.manager.P + max(ks)), seed=ctx)
    e2e.drive(engine, max_steps=4)
    out = []
    for k in (0, *ks):
        engine.scheduler.drafter = None
        if k:
            clear_span(engine, 2 * steps + 8 + k)
        engine.scheduler.drafter = ForcedDrafter(k, engine.vocab_size) if k else None
        r = dict(k=k, **timed_rows(engine, steps))
        r["kernels"] = kernel_profile(engine.step, reps=steps, top=16)
        r["kernel_us"] = sum(x["us"] for x in r["kernels"])
        r["host"] = e2e.host_functions(engine.step, calls=steps, top=24)
        out.append(r)
        print(json.dumps({key: v for key, v in r.items() if key != "kernels"}), flush=True)
    engine.scheduler.drafter = None
    for seq in list(engine.scheduler.running):
        engine.abort(seq.request_id)
    engine.drain()
    return out


def parser(ks: str, steps: int) -> argparse.ArgumentParser:
    """The command line this script shares with ``lab.scripts.verify_host``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--context", type=int, default=102400)
    ap.add_argument("--ks", default=ks)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--kv-gib", type=float, default=16)
    ap.add_argument("--out", type=Path, required=True)
    return ap


def spec_engine(model, method: str, kv_gib: float, k: int, **spec):
    """An engine of ``model`` with n-gram speculation of up to ``k`` drafts (``spec``: other ``SpeculativeConfig``
    fields), one sequence; OSCAR with a random artifact."""
    plain = e2e.build_engine(model, method, int(kv_gib * 2**30), 1, 8192)
    engine = e2e.bench_engine(model, replace(plain.cfg, speculative=SpeculativeConfig(
        "ngram", num_speculative_tokens=k, **spec)), e2e.random_artifact(model.config) if method == "oscar" else None)
    plain.close()
    return engine


def main() -> None:
    ap = parser("2,8", 6)
    ap.add_argument("--methods", default="oscar,bf16")
    a = ap.parse_args()
    ks = [int(x) for x in a.ks.split(",")]
    model = e2e.random_model(a.shape)
    res, lines = [], []
    for method in a.methods.split(","):
        engine = spec_engine(model, method, a.kv_gib, max(ks))
        for r in rows(engine, a.context, ks, a.steps):
            r.update(method=method, context=a.context, shape=a.shape)
            res.append(r)
            lines.append(f"\n{method} K={r['k']}: step {r['step_us'] / 1e3:.2f} ms, kernels {r['kernel_us'] / 1e3:.2f} ms, "
                         f"rows/step {r['rows_per_step']:.1f}, graph share {r['graph']:.2f}, captured {r['captured']}")
            lines += [f"  {x['us']:8.1f} us x{x['count']:5.1f}  {x['name']}" for x in r["kernels"]]
            lines += ["  host (cProfile, own time per step):"] + [f"  {x['us']:8.1f} us  {x['name']}" for x in r["host"]]
        engine.close()
        del engine
        e2e.release()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "verify_profile.json").write_text(json.dumps(res, indent=1))
    (a.out / "verify_profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
