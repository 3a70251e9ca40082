"""The low-bit KV format: per-token asymmetric integer codes, packed, with fp16 scale and zero.

This module *is* the numeric specification of DESIGN.md §2; every writer (the HF cache, the
calibration simulation, the engine's demotion, each Triton kernel) reproduces it bit for bit.

For a vector ``x`` of ``n`` channels split into groups of ``G`` channels:

    m = min(group), M = max(group), s = (M - m) / (2**bits - 1)
    s and m are rounded to fp16 *before* use, so encoder and decoder agree
    code = clamp(floor((x - m) / s + 0.5), 0, 2**bits - 1)      (fp32 arithmetic; s == 0 -> 0)
    x_hat = m + s * code

NOTE: rounding is half-up (``floor(y + 0.5)``), not torch's half-to-even, because it is the
form every kernel language expresses identically.

Non-uniform 2-bit levels (optional, ``levels``; DESIGN.md §2): a table ``L = (0, l1, l2, 3)`` in code
units, ``0 < l1 < l2 < 3``, each an fp16 value (so every kernel holds it exactly). The endpoints are
fixed so each group's min and max stay exact. With ``v = fl32(y + 0.5)`` (``y`` as above) and the
boundaries ``b_k = fl32(fl32((L[k-1] + L[k]) / 2) + 0.5)``, k = 1..3 (:func:`boundaries`, fp32)::

    code  = [v >= b_1] + [v >= b_2] + [v >= b_3]        (0 where s == 0)
    x_hat = m + s * L[code]                             (fp32)

i.e. nearest level with the midpoints as thresholds. NOTE: ``v`` is compared, not ``y`` against the
midpoints, so that ``L = (0, 1, 2, 3)`` (boundaries 1, 2, 3) gives ``min(floor(v), 3)``: today's uniform
codes bit for bit, ties included. 4-bit codes are always uniform.

Packing, INT2: four codes per byte. With ``L = G // 4``, byte ``j`` of a group holds elements
``j, j+G/4, j+G/2, j+3G/4`` in bits 0-1, 2-3, 4-5, 6-7 — so a kernel unpacks four contiguous
slices of a group with shifts. A packed row of ``n`` channels is ``n / 4`` bytes.

Packing, INT4: two 2-bit *planes*. A code ``c`` in 0..15 is ``lo + 4·hi`` with ``lo = c & 3``,
``hi = c >> 2``; the packed row is the INT2 packing of every ``lo`` (``n / 4`` bytes) followed by
the INT2 packing of every ``hi`` (``n / 4`` bytes). NOTE: planes, not nibbles, so that every
kernel reads a 4-bit row as two INT2 rows of the same channels and reuses the INT2 code path:
``m + s·c = (m + s·lo) + 4s·hi``, i.e. the high plane is an INT2 row with scale ``4s`` and
zero 0 (``oscarkv.kernels``). Scale and zero stay one fp16 pair per group.

The quantized axis is always the last one; callers that quantize along tokens (KIVI keys)
transpose first. Packed tensors flow to the caches (``oscarkv.cache``) and back here to be
dequantized.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Packed(NamedTuple):
    """Quantized tensor: codes ``uint8 [..., n * bits / 8]``, scale and zero ``fp16 [..., n / G]``."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self)


def _check(n: int, bits: int, group: int) -> None:
    if bits not in (2, 4):
        raise ValueError(f"bits must be 2 or 4, got {bits}")
    if group <= 0 or n % group:
        raise ValueError(f"group size {group} must divide the quantized dimension {n}")
    if group % 4:
        raise ValueError(f"group size {group} must be a multiple of 4 for {bits}-bit packing (2-bit planes)")


Levels = tuple[float, float, float, float]
"""A 2-bit level table ``(0, l1, l2, 3)`` in code units (module docstring); ``None`` where one is taken: uniform."""

UNIFORM: Levels = (0.0, 1.0, 2.0, 3.0)


def levels_error(levels) -> str | None:
    """Why ``levels`` is not a valid table (4 finite fp16 values, endpoints 0 and 3, strictly increasing), or ``None``."""
    t = torch.as_tensor(levels, dtype=torch.float32).flatten()
    if t.numel() != 4 or not torch.isfinite(t).all():
        return f"expected 4 finite values, got {t.tolist()}"
    if t[0] != 0 or t[3] != 3:
        return f"endpoints must be 0 and 3, got {t[0].item():g} and {t[3].item():g}"
    if not (t[1:] > t[:-1]).all():
        return f"levels must increase strictly, got {t.tolist()}"
    if not torch.equal(t.half().float(), t):
        return f"levels must be fp16 values (the kernels hold them in fp16), got {t.tolist()}"
    return None


