"""Per-KV-head key bits on the development objective, on the CPU (issue 26, development only).

Does a 4-bit key allocation per KV head beat the per-layer one at the same bytes? The base is the uniform INT2
recipe with the shipped windows (sink 64, recent 64). ``sens`` measures each KV head's sensitivity (development
answer NLL, teacher-forced, when that head alone of its layer stores 4-bit keys); run it once per seed, one
process per core. ``eval`` scores, on other samples and paired against the base: the unquantized cache, the
shipped per-layer recipe (9 layers of 4-bit keys), per-layer allocations from the summed head gains, and per-head
allocations of the same bytes (three heads cost one layer: these models have 3 to 8 KV heads a layer).

The per-head codec is a fake-quantization wrapper (:class:`HeadMix`) the engine does not serve: a finding for the
kernels to follow, not a servable recipe.

    OMP_NUM_THREADS=1 python lab/scripts/twobit_heads.py sens --seeds 1000 --samples 4 --out runs/heads &
    OMP_NUM_THREADS=1 python lab/scripts/twobit_heads.py sens --seeds 1001 --samples 4 --out runs/heads &
    wait; OMP_NUM_THREADS=1 python lab/scripts/twobit_heads.py eval --seeds 1006,1007 --samples 12 --out runs/heads
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from oscarkv.calibrate.default import frontier_artifacts  # noqa: E402
from oscarkv.cli.flags import load  # noqa: E402
from oscarkv.config import KVConfig  # noqa: E402
from oscarkv.eval.objective import dev_samples, dev_scores  # noqa: E402
from oscarkv.eval.paired import difference  # noqa: E402
from oscarkv.quant.artifact import Artifact, ModelFingerprint, apply_recipe  # noqa: E402
from oscarkv.quant.bpe import SlidingLayers  # noqa: E402
from oscarkv.quant.codec import KVCodec, LayerCodec, TensorCodec, build_codec  # noqa: E402

SHIPPED = Path("oscarkv/data/default_recipe.json")


@dataclass(frozen=True)
class HeadMix(TensorCodec):
    """The layer's INT2 key codec, with the KV heads ``heads`` stored by ``high`` (its 4-bit codec) instead."""

    high: TensorCodec | None = None
    heads: tuple[int, ...] = ()

    def encode(self, x_rot: torch.Tensor):
        return TensorCodec.encode(self, x_rot), self.high.encode(x_rot)

    def decode(self, p) -> torch.Tensor:
        out = TensorCodec.decode(self, p[0])
        hi = list(self.heads)
        out[:, hi] = self.high.decode(p[1])[:, hi]
        return out

    def bpe(self, n_low: int, n_bf16: int, page: int) -> float:
        h = self.rotation.shape[0] if self.rotation is not None else 1
        k = len(self.heads) / h
        return (1 - k) * TensorCodec.bpe(self, n_low, n_bf16, page) + k * self.high.bpe(n_low, n_bf16, page)


class Setup:
    """The default model, its shipped artifact, the base recipe and the codec builders."""

    def __init__(self, context: int):
        self.loaded = load("default", "float32", "cpu")
        c = self.loaded.model.config
        self.dims = ModelFingerprint.from_config(c).kv_dims
        self.layers, self.heads = self.dims[0], self.dims[1]
        art = Artifact.load("oscarkv/data/default_rotations", expect=ModelFingerprint.from_config(c))
        self.art, self.sliding, self.context = art, SlidingLayers.from_config(c), context
        uniform = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), frontier_artifacts(art)["int2"])
        rec = json.loads(SHIPPED.read_text()).get("recipe", {})
        self.base = replace(uniform, sink=64, recent=64)
        self.base_codec = self.build(self.base)
        self.shipped_bits = tuple(rec.get("layer_key_bits", ()))
        self.k4 = self.build(replace(self.base, layer_key_bits=(4,) * self.layers))

    def build(self, kv: KVConfig) -> KVCodec:
        return build_codec(kv, *self.dims, self.art, self.sliding)

    def by_layers(self, layers: set[int]) -> KVCodec:
        return self.build(replace(self.base, layer_key_bits=tuple(4 if i in layers else 2 for i in range(self.layers))))

    def by_heads(self, heads: set[tuple[int, int]]) -> KVCodec:
        """The base codec with the key heads ``(layer, head)`` at 4 bits (a whole layer: its own 4-bit codec)."""
        base = self.base_codec
        out = []
        for i, layer in enumerate(base.layers):
            mine = tuple(sorted(h for li, h in heads if li == i))
            if len(mine) == self.heads:
                out.append(LayerCodec(self.k4.layers[i].key, layer.value))
            elif mine:
                low = layer.key
                mix = HeadMix(**{f: getattr(low, f) for f in low.__dataclass_fields__}, high=self.k4.layers[i].key, heads=mine)
                out.append(LayerCodec(mix, layer.value))
            else:
                out.append(layer)
        return replace(base, layers=tuple(out))


