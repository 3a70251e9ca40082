"""Per-KV-head value sensitivities on top of the shipped recipe at 8K (issue 26, development only): which heads'
values, at 4 bits alone, gain most answer NLL once 28 heads already hold 4-bit keys?

The shipped recipe's 8K error sits past the keys (``docs/RESULTS.md``: 4-bit values everywhere close as much of the
per-layer recipe's gap as 4-bit keys did). Each configuration: the shipped recipe with one KV head's values at 4 bits
(``TensorCodec.head_bits`` on the value codec: the numeric spec serves it in the HF cache; the engine's pools split
by key bits only, so this is a study, not a servable recipe). Teacher-forced answer NLL on development samples
(seeds 1000/1001, the key-head study's), paired against the shipped recipe.

    OMP_NUM_THREADS=1 python lab/scripts/twobit_value_heads.py --seeds 1000 --samples 4 --out DIR &
    OMP_NUM_THREADS=1 python lab/scripts/twobit_value_heads.py --seeds 1001 --samples 4 --out DIR &
    wait; python lab/scripts/twobit_value_heads.py --combine --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.scripts.twobit_artifacts import SHIPPED  # noqa: E402
from lab.scripts.twobit_heads import logged_scores  # noqa: E402
from oscarkv.cli.flags import load  # noqa: E402
from oscarkv.config import KVConfig  # noqa: E402
from oscarkv.eval.paired import difference  # noqa: E402
from oscarkv.quant.artifact import Artifact, apply_recipe  # noqa: E402
from oscarkv.quant.codec import KVCodec, LayerCodec, build_codec  # noqa: E402


def codecs() -> dict[str, KVCodec]:
    art = Artifact.load(SHIPPED)  # the shipped recipe: 28 heads of 4-bit keys, sink 64, recent 64
    dims = art.fingerprint.kv_dims
    base = build_codec(apply_recipe(KVConfig(group_size=art.manifest["group_size"]), art), *dims, art)
    out = {"shipped": base}
    for i, layer in enumerate(base.layers):
        for h in range(dims[1]):
            value = replace(layer.value, head_bits=tuple(4 if j == h else 2 for j in range(dims[1])))
            layers = list(base.layers)
            layers[i] = LayerCodec(layer.key, value)
            out[f"value {i}.{h}"] = replace(base, layers=tuple(layers))
    return out


def combine(out: Path) -> None:
    rows = [json.loads(line) for f in sorted(out.glob("sens_*.jsonl")) for line in f.read_text().splitlines()]
    base = [r["nll"]["shipped"] for r in rows]
    gains = {}
    for label in rows[0]["nll"]:
        if label != "shipped":
            d, se = difference(base, [r["nll"][label] for r in rows])
            gains[label] = {"gain": d, "stderr": se}
    ranked = sorted(gains.items(), key=lambda kv: -kv[1]["gain"])
    total = sum(max(0.0, g["gain"]) for g in gains.values())
    for label, g in ranked[:15]:
        print(f"{label:<12} gain {g['gain']:+.4f} ± {g['stderr']:.4f} nats")
    print(f"{len(rows)} samples; shipped NLL {sum(base) / len(base):.3f}; positive gains sum {total:.3f}; "
          f"top 10 carry {sum(max(0.0, g['gain']) for _, g in ranked[:10]) / max(total, 1e-9):.0%}")
    (out / "value_heads.json").write_text(json.dumps({"samples": len(rows), "gains": dict(ranked)}, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1000")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--combine", action="store_true")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.combine:
        return combine(a.out)
    loaded = load("default", "float32", "cpu")
    logged_scores(loaded, codecs(), tuple(int(s) for s in a.seeds.split(",")), a.samples,
                  a.out / f"sens_{a.seeds.replace(',', '_')}.jsonl")

if __name__ == "__main__":
    main()
