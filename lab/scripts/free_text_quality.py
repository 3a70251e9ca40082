"""Free-running text after a long document, as served, per KV configuration (development data; lab code).

Needle answers are a few tokens; a user's summary or story is hundreds, each read back from the cache as stored. Per
configuration one ``LLM`` (the default model, loaded once) writes ``--max-tokens`` greedy tokens after each development
document (``--gazetteers`` gazetteers generated with development seeds, ``--prose`` consecutive slices of the
``calibration`` haystack's prose; never the bench's document, the shipped gazetteer's first 6144 tokens) and each
request (a story unrelated to it, a summary of it, a copy of its first entry). Reported per configuration: ``loop``,
the share of output 4-grams (tokens) that already occurred earlier in the output (0: no repetition; a text stuck in a
loop nears 1), ``stuck`` the share of outputs with ``loop`` >= 0.5, and ``agree``, the output tokens before the first
that differs from the unquantized cache's (BF16 here, fp32 on a CPU). Configurations: ``bf16``; ``shipped`` (the
artifact's recipe, as ``LLM`` serves it); ``shipped+sinkN`` (that recipe with a BF16 sink of N tokens); ``NAME=FILE``
(a recipe JSON's);
``int2+win`` (uniform INT2, sink 64, recent 256, pages of 64: ``KVConfig``'s defaults); ``k4v2+win`` (4-bit keys,
the same windows). Writes ``free_text_quality.json``.

    OMP_NUM_THREADS=1 python -m lab.scripts.free_text_quality --tokens 4096 --max-tokens 128 --out DIR
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from lab.scripts.make_prose_haystack import gazetteer
from lab.scripts.spec_draft_policies import slices
from oscarkv.calibrate.default import artifact_for
from oscarkv.config import EngineConfig, KVConfig
from oscarkv.data import read_text
from oscarkv.engine.request import SamplingParams
from oscarkv.llm import LLM
from oscarkv.models.loader import load_model
from oscarkv.quant.artifact import Artifact, apply_recipe

ASKS = {"story": "Now, without quoting the text above, write a short story about a fox who learns to play the violin.",
        "summary": "Summarize the text above in a few paragraphs.",
        "copy": "Repeat the first entry of the text above, word for word."}
FIXED = {"bf16": KVConfig("bf16"), "int2+win": KVConfig("oscar"), "k4v2+win": KVConfig("oscar", key_bits=4)}


def kv_config(name: str, artifact) -> KVConfig:
    """The KV configuration a name stands for (``shipped`` and ``shipped+sinkN`` from the artifact's recipe)."""
    if name in FIXED:
        return FIXED[name]
    if "=" in name:  # NAME=FILE: a recipe JSON (``recipe`` as ``oscarkv calibrate`` writes it in a manifest)
        recipe = json.loads(Path(name.partition("=")[2]).read_text())
        recipe = recipe.get("recipe", recipe)  # a manifest's or the recipe alone
        return apply_recipe(KVConfig("oscar"), Artifact({**artifact.manifest, "recipe": recipe}, artifact.tensors))
    recipe, _, sink = name.partition("+sink")
    assert recipe == "shipped", f"unknown configuration {name!r}"
    kv = apply_recipe(KVConfig("oscar"), artifact)
    return replace(kv, sink=int(sink)) if sink else kv


def documents(tok, n: int, gazetteers: range, prose: int) -> dict[str, str]:
    """Development documents of about ``n`` tokens each, cut at line ends."""
    out = {f"gaz{i}": slices(tok, gazetteer(f"oscarkv gazetteer dev {i}"), n, 1)[0] for i in gazetteers}
    out.update({f"prose{i}": text for i, text in enumerate(slices(tok, read_text("calibration.txt"), n, prose))})
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
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gazetteers", type=int, default=3)
    ap.add_argument("--first-gazetteer", type=int, default=1, help="the development seed of the first")
    ap.add_argument("--prose", type=int, default=1)
    ap.add_argument("--configs", default="bf16,shipped,int2+win,k4v2+win")
    ap.add_argument("--kv-gib", type=float, default=1.0, help="the engine's KV memory (more: more requests at once)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    loaded = load_model(a.model, "auto", device="auto")  # as LLM loads it: a GPU when there is one
    artifact, tok = artifact_for(loaded, "oscar", None), loaded.tokenizer
    docs = documents(tok, a.tokens, range(a.first_gazetteer, a.first_gazetteer + a.gazetteers), a.prose)
    outs, rows = {}, []
    for name in a.configs.split(","):
        kv = kv_config(name, artifact)
        llm = LLM(loaded, kv=kv.method, config=EngineConfig(kv, kv_memory_bytes=int(a.kv_gib * 2**30)), artifact=artifact if kv.method == "oscar" else None)
        prompts = {(d, t): llm.chat_prompt(f"{text}\n{ask}") for d, text in docs.items() for t, ask in ASKS.items()}
        gen = llm.generate(list(prompts.values()), SamplingParams(max_tokens=a.max_tokens, temperature=0, ignore_eos=True))
        outs[name] = {k: o.token_ids for k, o in zip(prompts, gen)}
        for (doc, task), ids in outs[name].items():
            ref = outs.get("bf16", {}).get((doc, task))
            agree = None if ref is None else next((i for i, (x, y) in enumerate(zip(ref, ids)) if x != y), len(ids))
            rows.append(dict(config=name.partition("=")[0], document=doc, task=task, loop=loop_share(ids), agree=agree,
                             text=tok.decode(ids)))
        llm.close()
        print(summary(name, [r for r in rows if r["config"] == name.partition("=")[0]]), flush=True)
        a.out.mkdir(parents=True, exist_ok=True)  # after each configuration: a run cut short keeps what it wrote
        (a.out / "free_text_quality.json").write_text(json.dumps(dict(tokens=a.tokens, documents=list(docs),
                                                                      rows=rows), indent=1))


def summary(name: str, sel: list[dict]) -> str:
    """One line: the configuration's mean loop share (per task), its stuck outputs and the mean agreement."""
    def mean(xs):
        return sum(xs) / max(len(xs), 1)
    tasks = ", ".join(f"{t} {mean([r['loop'] for r in sel if r['task'] == t]):.3f}" for t in ASKS)
    agree = [r["agree"] for r in sel if r["agree"] is not None]
    return (f"{name}: n {len(sel)}, loop {mean([r['loop'] for r in sel]):.3f} ({tasks}), stuck "
            f"{sum(r['loop'] >= 0.5 for r in sel)}/{len(sel)}" + (f", agree {mean(agree):.1f}" if agree else ""))


if __name__ == "__main__":
    main()
