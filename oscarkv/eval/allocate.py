"""Precision allocation: which layers' keys (or values), or which KV heads' keys, get 4 bits under a bits-per-element budget.

Role: ``oscarkv calibrate --max-bpe B --allocate KINDS`` measures, on the development samples of the recipe search
(``oscarkv.eval.objective``), the **sensitivity** of each unit a raise buys: the drop in development answer NLL when
that unit alone is stored at 4 bits, everything else at the base recipe's bits, paired sample by sample against the
base (mean ± standard error). The kinds (``ALLOCATE_KINDS``): ``key`` and ``value`` raise one layer's keys or values
(``KVConfig.layer_key_bits``/``layer_value_bits``); ``key-heads`` raises one KV head's keys in one layer
(``KVConfig.layer_key_heads``), the finer unit, since a layer's heads need not retrieve alike. :func:`allocate` then
raises units greedily, the largest gain first, while the codec's bits per element at the budget's context (windows
included: what is stored) stay within ``max_bpe``; every raise of one kind costs the same bytes, so greedy by gain is
the knapsack's optimum for a fixed window. :func:`allocation_codecs` builds one allocation per candidate window (a
smaller window frees bytes for more 4-bit units), which the recipe search then scores beside the uniform rungs; the
chosen one goes into the artifact's recipe (``layer_key_bits``, ``layer_value_bits``, ``layer_key_heads``) and is
served as allocated.

Beside each layer's sensitivity, the calibration's own per-layer prediction (``key_error_ratio``/``value_error_ratio``
of the manifest's summary: INT2's weighted error against Hadamard-only) is reported, a free proxy whose rank
correlation with the measured gains says whether it could replace them. The summary holds no per-head prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from oscarkv.config import KVConfig
from oscarkv.eval.paired import difference
from oscarkv.quant.codec import KVCodec

LAYER_KINDS = ("key", "value")
"""Kinds (of ``ALLOCATE_KINDS``) raised a whole layer at a time, in ``KVConfig.layer_bits`` order."""
HEADS = "key-heads"
"""The kind (of ``ALLOCATE_KINDS``) raised one KV head's keys at a time."""

Unit = tuple[int, str] | tuple[int, str, int]
"""What one raise buys: ``(layer, kind)`` for a layer's keys or values, ``(layer, "key-heads", head)`` for one KV
head's keys."""


@dataclass(frozen=True)
class Sensitivity:
    """One unit raised to 4 bits alone (a layer's kind, or one KV head's keys), on the development samples."""

    layer: int
    kind: str
    gain: float
    """Base answer NLL minus this configuration's (nats, mean over samples; positive: 4 bits help)."""
    stderr: float
    """Standard error of ``gain`` (paired over the samples)."""
    predicted: float | None = None
    """The calibration's predicted INT2 error ratio of this layer and kind (the manifest summary), if recorded."""
    head: int | None = None
    """The KV head whose keys were raised (kind ``key-heads``); ``None``: the whole layer."""

    @property
    def unit(self) -> Unit:
        """What this raise buys (:data:`Unit`)."""
        return (self.layer, self.kind) if self.head is None else (self.layer, self.kind, self.head)


def units(kinds: tuple[str, ...], num_layers: int, num_kv_heads: int | None = None) -> list[Unit]:
    """Every unit of ``kinds``: each layer of a layer kind, each layer's each KV head of ``key-heads``."""
    if HEADS in kinds and num_kv_heads is None:
        raise ValueError("allocating key-heads needs the model's number of KV heads")
    out: list[Unit] = []
    for kind in kinds:
        for i in range(num_layers):
            out += [(i, kind, h) for h in range(num_kv_heads)] if kind == HEADS else [(i, kind)]
    return out


def unit_label(unit: Unit) -> str:
    """A sensitivity configuration's label: ``key 3`` (layer 3's keys), ``key-head 3.1`` (layer 3, KV head 1)."""
    return f"{unit[1]} {unit[0]}" if len(unit) == 2 else f"key-head {unit[0]}.{unit[2]}"


