#!/usr/bin/env bash
# One GPU, ~4 min: follow-up turns as served (`bench followup --prefill-chunk 512`, Qwen3-4B shape, 100K cached,
# k = 1 / 64 / 512) for the working tree ("after") and the tree in $BEFORE (a copy of the previous `oscarkv/`,
# e.g. `git archive HEAD~1 oscarkv | tar -x -C .ab_before`), one after the other on one machine.
# Usage (repository root, a CUDA torch): BEFORE=.ab_before bash lab/scripts/gpu_followup_ab.sh   Out ($OUT): JSON each
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_followup_ab}; mkdir -p "$OUT"
ROOT=$PWD; case $OUT in /*) ;; *) OUT=$ROOT/$OUT;; esac
# NOTE: `python -m` puts the working directory ahead of PYTHONPATH, so a tree is run from inside it (until
# 2026-11-28 this passed the tree on PYTHONPATH from the root: both sides imported the working tree)
fu() { (cd "$1" && PYTHONPATH=$ROOT python3 -c "import oscarkv; print('$2 imports', oscarkv.__file__)" &&
  PYTHONPATH=$ROOT timeout 250 python3 -m oscarkv.cli bench followup --shapes qwen3-4b --contexts 102400 \
  --new-tokens 1,64,512 --methods bf16,oscar --kv-gib 24 --prefill-chunk 512 --out "$OUT/followup_$2.json" 2>&1 | grep '^|'); }
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== after"; fu . after
[ -n "${BEFORE:-}" ] && { echo "== before"; fu "$BEFORE" before; }
