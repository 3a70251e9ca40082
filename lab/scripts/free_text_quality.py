"""Free-running text after a long document, as served, per KV configuration (development data; lab code).

Needle answers are a few tokens; a user's summary or story is hundreds, each read back from the cache as stored. Per
configuration one ``LLM`` (the default model) writes ``--max-tokens`` greedy tokens after each development document
(gazetteer text past the bench's 6K-token document, and the ``calibration`` haystack's prose) and each request
(a story unrelated to it, a summary of it, a copy of its first entry). Reported per configuration: ``loop``, the share
of output 4-grams (tokens) that already occurred earlier in the output (0: no repetition; a text stuck in a loop
nears 1), and ``agree``, the output tokens before the first that differs from the unquantized cache's (BF16 here, fp32
on a CPU). Configurations: ``bf16``; ``shipped`` (the artifact's recipe, as ``LLM`` serves it); ``int2+win``
(uniform INT2, sink 64, recent 256, pages of 64: ``KVConfig``'s defaults); ``k4v2+win`` (4-bit keys, the same
windows). Writes ``free_text_quality.json``.

    OMP_NUM_THREADS=1 python -m lab.scripts.free_text_quality --tokens 4096 --max-tokens 128 --out DIR
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from oscarkv.config import EngineConfig, KVConfig
from oscarkv.data import read_text
from oscarkv.engine.request import SamplingParams
from oscarkv.llm import LLM

ASKS = {"story": "Now, without quoting the text above, write a short story about a fox who learns to play the violin.",
        "summary": "Summarize the text above in a few paragraphs.",
        "copy": "Repeat the first entry of the text above, word for word."}
CONFIGS = {"bf16": None, "shipped": None, "int2+win": KVConfig("oscar"), "k4v2+win": KVConfig("oscar", key_bits=4)}


def documents(tok, n: int) -> dict[str, str]:
    """Development documents of about ``n`` tokens: the gazetteer past its first 9000 tokens (the bench reads its
    first 6144), and the calibration prose."""
    out = {}
    for name, text, skip in (("gazetteer", read_text("gazetteer.txt"), 9000), ("calibration", read_text("calibration.txt"), 0)):
        ids = tok(text, add_special_tokens=False).input_ids[skip:skip + n]
        doc = tok.decode(ids)
        out[name] = doc[doc.index("\n\n") + 2:doc.rindex("\n")]  # whole paragraphs and lines
    return out


def loop_share(ids: list[int], n: int = 4) -> float:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    seen, again = set(), 0
    for g in grams:
        again += g in seen
        seen.add(g)
    return again / max(len(grams), 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    outs, rows, prompts = {}, [], None
    for name in a.configs.split(","):
        kv = CONFIGS[name]
        llm = LLM(kv="bf16" if name == "bf16" else "oscar",
                  config=None if kv is None else replace(EngineConfig(), kv=kv))
        tok = llm.loaded.tokenizer
        if prompts is None:
            prompts = {(d, t): llm.chat_prompt(f"{text}\n{ask}") for d, text in documents(tok, a.tokens).items()
                       for t, ask in ASKS.items()}
        gen = llm.generate(list(prompts.values()), SamplingParams(max_tokens=a.max_tokens, temperature=0, ignore_eos=True))
        outs[name] = {k: o.token_ids for k, o in zip(prompts, gen)}
        for (doc, task), ids in outs[name].items():
            ref = outs.get("bf16", {}).get((doc, task))
            agree = None if ref is None else next((i for i, (x, y) in enumerate(zip(ref, ids)) if x != y), len(ids))
            rows.append(dict(config=name, document=doc, task=task, loop=loop_share(ids), agree=agree,
                             text=tok.decode(ids)))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "text"}), flush=True)
        llm.close()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "free_text_quality.json").write_text(json.dumps(rows, indent=1))
    for name in outs:
        sel = [r for r in rows if r["config"] == name]
        print(f"{name}: loop {sum(r['loop'] for r in sel) / len(sel):.3f}, agree "
              f"{[r['agree'] for r in sel]}")


if __name__ == "__main__":
    main()
