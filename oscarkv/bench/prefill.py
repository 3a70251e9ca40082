"""``oscarkv bench prefill``: time to first token of one long prompt through the engine, BF16 vs OSCAR.

For each model shape (random bf16 weights, :mod:`oscarkv.bench.e2e`), KV method and prefill chunk, one
engine serves one request of ``context`` random tokens with ``max_tokens = 1``: every prefill chunk runs
the model (``LLMEngine.step``: QKV, the write path, extend attention — ``oscarkv.kernels.prefill`` for
long chunks —, the MLP; prompt middles demoted to INT2 as they fill), the last chunk samples the token.
TTFT = wall time from ``add_request`` to the finished output, synchronized; one untimed request of
``2 · chunk + 64`` tokens per engine first (JIT, graph captures); each context runs twice and the second
run is reported (the first, also in the JSON, includes building cuDNN plans for the step's new shapes).

The floor of the same run: causal attention over the whole prompt with PyTorch SDPA (its fastest
backend, native GQA) in every layer, plus the linear layers at their measured rate (one layer's
projections timed on a ``chunk``-token batch, scaled to the prompt and the layers). The embedding, norms,
RoPE and the write path are left out of it.

Breakdown (``profile_context``): one more TTFT run under ``torch.profiler``, its GPU kernel time split
into the cached prefix (staging BF16 pages, dequantizing INT2 pages, the prefix attention), the chunk's
own causal attention, the log-sum-exp merge, the tile kernel of short chunks, GEMMs, the write path and
demotion, and the rest (norms, RoPE, activations, casts).
"""

from __future__ import annotations

import bisect
import json
import time
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.bench.layer_bits import kv_rows
from oscarkv.bench.configs import PrefillBench


