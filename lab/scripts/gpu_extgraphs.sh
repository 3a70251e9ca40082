#!/usr/bin/env bash
# Extend graphs on one GPU (issue 29, item 3; < 6 min): short extend steps of one sequence replayed as CUDA graphs.
#   1. GPU tests: follow-ups through the extend graphs ≡ eager (near-tie bound), speculative verify chunks through
#      them ≡ without speculation, a padded step stores nothing outside its slots; the decode-graph and speculation
#      GPU tests beside them                                                                   -> pytest.log
#   2. the follow-up step profile at 100K (qwen3-4b, random weights; k = 1, 8, 64; oscar and bf16): wall, kernel
#      time, launches, extend-graph replays and fallback reasons per row      -> on/followup_profile.{json,txt}
#      ("before": the same command with --extend-graphs off, step 3 when asked: bash ... off)
#
# Usage (repository root, a CUDA torch): bash lab/scripts/gpu_extgraphs.sh [off] ; results under $OUT (default runs/gpu_extgraphs)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-python3}"
OUT="${OUT:-runs/gpu_extgraphs}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/engine/test_extend_graphs_gpu.py \
    tests/engine/test_extend_graphs.py tests/engine/test_speculative_gpu.py 2>&1 | tee "$OUT/pytest.log" || status=1
for mode in on ${1:-}; do
    timeout 200 "$PY" -m lab.scripts.followup_profile --context 102400 --new-tokens 1,8,64 --methods oscar,bf16 \
        --extend-graphs "$mode" --out "$OUT/$mode" 2>&1 | grep '^==\|cached in' | tee "$OUT/profile_$mode.log" || status=1
done
exit $status
