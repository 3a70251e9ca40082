"""Per-layer precision allocation: which layers' keys (or values) get 4 bits under a bits-per-element budget.

Role: ``oscarkv calibrate --max-bpe B --allocate`` measures, on the development samples of the recipe search
(``oscarkv.eval.objective``), each layer's **sensitivity**: the drop in development answer NLL when that layer
alone stores its keys (``kinds``: or values) at 4 bits, every other layer at the base recipe's bits, paired
sample by sample against the base (mean ± standard error). :func:`allocate` then raises layers greedily, the
largest gain first, while the codec's bits per element at the budget's context (windows included: what is
stored) stay within ``max_bpe``; every raise of one kind costs the same bytes, so greedy by gain is the
knapsack's optimum for a fixed window. :func:`allocation_codecs` builds one allocation per candidate window
(a smaller window frees bytes for more 4-bit layers), which the recipe search then scores beside the uniform
rungs; the chosen one goes into the artifact's recipe (``layer_key_bits``, ``layer_value_bits``) and is
served per layer (``KVConfig.layer_key_bits``).

Beside each sensitivity, the calibration's own per-layer prediction (``key_error_ratio``/``value_error_ratio``
of the manifest's summary: INT2's weighted error against Hadamard-only) is reported, a free proxy whose rank
correlation with the measured gains says whether it could replace them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from oscarkv.config import KVConfig
from oscarkv.eval.paired import difference
from oscarkv.quant.codec import KVCodec

KINDS = ("key", "value")


@dataclass(frozen=True)
class Sensitivity:
    """One layer and kind raised to 4 bits alone, on the development samples."""

    layer: int
    kind: str
    gain: float
    """Base answer NLL minus this configuration's (nats, mean over samples; positive: 4 bits help)."""
    stderr: float
    """Standard error of ``gain`` (paired over the samples)."""
    predicted: float | None = None
    """The calibration's predicted INT2 error ratio of this layer and kind (the manifest summary), if recorded."""


def raised(kv: KVConfig, num_layers: int, raise_: frozenset[tuple[int, str]]) -> KVConfig:
    """``kv`` with the ``(layer, kind)`` pairs in ``raise_`` at 4 bits, the other layers at ``kv``'s bits."""
    bits = {kind: [kv.layer_bits(i)[j] for i in range(num_layers)] for j, kind in enumerate(KINDS)}
    for layer, kind in raise_:
        bits[kind][layer] = 4
    return replace(kv, layer_key_bits=tuple(bits["key"]), layer_value_bits=tuple(bits["value"]))


def sensitivity_codecs(base: KVConfig, num_layers: int, build, kinds: tuple[str, ...] = ("key",)) -> dict[str, KVCodec]:
    """``base`` and, per layer and kind, ``base`` with that one raised: label → codec (``build``: KVConfig → codec)."""
    out = {"base": build(base)}
    for kind in kinds:
        for i in range(num_layers):
            out[f"{kind} {i}"] = build(raised(base, num_layers, frozenset({(i, kind)})))
    return out


def sensitivities(scores: dict, kinds: tuple[str, ...], num_layers: int,
                  summary: list[dict] | None = None) -> list[Sensitivity]:
    """Gains of :func:`sensitivity_codecs`' labels from their development scores (``DevScore`` by label)."""
    base = scores["base"].per_sample
    out = []
    for kind in kinds:
        for i in range(num_layers):
            gain, se = difference(base, scores[f"{kind} {i}"].per_sample)
            pred = summary[i].get(f"{kind}_error_ratio") if summary and i < len(summary) else None
            out.append(Sensitivity(i, kind, gain, se, pred))
    return out


def allocate(sens: list[Sensitivity], base: KVConfig, num_layers: int, build, context: int,
             max_bpe: float) -> KVConfig | None:
    """The greedy allocation: raise layers in order of gain (positive gains only) while ``build(kv).bpe(context)``
    stays within ``max_bpe``; ``None`` when not even ``base`` fits."""
    if build(base).bpe(context) > max_bpe:
        return None
    chosen: frozenset[tuple[int, str]] = frozenset()
    for s in sorted((s for s in sens if s.gain > 0), key=lambda s: -s.gain):
        trial = chosen | {(s.layer, s.kind)}
        if build(raised(base, num_layers, trial)).bpe(context) <= max_bpe:
            chosen = trial
    return raised(base, num_layers, chosen) if chosen else base


def allocation_codecs(sens: list[Sensitivity], windows: dict[str, KVCodec], num_layers: int, build, context: int,
                      max_bpe: float) -> dict[str, KVCodec]:
    """For each INT2 candidate window of the recipe search (``oscar s=.. r=..`` → its codec), the greedy allocation
    within ``max_bpe`` at ``context``, labelled ``oscar-k4xN s=.. r=..`` (N layers with 4-bit keys)."""
    out = {}
    for label, codec in windows.items():
        kv = codec.config
        if kv.bits != (2, 2) or kv.allocated:
            continue
        mine = allocate(sens, kv, num_layers, build, context, max_bpe)
        if mine is not None and mine.allocated:
            name = mine.label().removesuffix("+win")
            out[name + label.removeprefix("oscar")] = build(mine)
    return out


def report(sens: list[Sensitivity]) -> list[str]:
    """Lines for the log: each layer's gain ± stderr, largest first, with the calibration's prediction."""
    rows = sorted(sens, key=lambda s: -s.gain)
    return [f"  {s.kind:>5s} layer {s.layer:>2d}: gain {s.gain:+.4f} ± {s.stderr:.4f} nats"
            + ("" if s.predicted is None else f" (calibration's INT2 error ratio {s.predicted:.3f})") for s in rows]
