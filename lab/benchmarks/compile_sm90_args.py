"""The arguments :mod:`benchmarks.compile_sm90` compiles each kernel with, laid out as its launcher lays them out.

Qwen3-8B attention at 100K x 1: 8 KV heads, 32 query heads, d = 128, page 64, one sequence, 198 splits (12
programs per SM on 132 SMs). Tensors are torch dtypes (``compile_sm90`` turns them into 16-aligned stand-ins);
integers are the strides the pools of :mod:`oscarkv.cache.paged_layout` have at that shape. Each builder takes
the overrides (constexprs such as ``G``, ``KBITS``, ``KLEV``; launch options) and returns
``(kernel, args, kwargs, options)``; options are the production ones (``decode._config``, ``extend._config``).
"""

from __future__ import annotations

import torch

from oscarkv.kernels.decode import _decode_kernel
from oscarkv.kernels.chunk_splitk import _chunk_kernel
from oscarkv.kernels.chunk_splitk import _config as chunk_config
from oscarkv.kernels.decode_int2 import _int2_decode_kernel
from oscarkv.kernels.extend import _extend_kernel
from oscarkv.kernels.lse_merge import _merge_kernel
from oscarkv.kernels.prefill import _gather_bf16_kernel, _gather_int2_kernel

BF, F16, U8, I32, F32 = torch.bfloat16, torch.float16, torch.uint8, torch.int32, torch.float32
H, HQ, D, P, SPLITS = 8, 32, 128, 64, 198
QK_SCALE = 0.127
LEVELS = (1.1, 1.9)  # an interior level pair (l1, l2) of a 2-bit table


def _const(defaults: dict, overrides: dict) -> dict:
    return defaults | {k: v for k, v in overrides.items() if k in defaults or k in ("KLEV", "VLEV")}


def _pool_strides(bits: int) -> tuple[int, int, int]:
    """Code pool ``[pages, H, P, d·bits/8]`` strides (page, head, token)."""
    row = D * bits // 8
    return H * P * row, P * row, row


def _scale_strides(g: int) -> tuple[int, int, int]:
    ng = D // g
    return H * P * ng, P * ng, ng


BF_STRIDES = (H * P * D, P * D, D)


def _levels(c: dict) -> dict:
    """Pops ``KLEV``/``VLEV`` from ``c``; the level pairs ``{"K": (l1, l2), "V": ...}`` and the flags that are on."""
    pairs, flags = {}, {}
    for kind in ("K", "V"):
        on = bool(c.pop(f"{kind}LEV", 0))
        pairs[kind] = LEVELS if on else (0.0, 0.0)
        flags |= {f"{kind}LEV": True} if on else {}
    return pairs, flags


WINDOW = (BF, BF, BF_STRIDES)
TABLES = (I32, I32, I32, I32, 7, 1601)


def _history(c: dict, pairs: dict, int2: bool = True) -> tuple:
    """The history bundle of :mod:`oscarkv.kernels.pools`; a BF16-only cache passes its BF16 pool in its place."""
    if not int2:
        stand_in = (BF, BF, BF, BF_STRIDES, (0.0, 0.0))
        return stand_in, stand_in, BF_STRIDES
    return ((U8, F16, F16, _pool_strides(c["KBITS"]), pairs["K"]), (U8, F16, F16, _pool_strides(c["VBITS"]), pairs["V"]),
            _scale_strides(c["G"]))


def _decode_args(c: dict, pairs: dict, int2: bool) -> list:
    mid = (F32, F32, (HQ * SPLITS * D, SPLITS * D, D), (HQ * SPLITS, SPLITS))
    return [(BF, HQ * D, D), WINDOW, _history(c, pairs, int2), TABLES, mid, QK_SCALE, SPLITS]


def decode_int2(o: dict):
    c = _const(dict(H=H, REP=4, REP_PAD=8, D=D, G=128, P=P, BLOCK_N=64, CONV=2, CHUNK=32, INTERPRET=False,
                    KBITS=2, VBITS=2), o)
    pairs, flags = _levels(c)
    return _int2_decode_kernel, _decode_args(c, pairs, True), c | flags, dict(num_warps=1, num_stages=3, maxnreg=168)


