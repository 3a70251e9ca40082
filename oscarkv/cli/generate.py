"""``oscarkv generate``: stream tokens of one or more prompts from the paged engine to the terminal.

One prompt streams its text as it is generated; several run as one batch and print each text
when it is done. Engine flags: :func:`oscarkv.cli.flags.engine_args` (shared with ``serve``).
"""

from __future__ import annotations

import argparse

from oscarkv.cli.flags import UserError, engine_args, engine_config


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
    p.add_argument("--seed", dest="sample_seed", type=int, default=None,  # not EngineConfig.seed: config_from reads that
                   help="sampling seed (default: none)")


def run(args: argparse.Namespace) -> int:
    from oscarkv.cli.flags import artifact, load
    from oscarkv.engine.request import SamplingParams
    from oscarkv.llm import LLM

    engine_config(args)  # bad flags are reported before the model loads
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, seed=args.sample_seed)
    except ValueError as e:
        raise UserError(str(e)) from e
    loaded = load(args.model, args.dtype, args.device, args.tensor_parallel_size)
    art = artifact(loaded, args)
    try:  # NOTE: LLM logs the windows line (describe_recipe) once
        llm = LLM(loaded, args.kv, config=engine_config(args, art), artifact=art)
    except ValueError as e:
        raise UserError(str(e)) from e
    with llm:  # stops tensor-parallel workers, if any
        prompts = [llm.chat_prompt(p) if args.chat else p for p in args.prompt]
        stream = len(prompts) == 1
        for out in llm.stream(prompts, params):
            if stream:
                print(out.new_text, end="\n" if out.finished else "", flush=True)
            elif out.finished:
                print(f"--- prompt {out.request_id}\n{out.text}")
            if out.finished:
                print(f"[{out.finish_reason}, {len(out.token_ids)} tokens]")
    return 0
