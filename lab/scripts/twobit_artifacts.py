"""Artifacts for the two-bit study (issue 26): the shipped rotations with another recipe in the manifest.

    python lab/scripts/twobit_artifacts.py budget 4096            # INT2's bits per element at 4096 tokens (the shipped recipe)
    python lab/scripts/twobit_artifacts.py write RECIPE.json OUT  # OUT/alloc (RECIPE's allocation) and OUT/k4v2

``RECIPE.json``: a recipe as ``oscarkv calibrate --allocate`` writes it into a manifest (``sink``, ``recent``,
``layer_key_bits``, optionally ``layer_value_bits`` and ``key_clip``), or a whole manifest holding one. The
rotations, clips and fingerprint are the shipped artifact's; only the recipe differs, and each artifact is
validated on load as ``serve`` loads it.
"""

import json
import sys
from pathlib import Path

from oscarkv.config import KVConfig
from oscarkv.quant.artifact import Artifact, apply_recipe
from oscarkv.quant.codec import build_codec

SHIPPED = Path("oscarkv/data/default_rotations")


def budget(context: int) -> float:
    art = Artifact.load(SHIPPED)
    kv = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), art)
    return build_codec(kv, *art.fingerprint.kv_dims, art).bpe(context)


def write(recipe_file: Path, out: Path) -> None:
    rec = json.loads(recipe_file.read_text())
    rec = rec.get("recipe", rec)
    shipped = Artifact.load(SHIPPED)
    base = {k: v for k, v in shipped.manifest["recipe"].items() if k != "candidates"}
    recipes = {"alloc": {**base, **{k: v for k, v in rec.items() if k != "candidates"}},
               "k4v2": {**base, "key_bits": 4}}
    recipes["k4v2"].pop("key_clip", None)  # 4-bit keys are not clipped
    for name, r in recipes.items():
        art = Artifact({**shipped.manifest, "recipe": r}, shipped.tensors)
        art.save(out / name)
        kv = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), Artifact.load(out / name))
        codec = build_codec(kv, *art.fingerprint.kv_dims, art)
        print(f"{name}: sink {kv.sink}, recent {kv.recent}, key bits {''.join(map(str, kv.layer_key_bits)) or kv.key_bits}, "
              f"{', '.join(f'{codec.bpe(t):.3f}' for t in (4096, 8192, 102400))} bits per element at 4K / 8K / 100K")


if __name__ == "__main__":
    if sys.argv[1] == "budget":
        print(f"{budget(int(sys.argv[2])):.4f}")
    else:
        write(Path(sys.argv[2]), Path(sys.argv[3]))
