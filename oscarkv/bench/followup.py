"""``oscarkv bench followup``: a follow-up turn on a cached document — the first engine step of a request whose
long prefix is in the prefix cache, beside a decode step at the same context, BF16 vs OSCAR.

For each model shape (random bf16 weights, :mod:`oscarkv.bench.e2e`), KV method and context, one engine with
prefix caching on (prefill chunk = the largest k, rounded up to a page) first caches a ``context``-token prefix:
a request of that prompt, its chunks filled through the write path (``e2e.drive``) except the last, which runs
the model and samples one token; it finishes and its pages stay cached. Then, per k of ``new_tokens``, follow-up
requests of the same prefix plus k fresh random tokens (``max_tokens = 1``): the prefix cache serves the
``context`` tokens and the request's first step computes the k new tokens over the cached prefix and samples —
what a user waits for. Its wall time is timed, synchronized, from ``add_request`` to the finished output
(validation and page hashing, scheduling, the prefix match, the step, sampling; ``repeats`` requests per k, the last reported: the first of a
shape builds kernels and plans). Each timed request is checked: the prefix-cache hit is exactly ``context``
tokens and one model launch computed exactly k tokens. Last, a request of the prefix plus one token decodes
``steps`` timed steps at the same context (``oscarkv.bench.decode.timed_steps``): the decode step beside it. On a
GPU each row also carries its target, two decode steps plus the k tokens' GEMMs (``prefill.linear_seconds``), and
its bound: the target plus the computed tokens' own attention FLOPs at the GPU's best attention rate
(``prefill.attention_rate``; at k = 512 over 100K they take longer than the target itself).

With ``--prefill-chunk N`` the engine chunks as a server does (N tokens, e.g. the default 512) and the cached
prompt is ``context + N // 2`` tokens: page keys hash the chunk ends that computed each page
(``oscarkv.cache.seq_kv``), so a follow-up hits the prompt only up to its last multiple of N and recomputes the
rest beside its k tokens (the table says how many it computed). This is what a user of ``serve`` waits for; the
default (one chunk of k) is the kinder diagnostic of the step alone.

Runs on the CPU at tiny shapes too (:func:`followup_rows` takes any :class:`~oscarkv.models.llama.PagedLM`; the
tests check the hits and the computed tokens there).

NOTE: reaches into the engine (``manager.hit_tokens``, the :class:`~oscarkv.bench.e2e.BenchRunner`'s launches)
to check that the timed step is the cached-prefix step it claims to be.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.bench.configs import FollowupBench
from oscarkv.bench.prefill import attention_rate, chunk_attention_flops, linear_seconds
from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.models.llama import PagedLM


def followup_engine(model: PagedLM, method: str, kv_bytes: int, max_new: int, chunk: int = 0,
                    pieces: tuple[int, ...] = (), tokenizer=None) -> LLMEngine:
    """An engine with prefix caching whose prefill chunk is ``chunk`` tokens, or (0) holds ``max_new`` tokens
    (one chunk per follow-up); ``pieces``: its ``piecewise_graph_buckets``; ``tokenizer``: for text prompts."""
    page = KVConfig(method).page_size
    chunk = chunk or -(-max_new // page) * page
    cfg = EngineConfig(KVConfig(method), kv_memory_bytes=kv_bytes, max_num_seqs=1,
                       max_num_batched_tokens=chunk + 1, prefill_chunk=chunk, enable_prefix_caching=True,
                       piecewise_graph_buckets=pieces)
    art = e2e.random_artifact(model.config) if method == "oscar" else None
    return e2e.bench_engine(model, cfg, art, tokenizer)


def _ids(engine: LLMEngine, n: int, seed: int) -> list[int]:
    return torch.randint(0, engine.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def cache_prefix(engine: LLMEngine, prefix: list[int]) -> None:
    """Serve ``prefix`` once (``max_tokens = 1``), its chunks filled but the last: its pages stay cached."""
    engine.add_request(f"prefix-{len(prefix)}", prefix, SamplingParams(max_tokens=1, ignore_eos=True))
    e2e.drive(engine)


def followup_step(engine: LLMEngine, prefix: list[int], k: int, seed: int, whole: bool = True,
                  resume: bool = True) -> dict:
    """One follow-up request (``prefix`` + k fresh tokens, ``max_tokens = 1``; with ``resume``, resuming where
    ``prefix`` ended), timed from ``add_request`` (its validation and page hashing: ``admit_s``) to its output,
    synchronized; with ``whole``, raises unless the prefix cache served all of ``prefix`` and one launch computed
    k tokens (else the hit and the tokens computed are reported)."""
    runner, hits, ids = engine.runner, engine.manager.hit_tokens, prefix + _ids(engine, k, seed)
    n = len(runner.launches)
    e2e.sync()
    t, steps = time.perf_counter(), 0
    engine.add_request(f"f{len(prefix)}-{k}-{seed}", ids, SamplingParams(max_tokens=1, ignore_eos=True),
                       resume=(len(prefix),) if resume else ())
    admit = time.perf_counter() - t
    while engine.has_unfinished():
        engine.step()
        steps += 1
    e2e.sync()
    wall = time.perf_counter() - t
    hit, launched = engine.manager.hit_tokens - hits, [launch.tokens for launch in runner.launches[n:]]
    if whole and (hit != len(prefix) or launched != [k]):
        raise RuntimeError(f"bench followup: prefix hit {hit} of {len(prefix)} tokens, model launches of {launched} "
                           f"tokens (expected one of {k})")
    return dict(step_s=wall, admit_s=admit, engine_steps=steps, hit_tokens=hit, computed_tokens=sum(launched))


def decode_step(engine: LLMEngine, prefix: list[int], steps: int) -> float:
    """Seconds per decode step of one request at ``len(prefix) + 1`` tokens (its prefix cached)."""
    from oscarkv.bench.decode import timed_steps

    engine.add_request(f"d{len(prefix)}", prefix + _ids(engine, 1, 99),
                       SamplingParams(max_tokens=2 * steps + 8, ignore_eos=True))
    for _ in range(4):  # the first token, then graph capture
        engine.step()
    us = timed_steps(engine, steps)
    for seq in list(engine.scheduler.running):
        engine.abort(seq.request_id)
    engine.drain()
    return us / 1e6


def gemm_seconds(model: PagedLM, ks) -> dict[int, float]:
    """The k tokens' GEMMs of each k (every layer's linear layers on k rows, timed once per k): the second term of
    the bound a follow-up step is held to (two decode steps plus these); on a CUDA model only (``{}`` elsewhere)."""
    if not next(model.parameters()).is_cuda:
        return {}
    return {k: linear_seconds(model, k) for k in ks}


def followup_rows(model: PagedLM, cfg: FollowupBench, shape: str = "") -> list[dict]:
    """Every (method, context, k) row for one model: the follow-up steps and the decode step beside them."""
    rows, gemm = [], gemm_seconds(model, cfg.new_tokens)
    rate = attention_rate(model, max(cfg.contexts)) if gemm else 0.0
    for method in cfg.methods:
        engine = followup_engine(model, method, int(cfg.kv_gib * 2**30), max(cfg.new_tokens), cfg.prefill_chunk,
                                 cfg.piecewise_graph_buckets)
        whole = not cfg.prefill_chunk
        try:
            for ctx in cfg.contexts:
                prefix = _ids(engine, ctx + cfg.prefill_chunk // 2, ctx)
                cache_prefix(engine, prefix)
                runs = {k: [followup_step(engine, prefix, k, seed, whole, cfg.resume_turns) for seed in range(cfg.repeats)]
                        for k in cfg.new_tokens}
                decode_s = decode_step(engine, prefix, cfg.steps)
                for k, got in runs.items():
                    bound = dict(gemm_s=gemm[k], target_s=2 * decode_s + gemm[k]) if gemm else {}
                    if cfg.profile and ctx == max(cfg.contexts):  # one more follow-up, after the timed ones
                        bound["host"] = e2e.host_functions(partial(followup_step, engine, prefix, k, 99, whole,
                                                                   cfg.resume_turns))
                    rows.append(dict(shape=shape, method=method + ("" if cfg.piecewise_graph_buckets else " eager"),
                                     context=ctx, new_tokens=k, decode_s=decode_s,
                                     prefill_chunk=cfg.prefill_chunk, resume=cfg.resume_turns, cached_tokens=len(prefix),
                                     **got[-1],
                                     all_step_s=[g["step_s"] for g in got], **bound))
                    if rate:
                        rows[-1] |= _bound(model, rows[-1], rate)
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            engine.close()
            del engine
            e2e.release()
    return rows


def _bound(model: PagedLM, row: dict, rate: float) -> dict:
    """A row's bound: its target plus its computed tokens' attention FLOPs at ``rate`` (FLOP/s)."""
    computed = row.get("computed_tokens", row["new_tokens"])
    attention_s = chunk_attention_flops(model, computed, row.get("hit_tokens", row["cached_tokens"])) / rate
    return dict(attention_s=attention_s, attention_tflops=rate / 1e12, bound_s=row["target_s"] + attention_s)


def run(cfg: FollowupBench, out: Path | None) -> str:
    if not torch.cuda.is_available():
        raise ValueError("bench followup needs a CUDA device (its tests run the same code at tiny shapes on the CPU)")
    rows = []
    for shape in cfg.shapes:
        model = e2e.random_model(shape)
        rows += followup_rows(model, cfg, shape)
        del model
        e2e.release()
    e2e.write_json(out, cfg, rows)
    return format_table(rows)


def format_table(rows: list[dict]) -> str:
    """ms per (shape, context, method): the decode step, then the first step of each k; step / target (two
    decode steps plus the k tokens' GEMMs) where the target was measured, else step / decode, and step / bound
    (the target plus the tokens' attention FLOPs) in brackets where measured; the longest admission (validation
    and page hashing, inside each step's time) of the row."""
    ks = list(dict.fromkeys(r["new_tokens"] for r in rows))
    by = {(r["shape"], r["context"], r["method"], r["new_tokens"]): r for r in rows}
    bound = "target" if all("target_s" in r for r in rows) else "decode"
    brackets = " (bound)" if all("bound_s" in r for r in rows) else ""
    lines = ["| shape | context | kv | decode step ms | " + " | ".join(f"k = {k} ms" for k in ks)
             + " | " + " | ".join(f"k = {k} / {bound}{brackets}" for k in ks) + " | admission ms |",
             "|---|---:|---|---:|" + "---:|" * (2 * len(ks) + 1)]
    for s, n, m in dict.fromkeys((r["shape"], r["context"], r["method"]) for r in rows):
        got = [by.get((s, n, m, k)) for k in ks]
        dec = next(g for g in got if g)["decode_s"]
        lines.append(f"| {s} | {n} | {m} | {1e3 * dec:.2f} | "
                     + " | ".join(_step_cell(g) for g in got) + " | "
                     + " | ".join(_ratio_cell(g, bound, dec) for g in got)
                     + f" | {1e3 * max(g.get('admit_s', 0.0) for g in got if g):.1f} |")
    return "\n".join(lines)


def _ratio_cell(row: dict | None, bound: str, decode_s: float) -> str:
    if row is None:
        return "-"
    cell = f"{row['step_s'] / row.get(bound + '_s', decode_s):.1f}x"
    return cell + (f" ({row['step_s'] / row['bound_s']:.1f}x)" if "bound_s" in row else "")


def _step_cell(row: dict | None) -> str:
    """ms of a follow-up step; where it computed more than its k tokens (the server's chunking), those tokens too."""
    if row is None:
        return "-"
    computed = row.get("computed_tokens", row["new_tokens"])
    return f"{1e3 * row['step_s']:.1f}" + (f" ({computed} computed)" if computed != row["new_tokens"] else "")
