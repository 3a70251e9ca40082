"""``oscarkv bench capacity``: tokens in a fixed KV budget, and 32 × 100K-context job throughput.

Capacity: the engine's own pool sizing (:func:`oscarkv.cache.kv_pools.plan_pools`) for one
budget, ``kv=bf16`` vs ``naive`` INT2 (G = 128; OSCAR stores the same bytes), with
``max_num_seqs = 32`` and the default step budget: tokens per tier, and how many sequences of ``context + new_tokens``
tokens fit at once (BF16: whole sequences in BF16 pages; INT2: history pages and window
pages both).

Job throughput: ``requests`` requests of ``context`` prompt tokens, each decoding
``new_tokens`` greedy tokens, run to completion through the engine with ``max_num_seqs`` = the
concurrency that fits (capped at 32; pools sized for that run's step budget, see
:attr:`CapacityBench.chunks`). Prompts are filled fast through the write path
(:mod:`oscarkv.bench.e2e`; the fill is timed apart and excluded); the time is the sum of the
model steps (each request's first token and its decode steps: CUDA-graph decode, logits,
sampling), after an untimed warm-up run at 2K context (Triton JIT, graph capture of the
buckets used). jobs/s = requests / that time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.cache.kv_pools import plan_pools
from oscarkv.config import EngineConfig, KVConfig
from oscarkv.quant.bpe import history_end
from oscarkv.models.shapes import SHAPES


@dataclass(frozen=True)
class CapacityBench:
    shape: str = "qwen3-4b"
    kv_gib: float = 56.0
    context: int = 102400
    requests: int = 32
    new_tokens: int = 16
    chunks: tuple[tuple[str, int], ...] = (("bf16", 2048), ("naive", 256))
    """Prefill chunk per method for the throughput run; the token budget is ``chunk × seqs + seqs``
    so that every running sequence advances each step (a wave prefills, then decodes, together)."""


def fits(cfg: CapacityBench, method: str, chunk: int | None = None, max_num_seqs: int = 32) -> dict:
    """Pool sizing of ``method`` in the budget, and the sequences of ``context + new_tokens`` that fit.

    ``chunk=None``: the engine's default scheduling budget (``EngineConfig`` defaults);
    otherwise the throughput run's (``chunk × seqs + seqs`` tokens per step)."""
    s = SHAPES[cfg.shape]
    kv = KVConfig(method)
    step = dict(max_num_batched_tokens=chunk * max_num_seqs + max_num_seqs, prefill_chunk=chunk) if chunk else {}
    ecfg = EngineConfig(kv, kv_memory_bytes=int(cfg.kv_gib * 2**30), max_num_seqs=max_num_seqs, **step)
    geo = plan_pools(ecfg, s["num_hidden_layers"], s["num_key_value_heads"], s["head_dim"], min(s["head_dim"], 128),
                     torch.bfloat16)
    t, P = cfg.context + cfg.new_tokens, kv.page_size
    if method == "bf16":
        seqs = (geo.bf16_pages - 1) // -(-t // P)
    else:
        hist = (history_end(t, kv.sink, kv.recent, P) - kv.sink) // P
        window = -(-(kv.sink + kv.recent + P) // P) + 1
        seqs = min((geo.int2_pages - 1) // hist, (geo.bf16_pages - 1) // window)
    cap = geo.capacity()
    return dict(method=method, **cap, tokens=cap["bf16_tokens"] + cap["int2_tokens"], seqs_fit=seqs,
                bytes_per_token=geo.bytes_per_token())


def run(cfg: CapacityBench, out: Path | None) -> str:
    rows = [fits(cfg, m) for m, _ in cfg.chunks]
    if torch.cuda.is_available():
        model = e2e.random_model(cfg.shape)
        for r, (method, chunk) in zip(rows, cfg.chunks):
            conc = max(1, min(32, fits(cfg, method, chunk)["seqs_fit"]))
            engine = e2e.build_engine(model, method, int(cfg.kv_gib * 2**30), conc, chunk)
            for n in {conc, cfg.requests % conc or conc}:  # untimed: JIT compiles, graph captures of the batch buckets
                e2e.add_prompts(engine, n, 2048, 3, seed=n + 1)
                e2e.drive(engine)
            e2e.add_prompts(engine, cfg.requests, cfg.context, cfg.new_tokens)
            st = e2e.drive(engine)
            r.update(concurrency=conc, model_s=st.model_s, fill_s=st.fill_s, model_steps=st.steps,
                     mean_batch=sum(st.batch_sizes) / max(1, len(st.batch_sizes)),
                     jobs_per_s=cfg.requests / st.model_s, tokens_per_s=cfg.requests * cfg.new_tokens / st.model_s)
            print(json.dumps(r), flush=True)
            del engine
            e2e.release()
    table = format_table(rows)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                                   "config": asdict(cfg), "rows": rows}, indent=1))
    return table


def format_table(rows: list[dict]) -> str:
    b = rows[0]
    lines = ["| kv | tokens in budget | × bf16 | seqs of context fit | concurrency | model s | fill s | jobs/s | × bf16 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        jobs = f"{r['jobs_per_s']:.3f} | {r['jobs_per_s'] / b['jobs_per_s']:.2f}x" if "jobs_per_s" in r else "- | -"
        run_ = f"{r['concurrency']} | {r['model_s']:.2f} | {r['fill_s']:.2f}" if "model_s" in r else "- | - | -"
        lines.append(f"| {r['method']} | {r['tokens']} | {r['tokens'] / b['tokens']:.2f}x | {r['seqs_fit']} | {run_} | {jobs} |")
    return "\n".join(lines)