def ttft(engine, context: int, seed: int = 0) -> float:
    """Seconds from queueing one ``context``-token prompt (``max_tokens = 1``) to its finished output."""
    from oscarkv.engine.request import SamplingParams

    ids = torch.randint(0, engine.runner.model.config.vocab_size, (context,),
                        generator=torch.Generator().manual_seed(seed)).tolist()
    torch.cuda.synchronize()
    t = time.perf_counter()
    engine.add_request(f"p{seed}-{context}", ids, SamplingParams(max_tokens=1, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t


@torch.inference_mode()
def floor(model, context: int, chunk: int) -> dict:
    """The floor's two terms (module docstring): SDPA causal attention and the linear layers, seconds."""
    cfg = model.config
    hq, h, d, L = cfg.num_attention_heads, cfg.num_key_value_heads, model.head_dim, cfg.num_hidden_layers
    q = torch.randn(1, hq, context, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, h, context, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    attn = e2e.event_seconds(lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True), reps=3) * L
    q = k = v = None  # NOTE: frees them (rebound, not del: the timed lambda closes over these names)
    gemm = linear_seconds(model, chunk) * context / chunk
    return dict(attention_s=attn, gemm_s=gemm, floor_s=attn + gemm,
                attention_tflops=4 * hq * d * context * context / 2 * L / attn / 1e12)


@torch.inference_mode()
def attention_rate(model, keys: int, rows: int = 2048) -> float:
    """FLOP/s of the best attention the GPU runs (cuDNN through SDPA, one KV head's query heads stacked: ``rows``
    query rows of every KV head over ``keys`` keys): the rate a chunk's own attention FLOPs are held to in a
    follow-up's bound (one H200, 2026-11-28: 2048 rows over 100K keys, 1.26 ms a layer, ~680 TFLOP/s)."""
    h, d = model.config.num_key_value_heads, model.head_dim
    q = torch.randn(1, h, rows, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, h, keys, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return 4 * h * rows * keys * d / e2e.event_seconds(lambda: sdpa(q, k, v), reps=5)


def chunk_attention_flops(model, tokens: int, prefix: int) -> float:
    """FLOPs of ``tokens`` new tokens' attention over ``prefix`` cached tokens and (causally) over themselves,
    every layer: QKᵀ and PV, two FLOPs a multiply-add."""
    cfg = model.config
    return 4 * cfg.num_attention_heads * model.head_dim * tokens * (prefix + tokens / 2) * cfg.num_hidden_layers


@torch.inference_mode()
def linear_seconds(model, tokens: int) -> float:
    """Seconds of every decoder layer's linear layers (qkv, o, gate-up, down) on ``tokens`` rows, timed on layer
    0's weights (CUDA events) times the layer count: the GEMM term of the prefill floor and of a follow-up's bound."""
    cfg, d = model.config, model.head_dim
    layer = model.model.layers[0]
    x = torch.randn(tokens, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    xo = torch.randn(tokens, cfg.num_attention_heads * d, device="cuda", dtype=torch.bfloat16)
    xi = torch.randn(tokens, cfg.intermediate_size, device="cuda", dtype=torch.bfloat16)
    a, m = layer.self_attn, layer.mlp
    lin = torch.nn.functional.linear

    def linears():  # NOTE: the weights, not the modules: a row-parallel module's all-reduce waits for the other ranks
        for p, inp in ((a.qkv_proj, x), (a.o_proj, xo), (m.gate_up_proj, x), (m.down_proj, xi)):
            lin(inp, p.weight, p.bias)
    return e2e.event_seconds(linears, reps=10) * cfg.num_hidden_layers


_PARTS = {"prefill.prefix": "prefix_attention", "prefill.chunk": "chunk_attention", "prefill.merge": "merge"}


def _kernel_part(name: str) -> str | None:
    """The breakdown part of a GPU kernel outside the ``prefill.*`` ranges."""
    n = name.lower()
    if "_extend_kernel" in n:
        return "tile_kernel"
    if "sdpa" in n or "fmha" in n or "cudnn" in n or "flash" in n or "_merge_kernel" in n or "_gather_" in n:
        return "attention_unranged"  # NOTE: only if the profile lacks the GPU spans of the prefill.* ranges
    if "store_kv" in n or "_write_kernel" in n or "encode" in n or "demote" in n:
        return "write_demote"
    if ("gemm" in n or "nvjet" in n or "cutlass" in n or "xmma" in n) and "sdpa" not in n and "fmha" not in n:
        return "gemm"
    return None


def breakdown(engine, context: int) -> dict:
    """GPU seconds by part of one TTFT run under the profiler (module docstring). A kernel belongs to a
    ``prefill.*`` range when it starts inside the range's GPU span; the others go by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = ttft(engine, context, seed=7)
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = sorted((e.time_range.start, e.time_range.end, _PARTS[e.name]) for e in gpu if e.name in _PARTS)
    starts = [sp[0] for sp in spans]
    parts = dict.fromkeys(["prefix_attention", "stage_bf16", "dequant_int2", "chunk_attention", "merge",
                           "tile_kernel", "attention_unranged", "gemm", "write_demote", "other"], 0.0)
    other: dict[str, float] = {}
    for e in gpu:
        if e.name in _PARTS:
            continue
        us, i = e.time_range.elapsed_us(), bisect.bisect_right(starts, e.time_range.start) - 1
        ranged = spans[i][2] if i >= 0 and e.time_range.start < spans[i][1] else None
        part = ranged or _kernel_part(e.name) or "other"
        parts[part] += us
        if "_gather_bf16" in e.name or "_gather_int2" in e.name:
            parts["stage_bf16" if "bf16" in e.name else "dequant_int2"] += us
        if part == "other":
            other[e.name[:60]] = other.get(e.name[:60], 0.0) + us
    top = sorted(other.items(), key=lambda kv: -kv[1])[:8]
    total = sum(v for k, v in parts.items() if k not in ("stage_bf16", "dequant_int2"))
    return {"profiled_wall_s": wall, "gpu_s": total / 1e6, **{k: v / 1e6 for k, v in parts.items()},
            "other_top": {k: v / 1e6 for k, v in top}}


def rows_for(cfg: PrefillBench, shape: str) -> list[dict]:
    """Every (method, chunk, context) row of one model shape, with the floor of each context (rank 0's shard's
    with tensor parallelism, measured on the first engine's)."""
    tp = cfg.tensor_parallel_size
    model = e2e.random_model(shape, tp)
    floors = {} if tp > 1 else {n: floor(model, n, max(cfg.chunks)) for n in cfg.contexts}
    rows = []
    configs = kv_rows(cfg.methods, cfg.layer_key_bits, model.config.num_hidden_layers, model.config.num_key_value_heads)
    n = len(configs) * len(cfg.chunks) * (2 if cfg.profile_context else 1)  # engines of this process (e2e.one_kind)
    for method, kv in configs:
        for chunk in cfg.chunks:
            engine = e2e.build_engine(model, kv, int(cfg.kv_gib * 2**30), 1, chunk, tp, engines=n)
            floors = floors or {n: floor(engine.runner.model, n, max(cfg.chunks)) for n in cfg.contexts}
            ttft(engine, 2 * chunk + 64, seed=1)  # untimed
            for n in cfg.contexts:
                first = ttft(engine, n)  # NOTE: the first prompt of a length builds cuDNN plans for its shapes
                rows.append(dict(shape=shape, method=method, chunk=chunk, context=n, tp=tp, ttft_first_s=first,
                                 ttft_s=ttft(engine, n, seed=2), **floors[n]))
                print(json.dumps(rows[-1]), flush=True)
            engine.close()
            del engine
            e2e.release()
    # NOTE: profiles last: CUPTI stays attached after one and slows every later launch (see DecodeBench.profile)
    for method, kv in configs if cfg.profile_context else ():
        for chunk in cfg.chunks:
            engine = e2e.build_engine(model, kv, int(cfg.kv_gib * 2**30), 1, chunk, tp, engines=n)
            ttft(engine, 2 * chunk + 64, seed=1)
            rows.append(dict(shape=shape, method=method, chunk=chunk, context=cfg.profile_context, tp=tp,
                             breakdown=breakdown(engine, cfg.profile_context)))
            print(json.dumps(rows[-1]), flush=True)
            engine.close()
            del engine
            e2e.release()
    del model
    e2e.release()
    return rows


def run(cfg: PrefillBench, out: Path | None) -> str:
    if not torch.cuda.is_available():
        raise ValueError("bench prefill needs a CUDA device")
    rows = [r for shape in cfg.shapes for r in rows_for(cfg, shape)]
    e2e.write_json(out, cfg, rows)
    return format_table(rows)


def format_table(rows: list[dict]) -> str:
    """TTFT per shape, chunk and context: each method, OSCAR / BF16, BF16 / floor; then the breakdowns."""
    timed = [r for r in rows if "ttft_s" in r]
    key = {(r["shape"], r["chunk"], r["context"], r["method"]): r for r in timed}
    methods = list(dict.fromkeys(r["method"] for r in timed))
    lines = ["| shape | chunk | context | " + " | ".join(f"{m} TTFT s" for m in methods)
             + " | oscar / bf16 | floor s (attn + GEMM) | bf16 / floor |",
             "|---|---:|---:|" + "---:|" * len(methods) + "---:|---:|---:|"]
    for s, c, n in dict.fromkeys((r["shape"], r["chunk"], r["context"]) for r in timed):
        got = {m: key.get((s, c, n, m)) for m in methods}
        f = next(r for r in got.values() if r)
        ratio = (f"{got['oscar']['ttft_s'] / got['bf16']['ttft_s']:.2f}x" if got.get("oscar") and got.get("bf16")
                 else "-")
        vs_floor = f"{got['bf16']['ttft_s'] / f['floor_s']:.2f}x" if got.get("bf16") else "-"
        lines.append(f"| {s} | {c} | {n} | " + " | ".join(f"{g['ttft_s']:.3f}" if g else "-" for g in got.values())
                     + f" | {ratio} | {f['floor_s']:.3f} ({f['attention_s']:.3f} + {f['gemm_s']:.3f}) | {vs_floor} |")
    prof = [r for r in rows if "breakdown" in r]
    if prof:
        names = [k for k in prof[0]["breakdown"] if k not in ("profiled_wall_s", "other_top")]
        lines += ["", "| shape | method | chunk | context | " + " | ".join(names) + " |",
                  "|---|---|---:|---:|" + "---:|" * len(names)]
        for r in prof:
            lines.append(f"| {r['shape']} | {r['method']} | {r['chunk']} | {r['context']} | "
                         + " | ".join(f"{r['breakdown'][k]:.3f}" for k in names) + " |")
    return "\n".join(lines)
