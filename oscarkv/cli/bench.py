"""``oscarkv bench {attention, decode, prefill, followup, jobs, capacity, engine, serve, speculative}``: each prints a
table and writes JSON.

``attention``, ``decode``, ``prefill``, ``followup``, ``jobs`` and ``capacity`` need a GPU (random weights at real model
shapes); ``engine`` runs the engine on the CPU with a real model; ``serve`` drives a loopback server; ``speculative``
runs a real model on any device (and, with ``--shapes``, random weights at real shapes on a GPU).
Flags derive from the dataclasses of :mod:`oscarkv.bench.configs`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.bench.configs import (AttentionBench, CapacityBench, DecodeBench, EngineBench, FollowupBench, JobsBench,
                                   PrefillBench, ServeBench, SpeculativeBench)
from oscarkv.cli.flags import UserError, add_fields, config_from, load, model_args, recipe_args, recipe_given

BENCHES = {
    "attention": (AttentionBench, "GPU: decode attention time and bandwidth, BF16 vs INT2 vs PyTorch SDPA",
                  ["contexts", "batches", "q_heads", "kv_heads", "head_dim", "key_bits", "value_bits",
                   "levels"]),
    "decode": (DecodeBench, "GPU: end-to-end decode ms per step vs the byte floor, BF16 vs INT2 (random weights)",
               ["shapes", "contexts", "methods", "steps", "kv_gib", "batch", "temperature", "tensor_parallel_size",
                "all_reduce", "profile", "layer_key_bits", "l2_prefetch", "l2_prefetch_mib"]),
    "prefill": (PrefillBench, "GPU: time to first token of long prompts through the engine vs the floor, BF16 vs OSCAR",
                ["shapes", "contexts", "methods", "chunks", "kv_gib", "profile_context", "tensor_parallel_size",
                 "layer_key_bits"]),
    "followup": (FollowupBench, "GPU: the first step of a follow-up request on a cached long prefix (k new tokens) "
                 "beside a decode step, BF16 vs OSCAR (random weights)",
                 ["shapes", "contexts", "new_tokens", "methods", "repeats", "steps", "kv_gib", "prefill_chunk", "resume_turns",
                  "piecewise_graph_buckets", "profile"]),
    "jobs": (JobsBench, "GPU: whole jobs (real prefill, then decode) of many long requests in one KV budget, BF16 vs OSCAR",
             ["shape", "kv_gib", "context", "requests", "new_tokens", "methods", "tensor_parallel_size",
              "chunk"]),
    "capacity": (CapacityBench, "GPU: tokens in one KV budget and the job throughput of many long requests",
                 ["shape", "kv_gib", "context", "requests", "new_tokens", "methods", "tensor_parallel_size"]),
    "engine": (EngineBench, "CPU: engine decode tokens/s per batch size and KV bytes per token, real model",
               ["methods", "batches", "prompt_len", "new_tokens", "tensor_parallel_size"]),
    "serve": (ServeBench, "loopback server: requests/s, TTFT and TPOT per concurrency and KV method (openai client)",
              ["kv", "concurrency", "requests", "max_tokens"]),
    "speculative": (SpeculativeBench, "batch-1 speculative decoding with and without: acceptance, tokens per step and "
                    "ms per token on a real model (copy and no-copy tasks); GPU: verify-step cost at real shapes",
                    ["methods", "speculative", "num_speculative_tokens", "min_accepted_tokens", "measured_floor", "document_tokens", "max_tokens", "repeats",
                     "shapes", "contexts", "steps", "kv_gib"]),
}


def setup(p: argparse.ArgumentParser) -> None:
    """Benchmarks: attention kernels, decode and capacity on a GPU; the engine and the server on any device."""
    sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (cls, doc, names) in BENCHES.items():
        b = sub.add_parser(name, help=doc, description=doc)
        add_fields(b, cls, names)
        if name == "speculative":
            model_args(b)
            recipe_args(b)  # over OSCAR's recipe, as generate's and serve's flags
        elif name in ("engine", "serve"):
            b.add_argument("--model", default="default", help="model spec (default: default)")
        if name in ("engine", "serve", "speculative"):
            b.add_argument("--rotations", type=Path, default=None,
                           help="artifact for oscar (default: the default model's artifact, shipped with oscarkv)")
        out = None if name in ("engine", "serve") else Path(f"bench_{name}.json")  # CPU benches: a table only
        b.add_argument("--out", type=Path, default=out, help=f"JSON file to write (default: {out or 'none'})")


def run(args: argparse.Namespace) -> int:
    cfg = config_from(BENCHES[args.bench][0], args)
    if args.bench == "engine":
        import json

        from oscarkv.bench.engine import format_table, run_engine_cpu

        rows = run_engine_cpu(load(args.model, "float32", "cpu"), cfg, args.rotations)
        print(format_table(rows))
        if args.out:
            args.out.write_text(json.dumps(rows, indent=2) + "\n")
        return 0
    if args.bench == "serve":
        from oscarkv.bench import serve

        print(serve.run(cfg, args.model, args.rotations, args.out))
        return 0
    if args.bench == "speculative":
        return _speculative(cfg, args)
    from oscarkv.bench import attention, capacity, decode, followup, jobs, prefill

    try:
        mod = {"attention": attention, "decode": decode, "capacity": capacity, "prefill": prefill, "jobs": jobs,
               "followup": followup}
        print(mod[args.bench].run(cfg, args.out))
    except ValueError as e:
        raise UserError(str(e)) from e
    return 0


def _speculative(cfg: SpeculativeBench, args: argparse.Namespace) -> int:
    from oscarkv.bench import speculative
    from oscarkv.calibrate.default import artifact_for

    loaded = load(args.model, args.dtype, args.device)
    try:
        art = artifact_for(loaded, "oscar", args.rotations) if "oscar" in cfg.methods else None
        print(speculative.run(cfg, loaded, art, args.out, recipe_given(args)))
    except ValueError as e:
        raise UserError(str(e)) from e
    return 0
