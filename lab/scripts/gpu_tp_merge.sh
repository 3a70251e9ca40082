#!/usr/bin/env bash
# Decode at few KV heads per rank (issue 27), one call on 2 GPUs (<= 590 s): the column-parallel split-K merge,
# 512 splits at 2 KV heads, windows on the last splits, and the vocabulary-parallel logits of tp decode graphs.
#   1. GPU 0: the kernel GPU tests (decode, chunk split-K, head ranges)  ||  GPU 1: lab.scripts.few_heads_sweep
#   2. lab/scripts/gpu_tp_full.sh s1: Qwen3-8B 100K batch 1 at tp 2 (one_shot; bf16, then oscar + per-rank profile),
#      tp 1 (bf16, oscar) on the first GPU, then the tp GPU tests
# Out ($OUT): few_heads.json, few_heads.txt, pytest_kernels.txt, and gpu_tp_full.sh's five files.
export PYTHONPATH=. PYTHONUNBUFFERED=1
START=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/kernels/test_decode.py \
  tests/kernels/test_chunk_splitk.py tests/kernels/test_head_ranges.py > "$OUT/pytest_kernels.txt" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m lab.scripts.few_heads_sweep --out "$OUT/few_heads.json" \
  > "$OUT/few_heads.txt" 2>&1
wait
tail -3 "$OUT/pytest_kernels.txt"; grep -v '^{' "$OUT/few_heads.txt" | tail -8
echo "== kernels and sweep in $(( $(date +%s) - START ))s"
BUDGET=$(( 585 - $(date +%s) + START )) bash lab/scripts/gpu_tp_full.sh s1
