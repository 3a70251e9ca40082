"""``oscarkv bench capacity``: tokens in a fixed KV budget, and 32 × 100K-context job throughput.

Methods (``CapacityBench.methods``; ``bf16`` must be one, the × BF16 columns are relative to it):
``bf16``; ``naive`` INT2 (G = 128, no rotation); ``oscar``, the path users run, built as in
``oscarkv bench decode`` with a random artifact (:func:`oscarkv.bench.e2e.random_artifact`): the
query mapped by ``R⁻ᵀ`` in every layer, keys rotated, scaled, centered and clipped in the write
kernel, the value rotation folded into the weights.

Capacity: the engine's own pool sizing (:func:`oscarkv.cache.kv_pools.plan_pools`, with the
group the engine's codec uses) for one budget, with ``max_num_seqs = 32`` and the default step
budget: tokens per tier, bytes per token, and how many sequences of ``context + new_tokens``
tokens fit at once (BF16: whole sequences in BF16 pages; INT2: history pages and window pages
both). OSCAR stores the same bytes as naive at the same group size; this is computed, not
assumed: the oscar row's ``pools_equal_naive`` compares its pool geometry with naive's, and the
table says which.

Job throughput (on a GPU): ``requests`` requests of ``context`` prompt tokens, each decoding
``new_tokens`` greedy tokens, run to completion through the engine with ``max_num_seqs`` = the
concurrency that fits (capped at 32; pools sized for that run's step budget, see
:attr:`CapacityBench.chunks`; the built engine's pools are checked against that sizing). Prompts
are filled fast through the write path (:mod:`oscarkv.bench.e2e`; the fill is timed apart and
excluded); the time is the wall time of the engine steps that run the model (each request's first
token and its decode steps: scheduling, tables, CUDA-graph decode, logits, sampling, with the
engine's overlap of host and device work), after an untimed warm-up run at 2K context (Triton
JIT, graph capture of the buckets used). jobs/s = requests / that time. (Until 2026-11-23 the
time excluded scheduling and the engine ran its steps without overlap.)

Tensor parallelism (``--tensor-parallel-size n``): ``kv_gib`` per GPU for one rank's KV heads (the
sizing above with ``max(1, H_kv / n)`` heads), bytes per token for the whole group.

NOTE: reads ``engine.runner.pools.geo`` to check the built engine's pools against the sizing
computed here.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.cache.kv_pools import PoolGeometry, plan_pools
from oscarkv.config import EngineConfig, KVConfig
from oscarkv.models.shapes import SHAPES
from oscarkv.quant.bpe import history_end
from oscarkv.quant.codec import default_group
from oscarkv.bench.configs import CapacityBench




def geometry(cfg: CapacityBench, method: str, chunk: int | None = None, max_num_seqs: int = 32) -> PoolGeometry:
    """The pools ``LLMEngine.from_paged`` allocates for ``method`` in the budget (bfloat16 model).

    ``chunk=None``: the engine's default scheduling budget (``EngineConfig`` defaults);
    otherwise the throughput run's (``chunk × seqs + seqs`` tokens per step, as
    :func:`oscarkv.bench.e2e.build_engine`). NOTE: the engine sizes pools with its codec's group,
    ``default_group(head_dim, kv.group_size)`` for every method; an oscar artifact must match it
    (``Artifact.codec`` raises otherwise), so no artifact is needed here."""
    s = SHAPES[cfg.shape]
    kv = KVConfig(method)
    step = dict(max_num_batched_tokens=chunk * max_num_seqs + max_num_seqs, prefill_chunk=chunk) if chunk else {}
    ecfg = EngineConfig(kv, kv_memory_bytes=int(cfg.kv_gib * 2**30), max_num_seqs=max_num_seqs,
                        enable_prefix_caching=False, **step)  # as build_engine: no room for cached windows
    d, heads = s["head_dim"], max(1, s["num_key_value_heads"] // cfg.tensor_parallel_size)  # one rank's
    return plan_pools(ecfg, s["num_hidden_layers"], heads, d, default_group(d, kv.group_size), torch.bfloat16,
                      kv.stored_bits())


def fits(cfg: CapacityBench, method: str, chunk: int | None = None, max_num_seqs: int = 32) -> dict:
    """Pool sizing of ``method`` in the budget (:func:`geometry`), and the sequences of
    ``context + new_tokens`` that fit."""
    geo, kv = geometry(cfg, method, chunk, max_num_seqs), KVConfig(method)
    t, P = cfg.context + cfg.new_tokens, kv.page_size
    if method == "bf16":
        seqs = (geo.bf16_pages - 1) // -(-t // P)
    else:
        hist = (history_end(t, kv.sink, kv.recent, P) - kv.sink) // P
        window = -(-(kv.sink + kv.recent + P) // P) + 1
        seqs = min((geo.int2_pages - 1) // hist, (geo.bf16_pages - 1) // window)
    cap, n = geo.capacity(), cfg.tensor_parallel_size
    return dict(method=method, **cap, tokens=cap["bf16_tokens"] + cap["int2_tokens"], seqs_fit=seqs,
                bytes_per_token={k: v * n for k, v in geo.bytes_per_token().items()})


def capacity_rows(cfg: CapacityBench) -> list[dict]:
    """:func:`fits` of every method; the oscar row also says whether its pools equal naive's."""
    rows = [fits(cfg, m) for m in cfg.methods]
    for r in rows:
        if r["method"] == "oscar":
            r["pools_equal_naive"] = geometry(cfg, "oscar") == geometry(cfg, "naive")
    return rows


