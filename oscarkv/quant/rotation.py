"""Orthogonal rotations: eigenbasis U, Hadamard H and the bit-reversal permutation P_br.

R = U · H · P_br (DESIGN.md §1), applied to row vectors as ``x_rot = x @ R``. ``U`` holds the
eigenvectors of a calibrated second-moment matrix in columns, eigenvalues descending, solved
in fp64. ``H`` is the normalized Sylvester Hadamard for power-of-two ``d``, otherwise block
diagonal over the power-of-two blocks of ``d``'s binary expansion (largest first). ``P_br``
permutes channels so that output group ``g`` of ``G`` channels collects the channels whose
bit-reversed index falls in ``[g G, (g+1) G)`` — one channel from each importance level;
when ``G == d`` it only reorders a single group. Rotations are stored in fp32 in the
artifact (``oscarkv.quant.artifact``) and consumed by the codecs (``oscarkv.quant.codec``).
"""

from __future__ import annotations

import torch

ROTATION_KINDS = ("uhp", "u", "h", "none")
"""Rotation compositions: U·H·P_br (OSCAR), U only, H only (QuaRot-style), identity."""


def hadamard(d: int) -> torch.Tensor:
    """Normalized ``d x d`` Hadamard (block diagonal when ``d`` is not a power of two), fp64."""
    blocks, rest, size = [], d, 1 << (d.bit_length() - 1)
    while rest:
        if size <= rest:
            blocks.append(_sylvester(size))
            rest -= size
        size >>= 1
    return torch.block_diag(*blocks)


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def bit_reversal(d: int) -> torch.Tensor:
    """Permutation ``perm`` with ``perm[i]`` = bit-reversal of ``i`` (power-of-two ``d``; identity otherwise)."""
    if d & (d - 1):
        return torch.arange(d)
    bits = d.bit_length() - 1
    return torch.tensor([int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(d)])


def permutation_matrix(perm: torch.Tensor) -> torch.Tensor:
    """``P`` such that ``x @ P == x[..., perm]``."""
    d = perm.numel()
    p = torch.zeros(d, d, dtype=torch.float64)
    p[perm, torch.arange(d)] = 1.0
    return p


def eig_desc(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (descending) and eigenvectors (columns) of a symmetric matrix, in fp64."""
    c = c.double()
    evals, evecs = torch.linalg.eigh((c + c.transpose(-1, -2)) / 2)
    return evals.flip(-1), evecs.flip(-1)


def compose(u: torch.Tensor, kind: str) -> torch.Tensor:
    """Build ``R [..., d, d]`` (fp32) from eigenvectors ``u [..., d, d]`` for a rotation kind."""
    if kind not in ROTATION_KINDS:
        raise ValueError(f"rotation kind must be one of {ROTATION_KINDS}, got {kind!r}")
    d = u.shape[-1]
    eye = torch.eye(d, dtype=torch.float64).expand_as(u)
    left = u.double() if kind in ("uhp", "u") else eye
    if kind == "uhp":
        r = left @ hadamard(d) @ permutation_matrix(bit_reversal(d))
    elif kind == "h":
        r = left @ hadamard(d)
    else:
        r = left
    return r.float().contiguous()


def orthogonality_error(r: torch.Tensor) -> float:
    """``max |R Rᵀ - I|`` over all matrices in ``r [..., d, d]``."""
    eye = torch.eye(r.shape[-1], dtype=torch.float64)
    return float((r.double() @ r.double().transpose(-1, -2) - eye).abs().max())
