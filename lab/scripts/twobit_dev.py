"""Per-layer precision allocation on the development objective, on the CPU (issue 26, development only).

Two disjoint sets of development samples (needles in the calibration haystack, never evaluation's seed):
``--sens-seeds`` measure each layer's sensitivity (development answer NLL, teacher-forced protocol, when that
layer alone stores 4-bit keys, the uniform INT2 recipe elsewhere); ``--eval-seeds`` then score, paired sample by
sample, the unquantized cache, INT2 (the uniform recipe shipped before the allocation), K4V2 and the greedy allocation within the budget
(``--max-bpe``, default: INT2's own bits per element at ``--context``) for each candidate window, so the
allocation is chosen on one set and measured on another. One full-precision prefill per sample, shared by every
configuration (``oscarkv.eval.objective.dev_scores``, ``forced``). Writes JSON lines per sample and a summary.

    OMP_NUM_THREADS=1 python lab/scripts/twobit_dev.py --samples 8 --out runs/twobit_dev
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from oscarkv.cli.flags import load
from oscarkv.calibrate.default import frontier_artifacts
from oscarkv.config import KVConfig
from oscarkv.eval import allocate as alloc
from oscarkv.eval.objective import DevScore, dev_samples, dev_scores
from oscarkv.eval.paired import difference
from oscarkv.quant.artifact import Artifact, ModelFingerprint, apply_recipe
from oscarkv.quant.bpe import SlidingLayers
from oscarkv.quant.codec import build_codec

WINDOWS = ((64, 256), (64, 128), (0, 256), (0, 128), (64, 64), (0, 64))
"""Candidate (sink, recent) windows of the allocations: a smaller window frees bytes for 4-bit layers (at 8K,
INT2's own budget holds 0 layers at (64, 256), 6 at (64, 128), 9 at (64, 64) or (0, 128), 12 at (0, 64))."""


def scored(loaded, codecs, samples, log):
    t0 = time.time()

    def progress(sample, nll, acc):
        log.write(json.dumps({"seed": sample.seed, "nll": nll, "accuracy": acc}) + "\n")
        log.flush()
        print(f"  sample seed {sample.seed} done ({time.time() - t0:.0f} s)", flush=True)
    return dev_scores(loaded, codecs, samples, progress, "forced")


def from_recipe(base: KVConfig, rec: dict) -> KVConfig:
    """``base`` with a recipe file's windows and per-layer bits (its key clip is the shipped one)."""
    return replace(base, sink=rec["sink"], recent=rec["recent"], layer_key_bits=tuple(rec["layer_key_bits"]),
                   layer_value_bits=tuple(rec.get("layer_value_bits", ())))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rotations", default="oscarkv/data/default_rotations")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--samples", type=int, default=8, help="samples per set")
    p.add_argument("--sens-seeds", default="1000,1001")
    p.add_argument("--eval-seeds", default="1002,1003")
    p.add_argument("--max-bpe", default="", help="budget(s), comma-separated (default: INT2's own bits per element at --context)")
    p.add_argument("--kinds", default="key", help="what the sensitivities raise per layer: key, value or key,value")
    p.add_argument("--base-recipe", type=Path, default=None, help="a recipe JSON the sensitivities and allocations start from (default: the uniform INT2 recipe)")
    p.add_argument("--out", type=Path, default=Path("runs/twobit_dev"))
    p.add_argument("--sensitivity", type=Path, default=None, help="reuse a sensitivity.json, or a sensitivity_samples.jsonl of a run cut short")
    p.add_argument("--windows", default="all", help="'all' (WINDOWS, the first budget), 'base' (the base recipe's window, every budget) or 'none' (no allocation: only --recipes beside the references)")
    p.add_argument("--recipes", default="", help="recipe JSONs (comma-separated, twobit_recipe_cpu_*.json) scored beside the allocations")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    loaded = load("default", "float32", "cpu")
    c = loaded.model.config
    dims = ModelFingerprint.from_config(c).kv_dims
    art = Artifact.load(a.rotations, expect=ModelFingerprint.from_config(c))

    def build(kv: KVConfig):
        return build_codec(kv, *dims, art, SlidingLayers.from_config(c))

    uniform = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), frontier_artifacts(art)["int2"])  # the uniform INT2 recipe
    base = from_recipe(uniform, json.loads(a.base_recipe.read_text())) if a.base_recipe else uniform
    kinds = tuple(a.kinds.split(","))
    budgets = [float(x) for x in a.max_bpe.split(",")] if a.max_bpe else [build(uniform).bpe(a.context)]
    seeds = [tuple(int(x) for x in s.split(",")) for s in (a.sens_seeds, a.eval_seeds)]
    if a.sensitivity:  # a sensitivity.json, or the per-sample log of a run cut short
        text = a.sensitivity.read_text()
        if a.sensitivity.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            scores = {k: DevScore(0.0, 0.0, tuple(r["nll"][k] for r in rows)) for k in rows[0]["nll"]}
            sens = alloc.sensitivities(scores, kinds, dims[0], art.manifest.get("summary"))
            (a.out / "sensitivity.json").write_text(json.dumps([s.__dict__ for s in sens], indent=1))
        else:
            sens = [alloc.Sensitivity(**r) for r in json.loads(text)]
    else:
        samples = dev_samples(loaded.tokenizer, a.context, a.samples, seeds[0], c.max_position_embeddings)
        with open(a.out / "sensitivity_samples.jsonl", "w") as log:
            scores = scored(loaded, alloc.sensitivity_codecs(base, dims[0], build, kinds), samples, log)
        sens = alloc.sensitivities(scores, kinds, dims[0], art.manifest.get("summary"))
        (a.out / "sensitivity.json").write_text(json.dumps([s.__dict__ for s in sens], indent=1))
    print("\n".join(alloc.report(sens)))
    codecs = {"bf16": build(KVConfig("bf16")), "int2": build(uniform), "k4v2": build(replace(uniform, key_bits=4, key_clip=None))}
    if a.base_recipe:
        codecs["base"] = build(base)
    trials = [((s0, r), budgets[0]) for s0, r in WINDOWS] if a.windows == "all" else \
        [((base.sink, base.recent), b) for b in budgets] if a.windows == "base" else []
    for (s0, r), budget in trials:
        kv = alloc.allocate(sens, replace(base, sink=s0, recent=r), dims[0], build, a.context, budget)
        if kv is not None and kv.allocated:
            nk, nv = (sum(b == 4 for b in bits) for bits in (kv.layer_key_bits, kv.layer_value_bits))
            codecs[f"alloc s={s0} r={r} <= {budget:g} ({nk} K4, {nv} V4)"] = build(kv)
    for path in filter(None, a.recipes.split(",")):
        codecs[f"recipe {Path(path).stem}"] = build(from_recipe(base, json.loads(Path(path).read_text())))
    samples = dev_samples(loaded.tokenizer, a.context, a.samples, seeds[1], c.max_position_embeddings)
    with open(a.out / "allocation_samples.jsonl", "w") as log:
        scores = scored(loaded, codecs, samples, log)
    rows = {}
    for k, v in scores.items():
        d, se = difference(v.per_sample, scores["int2"].per_sample)
        rows[k] = {"bpe": round(codecs[k].bpe(a.context), 4), "answer_nll": round(v.answer_nll, 4),
                   "accuracy": round(v.accuracy, 4), "nll_minus_int2": round(d, 4), "stderr": round(se, 4),
                   "layer_key_bits": list(codecs[k].config.layer_key_bits),
                   "layer_value_bits": list(codecs[k].config.layer_value_bits)}
        print(f"{k:>32s}: {rows[k]['bpe']:.3f} BPE, NLL {v.answer_nll:.3f} (vs INT2 {d:+.3f} ± {se:.3f}), "
              f"accuracy {v.accuracy:.0%}")
    (a.out / "allocation.json").write_text(json.dumps({"budgets": budgets, "context": a.context, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
