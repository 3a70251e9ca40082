"""Registers, spills and SASS of the attention kernels for an H100 (sm_90), on a machine without a GPU.

``python -m lab.benchmarks.compile_sm90 OUT_PREFIX [NAME=VALUE ...]`` compiles one kernel with Triton's bundled
``ptxas`` at the Qwen3-8B attention shape (8 KV heads, 32 query heads, d = 128, page 64, 100K x 1) and the
specialization Triton gives those arguments at run time (Triton's own binder on stand-in tensors: 16-divisible
pointers and strides, integers of 1 as constants). ``kernel=NAME`` picks the kernel (:data:`KERNELS`; default
``decode_int2``); other NAME=VALUE override a constexpr (``G``, ``REP_PAD``, ``KBITS``, ``KLEV``, ``BLOCK_N``,
...) or an option (``num_warps``, ``num_stages``, ``maxnreg``). Writes ``OUT_PREFIX.{ttgir,ptx,cubin,sass}`` and
prints registers, stack bytes (spills), local loads/stores, mma (HMMA, HGMMA) and SASS instruction counts.

``python -m lab.benchmarks.compile_sm90 --table OUT.json [SASS_DIR [RUNG_PREFIX ...]]`` compiles every rung of :data:`RUNGS` (each kernel at its
production launch options: ``decode._config``, ``extend._config``) and writes the counts as JSON: the check that
a refactor of the kernels leaves their SASS unchanged. Round 6 chose the transposed tiles with it
(docs/lab/benchmarks-log.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import MockTensor, create_function_from_signature

from lab.benchmarks import compile_sm90_args as kargs

TARGET = GPUTarget("cuda", 90, 32)
OPTIONS = ("num_warps", "num_stages", "maxnreg")
KERNELS = kargs.KERNELS
RUNGS = {  # name: (kernel, overrides); options default to the kernel's production launch (compile_sm90_args)
    "int2_k2v2_g128": ("decode_int2", {}),
    "int2_k4v2_g128": ("decode_int2", dict(KBITS=4)),
    "int2_k2v4_g128": ("decode_int2", dict(VBITS=4)),
    "int2_k4v4_g128": ("decode_int2", dict(KBITS=4, VBITS=4)),
    "int2_klev_vlev_g128": ("decode_int2", dict(KLEV=1, VLEV=1)),
    "int2_klev_g128": ("decode_int2", dict(KLEV=1)),
    "int2_k2v2_g64": ("decode_int2", dict(G=64)),
    "int2_k4v4_g64": ("decode_int2", dict(G=64, KBITS=4, VBITS=4)),
    "int2_klev_vlev_g64": ("decode_int2", dict(G=64, KLEV=1, VLEV=1)),
    "int2_k2v2_g128_uncapped": ("decode_int2", dict(maxnreg=0)),
    "int2_k2v2_g128_p16": ("decode_int2", dict(P=16, BLOCK_N=16)),  # pages of 16 (the shipped recipe): tiles of a page
    "int2_k2v2_g128_p16_span64": ("decode_int2", dict(P=16, BLOCK_N=64)),  # ... or of four pages (SPAN_PAGES)
    "int2_k4v2_g128_p16_span64": ("decode_int2", dict(P=16, BLOCK_N=64, KBITS=4)),
    "generic_int2_g32": ("decode", dict(G=32)),
    "generic_k4v4_g32": ("decode", dict(G=32, KBITS=4, VBITS=4)),
    "generic_lev_g32": ("decode", dict(G=32, KLEV=1, VLEV=1)),
    "generic_bf16": ("decode", dict(HAS_INT2=0)),
    "extend_int2_g128": ("extend", {}),
    "extend_k4v4_lev_g128": ("extend", dict(KBITS=4, VBITS=2, VLEV=1)),
    "extend_bf16": ("extend", dict(HAS_INT2=0)),
    "chunk_int2_r8_g128": ("chunk", {}),
    "chunk_int2_r16_g128": ("chunk", dict(BLOCK_T=4)),
    "chunk_int2_r32_g128": ("chunk", dict(BLOCK_T=8)),
    "chunk_int2_r64_g128": ("chunk", dict(BLOCK_T=16)),
    "chunk_k4v4_lev_r16_g128": ("chunk", dict(BLOCK_T=4, KBITS=4, VBITS=2, VLEV=1)),
    "chunk_int2_r64_g64": ("chunk", dict(BLOCK_T=16, G=64)),
    "chunk_bf16_r16": ("chunk", dict(BLOCK_T=4, HAS_INT2=0)),
    "chunk_bf16_r64": ("chunk", dict(BLOCK_T=16, HAS_INT2=0)),
    "gather_int2_g128": ("gather_int2", {}),
    "gather_int2_k4_lev": ("gather_int2", dict(KBITS=4, VLEV=1)),
    "gather_bf16": ("gather_bf16", {}),
}


def _mock(value):
    """Stand-ins for the launcher's arguments: a torch dtype becomes a 16-aligned tensor, tuples recurse."""
    if isinstance(value, torch.dtype):
        return MockTensor(value)
    if isinstance(value, tuple):
        return tuple(_mock(v) for v in value)
    return value


