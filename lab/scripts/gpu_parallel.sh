#!/usr/bin/env bash
# One-GPU parts of lab/scripts/gpu_untimed.sh at once, one group per GPU of a machine of several (each part is
# bound by its own GPU; the host has cores to spare), else one group after another on GPU 0.
# Usage: bash lab/scripts/gpu_parallel.sh "GROUP0" "GROUP1" ...   e.g.  "tests span" "chunk" "followup" "d8 d4"
# A group that starts with @GPUS (e.g. "@2,3 tp2") runs on those GPUs; the others take GPU i of group i.
# Out ($OUT, 2 files: at most 8 come back): summary.txt (each group's console), parts.tgz (every part's files as
# gpu_untimed.sh writes them).
set -uo pipefail
cd "$(dirname "$0")/../.."
FINAL=${OUT:-runs/gpu_parallel}; mkdir -p "$FINAL"; OUT=$(mktemp -d /tmp/gpu_parallel.XXXX); export OUT
NGPU=$(nvidia-smi -L | wc -l); START=$(date +%s)
i=0
for group in "$@"; do
  gpu=$(( NGPU > 1 ? i % NGPU : 0 ))
  case $group in @*) gpu=${group%% *}; gpu=${gpu#@}; group=${group#* };; esac
  mkdir -p "$OUT/g$i"  # each group its own folder: two groups of one part would write the same files
  if [ "$NGPU" -gt 1 ]; then
    OUT="$OUT/g$i" CUDA_VISIBLE_DEVICES=$gpu bash lab/scripts/gpu_untimed.sh $group > "$OUT/group_$i.txt" 2>&1 &
  else
    OUT="$OUT/g$i" bash lab/scripts/gpu_untimed.sh $group > "$OUT/group_$i.txt" 2>&1
  fi
  i=$(( i + 1 ))
done
wait
for f in "$OUT"/group_*.txt; do echo "######## $f"; cat "$f"; done > "$FINAL/summary.txt"
tar -czf "$FINAL/parts.tgz" -C "$OUT" .
cat "$FINAL/summary.txt"; echo "== $NGPU GPUs, done in $(( $(date +%s) - START ))s"
