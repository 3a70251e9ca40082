"""CPU engine benchmark: decode tokens/s at several batch sizes, and KV bytes per token.

Role: ``oscarkv bench engine``. For each KV method it builds the engine on the loaded
model (fp32 on the CPU; pools BF16/INT2), prefills ``batch`` random prompts of
``prompt_len`` tokens, then times ``new_tokens`` decode steps of the whole batch
(tokens/s = batch × steps / seconds, prefill excluded). KV bytes per token are measured from
the pools — bytes of the pages the sequences hold, divided by their tokens — and compared
with the BPE formula of ``oscarkv.quant.bpe`` for the same tier split.

NOTE: reaches into the engine (``engine.scheduler``, each sequence's page lists,
``engine.runner.pools.geo``): the bytes are measured from the pages the sequences hold and the
decode steps are timed apart from the prefill, which no public method reports.
"""

from __future__ import annotations

import time

import torch

from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.calibrate.default import artifact_for
from oscarkv.quant.artifact import apply_recipe
from oscarkv.engine.request import SamplingParams
from oscarkv.bench.configs import EngineBench


def held_bytes(engine: LLMEngine) -> tuple[int, int, int]:
    """(bytes held, tokens held, KV elements stored) over the running sequences, from the page lists; with
    tensor parallelism the group's (a page id names one page on every rank, each for its KV heads)."""
    geo, n = engine.runner.pools.geo, engine.runner.tp.size
    b = i = tokens = 0
    for seq in engine.scheduler.running:
        b += len(seq.kv.sink) + len(seq.kv.recent)
        i += len(seq.kv.history)
        tokens += seq.num_computed
    # NOTE: partially filled BF16 pages count whole: that is what the pool holds.
    nbytes = n * (b * geo.bf16_page_bytes() + i * geo.int2_page_bytes())
    return nbytes, tokens, tokens * 2 * geo.num_layers * geo.num_kv_heads * n * geo.head_dim


def bench_one(loaded, method: str, batch: int, spec: EngineBench, artifact) -> dict:
    art = artifact if method == "oscar" else None  # OSCAR with the artifact's recipe, as `LLM` and `serve` apply it
    cfg = EngineConfig(apply_recipe(KVConfig(method), art), kv_memory_bytes=1 << 30, max_num_seqs=batch,
                       max_num_batched_tokens=max(2048, spec.prompt_len + batch), prefill_chunk=512,
                       tensor_parallel_size=spec.tensor_parallel_size)
    engine = LLMEngine.from_hf(loaded.model, cfg, art, loaded.tokenizer)
    try:
        return _timed(engine, method, batch, spec)
    finally:
        engine.close()


def _timed(engine: LLMEngine, method: str, batch: int, spec: EngineBench) -> dict:
    g = torch.Generator().manual_seed(batch)
    vocab = engine.vocab_size
    params = SamplingParams(max_tokens=spec.new_tokens + 1, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(str(i), torch.randint(0, vocab, (spec.prompt_len,), generator=g).tolist(), params)
    while any(s.num_computed < s.num_prompt for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # prefill (and the first token)
    t0, steps = time.perf_counter(), 0
    nbytes, tokens, elements = held_bytes(engine)
    while engine.has_unfinished():
        engine.step()
        steps += 1
    dt = time.perf_counter() - t0
    tr = engine.codec.tiers(tokens // batch)
    formula = engine.bpe(tokens // batch)
    return {"method": method, "batch": batch, "prompt_len": spec.prompt_len, "decode_steps": steps,
            "tokens_per_s": round(batch * steps / dt, 2), "kv_bytes_per_token": round(nbytes / tokens, 1),
            "bpe_measured": round(8.0 * nbytes / elements, 3), "bpe_formula": round(formula, 3),
            "tiers_per_seq": list(tr)}


def run_engine_cpu(loaded, spec: EngineBench, rotations=None) -> list[dict]:
    torch.set_grad_enabled(False)
    rows = []
    for method in spec.methods:
        artifact = artifact_for(loaded, method, rotations)
        for batch in spec.batches:
            rows.append(bench_one(loaded, method, batch, spec, artifact))
            print(rows[-1], flush=True)
    return rows


def format_table(rows: list[dict]) -> str:
    head = "| method | batch | decode tok/s | KV bytes/token | BPE measured | BPE formula | tiers (sink, hist, recent) |"
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        lines.append(f"| {r['method']} | {r['batch']} | {r['tokens_per_s']} | {r['kv_bytes_per_token']} | "
                     f"{r['bpe_measured']} | {r['bpe_formula']} | {tuple(r['tiers_per_seq'])} |")
    return "\n".join(lines)