def score(setup: Setup, codecs: dict[str, KVCodec], seeds: tuple[int, ...], n: int, log: Path):
    return logged_scores(setup.loaded, codecs, seeds, n, log, context=setup.context)


def logged_scores(loaded, codecs: dict[str, KVCodec], seeds: tuple[int, ...], n: int, log: Path, context: int = 8192,
                  extra: dict | None = None, protocol: str = "forced", artifacts: dict | None = None):
    """``dev_scores`` of ``codecs`` on ``n`` development samples of ``seeds``, each sample's scores (and ``extra``)
    written to ``log`` as one JSON line as soon as it is scored."""
    samples = dev_samples(loaded.tokenizer, context, n, seeds, loaded.model.config.max_position_embeddings)
    t0 = time.time()
    with open(log, "w") as f:
        def progress(sample, nll, acc):
            f.write(json.dumps({"seed": sample.seed, "nll": nll, "accuracy": acc, **(extra or {})}) + "\n")
            f.flush()
            print(f"  sample seed {sample.seed} done ({time.time() - t0:.0f} s)", flush=True)
        return dev_scores(loaded, codecs, samples, progress, protocol, artifacts)


def ranked_heads() -> list[tuple[int, int]]:
    """``(layer, head)`` of positive development key gain (``dev_twobit_8k_heads/sens_*.jsonl``), the largest first:
    the ranking the shipped per-head recipe takes its heads from."""
    gains = head_gains(sorted(Path("lab/results/dev_twobit_8k_heads").glob("sens_*.jsonl")))
    return sorted((k for k, g in gains.items() if g > 0), key=lambda k: -gains[k])


def head_gains(paths: list[Path]) -> dict[tuple[int, int], float]:
    """Mean gain (base NLL minus the head's) per ``(layer, head)`` over every sample of the ``sens`` logs."""
    rows = [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]
    out = {}
    for label in rows[0]["nll"]:
        if label.startswith("head "):
            li, h = (int(x) for x in label.split()[1].split("."))
            out[(li, h)] = sum(r["nll"]["base"] - r["nll"][label] for r in rows) / len(rows)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("sens", "eval"))
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--seeds", default="1000")
    p.add_argument("--out", type=Path, default=Path("runs/twobit_heads"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    setup, seeds = Setup(a.context), tuple(int(x) for x in a.seeds.split(","))
    if a.mode == "sens":
        codecs = {"base": setup.base_codec}
        codecs |= {f"head {i}.{h}": setup.by_heads({(i, h)}) for i in range(setup.layers) for h in range(setup.heads)}
        score(setup, codecs, seeds, a.samples, a.out / f"sens_{a.seeds.replace(',', '_')}.jsonl")
        return
    gains = head_gains(sorted(a.out.glob("sens_*.jsonl")))
    ranked = sorted(gains, key=lambda k: -gains[k])
    layer_gain = {i: sum(g for (li, _), g in gains.items() if li == i) for i in range(setup.layers)}
    top_layers = sorted(layer_gain, key=lambda i: -layer_gain[i])
    shipped = {i for i, b in enumerate(setup.shipped_bits) if b == 4}
    codecs = {"bf16": setup.build(KVConfig("bf16")), "base": setup.base_codec,
              f"shipped ({len(shipped)} layers)": setup.by_layers(shipped)}
    for n in (6, 9, 12):
        codecs[f"layers by summed head gain ({n})"] = setup.by_layers(set(top_layers[:n]))
        codecs[f"heads ({n * setup.heads})"] = setup.by_heads(set(ranked[:n * setup.heads]))
    scores = score(setup, codecs, seeds, a.samples, a.out / "eval_samples.jsonl")
    rows = {}
    for k, v in scores.items():
        d, se = difference(v.per_sample, scores["base"].per_sample)
        rows[k] = {"bpe": round(codecs[k].bpe(a.context), 4), "answer_nll": round(v.answer_nll, 4),
                   "minus_base": round(d, 4), "stderr": round(se, 4)}
        print(f"{k:>36s}: {rows[k]['bpe']:.3f} BPE, NLL {v.answer_nll:.3f} (vs base {d:+.3f} ± {se:.3f})")
    top = [{"layer": li, "head": h, "gain": round(gains[(li, h)], 4)} for li, h in ranked]
    (a.out / "heads.json").write_text(json.dumps({"context": a.context, "rows": rows, "head_gains": top,
                                                  "layer_gains": layer_gain}, indent=1))


if __name__ == "__main__":
    main()
