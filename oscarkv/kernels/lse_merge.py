"""The staged path's parts merged by log-sum-exp: attention of a chunk's queries over several sets of keys (the
cached prefix's segments, each cut into key spans, and the chunk itself) → one output.

Role: :mod:`oscarkv.kernels.prefill` makes the parts (:func:`stacked`, :func:`headed`) and calls :func:`merge`.
Each part is read in its own layout (``_Part``: strides per span, token and query head), so no part is copied
into a common one; zero keys padding a part (cuDNN's few shapes) leave its numerator and are taken out of its
denominator (``_Part.pad``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class _Part:
    """Attention of the chunk's queries over one set of keys: ``o`` and natural-log ``lse`` with the element
    of (span s, token t, query head ``h · rep + r``) at ``s·ss + t·st + h·sh + r·sr`` (``o``: times channels,
    contiguous); the part is the log-sum-exp merge of its ``spans``."""

    o: torch.Tensor
    lse: torch.Tensor
    o_strides: tuple[int, int, int]
    lse_strides: tuple[int, int, int]
    pad: int = 0
    """Zero keys (value zero) among the keys: each scored exactly 0, so each added 1 to ``Σ e^s`` in ``lse`` and
    nothing to ``o``'s numerator; the merge takes them out of the denominator. Exact but for the fp32 rounding of
    ``lse``: relative ``~1e-7 · (1 + pad / Σ_real e^s)``, small unless every real score of a row is below ``−13``."""
    spans: int = 1
    span_strides: tuple[int, int] = (0, 0)
    """``o``'s and ``lse``'s strides between spans."""

    def arg(self) -> tuple:
        """What :func:`_merge_kernel` reads of the part."""
        return (self.o, self.lse, *self.o_strides, *self.lse_strides, self.spans, *self.span_strides, float(self.pad))


def stacked(o: torch.Tensor, lse: torch.Tensor, rep: int, c: int, pad: int = 0) -> _Part:
    """A part from stacked queries: ``o [S, H, rep·c, d]``, ``lse [S, H, rep·c]`` (row ``r·c + t``; ``S`` spans);
    ``pad`` zero keys."""
    return _Part(o, lse, (o.stride(2), o.stride(1), c * o.stride(2)), (lse.stride(2), lse.stride(1), c * lse.stride(2)),
                 pad, o.shape[0], (o.stride(0), lse.stride(0)))


def headed(o: torch.Tensor, lse: torch.Tensor, rep: int) -> _Part:
    """A part over query heads: ``o [1, Hq, c, d]``, ``lse [1, Hq, c]``."""
    return _Part(o, lse, (o.stride(2), rep * o.stride(1), o.stride(1)), (lse.stride(2), rep * lse.stride(1), lse.stride(1)))


@triton.jit
def _part_max(part, h, r, t, ok, m):
    """``m`` raised to the largest ``lse`` of ``part``'s spans (rows ``t`` of query head ``h · REP + r``)."""
    O, L, o_t, o_h, o_r, l_t, l_h, l_r, spans, o_s, l_s, pad = part
    for s in range(spans):
        m = tl.maximum(m, tl.load(L + s * l_s + h * l_h + r * l_r + t * l_t, mask=ok, other=float("-inf")).to(tl.float32))
    return m


@triton.jit
def _part_sum(part, h, r, t, ok, cols, m, num, den):
    """``num += Σ_spans e^(lse − m) o``, ``den += Σ_spans e^(lse − m) − pad e^(−m)`` over ``part``'s spans."""
    O, L, o_t, o_h, o_r, l_t, l_h, l_r, spans, o_s, l_s, pad = part
    for s in range(spans):
        w = tl.exp(tl.load(L + s * l_s + h * l_h + r * l_r + t * l_t, mask=ok, other=0.0).to(tl.float32) - m)
        o = tl.load(O + (s * o_s + h * o_h + r * o_r + t * o_t)[:, None] + cols[None, :], mask=ok[:, None], other=0.0)
        num += o.to(tl.float32) * w[:, None]
        den += w
    return num, den - pad * tl.exp(-m)


@triton.jit
def _merge_kernel(A, B, Out, Lout, c, so_t, so_h, so_r,
                  REP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, WRITE_LSE: tl.constexpr):
    """``out = Σ e^(l − m) o / (Σ e^(l − m) − pad e^(−m))`` over the spans of parts ``A`` and ``B``
    (:meth:`_Part.arg`) for BLOCK_T tokens of query head ``program_id(1)``, fp32, and the merged ``lse``
    (``WRITE_LSE``: more parts follow): a part's ``pad`` zero keys (``_Part.pad``) leave its numerator and its real
    keys' weight."""
    hq = tl.program_id(1)
    h, r = hq // REP, hq % REP
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    ok = t < c
    cols = tl.arange(0, D)
    m = _part_max(B, h, r, t, ok, _part_max(A, h, r, t, ok, tl.full([BLOCK_T], float("-inf"), tl.float32)))
    m = tl.where(m == float("-inf"), 0.0, m)
    num, den = _part_sum(A, h, r, t, ok, cols, m, tl.zeros([BLOCK_T, D], tl.float32), tl.zeros([BLOCK_T], tl.float32))
    num, den = _part_sum(B, h, r, t, ok, cols, m, num, den)
    den = tl.where(ok, den, 1.0)  # rows past c: nothing to shed
    tl.store(Out + (h * so_h + r * so_r + t * so_t)[:, None] + cols[None, :], num / den[:, None], mask=ok[:, None])
    if WRITE_LSE:
        tl.store(Lout + hq * c + t, m + tl.log(den), mask=ok)


def merge(parts: list[_Part], c: int, hq: int, rep: int) -> torch.Tensor:
    """``Σ exp(lse_i − lse) o_i`` over the parts (and their spans) → fp32 ``[c, Hq, d]``: pairwise, one pass per
    extra part."""
    d = parts[0].o.shape[-1]
    out = torch.empty(c, hq, d, dtype=torch.float32, device=parts[0].o.device)
    o_strides = (hq * d, rep * d, d)
    if len(parts) == 1:  # no cached prefix: a strided copy
        p = parts[0]
        out.copy_(p.o[0].transpose(0, 1))
        return out
    acc = parts[0]
    for i, p in enumerate(parts[1:]):
        last = i == len(parts) - 2
        lse = None if last else torch.empty(hq, c, dtype=torch.float32, device=out.device)
        _merge_kernel[(triton.cdiv(c, 32), hq)](acc.arg(), p.arg(), out, lse if lse is not None else out, c,
                                                *o_strides, REP=rep, D=d, BLOCK_T=32, WRITE_LSE=not last)
        if not last:
            acc = _Part(out.clone(), lse, o_strides, (1, rep * c, c))
    return out
