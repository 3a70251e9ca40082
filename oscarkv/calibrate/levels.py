"""Lloyd-Max 2-bit level tables with fixed endpoints, fitted per layer for keys and for values.

Role: the table ``(0, l1, l2, 3)`` of ``oscarkv.quant.int2`` (DESIGN.md §2) that minimizes the mean squared
rounding error, in code units, of the calibration data exactly as the codec sees it: rotated, scaled,
centered, clipped and normalized per group by the stored fp16 scale and zero
(:meth:`~oscarkv.quant.codec.TensorCodec.normalized`). Lloyd-Max with the endpoints held: thresholds at
the midpoints of neighbouring levels, each interior level the mean of the values in its cell, until the
levels move less than ``TOL``; the result is rounded to fp16 values (what every kernel holds exactly).
The endpoints stay 0 and 3 so each group's min and max remain exact: the large key components that
retrieval needs are the extremes, and clamping them costs retrieval (lab/DEVELOPMENT.md).

NOTE: the fit weights every element alike in code units (an element's error in the original domain is
its group's scale times that): the table is the distribution's, not the objective's.

Next: :func:`level_tensors` gives the artifact's ``key.levels`` / ``value.levels`` ``[L, 4]``
(``oscarkv.calibrate.solve`` for a new artifact, ``oscarkv.calibrate.run.fit_missing_levels`` for one
fitted before the tables); serving reads them where ``KVConfig.levels`` is ``lloyd_max``.
"""

from __future__ import annotations

import torch

from oscarkv.quant.codec import TensorCodec
from oscarkv.quant.int2 import UNIFORM, Levels

MAX_ITERS = 200
"""Lloyd iterations at most (they converge in a few dozen on calibration data)."""
TOL = 1e-7
"""Stop once neither interior level moves more than this (code units)."""


def lloyd_max(u: torch.Tensor) -> Levels:
    """The table ``(0, l1, l2, 3)`` of least mean ``(u - L[nearest])²`` over the values ``u`` (code units, any
    shape), endpoints fixed, interior levels rounded to fp16 values; an interior cell left empty keeps its level."""
    s = u.detach().flatten().double().sort().values
    csum = torch.cat([s.new_zeros(1), s.cumsum(0)])
    lv = [1.0, 2.0]
    for _ in range(MAX_ITERS):
        cuts = torch.searchsorted(s, s.new_tensor([lv[0] / 2, (lv[0] + lv[1]) / 2, (lv[1] + 3) / 2])).tolist()
        new = [_cell_mean(csum, a, b, old) for a, b, old in ((cuts[0], cuts[1], lv[0]), (cuts[1], cuts[2], lv[1]))]
        done = max(abs(n - o) for n, o in zip(new, lv)) < TOL
        lv = new
        if done:
            break
    return _fp16_table(*lv)


def _cell_mean(csum: torch.Tensor, a: int, b: int, fallback: float) -> float:
    return float((csum[b] - csum[a]) / (b - a)) if b > a else fallback


def _fp16_table(l1: float, l2: float) -> Levels:
    """``(0, l1, l2, 3)`` with the interior levels rounded to fp16, kept strictly inside (0, 3) and apart."""
    h1, h2 = (float(torch.tensor(x).half()) for x in (l1, l2))
    tiny = 2.0**-10
    h1 = min(max(h1, tiny), 3 - 2 * tiny)
    h2 = min(max(h2, h1 + tiny), 3 - tiny)
    return (0.0, float(torch.tensor(h1).half()), float(torch.tensor(h2).half()), 3.0)


def fit_levels(codec: TensorCodec, x: torch.Tensor) -> Levels:
    """The Lloyd-Max table of 2-bit ``codec`` (its rotation, scaling, centering and clip) on ``x [N, H, d]``
    (original domain)."""
    return lloyd_max(codec.normalized(codec.to_rotated(x)))


def level_tensors(fitted: dict[str, dict[int, Levels]], num_layers: int) -> dict[str, torch.Tensor]:
    """``{kind}.levels [L, 4]`` fp32 from ``fitted[kind][layer]``; layers without a fit (sliding-window
    layers, never stored in INT2) get the uniform table."""
    return {f"{kind}.levels": torch.tensor([list(tables.get(i, UNIFORM)) for i in range(num_layers)],
                                           dtype=torch.float32) for kind, tables in fitted.items()}
