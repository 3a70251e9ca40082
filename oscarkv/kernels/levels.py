"""Non-uniform 2-bit level tables in the kernels: the code → level maps (select form and prmt lookup).

A 2-bit kind may carry a table ``(0, l1, l2, 3)`` (``Int2Pages.levels``; the spec is
``oscarkv.quant.int2``): its readers take code ``c`` as ``L[c]`` steps of the group's scale. Every
reading kernel gets the table the same way (:mod:`oscarkv.kernels.pools`): the interior levels ``(l1, l2)``
as two fp32 scalars in the kind's pool bundle and a ``constexpr`` flag (``KLEV``, ``VLEV``), so a pool without a
table compiles to the uniform kernel, unchanged. The maps are two selects: codes 0 and 3 are their own levels.
"""

from __future__ import annotations

import triton
import triton.language as tl



@triton.jit
def _levels(c, L1, L2, LEVELS: tl.constexpr):
    """2-bit codes → their level (fp32) under the table ``(0, L1, L2, 3)``; the codes unchanged without one."""
    if LEVELS:
        c = tl.where(c == 1, L1, tl.where(c == 2, L2, c.to(tl.float32)))
    return c


@triton.jit
def _level_slice(c, L1, L2, I: tl.constexpr, DT: tl.constexpr):
    """Slice ``I`` (bits ``2I..2I+1``) of packed uint8 codes ``c`` as its level ``L[code] · 4^I · 2^-6`` (fp32
    math, then ``DT``): the unit of ``oscarkv.kernels.decode_int2``'s level path (normal fp16 numbers). The
    interpreter's form; compiled kernels look the levels up with :func:`_lut_slice`."""
    code = (c >> (2 * I)) & 3
    lv = tl.where(code == 1, L1, tl.where(code == 2, L2, code.to(tl.float32)))
    return (lv * (2.0 ** (2 * I - 6))).to(DT)


@triton.jit
def _f16_bits(x):
    """The fp16 bit pattern of the fp32 scalar ``x`` in the low half of an int32."""
    return x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _lut_slice(c, L1, L2, I: tl.constexpr):
    """:func:`_level_slice` in fp16 by table lookup (inline PTX, 6 instructions per 4 codes): the slice's table
    ``L · 4^I · 2^-6`` is two words of fp16 pairs, ``lo = (L0, L1)`` and ``hi = (L2, L3)``, i.e. 8 bytes in
    which entry ``k`` is bytes ``2k, 2k+1``; for four code bytes, ``y = (c >> 2I) & 0x03030303`` holds one code
    per byte and ``y · 34 + 0x10101010`` the ``prmt`` selector nibbles ``(2k, 2k+1)`` per byte, so one ``prmt``
    per pair of codes gathers their two fp16 levels (the selector's low half for codes 0, 1, its high half for
    2, 3). Codes 0 and 3 are table entries like the others. (The fp32 select path cost 2.6× the uniform
    kernel's instructions and spilled: H100, 2026-11-27.)"""
    u: tl.constexpr = 2.0 ** (2 * I - 6)
    E3: tl.constexpr = ((2 * I + 10) << 10) | 0x200  # fp16 of 3 · 2^(2I-6): exponent 2I - 5 (+15), mantissa 1.5
    lo = _f16_bits(L1 * u) << 16  # entry 0 is +0
    hi = _f16_bits(L2 * u) | (E3 << 16)
    z = tl.zeros(c.shape, tl.int32)
    lo = lo + z
    hi = hi + z
    # NOTE: pack=4: $2 holds four code bytes; lo and hi are int32, one register per element ($3..$6, $7..$10,
    # all equal); $0 gets the levels of codes 0 and 1, $1 of codes 2 and 3 (element 0 in the low half).
    if I == 0:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 y, s, t; and.b32 y, $2, 0x03030303; mad.lo.u32 s, y, 34, 0x10101010; "
            "prmt.b32 $0, $3, $7, s; shr.b32 t, s, 16; prmt.b32 $1, $3, $7, t; }",
            "=r,=r,r,r,r,r,r,r,r,r,r", [c, lo, hi], dtype=tl.float16, is_pure=True, pack=4)
    elif I == 1:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 y, s, t; shr.b32 y, $2, 2; and.b32 y, y, 0x03030303; mad.lo.u32 s, y, 34, 0x10101010; "
            "prmt.b32 $0, $3, $7, s; shr.b32 t, s, 16; prmt.b32 $1, $3, $7, t; }",
            "=r,=r,r,r,r,r,r,r,r,r,r", [c, lo, hi], dtype=tl.float16, is_pure=True, pack=4)
    elif I == 2:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 y, s, t; shr.b32 y, $2, 4; and.b32 y, y, 0x03030303; mad.lo.u32 s, y, 34, 0x10101010; "
            "prmt.b32 $0, $3, $7, s; shr.b32 t, s, 16; prmt.b32 $1, $3, $7, t; }",
            "=r,=r,r,r,r,r,r,r,r,r,r", [c, lo, hi], dtype=tl.float16, is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 y, s, t; shr.b32 y, $2, 6; and.b32 y, y, 0x03030303; mad.lo.u32 s, y, 34, 0x10101010; "
            "prmt.b32 $0, $3, $7, s; shr.b32 t, s, 16; prmt.b32 $1, $3, $7, t; }",
            "=r,=r,r,r,r,r,r,r,r,r,r", [c, lo, hi], dtype=tl.float16, is_pure=True, pack=4)
