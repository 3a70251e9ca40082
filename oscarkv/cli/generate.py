"""``oscarkv generate``: stream tokens of one or more prompts from the paged engine to the terminal.

``engine_args``/``engine_config`` are the engine's flags, shared with ``oscarkv serve``; they
derive from :class:`~oscarkv.config.EngineConfig` and :class:`~oscarkv.config.KVConfig`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.cli.flags import UserError, add_fields, config_from, model_args
from oscarkv.config import ENGINE_METHODS, EngineConfig, KVConfig


def engine_args(p: argparse.ArgumentParser) -> None:
    model_args(p, "auto")
    p.add_argument("--kv", choices=ENGINE_METHODS, default="oscar", help="KV storage method (default: oscar)")
    p.add_argument("--rotations", type=Path, default=None,
                   help="artifact directory for --kv oscar (default: the default model's artifact, shipped with oscarkv)")
    add_fields(p, KVConfig, ["sink", "recent", "page_size"])
    add_fields(p, EngineConfig, ["kv_memory_bytes", "max_num_seqs", "max_num_batched_tokens", "prefill_chunk",
                                 "enable_prefix_caching", "overlap", "tensor_parallel_size"])


def engine_config(args: argparse.Namespace) -> EngineConfig:
    if args.rotations is not None and args.kv != "oscar":
        raise UserError(f"--rotations {args.rotations}: only --kv oscar uses a rotation artifact, and --kv {args.kv} "
                        "would ignore it; drop --rotations or use --kv oscar")
    kv = config_from(KVConfig, argparse.Namespace(method=args.kv, sink=args.sink, recent=args.recent,
                                                  page_size=args.page_size))
    return config_from(EngineConfig, args, kv=kv)


def setup(p: argparse.ArgumentParser) -> None:
    """Generate from prompts with the paged engine, streaming tokens to the terminal."""
    engine_args(p)
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap each prompt in the tokenizer's chat template (default: --chat)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default: 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature, 0 = greedy (default: 0.0)")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling, 0 = off (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p sampling (default: 1.0)")
    p.add_argument("--seed", dest="sample_seed", type=int, default=None, help="sampling seed (default: none)")


def run(args: argparse.Namespace) -> int:
    from oscarkv.cli.flags import artifact, load
    from oscarkv.engine.request import SamplingParams
    from oscarkv.llm import LLM

    cfg = engine_config(args)
    loaded = load(args.model, args.dtype)
    try:
        llm = LLM(loaded, args.kv, config=cfg, artifact=artifact(loaded, args.kv, args.rotations))
        params = SamplingParams(args.max_tokens, args.temperature, args.top_k, args.top_p, args.sample_seed)
    except ValueError as e:
        raise UserError(str(e)) from e
    with llm:  # stops tensor-parallel workers, if any
        prompts = [llm.chat_prompt(p) if args.chat else p for p in args.prompt]
        stream = len(prompts) == 1
        for out in llm.stream(prompts, params):
            if stream and not out.finished:
                print(out.new_text, end="", flush=True)
            elif out.finished:
                tail = f"[{out.finish_reason}, {len(out.token_ids)} tokens]"
                print((out.new_text + "\n" if stream else f"--- prompt {out.request_id}\n{out.text}\n") + tail)
    return 0
