"""Greedy allocations of 4-bit keys at larger budgets, from measured per-layer sensitivities (issue 26, development only).

The 8K allocation within INT2's bytes (9 layers, ``twobit_recipe_cpu_8192_dev8k.json``) kept 82% of the
unquantized cache as served; this writes the next rungs of the frontier from the same development
sensitivities (``lab/results/dev_twobit_8k/sensitivity.json``: each layer's paired answer-NLL gain when its
keys alone are 4-bit, 6 samples of the calibration haystack at 8192 tokens, seeds 1000/1001), no new data.

For each ``BUDGET:SINK:RECENT`` (bits per element at ``--context``, the codec's figure: what is stored, windows
included) layers are raised in order of gain while the budget holds. Unlike ``oscarkv.eval.allocate.allocate``,
layers whose measured gain is not positive are raised too (last, in order of gain): at these budgets every
positive layer is already in, and a non-positive gain is noise (the largest loss, layer 6's, is 1.9 standard
errors), not a reason to leave bytes unspent. Prints each recipe's bits per element at 4K / 8K / 100K.

    python lab/scripts/twobit_budgets.py 3.3:64:64 3.5:64:64 3.7:64:128   # lab/scripts/twobit_recipe_8192_b<B>.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from oscarkv.calibrate.default import frontier_artifacts
from oscarkv.config import KVConfig
from oscarkv.eval import allocate as alloc
from oscarkv.quant.artifact import Artifact, apply_recipe
from oscarkv.quant.codec import build_codec

SHIPPED = Path("oscarkv/data/default_rotations")
SENSITIVITY = Path("lab/results/dev_twobit_8k/sensitivity.json")


def greedy(sens: list[alloc.Sensitivity], base: KVConfig, build, context: int, budget: float) -> KVConfig:
    """``base`` with layers raised in order of gain (every layer, positive gains first) within ``budget``."""
    n = len(sens)
    chosen: frozenset[tuple[int, str]] = frozenset()
    for s in sorted(sens, key=lambda s: -s.gain):
        trial = chosen | {(s.layer, s.kind)}
        if build(alloc.raised(base, n, trial)).bpe(context) <= budget:
            chosen = trial
    return alloc.raised(base, n, chosen)


def recipe(kv: KVConfig, bpe: float, budget: float, context: int) -> dict:
    """The recipe file (the fields of ``twobit_recipe_cpu_*.json``, which ``twobit_artifacts.py write`` reads)."""
    keys = list(kv.layer_key_bits)
    return {"method": "oscar", "sink": kv.sink, "recent": kv.recent, "page_size": kv.page_size, "key_bits": 2,
            "value_bits": 2, "key_clip": kv.key_clip, "layer_key_bits": keys, "layer_value_bits": [2] * len(keys),
            "bpe": round(bpe, 4), "context": context, "max_bpe": budget,
            "objective": f"greedy by development answer-NLL gain ({SENSITIVITY}: teacher-forced, 6 samples of seeds "
                         f"1000/1001 at {context} tokens; non-positive gains raised last), lab/scripts/twobit_budgets.py",
            "protocol": "forced", "dev_context": context, "dev_samples": 6, "dev_seeds": [1000, 1001],
            "haystack": "calibration"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("budgets", nargs="+", help="BUDGET:SINK:RECENT, e.g. 3.5:64:64")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--sensitivity", type=Path, default=SENSITIVITY)
    p.add_argument("--out-dir", type=Path, default=Path("lab/scripts"))
    a = p.parse_args()
    sens = [alloc.Sensitivity(**r) for r in json.loads(a.sensitivity.read_text())]
    art = Artifact.load(SHIPPED)
    base = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), frontier_artifacts(art)["int2"])

    def build(kv: KVConfig):
        return build_codec(kv, *art.fingerprint.kv_dims, art)

    for spec in a.budgets:
        budget, sink, recent = spec.split(":")
        kv = greedy(sens, replace(base, sink=int(sink), recent=int(recent)), build, a.context, float(budget))
        codec = build(kv)
        out = a.out_dir / f"twobit_recipe_{a.context}_b{budget}.json"
        out.write_text(json.dumps(recipe(kv, codec.bpe(a.context), float(budget), a.context), indent=1) + "\n")
        print(f"{out}: sink {sink}, recent {recent}, {sum(b == 4 for b in kv.layer_key_bits)} layers of 4-bit keys "
              f"({''.join(map(str, kv.layer_key_bits))}), "
              f"{' / '.join(f'{codec.bpe(t):.3f}' for t in (4096, 8192, 102400))} BPE at 4K / 8K / 100K")


if __name__ == "__main__":
    main()
