"""Which KV heads' 2-bit keys disturb free-running text? Per-head key sensitivity on text (development; lab code).

The shipped recipe's free text repeats itself more than the unquantized cache's (``lab/results/free_text_quality/
gpu4096/``), and its 45 heads of 4-bit keys were ranked by development needle NLL. Here each head the recipe leaves at
2 bits is raised to 4 alone, over the shipped recipe, and scored on text: the NLL of the unquantized model's own greedy
continuation (``--max-tokens``) after a development document and a request (a story, a summary, a copy: as
``free_text_quality``), teacher-forced over the document stored by each codec (``oscarkv.eval.runner.score_sample``:
the request and the continuation as one full-precision chunk). Beside them: the shipped recipe, no 4-bit heads, and
4-bit keys everywhere (the recipe's windows). One JSON line per request in ``--out/sens_SHARD.jsonl``; ``summary``
ranks the heads by their mean gain and sets it beside the needle ranking.

    OMP_NUM_THREADS=1 python -m lab.scripts.text_head_sens run --shard 0 --shards 2 --out DIR &
    OMP_NUM_THREADS=1 python -m lab.scripts.text_head_sens run --shard 1 --shards 2 --out DIR &
    wait; python -m lab.scripts.text_head_sens summary --out DIR
    python -m lab.scripts.text_head_sens recipes --top 10 --out DIR   # candidates for development as served

``recipes`` writes two candidate recipes (development, for the GPU lanes): ``recipe_text{N}.json``, the shipped recipe
plus the ``N`` heads of most text gain (more bytes), and ``recipe_swap{N}.json``, those heads in place of the shipped
recipe's ``N`` heads of least needle gain (the same bytes).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from lab.scripts.free_text_quality import ASKS
from lab.scripts.make_prose_haystack import gazetteer
from lab.scripts.spec_draft_policies import slices
from lab.scripts.twobit_heads import ranked_heads
from oscarkv.cli.flags import load
from oscarkv.config import KVConfig
from oscarkv.data import default_recipe, default_rotations_dir
from oscarkv.eval.runner import prefill, score_sample
from oscarkv.quant.artifact import Artifact, ModelFingerprint, apply_recipe
from oscarkv.quant.codec import build_codec

TAIL = 48
"""Prompt tokens scored as the question chunk (the request and the chat template's end); the rest is the document."""


def configs(ship: KVConfig, layers: int, heads: int) -> dict[str, KVConfig]:
    """The shipped recipe, it without 4-bit heads, 4-bit keys everywhere, and it plus each 2-bit head raised alone."""
    out = {"shipped": ship, "none": replace(ship, layer_key_heads=((),) * layers),
           "k4": replace(ship, key_bits=4, layer_key_heads=())}
    for li in range(layers):
        for h in range(heads):
            if h not in ship.layer_key_heads[li]:
                mine = tuple(tuple(sorted({*hs, h})) if i == li else hs for i, hs in enumerate(ship.layer_key_heads))
                out[f"{li}.{h}"] = replace(ship, layer_key_heads=mine)
    return out


def run(a) -> None:
    loaded = load("default", "float32", "cpu")
    model, tok = loaded.model, loaded.tokenizer
    dims = ModelFingerprint.from_config(model.config).kv_dims
    art = Artifact.load(default_rotations_dir())
    ship = apply_recipe(KVConfig("oscar", group_size=art.manifest["group_size"]), art)
    codecs = {k: build_codec(kv, *dims, art) for k, kv in configs(ship, dims[0], dims[1]).items()}
    docs = [slices(tok, gazetteer(f"oscarkv gazetteer dev {i}"), a.tokens, 1)[0]
            for i in range(a.first_gazetteer, a.first_gazetteer + a.gazetteers)]
    requests = [(d, t) for d in range(len(docs)) for t in ASKS][a.shard::a.shards]
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / f"sens_{a.shard}.jsonl", "a") as f:
        for d, task in requests:
            t0 = time.time()
            text = tok.apply_chat_template([{"role": "user", "content": f"{docs[d]}\n{ASKS[task]}"}], tokenize=False,
                                           add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
            with torch.inference_mode():
                gen = model.generate(ids, max_new_tokens=a.max_tokens, do_sample=False)[:, ids.shape[1]:]
                cache = prefill(model, ids[:, :-TAIL])
                nll = {k: score_sample(model, cache, c, ids[:, -TAIL:], gen, [(0, gen.shape[1])])[1]
                       for k, c in codecs.items()}
            f.write(json.dumps({"document": a.first_gazetteer + d, "task": task, "nll": nll}) + "\n")
            f.flush()
            print(f"gaz{a.first_gazetteer + d} {task}: shipped {nll['shipped']:.3f}, none {nll['none']:.3f}, "
                  f"k4 {nll['k4']:.3f} ({time.time() - t0:.0f} s)", flush=True)


def summary(a) -> None:
    rows = [json.loads(x) for p in sorted(a.out.glob("sens_*.jsonl")) for x in p.read_text().splitlines() if x]
    n = len(rows)

    def mean(k: str) -> float:
        return sum(r["nll"][k] for r in rows) / n
    gains = {k: mean("shipped") - mean(k) for k in rows[0]["nll"] if "." in k}
    needle = {f"{li}.{h}" for li, h in ranked_heads()}
    top = sorted(gains, key=lambda k: -gains[k])
    lines = [f"{n} requests; mean NLL: shipped {mean('shipped'):.4f}, no 4-bit heads {mean('none'):.4f}, "
             f"4-bit keys everywhere {mean('k4'):.4f}",
             f"gain of each 2-bit head raised alone (shipped NLL minus its): positive {sum(g > 0 for g in gains.values())} "
             f"of {len(gains)}; of the top 10, with positive needle gain: {sum(k in needle for k in top[:10])}",
             "| head (layer.head) | text gain (nats) |", "|---|---:|"] + [f"| {k} | {gains[k]:+.4f} |" for k in top[:15]]
    (a.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def text_ranking(out: Path) -> list[tuple[int, int]]:
    """``(layer, head)`` of positive mean text gain over the shipped recipe, the largest first."""
    rows = [json.loads(x) for p in sorted(out.glob("sens_*.jsonl")) for x in p.read_text().splitlines() if x]
    gains = {k: sum(r["nll"]["shipped"] - r["nll"][k] for r in rows) for k in rows[0]["nll"] if "." in k}
    return [tuple(map(int, k.split("."))) for k in sorted(gains, key=lambda k: -gains[k]) if gains[k] > 0]


def recipes(a) -> None:
    from lab.scripts.twobit_artifacts import SHIPPED
    from oscarkv.calibrate.default import frontier_artifacts

    entry = default_recipe()
    ship = [(li, h) for li, hs in enumerate(entry["recipe"]["layer_key_heads"]) for h in hs]
    needle = [k for k in ranked_heads() if k in ship]  # the shipped heads, most needle gain first
    text = text_ranking(a.out)[:a.top]
    art = frontier_artifacts(Artifact.load(SHIPPED))["int2"]
    for name, heads, what in ((f"text{a.top}", ship + text, f"the shipped recipe plus the {a.top} 2-bit heads of most text gain"),
                              (f"swap{a.top}", needle[:len(needle) - a.top] + text, f"the {a.top} 2-bit heads of most text gain in "
                               f"place of the shipped recipe's {a.top} of least needle gain")):
        rec = {**entry["recipe"], "layer_key_heads": [sorted(h for li, h in heads if li == i) for i in range(len(entry["recipe"]["layer_key_heads"]))]}
        kv = apply_recipe(KVConfig("oscar", group_size=art.manifest["group_size"]), Artifact({**art.manifest, "recipe": rec}, art.tensors))
        codec = build_codec(kv, *art.fingerprint.kv_dims, art)
        bpe = [round(codec.bpe(n), 4) for n in (4096, 8192, 102400)]
        rec["bpe"] = bpe[1]
        (a.out / f"recipe_{name}.json").write_text(json.dumps({"provenance": (
            f"a development candidate, not shipped: {what} (lab.scripts.text_head_sens, {a.out}); {len(heads)} heads, "
            f"{bpe[0]} / {bpe[1]} / {bpe[2]} BPE at 4K / 8K / 100K by the codec"), "recipe": rec}, indent=1) + "\n")
        print(f"{name}: {len(heads)} heads, {bpe} BPE at 4K / 8K / 100K")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("run", "summary", "recipes"))
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--gazetteers", type=int, default=8)
    ap.add_argument("--first-gazetteer", type=int, default=101, help="development seeds apart from the text study's 1-36")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    {"run": run, "summary": summary, "recipes": recipes}[a.mode](a)


if __name__ == "__main__":
    main()
