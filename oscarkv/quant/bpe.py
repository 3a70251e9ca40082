"""Tier boundaries of the mixed-precision cache and bits-per-element accounting.

A sequence of ``t`` tokens is split (DESIGN.md §3) into a BF16 sink ``[0, S0)``, low-bit
history ``[S0, h)`` and a BF16 recent window ``[h, t)`` whose length ``W'`` satisfies
``W <= W' < W + P`` once the sequence is long enough: the window grows until it holds
``W + P`` tokens, then its oldest page is demoted. Every cache uses :func:`history_end`, so
tier boundaries agree between the HF cache, the evaluation simulation and the engine.
"""

from __future__ import annotations

from typing import NamedTuple


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
