"""Tier boundaries of the mixed-precision cache and bits-per-element accounting.

A sequence of ``t`` tokens is split (DESIGN.md §3) into a BF16 sink ``[0, S0)``, low-bit
history ``[S0, h)`` and a BF16 recent window ``[h, t)`` whose length ``W'`` satisfies
``W <= W' < W + P`` once the sequence is long enough: the window grows until it holds
``W + P`` tokens, then its oldest page is demoted. Every cache uses :func:`history_end`, so
tier boundaries agree between the HF cache, the evaluation simulation and the engine.

Sliding-window layers (Gemma 3, :class:`SlidingLayers`) have no tiers: they keep a bounded BF16
window of the last tokens (:func:`window_tokens`) and never store INT2; :func:`mixed_bpe` counts
them with the tiered layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Tiers(NamedTuple):
    """Token counts per tier."""

    sink: int
    history: int
    recent: int


def history_end(t: int, sink: int, recent: int, page: int) -> int:
    """End (exclusive) of the low-bit history for a sequence of ``t`` tokens."""
    if t <= sink:
        return t
    demoted = page * (max(0, t - sink - recent) // page)
    return sink + demoted


def history_ends(t: np.ndarray, sink: int, recent: int, page: int) -> np.ndarray:
    """:func:`history_end` of every length in the integer array ``t``."""
    return np.where(t <= sink, t, sink + page * (np.maximum(0, t - sink - recent) // page))


def tiers(t: int, sink: int, recent: int, page: int) -> Tiers:
    """Split ``t`` tokens into (sink, history, recent) counts."""
    h = history_end(t, sink, recent, page)
    s = min(t, sink)
    return Tiers(s, h - s, t - h)


def bits_per_element(n_low: int, n_bf16: int, bits: int, meta_group: int) -> float:
    """BPE = [(bits + 32/G) N_low + 16 N_bf16] / N_total, with 32 bits of fp16 scale+zero per group."""
    total = n_low + n_bf16
    if total == 0:
        return 0.0
    return ((bits + 32.0 / meta_group) * n_low + 16.0 * n_bf16) / total


@dataclass(frozen=True)
class SlidingLayers:
    """A model's sliding-window layers: query ``p`` attends to keys ``k`` with ``p - window < k <= p``
    (transformers' ``sliding_window_overlay``), so a layer needs only the last ``window - 1`` tokens."""

    layers: frozenset[int]
    window: int

    @classmethod
    def from_config(cls, config) -> SlidingLayers | None:
        """From a transformers config's ``layer_types`` (``"sliding_attention"``) and ``sliding_window``;
        ``None`` when no layer slides."""
        types = getattr(config, "layer_types", None) or []
        layers = frozenset(i for i, t in enumerate(types) if t == "sliding_attention")
        window = getattr(config, "sliding_window", None)
        return cls(layers, int(window)) if layers and window else None


def window_start(t: int, window: int, page: int) -> int:
    """First position a sliding layer holds once ``t`` tokens are stored: the page of ``t - window + 1``
    (the oldest key the next query ``t`` reads), 0 while the sequence is shorter."""
    return max(0, t - window + 1) // page * page


def window_tokens(t: int, window: int, page: int) -> int:
    """Tokens a sliding layer holds for a ``t``-token sequence (``window - 1`` up to ``window + page - 2``)."""
    return t - window_start(t, window, page)


def mixed_bpe(tiered: float, num_tiered: int, t: int, sliding: SlidingLayers | None, page: int) -> float:
    """BPE of a model whose ``num_tiered`` layers store ``t`` tokens at ``tiered`` bits per element and
    whose sliding layers hold their BF16 windows (16 bits, :func:`window_tokens`): bits over elements held."""
    if sliding is None or not sliding.layers:
        return tiered
    n_win = len(sliding.layers) * window_tokens(t, sliding.window, page)
    total = num_tiered * t + n_win
    return (tiered * num_tiered * t + 16.0 * n_win) / total if total else 0.0
