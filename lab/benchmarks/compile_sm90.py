"""Registers, spills and SASS of the INT2 decode kernel for an H100 (sm_90), on a machine without a GPU.

``python -m lab.benchmarks.compile_sm90 OUT_PREFIX [NAME=VALUE ...]`` compiles
:func:`oscarkv.kernels.decode_int2._int2_decode_kernel` with Triton's bundled ``ptxas`` at the
Qwen3-8B attention shape (8 KV heads, 32 query heads, d = 128, page 64, 100K x 1 strides) and
the specialization Triton would give those arguments at run time (16-divisible pointers and
strides, strides of 1 as constants). NAME=VALUE overrides a constexpr (``G``, ``REP_PAD``, ``KBITS``, ``KLEV``,
``BLOCK_N``, ...) or an option (``num_warps``, ``num_stages``, ``maxnreg``). Writes
``OUT_PREFIX.{ttgir,ptx,cubin,sass}`` and prints registers, stack bytes (spills) and the count of
local loads/stores and mma instructions. Round 6 chose the transposed tiles with it (lab/record/benchmarks-log.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from oscarkv.kernels.decode_int2 import _int2_decode_kernel

POINTERS = {"Q": "*bf16", "Kb": "*bf16", "Vb": "*bf16", "Kc": "*u8", "Ks": "*fp16", "Kz": "*fp16", "Vc": "*u8",
            "Vs": "*fp16", "Vz": "*fp16", "BfTable": "*i32", "BfLens": "*i32", "InTable": "*i32", "InLens": "*i32",
            "MidO": "*fp32", "MidL": "*fp32"}
FLOATS = ("qk_scale", "KL1", "KL2", "VL1", "VL2")
OPTIONS = ("num_warps", "num_stages", "maxnreg")


def _ints(group: int, kbits: int = 2, vbits: int = 2, splits: int = 198) -> dict[str, int]:
    """Integer arguments at 100K x 1 (pool [pages, 8, 64, .], q [1, 32, 128], 12 programs per SM on 132 SMs; a
    code row of ``bits · 128 / 8`` bytes)."""
    return dict(NUM_SPLITS=splits, stride_qb=4096, stride_qh=128, stride_bp=65536, stride_bh=8192, stride_bt=128,
                stride_cp=8192 * kbits, stride_ch=1024 * kbits, stride_ct=16 * kbits,
                stride_vp=8192 * vbits, stride_vh=1024 * vbits, stride_vt=16 * vbits, stride_sp=512 * 128 // group,
                stride_sh=64 * 128 // group, stride_st=128 // group, stride_bfb=7, stride_inb=1601,
                stride_ob=32 * splits * 128, stride_oh=splits * 128, stride_os=128, stride_lb=32 * splits,
                stride_lh=splits)


def compile_sm90(overrides: dict[str, int]) -> triton.compiler.CompiledKernel:
    const = dict(H=8, REP=4, REP_PAD=8, D=128, G=128, P=64, BLOCK_N=64, CONV=2, CHUNK=32, INTERPRET=False,
                 KBITS=2, VBITS=2, KLEV=0, VLEV=0)
    const.update({k: v for k, v in overrides.items() if k in const})
    ints = _ints(const["G"], const["KBITS"], const["VBITS"])
    sig, attrs, cx = {}, {}, {}
    for i, name in enumerate(_int2_decode_kernel.arg_names):
        if name in const or ints.get(name) == 1:  # Triton makes an integer argument of 1 a constant
            sig[name], cx[(i,)] = "constexpr", const.get(name, 1)
        elif name in POINTERS or name in FLOATS:
            sig[name] = POINTERS.get(name, "fp32")  # qk_scale, the level tables' l1, l2
            attrs[(i,)] = [["tt.divisibility", 16]] if name in POINTERS else []
        else:
            sig[name] = "i32"
            attrs[(i,)] = [["tt.divisibility", 16]] if ints[name] % 16 == 0 else []
    opts = dict(num_warps=1, num_stages=3) | {k: v for k, v in overrides.items() if k in OPTIONS}
    return triton.compile(ASTSource(_int2_decode_kernel, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                          options=opts)


def main(prefix: str, overrides: dict[str, int]) -> None:
    k = compile_sm90(overrides)
    for ir in ("ttgir", "ptx"):
        with open(f"{prefix}.{ir}", "w") as f:
            f.write(k.asm[ir])
    with open(f"{prefix}.cubin", "wb") as f:
        f.write(k.asm["cubin"])
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    usage = subprocess.run([f"{tools}/cuobjdump", "--dump-resource-usage", f"{prefix}.cubin"],
                           capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([f"{tools}/nvdisasm", "-c", f"{prefix}.cubin"], capture_output=True, text=True,
                          check=True).stdout
    with open(f"{prefix}.sass", "w") as f:
        f.write(sass)
    regs = next(line.split()[0:2] for line in usage.splitlines() if "REG:" in line)
    print(overrides, *regs, "LDL", sass.count("LDL"), "STL", sass.count("STL"), "HMMA", sass.count("HMMA"))


if __name__ == "__main__":
    main(sys.argv[1], {k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])})
