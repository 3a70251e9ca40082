#!/usr/bin/env bash
# The bench engines' runner (oscarkv.bench.e2e.BenchRunner, given to the engine at construction) on GPUs, one
# GPU and two (tensor parallelism: the BenchRunner wraps a ParallelRunner, the path whose runner swap failed the
# two-GPU job). Needs a host with 2 GPUs (nvidia-h100-x2); each bench is short (a few minutes in all).
#
#   1. the CPU tests of the runner interface and the benches (tests/bench, tests/engine/test_runner_interface.py)
#      and the GPU-marked engine tests of both runners (tests/engine/test_gpu_engine.py,
#      tests/engine/test_tensor_parallel_gpu.py);
#   2. bench decode, capacity and jobs on qwen3-4b, short contexts, tp=1 and tp=2: each must run to its table
#      (decode: graph replays and host phases through BenchRunner.graphs; capacity: the fill; jobs: step kinds).
#
# Usage (repository root, a CUDA torch):  bash lab/scripts/gpu_runner_interface.sh [PYTHON]
# Writes pytest.log and {decode,capacity,jobs}_tp{1,2}.{json,txt} under $OUT (default runs/gpu_runner).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${1:-python}"
OUT="${OUT:-runs/gpu_runner}"
mkdir -p "$OUT"
status=0

"$PY" -m pytest -q -p no:cacheprovider tests/bench tests/engine/test_runner_interface.py 2>&1 | tee "$OUT/pytest.log" || status=1
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu_engine.py tests/engine/test_tensor_parallel_gpu.py \
    2>&1 | tee -a "$OUT/pytest.log" || status=1

for tp in 1 2; do
    "$PY" -m oscarkv.cli bench decode --shapes qwen3-4b --contexts 8192 --methods bf16,oscar --steps 32 --kv-gib 8 \
        --tensor-parallel-size "$tp" --out "$OUT/decode_tp$tp.json" 2>&1 | tee "$OUT/decode_tp$tp.txt" || status=1
    "$PY" -m oscarkv.cli bench capacity --shape qwen3-4b --kv-gib 8 --context 8192 --requests 8 --new-tokens 16 \
        --methods bf16,oscar --tensor-parallel-size "$tp" --out "$OUT/capacity_tp$tp.json" 2>&1 | tee "$OUT/capacity_tp$tp.txt" || status=1
    "$PY" -m oscarkv.cli bench jobs --shape qwen3-4b --kv-gib 8 --context 8192 --requests 4 --new-tokens 32,64 \
        --methods bf16,oscar --tensor-parallel-size "$tp" --out "$OUT/jobs_tp$tp.json" 2>&1 | tee "$OUT/jobs_tp$tp.txt" || status=1
done
echo "gpu_runner_interface: exit $status (0: every test passed and every bench printed its table)"
exit $status
