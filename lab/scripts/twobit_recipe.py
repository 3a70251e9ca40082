"""The recipe JSON of one allocation of a CPU development study (``lab/scripts/twobit_dev.py``), for gpu_twobit.sh.

``twobit_dev.py`` writes ``OUT/allocation.json``: per configuration its bits per element at the study's context,
its paired development scores and ``layer_key_bits``. This writes the chosen allocation (``--sink``, ``--recent``)
as a recipe in the format of ``lab/scripts/twobit_recipe_cpu_CONTEXT.json``: what ``twobit_artifacts.py write``
and ``gpu_twobit.sh eval`` (``RECIPE=``) read. The key clip is the shipped recipe's.

    python lab/scripts/twobit_recipe.py runs/twobit_dev_8k --sink 64 --recent 64 --samples 6 \\
        --out lab/scripts/twobit_recipe_cpu_8192_dev8k.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from oscarkv.calibrate.default import frontier_artifacts
from oscarkv.config import KVConfig
from oscarkv.quant.artifact import Artifact, apply_recipe
from oscarkv.quant.codec import build_codec

SHIPPED = Path("oscarkv/data/default_rotations")


def chosen_row(rows: dict, sink: int, recent: int) -> dict:
    """The ``alloc s=SINK r=RECENT (N layers)`` row of ``allocation.json``."""
    for label, row in rows.items():
        m = re.fullmatch(r"alloc s=(\d+) r=(\d+) \(\d+ layers\)", label)
        if m and (int(m[1]), int(m[2])) == (sink, recent):
            return row
    raise SystemExit(f"no allocation with sink {sink}, recent {recent} in {sorted(rows)}")


def recipe(row: dict, sink: int, recent: int, study: dict, a: argparse.Namespace) -> dict:
    """The recipe: the uniform INT2 recipe's fields with the allocation's windows and per-layer key bits."""
    art = Artifact.load(SHIPPED)
    base = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), frontier_artifacts(art)["int2"])
    keys = row["layer_key_bits"]
    kv = KVConfig("oscar", sink=sink, recent=recent, page_size=base.page_size, group_size=base.group_size,
                  key_bits=2, value_bits=2, key_clip=base.key_clip, layer_key_bits=tuple(keys),
                  layer_value_bits=(2,) * len(keys))
    bpe = build_codec(kv, *art.fingerprint.kv_dims, art).bpe(study["context"])
    assert abs(bpe - row["bpe"]) < 1e-3, f"recomputed {bpe:.4f} BPE, the study logged {row['bpe']}"
    seeds = [int(s) for s in a.sens_seeds.split(",")]
    return {"method": "oscar", "sink": sink, "recent": recent, "page_size": kv.page_size, "key_bits": 2,
            "value_bits": 2, "key_clip": kv.key_clip, "layer_key_bits": keys, "layer_value_bits": [2] * len(keys),
            "bpe": round(bpe, 4), "context": study["context"], "max_bpe": round(study["budget"], 4),
            "objective": f"development NIAH answer NLL (teacher-forced, lab/scripts/twobit_dev.py: sensitivities on "
                         f"{a.samples} samples of seeds {a.sens_seeds.replace(',', '/')}, allocations scored on "
                         f"{a.samples} of seeds {a.eval_seeds.replace(',', '/')})",
            "protocol": "forced", "dev_context": study["context"], "dev_samples": a.samples, "dev_seeds": seeds,
            "haystack": "calibration"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", type=Path, help="the --out folder of twobit_dev.py (holding allocation.json)")
    p.add_argument("--sink", type=int, required=True)
    p.add_argument("--recent", type=int, required=True)
    p.add_argument("--samples", type=int, required=True, help="the study's --samples")
    p.add_argument("--sens-seeds", default="1000,1001")
    p.add_argument("--eval-seeds", default="1002,1003")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    study = json.loads((a.study / "allocation.json").read_text())
    row = chosen_row(study["rows"], a.sink, a.recent)
    a.out.write_text(json.dumps(recipe(row, a.sink, a.recent, study, a), indent=1))
    print(f"{a.out}: sink {a.sink}, recent {a.recent}, {sum(b == 4 for b in row['layer_key_bits'])} layers of "
          f"4-bit keys, {row['bpe']:.4f} BPE at {study['context']} (budget {study['budget']:.4f})")


if __name__ == "__main__":
    main()
