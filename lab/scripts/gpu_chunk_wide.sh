#!/usr/bin/env bash
# The rows-on-M chunk kernel (oscarkv.kernels.chunk_wide) on one GPU: its oracle tests at real shapes, then
# chunk_sweep --wide (100K cached tokens; rows x warps x stages x key tile x splits, beside the staged path and
# today's default), one process per (kind, k) so a CUDA error stops only its own row. Writes pytest.log and
# wide_KIND_K/chunk_sweep.json under $OUT.
#
# Usage (repository root): OUT=DIR bash lab/scripts/gpu_chunk_wide.sh "int2:64 int2:16 bf16:64" [BLOCK_NS] [WARPS]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-runs/gpu_chunk_wide}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_chunk_splitk.py -k wide \
    2>&1 | tail -30 | tee "$OUT/pytest.log" || status=1
for row in ${1:-int2:64 int2:16 int2:32 int2:128 bf16:64 bf16:32 bf16:128}; do
    timeout "${ROW_S:-90}" python -m lab.scripts.chunk_sweep --out "$OUT/wide_${row/:/_}" --wide --chunks "${row#*:}" \
        --kinds "${row%:*}" --rows 64,128 --warps "${3:-4,8}" --stages 2,3 --block-n "${2:-32}" --mults 1,2,4 \
        2>&1 | grep -v Warning | tail -3 || status=1
done
exit $status
