"""Non-uniform 2-bit level tables in the kernels: the code → level maps and the launch arguments.

A 2-bit kind may carry a table ``(0, l1, l2, 3)`` (``Int2Pages.levels``; the spec is
``oscarkv.quant.int2``): its readers take code ``c`` as ``L[c]`` steps of the group's scale. Every
reading kernel gets the table the same way (:func:`level_args`): two fp32 scalars per kind (``KL1, KL2``,
``VL1, VL2``, the interior levels) and a ``constexpr`` flag (``KLEV``, ``VLEV``), so a pool without a table
compiles to the uniform kernel, unchanged. The maps are two selects: codes 0 and 3 are their own levels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from oscarkv.cache.paged_layout import Int2Pages


@triton.jit
def _levels(c, L1, L2, LEVELS: tl.constexpr):
    """2-bit codes → their level (fp32) under the table ``(0, L1, L2, 3)``; the codes unchanged without one."""
    if LEVELS:
        c = tl.where(c == 1, L1, tl.where(c == 2, L2, c.to(tl.float32)))
    return c


@triton.jit
def _level_slice(c, L1, L2, I: tl.constexpr, DT: tl.constexpr):
    """Slice ``I`` (bits ``2I..2I+1``) of packed uint8 codes ``c`` as its level ``L[code] · 4^I · 2^-6`` (fp32
    math, then ``DT``): the unit of ``oscarkv.kernels.decode_int2``'s level path (normal fp16 numbers)."""
    code = (c >> (2 * I)) & 3
    lv = tl.where(code == 1, L1, tl.where(code == 2, L2, code.to(tl.float32)))
    return (lv * (2.0 ** (2 * I - 6))).to(DT)


def level_args(k2: Int2Pages, v2: Int2Pages) -> dict:
    """The level-table arguments of the decode, extend and prefill kernels: ``KL1, KL2, VL1, VL2`` (fp32 scalars)
    and the ``constexpr`` flags ``KLEV``/``VLEV``, for the kinds that carry a table (the others keep the defaults)."""
    out = {}
    for name, pool in (("K", k2), ("V", v2)):
        if pool.levels is not None:
            assert pool.bits == 2, "level tables are for 2-bit codes"
            out |= {f"{name}L1": pool.levels[1], f"{name}L2": pool.levels[2], f"{name}LEV": True}
    return out