def compile_sm90(overrides: dict[str, int], kernel: str = "decode_int2") -> triton.compiler.CompiledKernel:
    """Compile ``kernel`` (a key of :data:`KERNELS`) with ``overrides`` of its constexprs and launch options."""
    fn, args, kwargs, opts = kargs.KERNELS[kernel](overrides)
    opts |= {k: v for k, v in overrides.items() if k in OPTIONS}
    if not opts.get("maxnreg"):
        opts.pop("maxnreg", None)
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, _ = binder(*_mock(tuple(args)), **{k: _mock(v) for k, v in kwargs.items()})
    _, sig, cx, attrs = fn._pack_args(backend, opts, bound, spec, None)
    return triton.compile(ASTSource(fn, sig, cx, attrs), target=TARGET, options=opts)


def _counts(k: triton.compiler.CompiledKernel, prefix: str) -> dict[str, int]:
    """Write ``prefix.{ttgir,ptx,cubin,sass}``; registers, stack, LDL/STL/HMMA and SASS instruction counts."""
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
    res = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    instr = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", line)]
    return dict(regs=int(res["REG"]), stack=int(res["STACK"]), shared=int(res.get("SHARED", 0)),
                ldl=sass.count("LDL"), stl=sass.count("STL"), hmma=sass.count("HMMA"), hgmma=sass.count("HGMMA"),
                sass_instructions=len(instr))


def table(path: str, keep: str | None = None, only: tuple[str, ...] = ()) -> None:
    """Compile every rung of :data:`RUNGS`; write their counts to ``path`` (JSON) and print one line each;
    ``keep``: a folder for each rung's ttgir, ptx, cubin and SASS (to diff two versions of the kernels); ``only``:
    the rungs whose names start with one of these."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (kernel, overrides) in RUNGS.items():
            if only and not name.startswith(only):
                continue
            out[name] = dict(kernel=kernel, overrides=overrides,
                             **_counts(compile_sm90(overrides, kernel), os.path.join(keep or tmp, name)))
            print(name, out[name], flush=True)
    with open(path, "w") as f:
        json.dump(dict(triton=triton.__version__, target="sm_90", rungs=out), f, indent=1)


def main(prefix: str, overrides: dict[str, str]) -> None:
    kernel = overrides.pop("kernel", "decode_int2")
    ints = {k: int(v) for k, v in overrides.items()}
    print(kernel, ints, _counts(compile_sm90(ints, kernel), prefix))


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None, tuple(sys.argv[4:]))
    else:
        main(sys.argv[1], dict(a.split("=") for a in sys.argv[2:]))
