"""Artifacts for the two-bit study (issue 26): the shipped rotations with another recipe in the manifest.

    python lab/scripts/twobit_artifacts.py budget 4096            # INT2's bits per element at 4096 tokens
    python lab/scripts/twobit_artifacts.py write RECIPE.json OUT  # OUT/alloc (RECIPE's allocation), OUT/int2, OUT/k4v2

``RECIPE.json``: a recipe as ``oscarkv calibrate --allocate`` writes it into a manifest (``sink``, ``recent``,
``layer_key_bits``, optionally ``layer_value_bits`` and ``key_clip``), or a whole manifest holding one. The
rotations, clips and fingerprint are the shipped artifact's; only the recipe differs, and each artifact is
validated on load as ``serve`` loads it. INT2 and K4V2 are the default recipe's ``frontier`` (the uniform INT2
recipe shipped before the allocation; ``oscarkv.calibrate.default.frontier_artifacts``, as ``oscarkv demo`` runs them).
"""

import json
import sys
from pathlib import Path

from oscarkv.calibrate.default import frontier_artifacts
from oscarkv.config import KVConfig
from oscarkv.quant.artifact import Artifact, apply_recipe
from oscarkv.quant.codec import build_codec

SHIPPED = Path("oscarkv/data/default_rotations")


def budget(context: int) -> float:
    art = frontier_artifacts(Artifact.load(SHIPPED))["int2"]
    kv = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), art)
    return build_codec(kv, *art.fingerprint.kv_dims, art).bpe(context)


def write(recipe_file: Path, out: Path) -> None:
    rec = json.loads(recipe_file.read_text())
    rec = rec.get("recipe", rec)
    frontier = frontier_artifacts(Artifact.load(SHIPPED))
    base = {k: v for k, v in frontier["int2"].manifest["recipe"].items() if k != "candidates"}
    arts = {"alloc": frontier["int2"].with_recipe({**base, **{k: v for k, v in rec.items() if k != "candidates"}}),
            "int2": frontier["int2"], "k4v2": frontier["k4v2"]}
    for name, art in arts.items():
        art.save(out / name)
        kv = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), Artifact.load(out / name))
        codec = build_codec(kv, *art.fingerprint.kv_dims, art)
        print(f"{name}: sink {kv.sink}, recent {kv.recent}, key bits {''.join(map(str, kv.layer_key_bits)) or kv.key_bits}, "
              f"{sum(map(len, kv.layer_key_heads))} heads of 4-bit keys, "
              f"{', '.join(f'{codec.bpe(t):.3f}' for t in (4096, 8192, 102400))} bits per element at 4K / 8K / 100K")


if __name__ == "__main__":
    if sys.argv[1] == "budget":
        print(f"{budget(int(sys.argv[2])):.4f}")
    else:
        write(Path(sys.argv[2]), Path(sys.argv[3]))
