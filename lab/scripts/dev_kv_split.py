"""Development diagnostic: which side of the INT2 cache costs NIAH accuracy, keys or values?

Runs niah_single on *development* samples (calibration-text haystack, a seed other than the
evaluation's) with an OSCAR artifact's codec, and with two hybrids of it: INT2 keys + 4-bit
values (same rotation, centering and clip) and 4-bit keys + INT2 values. No windows. Prints
accuracy and mean answer NLL per codec.

    OMP_NUM_THREADS=1 python lab/scripts/dev_kv_split.py --rotations DIR [--samples 6] [--seed 1000]
"""

from __future__ import annotations

import argparse
import dataclasses

from oscarkv.config import EvalConfig
from oscarkv.eval import tasks as task_lib
from oscarkv.eval.runner import build_codecs, prefill, score_sample
from oscarkv.eval.samples import answer_spans
from oscarkv.models.loader import load_model
from oscarkv.quant.artifact import Artifact, ModelFingerprint
from oscarkv.quant.codec import KVCodec, LayerCodec


def hybrid(codec: KVCodec, key_bits: int, value_bits: int) -> KVCodec:
    layers = tuple(LayerCodec(dataclasses.replace(lc.key, bits=key_bits), dataclasses.replace(lc.value, bits=value_bits))
                   for lc in codec.layers)
    return dataclasses.replace(codec, layers=layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rotations", required=True)
    p.add_argument("--samples", type=int, default=6)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--context", type=int, default=4096)
    args = p.parse_args()
    loaded = load_model("default")
    model, tok = loaded.model, loaded.tokenizer
    art = Artifact.load(args.rotations, expect=ModelFingerprint.from_config(loaded.config))
    base = build_codecs(model, EvalConfig(methods=("oscar",), windows=(False,)), {"": art})["oscar"]
    codecs = {"K2 V2 (oscar)": base, "K2 V4": hybrid(base, 2, 4), "K4 V2": hybrid(base, 4, 2)}
    sums = {k: [0.0, 0.0] for k in codecs}
    samples = task_lib.generate("niah_single", args.context, args.samples, tok, seed=args.seed, haystack="calibration")
    for i, s in enumerate(samples):
        doc = prefill(model, tok(s.document, add_special_tokens=False, return_tensors="pt").input_ids)
        q = tok(s.question, add_special_tokens=False, return_tensors="pt").input_ids
        target, spans = answer_spans(tok, task_lib.answer_target(s), s.answers)
        row = []
        for name, codec in codecs.items():
            acc, nll, _ = score_sample(model, doc, codec, q, target, spans)
            sums[name][0] += acc
            sums[name][1] += nll
            row.append(f"{name}: {acc:.0f} {nll:.3f}")
        print(f"sample {i}: " + " | ".join(row), flush=True)
    print(f"\n{'codec':<15} {'accuracy':>8} {'answer NLL':>10}   ({args.samples} samples, seed {args.seed}, {args.context} tokens)")
    for name, (acc, nll) in sums.items():
        print(f"{name:<15} {acc / args.samples:>8.2f} {nll / args.samples:>10.3f}")


if __name__ == "__main__":
    main()
