"""``oscarkv generate`` (stream tokens to the terminal) and ``oscarkv bench-engine`` (CPU).

Role: the command-line faces of the engine; registered in ``oscarkv.cli_commands.COMMANDS``.
Engine flags derive from :class:`~oscarkv.config.EngineConfig` and
:class:`~oscarkv.config.KVConfig` fields.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from oscarkv.cli import add_fields, pick
from oscarkv.config import ENGINE_METHODS, EngineConfig, KVConfig


def _engine_args(p: argparse.ArgumentParser) -> None:
    from oscarkv.cli_commands import _model_args

    _model_args(p, "auto")
    p.add_argument("--kv", choices=ENGINE_METHODS, default="oscar", help="KV storage method (default oscar)")
    p.add_argument("--rotations", type=Path, default=None, help="artifact directory for --kv oscar "
                   "(default model: its cached calibration)")
    add_fields(p, KVConfig, ["sink", "recent", "page_size"])
    add_fields(p, EngineConfig, ["kv_memory_bytes", "max_num_seqs", "max_num_batched_tokens", "prefill_chunk",
                                 "enable_prefix_caching", "overlap"])


def _engine_config(args) -> EngineConfig:
    from oscarkv.cli_commands import UserError

    try:
        kv = KVConfig(args.kv, args.sink, args.recent, args.page_size)
        return pick(EngineConfig, args, kv=kv)
    except ValueError as e:
        raise UserError(str(e)) from e


def _llm(args):
    from oscarkv.cli_commands import UserError, _load
    from oscarkv.engine.llm import LLM

    try:
        return LLM(_load(args.model, args.dtype), args.kv, args.rotations, _engine_config(args))
    except ValueError as e:
        raise UserError(str(e)) from e


# ---------------------------------------------------------------------------------- generate
def setup_generate(p: argparse.ArgumentParser) -> None:
    """Generate from prompts with the paged engine, streaming tokens to the terminal."""
    _engine_args(p)
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap each prompt in the tokenizer's chat template (default on)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p sampling (default 1.0)")
    p.add_argument("--seed", dest="sample_seed", type=int, default=None, help="sampling seed")


def run_generate(args: argparse.Namespace) -> int:
    from oscarkv.engine.request import SamplingParams

    llm = _llm(args)
    print(f"[engine] {llm.engine.describe()}", file=sys.stderr)
    params = SamplingParams(args.max_tokens, args.temperature, args.top_k, args.top_p, args.sample_seed)
    tok = llm.loaded.tokenizer
    for i, prompt in enumerate(args.prompt):
        if args.chat and getattr(tok, "chat_template", None):
            prompt = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        llm.engine.add_request(f"cli-{i}", tok(prompt, add_special_tokens=False).input_ids, params)
    stream = len(args.prompt) == 1
    done = {}
    while llm.engine.has_unfinished():
        for out in llm.engine.step():
            if stream:
                print(out.new_text, end="", flush=True)
            if out.finished:
                done[out.request_id] = out
    for i in range(len(args.prompt)):
        out = done[f"cli-{i}"]
        print(("\n" if stream else f"--- prompt {i}\n{out.text}\n") + f"[{out.finish_reason}, {len(out.token_ids)} tokens]")
    return 0


# ---------------------------------------------------------------------------------- bench
def setup_bench(p: argparse.ArgumentParser) -> None:
    """Engine on the CPU: decode tokens/s per batch size and KV bytes per token per method."""
    p.add_argument("--model", default="default", help="model spec (default: the default model)")
    p.add_argument("--kv", type=lambda s: tuple(s.split(",")), default=("bf16", "oscar"),
                   help="KV methods, comma-separated (default bf16,oscar)")
    p.add_argument("--rotations", type=Path, default=None, help="artifact for oscar (default model: cached calibration)")
    p.add_argument("--batch", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 8, 32),
                   help="batch sizes (default 1,8,32)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per sequence (default 512)")
    p.add_argument("--new-tokens", type=int, default=32, help="decode tokens per sequence (default 32)")
    p.add_argument("--out", type=Path, default=None, help="write results as JSON here")


def run_bench(args: argparse.Namespace) -> int:
    import json

    from oscarkv.bench.engine_cpu import BenchSpec, format_table, run_engine_cpu
    from oscarkv.cli_commands import _load

    loaded = _load(args.model, "float32")
    spec = BenchSpec(args.kv, args.batch, args.prompt_len, args.new_tokens)
    rows = run_engine_cpu(loaded, spec, args.rotations)
    print(format_table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


COMMANDS = {"generate": (setup_generate, run_generate), "bench-engine": (setup_bench, run_bench)}
