"""``oscarkv bench decode``: end-to-end batch-1 decode tokens/s at long context, BF16 vs INT2 KV.

For each model shape (random bf16 weights, :mod:`oscarkv.bench.e2e`), KV method (``bf16``;
``naive`` = INT2 pages, G = 128, no rotation; ``oscar`` = the same pages with a random OSCAR
artifact, :func:`oscarkv.bench.e2e.random_artifact`: the query mapped by ``R⁻ᵀ`` in every layer,
keys rotated, scaled, centered and clipped on write, the value rotation folded into the weights
— the same bytes read; then each ``--layer-key-bits`` allocation, ``oscar`` with 4-bit keys in some layers,
:mod:`oscarkv.bench.layer_bits`) and context, one request's prompt is filled fast through the
write path (random K/V, see ``oscarkv.bench.e2e``), then ``steps`` decode steps of the real
engine are timed (``LLMEngine.step``: schedule, tables, CUDA-graph replay of the forward,
logits, sampling; medians are not used: total time / steps after ``warmup`` steps).

Reported per row: the codec's bits per element at the context (``KVCodec.bpe``: what is stored, windows
included); ms per step and tokens/s; the graph replay alone (the forward and the
logits, CUDA events); the host phases of a step (:func:`host_phases`); the floor = (weight bytes + KV bytes the step reads) / measured copy bandwidth; and
the write path's share of a step = (36-layer K/V write of one token, as a CUDA graph +
one page demotion per ``P`` steps, eager) / step time.

Tensor parallelism (``--tensor-parallel-size``, one GPU per rank; ``--all-reduce``: the row-parallel
all-reduce, ``oscarkv.models.allreduce``): the prompt's K/V is random on rank 0 and zeros on the other
ranks (a decode step reads the same bytes); the floor is rank 0's (its weight shard, the replicated
``lm_head``, its KV heads); a rank's graph holds all-reduces and replays only with every rank's, so the
graph column replays every rank's graph together (``ParallelRunner.replay``, timed on rank 0) and
``--profile`` profiles those replays on every rank (rank 0's rows in the JSON; each worker prints its
own as a JSON line tagged with its rank: the all-reduce kernels' rows include their waits for the peers).

NOTE: reaches into the engine (``scheduler``, ``runner``, ``manager``, ``_launch``, ``_sample``,
``overlap``): it times a step's phases one by one, the CUDA graph replay alone and the write
path, which the public API hides by design.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.bench.configs import DecodeBench
from oscarkv.bench.layer_bits import kv_rows
from oscarkv.config import KVConfig
from oscarkv.engine.rank_profile import kernel_profile


def write_path_us(engine) -> tuple[float, float]:
    """(one token's K/V write into every layer, CUDA graph; one page demotion in every layer as the engine runs
    it before a graph's replay: ``ModelRunner.demote_all``) in µs."""
    r = engine.runner
    geo = r.pools.geo
    k, v = torch.randn(2, 1, geo.num_kv_heads, geo.head_dim, device="cuda")
    slots = torch.zeros(1, dtype=torch.int32, device="cuda")  # the scratch page

    def writes():
        for i in range(geo.num_layers):
            r.backend.write(r.pools.layer(i), k, v, slots)
    writes()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        writes()
    w = 1e6 * e2e.event_seconds(g.replay)
    if not geo.int2_pages:
        return w, 0.0
    return w, 1e6 * e2e.event_seconds(lambda: r.demote_all([0], [0]))  # the scratch page into itself


def launch_us(graph, reps: int = 10) -> float:
    """Median host time of ``graph.replay()`` itself (the launch; the GPU idle before it)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        graph.replay()
        times.append(1e6 * (time.perf_counter() - t))
    torch.cuda.synchronize()
    return sorted(times)[reps // 2]


def host_phases(engine, steps: int) -> dict[str, float]:
    """Mean µs per step of ``LLMEngine.step``'s phases, run one after the other without overlap: schedule,
    runner (tables, staging, graph launch, the device argmax), commit, sample (waits for the GPU:
    tokens to the host; stop checks, outputs). With overlap these phases, except the wait, run
    while the device computes the step ahead. ``outputs_us`` (building each request's
    ``RequestOutput``; until round 5 it copied the prompt ids) is timed apart on the same sequence:
    it is part of ``sample``."""
    engine.drain()
    t = dict(schedule=0.0, runner=0.0, commit=0.0, sample=0.0)
    for _ in range(steps):
        t0 = time.perf_counter()
        out = engine.scheduler.schedule()
        t1 = time.perf_counter()
        cur = engine._launch(out)
        t2 = time.perf_counter()
        engine.scheduler.commit(out)
        t3 = time.perf_counter()
        engine._sample(cur)
        t4 = time.perf_counter()
        for k, a, b in (("schedule", t0, t1), ("runner", t1, t2), ("commit", t2, t3), ("sample", t3, t4)):
            t[k] += 1e6 * (b - a) / steps
    seq = engine.scheduler.running[0]
    a = time.perf_counter()
    for _ in range(steps):
        seq.output()
    t["outputs"] = 1e6 * (time.perf_counter() - a) / steps
    return {f"{k}_us": v for k, v in t.items()}


def timed_steps(engine, steps: int) -> float:
    """µs per ``LLMEngine.step`` over ``steps`` calls, after one untimed call. NOTE: no device sync around
    the timed calls: each returns once its own step's tokens are on the host, and with overlap the
    next step is then in flight, as it was before the first timed call — the timed calls are exactly
    ``steps`` steps."""
    engine.drain()
    engine.step()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return 1e6 * (time.perf_counter() - t) / steps


def measure(engine, ctx: int, cfg: DecodeBench, copy_gbps: float, wbytes: int) -> dict:
    e2e.add_prompts(engine, cfg.batch, ctx, 4 * cfg.batch + cfg.warmup + 4 * cfg.steps + 6, seed=ctx,
                    temperature=cfg.temperature)
    for _ in range(4 * cfg.batch):  # fill and first tokens: the scheduler admits a batch's prompts over several steps
        e2e.drive(engine, max_steps=1)
        if len(engine.scheduler.running) == cfg.batch and all(s.output_ids for s in engine.scheduler.running):
            break
    e2e.drive(engine, max_steps=cfg.warmup)  # graph capture
    seqs = list(engine.scheduler.running)
    if len(seqs) != cfg.batch:
        raise RuntimeError(f"decode bench: {len(seqs)} of {cfg.batch} sequences running (KV budget --kv-gib?)")
    seq = seqs[0]
    step_us = timed_steps(engine, cfg.steps)
    engine.overlap = False  # the same steps one after the other, for comparison
    sequential_us = timed_steps(engine, cfg.steps)
    engine.overlap = True
    for s in seqs:
        if getattr(s, "error", None) or s not in engine.scheduler.running:  # a failed step finishes its requests
            raise RuntimeError(f"decode bench: a request stopped early ({getattr(s, 'error', None)})")
    phases = host_phases(engine, cfg.steps)
    kv = e2e.kv_read_bytes(engine, seqs)
    runner, solo = engine.runner, engine.runner.tp.size == 1
    bucket = runner.graphs.bucket(cfg.batch)
    graph = runner.graphs.graphs[bucket].graph
    # NOTE: a tensor-parallel rank's graph holds all-reduces and replays only with every rank's: ParallelRunner.replay
    replay = graph.replay if solo else (lambda: runner.replay(bucket))
    fwd_us = 1e6 * e2e.event_seconds(replay)
    if solo:
        phases["launch_us"] = launch_us(graph)
    if cfg.profile and ctx == max(cfg.contexts):
        phases["host"] = e2e.host_functions(engine.step, cfg.steps)
        try:  # with tensor parallelism every rank profiles its graph and prints its rows (a JSON line per rank)
            phases["kernels"] = kernel_profile(replay) if solo else runner.profile(bucket)
        except Exception as e:  # the profile is a diagnosis; the timings stand without it
            phases["kernels"] = [dict(name=f"profile failed: {e!r}"[:90], us=0.0, count=0)]
    tiers = list(engine.manager.tier_tokens(seq))
    for s in seqs:
        engine.abort(s.request_id)
    floor_us = (wbytes + kv) / copy_gbps / 1e3
    reduce = None if solo else getattr(runner.tp.reduce, "kind", "nccl")
    return dict(context=ctx, batch=cfg.batch, tp=runner.tp.size, all_reduce=reduce, step_us=step_us, sequential_step_us=sequential_us,
                tokens_per_s=cfg.batch * 1e6 / step_us, graph_us=fwd_us,
                weight_bytes=wbytes, kv_bytes=kv, floor_us=floor_us, step_over_floor=step_us / floor_us,
                tiers=tiers, **phases)


def run(cfg: DecodeBench, out: Path | None) -> str:
    from oscarkv.bench.attention import copy_bandwidth

    copy_bandwidth(), copy_bandwidth()
    copy_gbps = copy_bandwidth()
    rows = []
    for shape in cfg.shapes:
        model = e2e.random_model(shape, cfg.tensor_parallel_size)
        every = variants(cfg, model.config)
        for method, kv, prefetch in every:
            # NOTE: the step budget (chunk x seqs) sizes the BF16 pool; a batch uses bench capacity's small
            # INT2 chunk so that its sequences fit the KV budget
            engine = e2e.build_engine(model, kv, int(cfg.kv_gib * 2**30), cfg.batch,
                                      8192 if cfg.batch == 1 else 256, cfg.tensor_parallel_size, cfg.all_reduce,
                                      l2_prefetch=prefetch, l2_prefetch_mib=cfg.l2_prefetch_mib,
                                      engines=len(cfg.shapes) * len(every))
            wbytes = e2e.weight_bytes(engine.runner.model)  # rank 0's shard with tensor parallelism
            w_us, d_us = write_path_us(engine)
            for ctx in cfg.contexts:
                row = dict(shape=shape, method=method, bpe=engine.codec.bpe(ctx), write_us=w_us, demote_us=d_us,
                           **measure(engine, ctx, cfg, copy_gbps, wbytes))
                row["write_share"] = (w_us + d_us / engine.cfg.kv.page_size) / row["step_us"]
                rows.append(row)
                print(json.dumps(row), flush=True)
            engine.close()
            del engine
            e2e.release()
        del model
        e2e.release()
    table = format_table(rows, copy_gbps) + "\n" + format_kernels(rows)
    e2e.write_json(out, cfg, rows, copy_gbps=copy_gbps)
    return table


def kv_configs(cfg: DecodeBench, num_layers: int, num_kv_heads: int) -> list[tuple[str, KVConfig]]:
    """(row label, KV config) of each method, then of each ``layer_key_bits`` allocation (``layer_bits.kv_rows``)."""
    return kv_rows(cfg.methods, cfg.layer_key_bits, num_layers, num_kv_heads)


def variants(cfg: DecodeBench, config) -> list[tuple[str, KVConfig, str]]:
    """(row label, KV config, ``l2_prefetch``) of every KV row (:func:`kv_configs`) under each prefetch variant;
    a label gains `` l2=VARIANT`` unless the variant is ``off``."""
    rows = kv_configs(cfg, config.num_hidden_layers, config.num_key_value_heads)
    return [(label if v == "off" else f"{label} l2={v}", kv, v) for v in cfg.l2_prefetch for label, kv in rows]


def format_table(rows: list[dict], copy_gbps: float) -> str:
    lines = [f"copy bandwidth (read + write): {copy_gbps:.0f} GB/s",
             "| model | context | kv | BPE | ms/step | no overlap | tok/s | graph ms | step-graph ms | runner us | outputs us | "
             "floor ms | step/floor | write share | tok/s vs bf16 |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["shape"], r["context"], r["method"]): r for r in rows}
    for r in rows:
        peer = by.get((r["shape"], r["context"], "bf16"))
        speed = f"{r['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if peer and r["method"] != "bf16" else ""
        graph = f"{r['graph_us'] / 1e3:.2f} | {(r['step_us'] - r['graph_us']) / 1e3:.2f}"
        model = r["shape"] + (f" tp{r['tp']} {r['all_reduce']}" if r.get("tp", 1) > 1 else "")
        lines.append(f"| {model} | {r['context']} | {r['method']} | {r['bpe']:.2f} | {r['step_us'] / 1e3:.2f} | "
                     f"{r['sequential_step_us'] / 1e3:.2f} | {r['tokens_per_s']:.1f} | {graph} | "
                     f"{r['runner_us']:.0f} | {r['outputs_us']:.0f} | {r['floor_us'] / 1e3:.2f} | "
                     f"{r['step_over_floor']:.2f} | {100 * r['write_share']:.1f}% | {speed} |")
    return "\n".join(lines)


def format_kernels(rows: list[dict]) -> str:
    """The per-kernel profile of each row that has one (µs per step, launches per step)."""
    lines = []
    for r in rows:
        if "host" in r:
            lines.append(f"{r['shape']} {r['context']} {r['method']}: host (cProfile, own time) " +
                         "; ".join(f"{k['name'][-48:]} {k['us']:.0f}us" for k in r["host"]))
        if "kernels" in r:
            launch = f"graph launch {r['launch_us']:.0f} us" if "launch_us" in r else "whole steps"
            lines.append(f"{r['shape']} {r['context']} {r['method']}: {launch}; kernels " +
                         "; ".join(f"{k['name'][:48]} {k['us']:.0f}us x{k['count']:.0f}" for k in r["kernels"]))
    return "\n".join(lines)
