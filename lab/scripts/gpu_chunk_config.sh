#!/usr/bin/env bash
# One GPU, ~6 min: the split-K chunk kernel at its timed configuration (chunk_splitk._config, from
# lab/scripts/chunk_sweep.py): its GPU oracle tests and those of the engine, extend graphs and speculation; attention
# per layer by path (lab.benchmarks.chunk_attention: 32K and 100K, k = 1, 8, 64, 512); the follow-up step alone
# (`bench followup`, one chunk of k: the whole prefix hit) at 100K, k = 1, 8, 64.
# Usage (repository root, a CUDA torch): bash lab/scripts/gpu_chunk_config.sh   Out ($OUT): logs, JSON, summary.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_chunk_config}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_chunk_splitk.py tests/kernels/test_prefill.py \
    tests/engine/test_gpu_engine.py tests/engine/test_extend_graphs_gpu.py tests/engine/test_speculative_gpu.py \
    > "$OUT/gpu_tests.log" 2>&1; tail -3 "$OUT/gpu_tests.log"
  timeout 120 python3 -m lab.benchmarks.chunk_attention "$OUT/chunk_attention.json" 2>&1 | grep -v Warn
  timeout 150 python3 -m oscarkv.cli bench followup --shapes qwen3-4b --contexts 102400 --new-tokens 1,8,64 \
    --methods bf16,oscar --kv-gib 24 --out "$OUT/followup_alone.json" 2>&1 | grep '^|'
} 2>&1 | tee "$OUT/summary.txt"
