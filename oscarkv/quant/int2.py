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


def quantize_codes(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpacked codes ``uint8 [..., n]`` plus fp16 scale and zero ``[..., n / group]``."""
    n = x.shape[-1]
    _check(n, bits, group)
    xg = x.float().reshape(*x.shape[:-1], n // group, group)  # [..., n/G, G]
    lo, hi = xg.amin(-1), xg.amax(-1)
    qmax = (1 << bits) - 1
    scale = ((hi - lo) / qmax).to(torch.float16)
    zero = lo.to(torch.float16)
    s, m = scale.float().unsqueeze(-1), zero.float().unsqueeze(-1)
    y = torch.where(s > 0, (xg - m) / torch.where(s > 0, s, 1.0), 0.0)
    codes = torch.floor(y + 0.5).clamp_(0, qmax).to(torch.uint8)
    return codes.reshape(x.shape), scale, zero


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


def quantize(x: torch.Tensor, bits: int, group: int) -> Packed:
    """Quantize the last dimension of ``x`` in groups of ``group`` channels and pack the codes."""
    codes, scale, zero = quantize_codes(x, bits, group)
    return Packed(pack(codes, bits, group), scale, zero)


def dequantize(p: Packed, bits: int, group: int) -> torch.Tensor:
    """Reconstruct ``float32 [..., n]`` as ``zero + scale * code``."""
    codes = unpack(p.codes, bits, group)
    n = codes.shape[-1]
    cg = codes.reshape(*codes.shape[:-1], n // group, group).float()
    x = p.zero.float().unsqueeze(-1) + p.scale.float().unsqueeze(-1) * cg
    return x.reshape(codes.shape)


def fake_quantize(x: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """``dequantize(quantize(x))`` without packing: the reference for error measurements."""
    codes, scale, zero = quantize_codes(x, bits, group)
    n = x.shape[-1]
    cg = codes.reshape(*x.shape[:-1], n // group, group).float()
    return (zero.float().unsqueeze(-1) + scale.float().unsqueeze(-1) * cg).reshape(x.shape)
