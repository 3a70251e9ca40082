"""Per-group magnitude clipping applied after rotation and centering, before quantization.

The one clip definition (DESIGN.md §1): for each group of ``G`` channels, ``tau`` is the
``floor(c * G)``-th smallest ``|x|`` of the group and the group is clamped to ``[-tau, tau]``.
``c >= 1`` (or ``None``) disables clipping. Fitted ``c`` values live in the rotation artifact.
"""

from __future__ import annotations

import math

import torch


def clip_rank(c: float, group: int) -> int:
    """The 1-based rank ``floor(c * G)`` of the clipping threshold within a group (at least 1)."""
    if not 0.0 < c:
        raise ValueError(f"clip ratio must be positive, got {c}")
    return max(1, min(group, math.floor(c * group + 1e-9)))


def clip_groups(x: torch.Tensor, c: float | None, group: int) -> torch.Tensor:
    """Clamp each group of the last dimension of ``x`` to ``±tau`` (see module docstring)."""
    if c is None or clip_rank(c, group) == group:
        return x
    n = x.shape[-1]
    xg = x.reshape(*x.shape[:-1], n // group, group)  # [..., n/G, G]
    tau = xg.abs().kthvalue(clip_rank(c, group), dim=-1, keepdim=True).values
    return torch.maximum(torch.minimum(xg, tau), -tau).reshape(x.shape)
