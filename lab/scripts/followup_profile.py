"""Where the time of a follow-up turn goes (issue 29 diagnostic, one GPU): for each KV method and k, one warm
follow-up request over a cached prefix (as ``oscarkv bench followup`` times it), then the same step again under
``torch.profiler`` (host and device) and ``cProfile`` (host): wall, summed kernel time, the top kernels, the top
host functions. Writes ``followup_profile.json`` and a text table under the output folder.

    python -m lab.scripts.followup_profile --shape qwen3-4b --context 102400 --new-tokens 1,8,64,512 --out DIR
        [--prefill-chunk 512 --resume / --no-resume]   (as served: bench followup --prefill-chunk 512)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path


from oscarkv.bench import e2e
from oscarkv.bench.followup import _ids, cache_prefix, followup_engine, followup_step
from oscarkv.config.serving import PIECEWISE_BUCKETS


def kernels(prof) -> list[dict]:
    rows = [dict(name=e.key[:90], us=e.device_time_total, count=e.count, kind=str(e.device_type).split(".")[-1])
            for e in prof.key_averages() if getattr(e, "device_time_total", 0.0) > 0]
    rows.sort(key=lambda r: -r["us"])
    return rows


def host(pr: cProfile.Profile, top: int = 25) -> str:
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(top)
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)  # NOTE: where the host's own time goes
    return s.getvalue()


def one(engine, prefix: list[int], k: int, seed: int, served: tuple[bool, bool] = (True, True)) -> dict:
    """``served``: ``followup_step``'s ``(whole, resume)``."""
    from torch.profiler import ProfilerActivity, profile

    warm = followup_step(engine, prefix, k, seed, *served)["step_s"]
    timed = followup_step(engine, prefix, k, seed + 1, *served)["step_s"]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        followup_step(engine, prefix, k, seed + 2, *served)
    rows = kernels(prof)
    pr = cProfile.Profile()
    pr.enable()
    followup_step(engine, prefix, k, seed + 3, *served)
    pr.disable()
    gpu = [r for r in rows if r["kind"] == "CUDA"]  # NOTE: the kernels alone (ops and ranges repeat their time)
    return dict(k=k, warm_ms=warm * 1e3, wall_ms=timed * 1e3, kernel_ms=sum(r["us"] for r in gpu) / 1e3,
                launches=sum(r["count"] for r in rows), top=rows[:14], host=host(pr), every=rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--context", type=int, default=102400)
    ap.add_argument("--new-tokens", default="1,8,64,512")
    ap.add_argument("--methods", default="oscar,bf16")
    ap.add_argument("--kv-gib", type=float, default=24)
    ap.add_argument("--extend-graphs", choices=("on", "off"), default="on",
                    help="off: short extend steps run eagerly (the engine before oscarkv.engine.extend_graphs)")
    ap.add_argument("--prefill-chunk", type=int, default=0,
                    help="as served (e.g. 512): the cached prompt ends half a chunk past the context; 0: one chunk")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="the follow-up resumes where the cached prompt ended (EngineConfig.resume_turns)")
    ap.add_argument("--pieces", type=lambda x: tuple(int(v) for v in x.split(",") if v), default=PIECEWISE_BUCKETS,
                    help="piecewise graph buckets (default: as bench followup serves; '' eager)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    ks = [int(x) for x in a.new_tokens.split(",")]
    model = e2e.random_model(a.shape)
    res, lines = [], []
    for method in a.methods.split(","):
        engine = followup_engine(model, method, int(a.kv_gib * 2**30), max(ks), a.prefill_chunk, a.pieces)
        if a.extend_graphs == "off":
            engine.runner.inner.extend_graphs = engine.runner.extend_graphs = None
        prefix = _ids(engine, a.context + a.prefill_chunk // 2, a.context)
        t = time.perf_counter()
        cache_prefix(engine, prefix)
        lines.append(f"{method}: prefix cached in {time.perf_counter() - t:.1f} s")
        for k in ks:
            r = one(engine, prefix, k, 10 * k, (not a.prefill_chunk, a.resume))
            graphs = engine.runner.extend_graphs
            r.update(method=method, context=a.context, extend_graphs=a.extend_graphs,
                     extend_replays=graphs.replays if graphs else 0, fallbacks=dict(graphs.fallbacks) if graphs else {})
            res.append(r)
            lines.append(f"\n== {method} ctx {a.context} k {k}: wall {r['wall_ms']:.1f} ms (warm-up {r['warm_ms']:.1f}), "
                         f"kernels {r['kernel_ms']:.1f} ms in {r['launches']} launches")
            lines += [f"   {x['us'] / 1e3:8.2f} ms {x['count']:6d}  {x['name']}" for x in r["top"]]
            lines.append(r["host"][:12000])
            print("\n".join(lines[-18:]), flush=True)
        engine.close()
        del engine
        e2e.release()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "followup_profile.json").write_text(json.dumps(res, indent=1))
    (a.out / "followup_profile.txt").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
