#!/usr/bin/env bash
# One GPU, ~4 min: follow-up turns as served (`bench followup --prefill-chunk 512`, Qwen3-4B shape, 100K cached,
# k = 1 / 64 / 512) for the working tree ("after") and the tree in $BEFORE (a copy of the previous `oscarkv/`,
# e.g. `git archive HEAD~1 oscarkv | tar -x -C .ab_before`), one after the other on one machine.
# Usage (repository root, a CUDA torch): BEFORE=.ab_before bash lab/scripts/gpu_followup_ab.sh   Out ($OUT): JSON each
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_followup_ab}; mkdir -p "$OUT"
fu() { PYTHONPATH="$1" timeout 250 python3 -m oscarkv.cli bench followup --shapes qwen3-4b --contexts 102400 \
  --new-tokens 1,64,512 --methods bf16,oscar --kv-gib 24 --prefill-chunk 512 --out "$OUT/followup_$2.json" 2>&1 | grep '^|'; }
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== after"; fu . after
[ -n "${BEFORE:-}" ] && { echo "== before"; fu "$BEFORE" before; }