def run(cfg: CapacityBench, out: Path | None) -> str:
    rows = capacity_rows(cfg)
    if torch.cuda.is_available():
        model = e2e.random_model(cfg.shape, cfg.tensor_parallel_size)
        for r in rows:
            r.update(throughput(cfg, model, r["method"]))
            print(json.dumps(r), flush=True)
    table = format_table(rows)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                                   "config": asdict(cfg), "rows": rows}, indent=1))
    return table


def throughput(cfg: CapacityBench, model, method: str) -> dict:
    """The job-throughput run of ``method`` (see the module docstring) on the GPU."""
    chunk = dict(cfg.chunks)[method]
    conc = max(1, min(32, fits(cfg, method, chunk)["seqs_fit"]))
    engine = e2e.build_engine(model, method, int(cfg.kv_gib * 2**30), conc, chunk, cfg.tensor_parallel_size,
                              engines=len(cfg.methods))
    if engine.runner.pools.geo != geometry(cfg, method, chunk, conc):
        raise RuntimeError(f"capacity bench: the engine's {method} pools {engine.runner.pools.geo} are not the "
                           f"sizing computed here {geometry(cfg, method, chunk, conc)}")
    for n in {conc, cfg.requests % conc or conc}:  # untimed: JIT compiles, graph captures of the batch buckets
        e2e.add_prompts(engine, n, 2048, 3, seed=n + 1)
        e2e.drive(engine)
    e2e.add_prompts(engine, cfg.requests, cfg.context, cfg.new_tokens)
    st = e2e.drive(engine)
    engine.close()
    del engine
    e2e.release()
    return dict(concurrency=conc, model_s=st.model_s, fill_s=st.fill_s, model_steps=st.steps,
                mean_batch=sum(st.batch_sizes) / max(1, len(st.batch_sizes)), batch_sizes=st.batch_sizes,
                model_call_ms=[round(1e3 * t, 3) for t in st.model_calls_s],
                jobs_per_s=cfg.requests / st.model_s, tokens_per_s=cfg.requests * cfg.new_tokens / st.model_s)


def format_table(rows: list[dict]) -> str:
    """Markdown table of every row, × BF16 relative to the bf16 row; then whether oscar's pools equal naive's."""
    b = next((r for r in rows if r["method"] == "bf16"), None)
    if b is None:
        raise ValueError("capacity table: no bf16 row, the × BF16 columns are relative to it")
    lines = ["| kv | tokens in budget | × bf16 | INT2 B/token | seqs of context fit | concurrency | model s | "
             "fill s | jobs/s | × bf16 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        jobs = f"{r['jobs_per_s']:.3f} | {r['jobs_per_s'] / b['jobs_per_s']:.2f}x" if "jobs_per_s" in r else "- | -"
        run_ = f"{r['concurrency']} | {r['model_s']:.2f} | {r['fill_s']:.2f}" if "model_s" in r else "- | - | -"
        bpt = f"{r['bytes_per_token']['int2']:.0f}" if r["int2_tokens"] else "-"
        lines.append(f"| {r['method']} | {r['tokens']} | {r['tokens'] / b['tokens']:.2f}x | {bpt} | "
                     f"{r['seqs_fit']} | {run_} | {jobs} |")
    for r in rows:
        if "pools_equal_naive" in r:
            same = "equal naive's (computed" if r["pools_equal_naive"] else "DIFFER from naive's (computed"
            lines.append(f"\noscar pools {same}: pages per tier and bytes per token at this budget)")
    return "\n".join(lines)