def decode(o: dict):
    c = _const(dict(H=H, REP=4, REP_PAD=16, D=D, G=32, P=P, BLOCK_N=64, HAS_INT2=True, INTERPRET=False,
                    KBITS=2, VBITS=2), o)
    c["HAS_INT2"] = bool(c["HAS_INT2"])
    if not c["HAS_INT2"]:
        c |= dict(G=D, BLOCK_N=128)
    pairs, flags = _levels(c)
    return _decode_kernel, _decode_args(c, pairs, c["HAS_INT2"]), c | flags, dict(num_warps=4, num_stages=3)


def extend(o: dict):
    c = _const(dict(REP=4, REP_PAD=4, D=D, G=128, P=P, BLOCK_T=16, BLOCK_N=64, HAS_INT2=True, INTERPRET=False,
                    KBITS=2, VBITS=2), o)
    c["HAS_INT2"] = bool(c["HAS_INT2"])
    if not c["HAS_INT2"]:
        c["G"] = D
    pairs, flags = _levels(c)
    args = [(BF, HQ * D, D), (BF, BF, (H * D, D), (H * D, D)), WINDOW, _history(c, pairs, c["HAS_INT2"]), TABLES, I32,
            (BF, HQ * D, D), QK_SCALE]
    return _extend_kernel, args, c | flags, dict(num_warps=4, num_stages=2)


def chunk(o: dict):
    """The split-K chunk kernel; ``BLOCK_T · REP_PAD`` query rows per program pick the launch (``chunk_splitk._config``)."""
    c = _const(dict(H=H, REP=4, REP_PAD=4, D=D, G=128, P=P, BLOCK_T=2, BLOCK_N=64, CONV=2, CHUNK=32, HAS_INT2=True,
                    INTERPRET=False, KBITS=2, VBITS=2), o)
    c["HAS_INT2"] = bool(c["HAS_INT2"])
    if not c["HAS_INT2"]:
        c["G"] = D
    pairs, flags = _levels(c)
    cfg = chunk_config(torch.device("cuda"), c["BLOCK_T"] * c["REP_PAD"], c["HAS_INT2"])
    args = [(BF, HQ * D, D), (BF, BF, (H * D, D), (H * D, D)), WINDOW, _history(c, pairs, c["HAS_INT2"]), TABLES, I32,
            _decode_args(c, pairs, True)[4], QK_SCALE, SPLITS]
    return _chunk_kernel, args, c | flags, {k: cfg[k] for k in ("num_warps", "num_stages", "maxnreg") if k in cfg}


SPAN = (4096, 8192, 64)  # t0, count, out0
OUT = (BF, BF, 131072 * D)


def gather_int2(o: dict):
    c = _const(dict(D=D, G=128, P=P, BLOCK=64, KBITS=2, VBITS=2, RAW=0, CONV=0), o)
    pairs, flags = _levels(c)
    return _gather_int2_kernel, [_history(c, pairs), I32, OUT, SPAN], c | flags, dict(num_warps=4, num_stages=3)


def gather_bf16(o: dict):
    c = _const(dict(D=D, P=P, BLOCK=64), o)
    return _gather_bf16_kernel, [WINDOW, I32, OUT, SPAN], c, dict(num_warps=4, num_stages=3)


def merge(o: dict):
    """The staged path's merge of a prefix part of 16 key spans (64 tokens: 256 stacked rows) and the causal part."""
    c = _const(dict(REP=4, D=D, BLOCK_T=32, WRITE_LSE=False), o)
    rows = 4 * 64
    spans = (BF, F32, D, rows * D, 64 * D, 1, rows, 64, 16, H * rows * D, H * rows, 4096.0)
    causal = (BF, F32, D, 4 * 64 * D, 64 * D, 1, 4 * 64, 64, 1, 0, 0, 0.0)
    return _merge_kernel, [spans, causal, F32, F32, 64, HQ * D, 4 * D, D], c, dict(num_warps=4, num_stages=3)


KERNELS = dict(decode_int2=decode_int2, decode=decode, extend=extend, chunk=chunk, gather_int2=gather_int2,
               gather_bf16=gather_bf16, merge=merge)
