"""Compile a kernel for an H100 (sm_90) with Triton's bundled ptxas, on a machine without a GPU, in a process of its
own without ``TRITON_INTERPRET``: the interpreter swaps ``triton.language``'s builtins while it runs a kernel, and a
compile in the same process that meets them fails (once in a full CI run, 2026-11-28)."""

import json
import os
import subprocess
import sys

import pytest


_TAIL = """
import json, sys
try:
    k = build()
except (RuntimeError, FileNotFoundError) as e:  # no CUDA backend tools in this Triton
    print(json.dumps({"skip": str(e)})); sys.exit()
print(json.dumps({"ptx": k.asm["ptx"], "cubin": bool(k.asm["cubin"])}))
"""


def compile_sm90(code: str) -> dict:
    """Run ``code``, which defines ``build()`` returning a Triton ``CompiledKernel`` for sm_90, in a fresh
    interpreter-free process: ``{"ptx": ..., "cubin": bool}``, or the test skipped when this Triton has no CUDA
    toolchain."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code + _TAIL], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(f"no sm_90 toolchain: {got['skip']}")
    return got
