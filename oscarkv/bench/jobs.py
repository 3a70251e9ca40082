"""``oscarkv bench jobs``: whole jobs — real prefill through the model, then decode — BF16 vs OSCAR in one KV budget.

``bench capacity`` fills prompts without running the model, so its job throughput is decode-only.
Here every prompt chunk runs the model (``LLMEngine.step``, the path users run). Per method: an engine
with ``max_num_seqs`` = the sequences of ``context + max(new_tokens)`` that fit the budget
(:func:`oscarkv.bench.capacity.fits`: BF16 3, OSCAR 26 at 56 GiB and 100K + 8K on the Qwen3-4B shape),
prefill chunk per :meth:`JobsBench.chunk_of`, step budget ``chunk × seqs + seqs``, so requests run in
waves: a wave prefills together, then decodes together.

1. One ``context``-token request alone (``max_tokens = 1``, after an untimed warm-up): its TTFT is the
   prefill rate of the bound below.
2. The job: ``requests`` requests of ``new_tokens[0]`` greedy tokens run to completion, every
   ``step()`` call timed (wall, synchronized at the end); a call that launched any prefill chunk counts
   as prefill, the others as decode (by batch size).
3. Other ``new_tokens``: prefill time as measured, decode time = per wave ``(n − 1)`` steps at the
   median measured step time of the wave's batch. NOTE: that step time is taken at ~100K tokens of
   context; the longer contexts of long answers make real steps a little slower (by the KV bytes read).

Bound: ``requests × TTFT`` + the same decode time — what the measured prefill and decode rates allow
if nothing else were lost (waves, scheduling, the prefill of many sequences in one step).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.bench.capacity import fits
from oscarkv.bench.configs import CapacityBench, JobsBench
from oscarkv.bench.prefill import ttft


def _add(engine, n: int, length: int, new_tokens: int, seed: int) -> None:
    from oscarkv.engine.request import SamplingParams

    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    for i in range(n):
        ids = torch.randint(0, engine.vocab_size, (length,), generator=g).tolist()
        engine.add_request(f"j{seed}-{i}", ids, params)


def run_job(engine, cfg: JobsBench) -> dict:
    """Step 2 of the module docstring: prefill seconds, decode step times by batch size, total wall time. The
    step kinds are the launches' shapes, as the engine's :class:`~oscarkv.bench.e2e.BenchRunner` records them
    (any runner, a tensor-parallel one too)."""
    launches = engine.runner.launches
    prefill_s = 0.0
    decode: dict[int, list[float]] = {}
    _add(engine, cfg.requests, cfg.context, cfg.new_tokens[0], seed=0)
    e2e.sync()
    t0 = time.perf_counter()
    while engine.has_unfinished():
        n, t = len(launches), time.perf_counter()
        engine.step()
        dt, new = time.perf_counter() - t, launches[n:]
        if any(not launch.decode for launch in new):
            prefill_s += dt
        elif new:
            decode.setdefault(new[-1].batch, []).append(dt)
    e2e.sync()
    total = time.perf_counter() - t0
    return dict(total_s=total, prefill_s=prefill_s, decode_s=total - prefill_s,
                decode_step_ms={b: 1e3 * statistics.median(v) for b, v in sorted(decode.items())},
                decode_steps={b: len(v) for b, v in sorted(decode.items())})


def method_row(cfg: JobsBench, model, method: str) -> dict:
    """Steps 1–3 of the module docstring for one KV method."""
    chunk = cfg.chunk_of(method)
    cap = CapacityBench(shape=cfg.shape, kv_gib=cfg.kv_gib, context=cfg.context, requests=cfg.requests,
                        new_tokens=max(cfg.new_tokens), methods=("bf16", method) if method != "bf16" else ("bf16",),
                        chunks=cfg.chunks, tensor_parallel_size=cfg.tensor_parallel_size)
    conc = max(1, min(cfg.requests, fits(cap, method, chunk)["seqs_fit"]))
    engine = e2e.build_engine(model, method, int(cfg.kv_gib * 2**30), conc, chunk, cfg.tensor_parallel_size,
                              engines=len(cfg.methods))
    for n in dict.fromkeys((conc, cfg.requests % conc or conc)):  # untimed: JIT, graph captures of the buckets
        _add(engine, n, 2 * chunk + 64, 3, seed=100 + n)
        while engine.has_unfinished():
            engine.step()
    one = ttft(engine, cfg.context, seed=5)
    row = dict(method=method, chunk=chunk, concurrency=conc, ttft_s=one, run=run_job(engine, cfg))
    engine.close()
    del engine
    e2e.release()
    row["jobs"] = project(row["run"], conc, one, cfg.requests, cfg.new_tokens)
    return row


def project(run: dict, conc: int, ttft_s: float, requests: int, new_tokens: tuple[int, ...]) -> list[dict]:
    """Step 3 and the bound of the module docstring: per answer length, the job's prefill, decode and total
    seconds (``new_tokens[0]``: as ``run`` measured them) and jobs/s, and the bound's jobs/s."""
    waves = [conc] * (requests // conc) + ([requests % conc] if requests % conc else [])
    step = run["decode_step_ms"]
    jobs = []
    for n in new_tokens:
        dec = sum((n - 1) * step.get(b, step[max(step)]) / 1e3 for b in waves)
        measured = n == new_tokens[0]
        total = run["total_s"] if measured else run["prefill_s"] + dec
        jobs.append(dict(new_tokens=n, measured=measured, prefill_s=run["prefill_s"],
                         decode_s=run["decode_s"] if measured else dec, total_s=total,
                         jobs_per_s=requests / total, bound_jobs_per_s=requests / (requests * ttft_s + dec)))
    return jobs


def run(cfg: JobsBench, out: Path | None) -> str:
    if not torch.cuda.is_available():
        raise ValueError("bench jobs needs a CUDA device")
    model = e2e.random_model(cfg.shape, cfg.tensor_parallel_size)
    rows = []
    for m in cfg.methods:
        rows.append(method_row(cfg, model, m))
        print(json.dumps(rows[-1]), flush=True)
        e2e.write_json(out, cfg, rows)  # NOTE: after every method: a long run cut short keeps what it measured
    return format_table(rows)


def format_table(rows: list[dict]) -> str:
    """One line per method and answer length; × BF16 against the bf16 row of the same length."""
    base = {j["new_tokens"]: j for r in rows if r["method"] == "bf16" for j in r["jobs"]}
    lines = ["| kv | concurrency | new tokens | run | prefill s | decode s | total s | jobs/s | × BF16 | "
             "bound jobs/s | measured / bound |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for j in r["jobs"]:
            b = base.get(j["new_tokens"])
            x = f"{j['jobs_per_s'] / b['jobs_per_s']:.2f}x" if b else "-"
            lines.append(f"| {r['method']} | {r['concurrency']} | {j['new_tokens']} | "
                         f"{'end to end' if j['measured'] else 'computed'} | {j['prefill_s']:.1f} | {j['decode_s']:.1f} | "
                         f"{j['total_s']:.1f} | {j['jobs_per_s']:.4f} | {x} | {j['bound_jobs_per_s']:.4f} | "
                         f"{j['jobs_per_s'] / j['bound_jobs_per_s']:.2f} |")
    return "\n".join(lines)
