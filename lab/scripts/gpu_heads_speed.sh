#!/usr/bin/env bash
# One GPU, ~6 min: the GPU tests of per-layer and per-head allocations (engine through Triton and CUDA graphs ≡ the
# oracles; kernels on a head range), then decode at 100K, Qwen3-8B shape (random weights), batch 1 and 8, of the
# per-head recipe within INT2+win's bytes (28 of 90 heads on the default model; its per-layer head shares carried
# over to 36 layers × 8 KV heads: bench/layer_bits.spread_heads) beside INT2, the shipped per-layer recipe and BF16.
# REC: the recipes timed (comma-separated; default the 45-head recipe of pages of 16 with no sink / recent 16, then
# the 28 heads; a recipe's page size and windows come with it: bench/layer_bits).
# Usage (repository root, a CUDA torch): bash lab/scripts/gpu_heads_speed.sh   Out ($OUT): JSON per part, summary.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_heads_speed}; mkdir -p "$OUT"
OSC="python3 -m oscarkv.cli"
REC=${REC:-lab/scripts/twobit_recipe_8192_s0_r16_p16.json,lab/scripts/twobit_recipe_8192_heads28.json}
{ nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/engine/test_allocation.py \
    tests/kernels/test_head_ranges.py 2>&1 | tail -n 12
  timeout 170 $OSC bench decode --shapes qwen3-8b --contexts 102400 --methods bf16,oscar --batch 1 --layer-key-bits "$REC" \
    --out "$OUT/decode_b1.json" 2>&1 | grep '^|'
  timeout 170 $OSC bench decode --shapes qwen3-8b --contexts 102400 --methods oscar --batch 8 --kv-gib 40 \
    --layer-key-bits "$REC" --out "$OUT/decode_b8.json" 2>&1 | grep '^|'
} 2>&1 | tee "$OUT/summary.txt"
