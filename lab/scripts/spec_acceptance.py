"""Acceptance rate and tokens per decode step of n-gram speculative decoding on the default model.

Two short greedy tasks: a copy-heavy one (repeat a passage that is in the prompt) and one that does not
copy (free continuation). Each runs without and with ``--speculative ngram``; the tokens must be equal.
Prints one table row per (task, K): acceptance rate, tokens per step, engine steps, wall seconds.

    PYTHONPATH=$PWD .venv/bin/python -m lab.scripts.spec_acceptance [--max-tokens 48] [--kv oscar] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from oscarkv.config import EngineConfig, SpeculativeConfig
from oscarkv.engine.request import SamplingParams
from oscarkv.llm import LLM

PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, lit the great lamp, wound the "
           "clockwork that turned the lens, and wrote the state of the sea and the sky in a leather logbook.")
TASKS = {"copy": f"Here is a passage:\n\n{PASSAGE}\n\nRepeat the passage exactly, word for word:\n\n",
         "no-copy": "Write a short story about a fox who learns to play the violin."}


def measure(llm: LLM, prompt: str, max_tokens: int) -> tuple[list[int], int, float]:
    """Greedy tokens, engine steps and wall seconds for one prompt."""
    engine, steps = llm.engine, 0
    engine.add_request("r", llm.chat_prompt(prompt), SamplingParams(max_tokens=max_tokens, temperature=0))
    t, out = time.perf_counter(), None
    while engine.has_unfinished():
        steps += 1
        out = next((o for o in engine.step() if o.finished), out)
    return out.token_ids, steps, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--kv", default="oscar")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--k", default="2,4")
    args = ap.parse_args()
    base = EngineConfig(kv_memory_bytes=1 << 27, max_num_seqs=4)
    print("| task | K | acceptance | tokens/step | steps | s | tokens equal |\n|---|---:|---:|---:|---:|---:|---|")
    for task, prompt in TASKS.items():
        with LLM(kv=args.kv, config=base, device=args.device) as llm:
            ref, steps, wall = measure(llm, prompt, args.max_tokens)
        print(f"| {task} | 0 | - | 1.00 | {steps} | {wall:.1f} | - |")
        for k in map(int, args.k.split(",")):
            cfg = replace(base, speculative=SpeculativeConfig("ngram", num_speculative_tokens=k))
            with LLM(kv=args.kv, config=cfg, device=args.device) as llm:
                toks, steps, wall = measure(llm, prompt, args.max_tokens)
                st = llm.engine.spec.stats
            print(f"| {task} | {k} | {st.acceptance_rate:.2f} | {st.tokens_per_step:.2f} | {steps} | {wall:.1f} | "
                  f"{toks == ref} |")


if __name__ == "__main__":
    main()
