#!/usr/bin/env bash
# Split-K chunk attention (oscarkv.kernels.chunk_splitk) on one GPU (an H100), in under 8 minutes:
#
#   1. the GPU-marked oracle tests of the kernel at real shapes (Qwen3-4B/8B attention: 32 query heads, 8 KV heads,
#      d = 128, page 64; INT2, BF16, K4V2 and level-table caches; GQA 5 and 1) and the routing/prefill tests;
#   2. registers and spills of every chunk kernel the tests compiled (n_regs, n_spills per specialization);
#   3. attention-only time per layer: split-K vs the tile kernel (extend) vs the staged path (prefill) vs what
#      TritonAttention.extend routes to vs one decode step, 32K and 100K cached tokens, k = 1, 8, 64, 512,
#      BF16 and INT2 caches (lab.benchmarks.chunk_attention), a table on stdout and chunk_attention.json.
#
# Usage (repository root, a CUDA torch and Triton installed):  bash lab/scripts/gpu_chunk.sh [PYTHON]
# Writes pytest.log, registers.json, chunk_attention.{json,txt} under $OUT (default runs/gpu_chunk). Each step
# has its own timeout; a failing step does not stop the others (the exit status says whether one failed).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${1:-python}"
OUT="${OUT:-runs/gpu_chunk}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0

timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_chunk_splitk.py \
    tests/kernels/test_prefill.py -x 2>&1 | tail -40 | tee "$OUT/pytest.log" || status=1

timeout 90 "$PY" - "$OUT/registers.json" <<'PYEOF' || status=1
"""Compile the chunk kernel at each row tile (INT2 and BF16 caches) and report registers and spills."""
import json, sys
import torch
from oscarkv.kernels.chunk_splitk import _chunk_kernel, chunk_attention
from oscarkv.kernels.synthetic import random_cache

for int2 in (True, False):
    kv, tables = random_cache([4096], 8, 128, page=64, sink=64, recent=256, int2=int2, device="cuda")
    for k in (1, 2, 8, 16):  # rows 8, 8, 32, 64 (and 16 through ROWS)
        q, kn, vn = (torch.randn(k, n, 128, device="cuda", dtype=torch.bfloat16) for n in (32, 8, 8))
        cu = torch.tensor([0, k], dtype=torch.int32, device="cuda")
        chunk_attention(q, kn, vn, kv, tables, cu, 128**-0.5, k)
    chunk_attention(q, kn, vn, kv, tables, cu, 128**-0.5, k, config=dict(ROWS=16))
torch.cuda.synchronize()
rows = [dict(regs=k.n_regs, spills=k.n_spills, key=str(key)[-160:])
        for cache in _chunk_kernel.device_caches.values() for key, k in cache[0].items()]
for r in rows:
    print(r["regs"], r["spills"], r["key"][-100:])
json.dump(rows, open(sys.argv[1], "w"), indent=1)
PYEOF

timeout 300 "$PY" -m lab.benchmarks.chunk_attention "$OUT/chunk_attention.json" 2>&1 | tee "$OUT/chunk_attention.txt" \
    || status=1

exit $status
