"""The clip ratio on the development objective as served: copies of an artifact with other clips, scored.

Each ``NAME=KEY:VALUE`` writes ``OUT/NAME``, the artifact's rotations with every layer's key clip
ratio set to KEY and value clip ratio to VALUE (``fit`` keeps the fitted per-layer ratios; a ratio
of 1 disables clipping, ``oscarkv.quant.clip``). With ``--score``, every copy runs the development
samples (calibration haystack, ``oscarkv.eval.objective.dev_samples``) through the engine's chunked
prefill at the default windows (``--protocol served`` of the recipe search), and the answer NLL of
each is printed with its paired difference against the first variant; ``OUT/dev_clips.json`` keeps
every sample's NLL (lab/DEVELOPMENT.md).

    OMP_NUM_THREADS=1 python lab/scripts/clip_variants.py --rotations oscarkv/data/default_rotations \\
        --out runs/clips --score --samples 12 fitted=fit:fit keys_off=1:fit keys_85=0.85:fit
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def variant(src: Path, dst: Path, key: str, value: str) -> None:
    manifest = json.loads((src / "manifest.json").read_text())
    for kind, ratio in (("key", key), ("value", value)):
        if ratio != "fit":
            c = float(ratio)
            if not 0.0 < c <= 1.0:
                raise SystemExit(f"clip ratio must be in (0, 1], got {ratio}")
            manifest["clip"][kind] = [c] * len(manifest["clip"][kind])
    manifest.setdefault("notes", []).append(f"clip variant of {src}: key {key}, value {value}")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.safetensors"):
        shutil.copy(f, dst / f.name)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def score(out: Path, names: list[str], samples: int, context: int) -> None:
    from oscarkv.config import KVConfig
    from oscarkv.eval.objective import dev_samples, dev_scores
    from oscarkv.eval.paired import difference
    from oscarkv.models.loader import load_model
    from oscarkv.quant.artifact import Artifact, ModelFingerprint
    from oscarkv.quant.bpe import SlidingLayers
    from oscarkv.quant.codec import build_codec

    loaded = load_model("default", device="cpu")
    fp = ModelFingerprint.from_config(loaded.config)
    arts = {n: Artifact.load(out / n, expect=fp) for n in names}
    codecs = {n: build_codec(KVConfig("oscar", group_size=a.manifest["group_size"]), *fp.kv_dims, a,
                             SlidingLayers.from_config(loaded.config)) for n, a in arts.items()}
    scores = dev_scores(loaded, codecs, dev_samples(loaded.tokenizer, context, samples), protocol="served", artifacts=arts)
    base = scores[names[0]].per_sample
    print(f"| variant | answer NLL | accuracy | minus {names[0]} |")
    for n in names:
        diff, se = difference(scores[n].per_sample, base)
        print(f"| {n} | {scores[n].answer_nll:.3f} | {100 * scores[n].accuracy:.0f}% | {diff:+.3f} ± {se:.3f} |")
    (out / "dev_clips.json").write_text(json.dumps({n: {"answer_nll": s.answer_nll, "accuracy": s.accuracy,
                                                        "per_sample": s.per_sample} for n, s in scores.items()}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rotations", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--score", action="store_true", help="score the variants on the development objective, as served")
    p.add_argument("--samples", type=int, default=12, help="development samples")
    p.add_argument("--context", type=int, default=2048, help="development context in tokens")
    p.add_argument("variants", nargs="+", help="NAME=KEY:VALUE, each a ratio in (0, 1] or 'fit'")
    args = p.parse_args()
    for spec in args.variants:
        name, _, ratios = spec.partition("=")
        key, _, value = ratios.partition(":")
        if not (name and key and value):
            raise SystemExit(f"bad variant {spec!r}: expected NAME=KEY:VALUE")
        variant(args.rotations, args.out / name, key, value)
        print(args.out / name)
    if args.score:
        score(args.out, [v.partition("=")[0] for v in args.variants], args.samples, args.context)


if __name__ == "__main__":
    main()
