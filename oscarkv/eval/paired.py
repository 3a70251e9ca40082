"""Each configuration against the unquantized reference on the same samples, pooled over haystacks.

Input: accuracy records of ``oscarkv.eval.runner`` carrying ``values`` (each sample's score, in
the order the samples ran; every configuration runs the same samples in the same order). Output:
rows per (task group, context, method) of the headline protocol — the pooled accuracy, BPE, the
share of the reference's accuracy, and the paired difference in points with its standard error —
and, per (task group, context), the cheapest configuration holding a given share. This is the
question a user asks of a recipe ("does it keep 95% of BF16 here, at what bits?"), with the noise
beside the answer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import mean

HOLD = 0.95
"""The share of the reference's accuracy a configuration must keep to be called holding."""


@dataclass(frozen=True)
class Paired:
    group: str
    context: int
    method: str
    reference: bool  # the unquantized reference itself
    samples: int
    accuracy: float
    bpe: float
    share: float | None  # accuracy / the reference's (None: the reference scores 0)
    diff: float  # mean paired difference in points
    se: float  # its standard error, in points


def difference(mine: Sequence[float], theirs: Sequence[float]) -> tuple[float, float]:
    """Mean of the paired differences ``mine − theirs`` and its standard error (sample standard
    deviation / √n; 0 for a single pair)."""
    d = [a - b for a, b in zip(mine, theirs, strict=True)]
    m = mean(d)
    return m, math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d)) if len(d) > 1 else 0.0


def compare(acc: list[dict], group_of: Callable[[str], str], references: Sequence[str]) -> list[Paired]:
    """Rows for every configuration in ``acc`` (one protocol's records) that ran on exactly the
    reference's samples; ``group_of`` maps a task to its group, ``references`` are the labels the
    unquantized reference may carry."""
    cells: dict[tuple[str, int, str], list[dict]] = defaultdict(list)
    for r in acc:
        if r.get("values"):
            cells[(group_of(r["task"]), r["context"], r["method"])].append(r)
    out = []
    for (group, ctx, method), rows in sorted(cells.items()):
        ref = next((cells[(group, ctx, m)] for m in references if (group, ctx, m) in cells), None)
        if ref is None:
            continue
        mine, theirs = _joined(rows, ref)
        if mine is None:
            continue
        diff, se = difference(mine, theirs)
        base = mean(theirs)
        out.append(Paired(group, ctx, method, method in references, len(mine), mean(mine), _pooled_bpe(rows),
                          mean(mine) / base if base else None, 100 * diff, 100 * se))
    return out


def _joined(rows: list[dict], ref: list[dict]) -> tuple[list[float] | None, list[float]]:
    """Both configurations' values over the cells (task, haystack) they share, sample for sample;
    None when a shared cell holds different numbers of samples (not the same samples)."""
    key = lambda r: (r["task"], r["haystack"])  # noqa: E731
    theirs_by = {key(r): r["values"] for r in ref}
    mine, theirs = [], []
    for r in sorted(rows, key=key):
        other = theirs_by.get(key(r))
        if other is None:
            continue
        if len(other) != len(r["values"]):
            return None, []
        mine += r["values"]
        theirs += other
    return (mine, theirs) if mine else (None, [])


def _pooled_bpe(rows: list[dict]) -> float:
    n = sum(len(r["values"]) for r in rows)
    return sum(r["bpe"] * len(r["values"]) for r in rows) / n


def cheapest_holding(rows: list[Paired], hold: float = HOLD) -> dict[tuple[str, int], Paired]:
    """Per (task group, context): the configuration of fewest bits keeping ``hold`` of the reference."""
    best: dict[tuple[str, int], Paired] = {}
    for p in rows:
        if p.reference or p.share is None or p.share < hold:
            continue
        k = (p.group, p.context)
        if k not in best or p.bpe < best[k].bpe:
            best[k] = p
    return best


def table(rows: list[Paired], hold: float = HOLD) -> list[str]:
    """Markdown: one line per (task group, context, method), the cheapest holding configuration in bold."""
    if not rows:
        return []
    best = {id(p) for p in cheapest_holding(rows, hold).values()}
    lines = ["| task group | context | method | samples | accuracy | BPE | share of reference | paired difference (points) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in sorted(rows, key=lambda p: (p.group, p.context, -p.bpe)):
        share = f"{100 * p.share:.1f}%" if p.share is not None else "–"
        name = f"**{p.method}**" if id(p) in best else p.method
        diff = "—" if p.reference else f"{p.diff:+.1f} ± {p.se:.1f}"
        lines.append(f"| {p.group} | {p.context} | {name} | {p.samples} | {100 * p.accuracy:.1f} | {p.bpe:.2f} | "
                     f"{share} | {diff} |")
    return lines