def boundaries(levels: Levels) -> tuple[float, float, float]:
    """``b_k = fl32(fl32((L[k-1] + L[k]) / 2) + 0.5)``, k = 1..3: the thresholds on ``v = fl32(y + 0.5)``."""
    t = torch.tensor(levels, dtype=torch.float32)
    return tuple(((t[:-1] + t[1:]) * 0.5 + 0.5).tolist())


def normalized(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y = (x - m) / s`` per group, fp32 ``[..., n/G, G]`` (0 where ``s == 0``), with the stored fp16 scale and
    zero ``[..., n/G]``: what the encoder rounds (and what Lloyd-Max levels are fitted on)."""
    n = x.shape[-1]
    _check(n, bits, group)
    xg = x.float().reshape(*x.shape[:-1], n // group, group)  # [..., n/G, G]
    lo, hi = xg.amin(-1), xg.amax(-1)
    scale = ((hi - lo) / ((1 << bits) - 1)).to(torch.float16)
    zero = lo.to(torch.float16)
    s, m = scale.float().unsqueeze(-1), zero.float().unsqueeze(-1)
    return torch.where(s > 0, (xg - m) / torch.where(s > 0, s, 1.0), 0.0), scale, zero


def quantize_codes(x: torch.Tensor, bits: int, group: int,
                   levels: Levels | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpacked codes ``uint8 [..., n]`` plus fp16 scale and zero ``[..., n / group]``; ``levels``: a 2-bit table."""
    y, scale, zero = normalized(x, bits, group)
    if levels is None:
        codes = torch.floor(y + 0.5).clamp_(0, (1 << bits) - 1).to(torch.uint8)
    else:
        assert bits == 2, "level tables are for 2-bit codes"
        v = y + 0.5
        codes = sum((v >= b).to(torch.uint8) for b in boundaries(levels))
    return codes.reshape(x.shape), scale, zero


def level_values(codes: torch.Tensor, levels: Levels | None) -> torch.Tensor:
    """Codes → their value in code units, fp32: the code itself, or ``levels[code]``."""
    if levels is None:
        return codes.float()
    return torch.tensor(levels, dtype=torch.float32, device=codes.device)[codes.long()]


def pack(codes: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Pack codes ``uint8 [..., n]`` into ``uint8 [..., n * bits / 8]`` (layout in the module docstring)."""
    n = codes.shape[-1]
    _check(n, bits, group)
    if bits == 4:  # two INT2 planes: low bits, then high bits
        return torch.cat([pack(codes & 3, 2, group), pack(codes >> 2, 2, group)], -1)
    cg = codes.reshape(*codes.shape[:-1], n // group, 4, group // 4)  # [..., groups, slice, L]
    out = torch.zeros(cg.shape[:-2] + cg.shape[-1:], dtype=torch.uint8, device=codes.device)
    for i in range(4):
        out |= cg[..., i, :] << (2 * i)
    return out.reshape(*codes.shape[:-1], n // 4)


def unpack(packed: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Inverse of :func:`pack`: ``uint8 [..., n * bits / 8]`` to codes ``uint8 [..., n]``."""
    n = packed.shape[-1] * 8 // bits
    _check(n, bits, group)
    if bits == 4:
        lo, hi = packed.split(n // 4, -1)
        return unpack(lo, 2, group) | (unpack(hi, 2, group) << 2)
    pg = packed.reshape(*packed.shape[:-1], n // group, group // 4)  # [..., groups, L]
    slices = [(pg >> (2 * i)) & 3 for i in range(4)]
    return torch.stack(slices, dim=-2).reshape(*packed.shape[:-1], n)


def quantize(x: torch.Tensor, bits: int, group: int, levels: Levels | None = None) -> Packed:
    """Quantize the last dimension of ``x`` in groups of ``group`` channels and pack the codes."""
    codes, scale, zero = quantize_codes(x, bits, group, levels)
    return Packed(pack(codes, bits, group), scale, zero)


def _reconstruct(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int,
                 levels: Levels | None) -> torch.Tensor:
    n = codes.shape[-1]
    cg = level_values(codes, levels).reshape(*codes.shape[:-1], n // group, group)
    return (zero.float().unsqueeze(-1) + scale.float().unsqueeze(-1) * cg).reshape(codes.shape)


def dequantize(p: Packed, bits: int, group: int, levels: Levels | None = None) -> torch.Tensor:
    """Reconstruct ``float32 [..., n]`` as ``zero + scale * code`` (``scale * levels[code]`` with a table)."""
    return _reconstruct(unpack(p.codes, bits, group), p.scale, p.zero, group, levels)


def fake_quantize(x: torch.Tensor, bits: int, group: int, levels: Levels | None = None) -> torch.Tensor:
    """``dequantize(quantize(x))`` without packing: the reference for error measurements."""
    codes, scale, zero = quantize_codes(x, bits, group, levels)
    return _reconstruct(codes, scale, zero, group, levels)