def raised(kv: KVConfig, num_layers: int, raise_: frozenset[Unit]) -> KVConfig:
    """``kv`` with the units in ``raise_`` at 4 bits, the rest at ``kv``'s bits; per-layer bits are set only where
    a layer is raised (or ``kv`` sets them), 4-bit key heads only where a head is."""
    bits = {kind: [kv.layer_bits(i)[j] for i in range(num_layers)] for j, kind in enumerate(LAYER_KINDS)}
    heads = [set(kv.key_heads(i)) for i in range(num_layers)]
    for layer, kind, *head in raise_:
        if head:
            heads[layer].add(head[0])
        else:
            bits[kind][layer] = 4
    out = kv
    if any(len(u) == 2 for u in raise_) or kv.layer_key_bits or kv.layer_value_bits:
        out = replace(out, layer_key_bits=tuple(bits["key"]), layer_value_bits=tuple(bits["value"]))
    if any(heads):
        out = replace(out, layer_key_heads=tuple(tuple(sorted(h)) for h in heads))
    return out


def sensitivity_codecs(base: KVConfig, num_layers: int, build, kinds: tuple[str, ...] = ("key",),
                       num_kv_heads: int | None = None) -> dict[str, KVCodec]:
    """``base`` and, per unit of ``kinds`` (:func:`units`), ``base`` with that one raised: label (:func:`unit_label`)
    → codec (``build``: KVConfig → codec)."""
    out = {"base": build(base)}
    for u in units(kinds, num_layers, num_kv_heads):
        out[unit_label(u)] = build(raised(base, num_layers, frozenset({u})))
    return out


def sensitivities(scores: dict, kinds: tuple[str, ...], num_layers: int, summary: list[dict] | None = None,
                  num_kv_heads: int | None = None) -> list[Sensitivity]:
    """Gains of :func:`sensitivity_codecs`' labels from their development scores (``DevScore`` by label)."""
    base = scores["base"].per_sample
    out = []
    for u in units(kinds, num_layers, num_kv_heads):
        gain, se = difference(base, scores[unit_label(u)].per_sample)
        layer, kind, head = (*u, None)[:3]  # head None: a layer kind, which the summary predicts
        pred = summary[layer].get(f"{kind}_error_ratio") if head is None and summary and layer < len(summary) else None
        out.append(Sensitivity(layer, kind, gain, se, pred, head))
    return out


def allocate(sens: list[Sensitivity], base: KVConfig, num_layers: int, build, context: int,
             max_bpe: float) -> KVConfig | None:
    """The greedy allocation: raise units in order of gain (positive gains only) while ``build(kv).bpe(context)``
    stays within ``max_bpe``; ``None`` when not even ``base`` fits."""
    if build(base).bpe(context) > max_bpe:
        return None
    chosen: frozenset[Unit] = frozenset()
    for s in sorted((s for s in sens if s.gain > 0), key=lambda s: -s.gain):
        trial = chosen | {s.unit}
        if build(raised(base, num_layers, trial)).bpe(context) <= max_bpe:
            chosen = trial
    return raised(base, num_layers, chosen) if chosen else base


def allocation_codecs(sens: list[Sensitivity], windows: dict[str, KVCodec], num_layers: int, build, context: int,
                      max_bpe: float) -> dict[str, KVCodec]:
    """For each INT2 candidate window of the recipe search (``oscar s=.. r=..`` → its codec), the greedy allocation
    within ``max_bpe`` at ``context``, labelled as its config names it: ``oscar-k4xN s=.. r=..`` (N layers with 4-bit
    keys), ``oscar-kh4xN s=.. r=..`` (N KV heads with 4-bit keys)."""
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
    """Lines for the log: each unit's gain ± stderr, largest first, with the calibration's prediction."""
    rows = sorted(sens, key=lambda s: -s.gain)
    return [f"  {s.kind:>9s} layer {s.layer:>2d}{'' if s.head is None else f' head {s.head:>2d}'}: "
            f"gain {s.gain:+.4f} ± {s.stderr:.4f} nats"
            + ("" if s.predicted is None else f" (calibration's INT2 error ratio {s.predicted:.3f})") for s in rows]
