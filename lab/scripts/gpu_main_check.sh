#!/usr/bin/env bash
# One GPU call over main after the kernels took pool bundles, the engine took one Runner interface and
# speculative decoding landed: the GPU-marked tests, then decode and prefill timings of main beside a
# baseline tree (the package as of 9dcae41, extracted by the caller into $BASE with
# `git archive 9dcae41 oscarkv | tar -x -C .gpu_base`), same machine, same call.
#
# Usage (repository root, a CUDA torch):  BASE=.gpu_base bash lab/scripts/gpu_main_check.sh
# Writes pytest_*.txt, decode_{main,base}.json, prefill_{main,base}.json under $OUT (default runs/gpu_main).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
ROOT=$PWD
OUT="${OUT:-runs/gpu_main}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
BASE="${BASE:-.gpu_base}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 | tail -8 | tee "$OUT/pytest_kernels.txt"
timeout 170 python -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu_engine.py tests/engine/test_levels.py \
    tests/engine/test_decode_qk_fusion.py 2>&1 | tail -8 | tee "$OUT/pytest_engine.txt"
for tree in main base; do
    dir=$ROOT; [ "$tree" = base ] && dir=$ROOT/$BASE
    (cd "$dir" && timeout 75 python -m oscarkv.cli bench decode --shapes qwen3-8b --contexts 102400 --batch 1 \
        --methods bf16,oscar --out "$OUT/decode_$tree.json" 2>&1 | grep -v "^\s*$" | tail -6)
    (cd "$dir" && timeout 75 python -m oscarkv.cli bench prefill --shapes qwen3-4b --contexts 32768 --chunks 8192 \
        --profile-context 0 --out "$OUT/prefill_$tree.json" 2>&1 | grep -v "^\s*$" | tail -6)
done
