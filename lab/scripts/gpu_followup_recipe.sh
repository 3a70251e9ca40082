#!/usr/bin/env bash
# One GPU, ~6 min: follow-up turns as served after the pool keeps room for cached windows (issue 29), and decode
# at 100K of the 8K fallback recipe (4-bit keys, 4-bit values in 7 of 30 layers, sink 64 / recent 64; issue 26)
# beside INT2, the shipped recipe and BF16 (Qwen3-8B shape, random weights; the recipe's shares spread over 36 layers).
# Usage (repository root, a CUDA torch): bash lab/scripts/gpu_followup_recipe.sh   Out ($OUT): JSON per part, summary.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_followup_recipe}; mkdir -p "$OUT"
OSC="python3 -m oscarkv.cli"
REC=lab/scripts/twobit_recipe_8192_k4_v7.json,oscarkv/data/default_recipe.json
{ nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 240 $OSC bench followup --shapes qwen3-4b --contexts 32768,102400 --new-tokens 1,8,64,512 --methods bf16,oscar \
    --kv-gib 24 --prefill-chunk 512 --out "$OUT/followup_served.json" 2>&1 | grep -v '^{'
  timeout 150 $OSC bench decode --shapes qwen3-8b --contexts 102400 --methods bf16,oscar --batch 1 --layer-key-bits "$REC" \
    --out "$OUT/decode_b1.json" 2>&1 | grep '^|'
  timeout 150 $OSC bench decode --shapes qwen3-8b --contexts 102400 --methods oscar --batch 8 --kv-gib 40 \
    --layer-key-bits "$REC" --out "$OUT/decode_b8.json" 2>&1 | grep '^|'
} 2>&1 | tee "$OUT/summary.txt"
