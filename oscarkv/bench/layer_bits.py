"""Per-layer key bits at a benchmark's shape: a precision allocation carried over to another model's layers.

Role: ``oscarkv bench decode|prefill --layer-key-bits FILE|FRACTION`` times a per-layer allocation
(``KVConfig.layer_key_bits``, issue 26) beside BF16 and INT2 at real shapes, whose layer count is not the
calibrated model's. :func:`allocation_config` turns one such spec into the ``oscar`` :class:`KVConfig` the
bench engine is built with (``oscarkv.bench.e2e.build_engine``):

- ``FILE``: a recipe JSON (``lab/scripts/twobit_recipe_*.json``, or a manifest holding one under ``recipe``):
  its windows and page size, and its shares of 4-bit-key (and 4-bit-value) layers spread over the shape's layers as the
  recipe spreads them (:func:`spread`); a per-head recipe (``layer_key_heads``): each shape layer takes the
  share of 4-bit key heads of the source layer at its relative depth (:func:`spread_heads`), its first heads;
- ``FRACTION`` in (0, 1]: that share of the layers, evenly spaced, the default windows.

Decode time depends on how many layers read 4-bit keys (bytes) and on the per-layer pools (launches), not on
which layers they are; the spread keeps the recipe's picture anyway.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from oscarkv.config import KVConfig


def spread(bits: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """``bits`` (one per layer of the source model, 2 or 4) carried over to ``num_layers`` layers: the same share of
    4-bit layers (rounded), placed at the layers whose relative depth is nearest a source 4-bit layer's."""
    src = len(bits)
    fours = [(j + 0.5) / src for j, b in enumerate(bits) if b == 4]
    n = round(len(fours) * num_layers / src)
    if not fours or n == 0:
        return (2,) * num_layers
    dist = [min(abs((i + 0.5) / num_layers - c) for c in fours) for i in range(num_layers)]
    chosen = set(sorted(range(num_layers), key=lambda i: (dist[i], i))[:n])
    return tuple(4 if i in chosen else 2 for i in range(num_layers))


def spread_heads(heads: Sequence[Sequence[int]], num_heads: int, num_layers: int,
                 num_kv_heads: int) -> tuple[tuple[int, ...], ...]:
    """A per-head allocation of a ``num_heads``-head source (4-bit key heads per layer) carried over to
    ``num_layers`` layers of ``num_kv_heads``: layer ``i`` takes the share of the source layer at its relative depth,
    rounded, as its first heads. NOTE: which heads does not change the time; how many, and how many layers split."""
    src = len(heads)
    return tuple(tuple(range(round(len(heads[(2 * i + 1) * src // (2 * num_layers)]) * num_kv_heads / num_heads)))
                 for i in range(num_layers))


def even(fraction: float, num_layers: int) -> tuple[int, ...]:
    """``round(fraction · num_layers)`` layers of 4-bit keys, evenly spaced (Bresenham), the others 2."""
    n = round(fraction * num_layers)
    return tuple(4 if (i + 1) * n // num_layers > i * n // num_layers else 2 for i in range(num_layers))


def is_fraction(spec: str) -> bool:
    try:
        return 0 < float(spec) <= 1
    except ValueError:
        return False


def kv_rows(methods: Sequence[str], specs: Sequence[str], num_layers: int,
            num_kv_heads: int) -> list[tuple[str, KVConfig]]:
    """(row label, KV config) of each method, then of each allocation spec at ``num_layers`` layers of ``num_kv_heads``
    (labelled as reports label it: ``oscar-k4x12+win``, 12 layers of 4-bit keys; ``oscar-kh4x96+win``, 96 KV heads)."""
    out = [(m, KVConfig(m)) for m in methods]
    for spec in specs:
        kv = allocation_config(spec, num_layers, num_kv_heads)
        out.append((kv.label(), kv))
    return out


def allocation_config(spec: str, num_layers: int, num_kv_heads: int, source_kv_heads: int = 3) -> KVConfig:
    """The ``oscar`` config of one ``--layer-key-bits`` entry (a recipe JSON or a fraction) at ``num_layers`` layers of
    ``num_kv_heads`` (``source_kv_heads``: the recipe's model's, 3 for the default model)."""
    if is_fraction(spec):
        return KVConfig("oscar", layer_key_bits=even(float(spec), num_layers))
    rec = json.loads(Path(spec).read_text())
    rec = rec.get("recipe", rec)
    if not rec.get("layer_key_bits") and not rec.get("layer_key_heads"):
        raise ValueError(f"{spec}: a recipe with layer_key_bits (per-layer key bits) or layer_key_heads expected")
    values = rec.get("layer_value_bits") or ()
    keys = spread(rec["layer_key_bits"], num_layers) if rec.get("layer_key_bits") else ()
    heads = rec.get("layer_key_heads")
    return KVConfig("oscar", sink=rec.get("sink", KVConfig.sink), recent=rec.get("recent", KVConfig.recent),
                    page_size=rec.get("page_size", KVConfig.page_size),
                    layer_key_bits=keys, layer_value_bits=spread(values, num_layers) if 4 in values else (),
                    layer_key_heads=spread_heads(heads, source_kv_heads, num_layers, num_kv_heads) if heads else ())
