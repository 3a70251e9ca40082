#!/usr/bin/env bash
# Lloyd-Max 2-bit level tables on a GPU (an H100): correctness at real shapes, then decode speed.
#
#   1. the GPU-marked oracle tests of the level path (decode raw-code and generic kernels, extend, staged
#      prefill, the Triton engine with CUDA graphs) and, as a regression check of the uniform path, the
#      decode kernel's own GPU tests;
#   2. registers and spills of every compiled raw-code decode kernel, uniform and with tables (the uniform one
#      should keep 168 registers and no spills: DESIGN.md §4);
#   3. decode attention time, Qwen3-8B attention shape (32 query heads, 8 KV heads, head_dim 128), 32K and
#      100K context, batch 1 and 8: BF16, INT2 uniform, INT2 with a level table (``oscarkv bench attention
#      --levels``), a table on stdout and JSON.
#
# Usage (repository root, a CUDA torch and Triton installed):  bash lab/scripts/gpu_levels_check.sh [PYTHON]
# Writes pytest.log, registers.json, levels_attention.{json,txt} under $OUT (default runs/gpu_levels).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${1:-python}"
OUT="${OUT:-runs/gpu_levels}"
mkdir -p "$OUT"
status=0

"$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_levels.py tests/engine/test_levels.py \
    tests/kernels/test_decode.py 2>&1 | tee "$OUT/pytest.log" || status=1

"$PY" - "$OUT/registers.json" <<'EOF' || status=1
"""Compile the raw-code decode kernel uniform and with tables (keys, values, both) and report its resources."""
import json, sys
import torch
from oscarkv.kernels.decode import decode_attention
from oscarkv.kernels.decode_int2 import _int2_decode_kernel
from oscarkv.kernels.synthetic import random_cache

LM = (0.0, 0.875, 2.125, 3.0)
for levels in ((None, None), (LM, None), (None, LM), (LM, LM)):
    kv, tables = random_cache([4096] * 2, 8, 128, page=64, sink=64, recent=256, device="cuda", levels=levels)
    decode_attention(torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16), kv, tables, 128**-0.5)
torch.cuda.synchronize()
rows = [dict(regs=k.n_regs, spills=k.n_spills, key=str(key)[-200:])
        for cache in _int2_decode_kernel.device_caches.values() for key, k in cache[0].items()]
for r in rows:
    print(f"raw INT2 decode kernel: {r['regs']} registers, {r['spills']} spills  ({r['key'][-90:]})")
json.dump({"device": torch.cuda.get_device_name(), "kernels": rows}, open(sys.argv[1], "w"), indent=1)
EOF

"$PY" -m oscarkv.cli bench attention --contexts 32768,102400 --batches 1,8 --levels \
    --out "$OUT/levels_attention.json" 2>&1 | tee "$OUT/levels_attention.txt" || status=1

echo "gpu_levels_check: $([ $status = 0 ] && echo ok || echo FAILED) (logs in $OUT)"
exit $status
