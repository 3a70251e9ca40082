"""A 3-bit key rung on the development objective at 8K, on the CPU (issue 26, development only).

The issue names a 3-bit key rung "if the allocation needs the middle step". At the bytes of one 4-bit key layer,
two layers can hold 3-bit keys: is spreading 3-bit keys over twice the layers better than the shipped per-layer
recipe (9 layers of 4-bit keys)? Layers are ranked by the summed per-head key gains of
``lab/results/dev_twobit_8k_heads/sens_*.jsonl`` (``twobit_heads.py sens``). The 3-bit code is a fake-quantization
wrapper (:class:`Key3`: per-token asymmetric, 8 levels, an fp16 scale and zero per group, the 4-bit rung's clip)
the engine does not serve. Scored like ``twobit_heads.py eval`` (teacher-forced answer NLL, base: uniform INT2
with sink 64 / recent 64), on the same 12 samples (seeds 1006, 1007), one process per seed, then ``combine``.

    OMP_NUM_THREADS=1 python lab/scripts/twobit_k3.py run --seeds 1006 --samples 6 --out runs/k3 &
    OMP_NUM_THREADS=1 python lab/scripts/twobit_k3.py run --seeds 1007 --samples 6 --out runs/k3 &
    wait; python lab/scripts/twobit_k3.py combine --out runs/k3

``--study heads`` (same commands): per-head 4-bit keys in 36 to 63 heads beside 4-bit keys in every layer.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.scripts.twobit_heads import Setup, head_gains, score  # noqa: E402
from oscarkv.config import KVConfig  # noqa: E402
from oscarkv.eval.paired import difference  # noqa: E402
from oscarkv.quant.bpe import bits_per_element  # noqa: E402
from oscarkv.quant.clip import clip_groups  # noqa: E402
from oscarkv.quant.codec import LayerCodec, TensorCodec  # noqa: E402

SENS = Path("lab/results/dev_twobit_8k_heads")


@dataclass(frozen=True)
class Key3(TensorCodec):
    """A layer's key codec at 3 bits: clip, then per token and group ``m + s · code``, code in 0..7."""

    def encode(self, x_rot: torch.Tensor):
        x = clip_groups(x_rot, self.clip, self.group).float()
        xg = x.reshape(*x.shape[:-1], -1, self.group)
        lo, hi = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
        s, m = ((hi - lo) / 7).half().float(), lo.half().float()
        codes = torch.where(s > 0, (xg - m) / torch.where(s > 0, s, 1.0), 0.0).add(0.5).floor().clamp(0, 7)
        return codes, s, m

    def decode(self, p) -> torch.Tensor:
        codes, s, m = p
        return (m + s * codes).flatten(-2)

    def bpe(self, n_low: int, n_bf16: int, page: int) -> float:
        return bits_per_element(n_low, n_bf16, 3, self.group)


def codecs(setup: Setup) -> dict:
    gains = head_gains(sorted(SENS.glob("sens_*.jsonl")))
    layer_gain = {i: sum(g for (li, _), g in gains.items() if li == i) for i in range(setup.layers)}
    ranked = sorted(layer_gain, key=lambda i: -layer_gain[i])

    def mix(k4: set[int], k3: set[int]):
        out = []
        for i, layer in enumerate(setup.base_codec.layers):
            if i in k4:
                out.append(LayerCodec(setup.k4.layers[i].key, layer.value))
            elif i in k3:
                hi = setup.k4.layers[i].key
                out.append(LayerCodec(Key3(**{f: getattr(hi, f) for f in hi.__dataclass_fields__}), layer.value))
            else:
                out.append(layer)
        return replace(setup.base_codec, layers=tuple(out))

    shipped = {i for i, b in enumerate(setup.shipped_bits) if b == 4}
    return {"bf16": setup.build(KVConfig("bf16")), "base": setup.base_codec,
            f"shipped ({len(shipped)} layers K4)": setup.by_layers(shipped),
            "K3 in 18 layers": mix(set(), set(ranked[:18])),
            "K4 in 3 + K3 in 12 layers": mix(set(ranked[:3]), set(ranked[3:15])),
            "K3 in 24 layers": mix(set(), set(ranked[:24])),
            "K3 in all 30 layers": mix(set(), set(ranked))}


def head_curve(setup: Setup, counts: tuple[int, ...]) -> dict:
    """``--study heads``: 4-bit keys in the 36 to 63 most sensitive KV heads, and in every layer (K4V2), beside the
    shipped recipe: how many heads (bytes) per-head allocation needs to reach 4-bit keys everywhere."""
    gains = head_gains(sorted(SENS.glob("sens_*.jsonl")))
    ranked = sorted(gains, key=lambda k: -gains[k])
    shipped = {i for i, b in enumerate(setup.shipped_bits) if b == 4}
    out = {"bf16": setup.build(KVConfig("bf16")), "base": setup.base_codec,
           f"shipped ({len(shipped)} layers K4)": setup.by_layers(shipped),
           "K4 in every layer": setup.by_layers(set(range(setup.layers)))}
    return out | {f"heads ({n})": setup.by_heads(set(ranked[:n])) for n in counts}


def combine(out: Path, context: int, study: str) -> None:
    rows = [json.loads(line) for p in sorted(out.glob(f"{study}_*.jsonl")) for line in p.read_text().splitlines() if line]
    base = [r["nll"]["base"] for r in rows]
    ref = [r["nll"][k] for r in rows for k in r["nll"] if k.startswith("shipped")]
    result = {}
    for label in rows[0]["nll"]:
        vals = [r["nll"][label] for r in rows]
        d, se = difference(vals, ref)
        db, seb = difference(vals, [r["nll"]["bf16"] for r in rows])
        result[label] = dict(answer_nll=round(sum(vals) / len(vals), 4), vs_shipped=round(d, 4), stderr=round(se, 4),
                             vs_unquantized=round(db, 4), stderr_unq=round(seb, 4))
        print(f"{label:>28s}: NLL {result[label]['answer_nll']:.3f}  vs shipped {d:+.3f} ± {se:.3f}  "
              f"vs unquantized {db:+.3f} ± {seb:.3f}")
    (out / f"{study}.json").write_text(json.dumps({"context": context, "samples": len(base), "rows": result,
                                                  "bpe": json.loads((out / f"bpe_{study}.json").read_text())}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("run", "combine"))
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--samples", type=int, default=6)
    p.add_argument("--seeds", default="1006")
    p.add_argument("--out", type=Path, default=Path("runs/k3"))
    p.add_argument("--study", choices=("k3", "heads"), default="k3")
    p.add_argument("--heads", default="36,45,54,63", help="--study heads: head counts of 4-bit keys")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.mode == "combine":
        return combine(a.out, a.context, a.study)
    setup = Setup(a.context)
    cs = codecs(setup) if a.study == "k3" else head_curve(setup, tuple(int(x) for x in a.heads.split(",")))
    (a.out / f"bpe_{a.study}.json").write_text(json.dumps({k: round(c.bpe(a.context), 4) for k, c in cs.items()}, indent=1))
    log = a.out / f"{a.study}_{a.seeds.replace(',', '_')}.jsonl"
    score(setup, cs, tuple(int(x) for x in a.seeds.split(",")), a.samples, log)


if __name__ == "__main__":
    main()
