#!/usr/bin/env bash
# A/B on one machine (issue 27): this tree against the package of another commit unpacked in .ab_old
# (`mkdir .ab_old && git archive COMMIT oscarkv | tar -x -C .ab_old`; ignored by git: pass carry [".ab_old"]).
# Qwen3-8B decode at 100K, batch 1, with per-rank kernel profiles: tp 1 (bf16, oscar), then tp 2 one_shot (bf16,
# oscar: one method per process), new and old interleaved. 2 GPUs, ~4.5 min.
# Out ($OUT): summary.txt (tables and profiles per side), ab.tgz (every JSON and log).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=$(mktemp -d); mkdir -p "$W/new" "$W/old"
DEC="python3 -m lab.scripts.with_stacks oscarkv.cli.main bench decode --contexts 102400 --steps 12 --kv-gib 16 --shapes qwen3-8b --profile"
ROOT=$PWD
# NOTE: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH: the old side runs in .ab_old
# (its oscarkv) with this tree's lab on PYTHONPATH
run() { local side=$1 name=$2 gpus=$3; shift 3; local dir=$ROOT; [ "$side" = old ] && dir=$ROOT/.ab_old
  local t=$(date +%s)
  (cd "$dir" && CUDA_VISIBLE_DEVICES=$gpus PYTHONPATH=$ROOT timeout 120 $DEC --out "$W/$side/$name.json" "$@") \
    > "$W/$side/$name.log" 2>&1
  echo "== $side $name: exit $? in $(( $(date +%s) - t ))s"; }
for side in new old; do d=$ROOT; [ "$side" = old ] && d=$ROOT/.ab_old
  (cd "$d" && PYTHONPATH=$ROOT python3 -c "import oscarkv.kernels.split_k as s; print('$side:', s.__file__)"); done
for side in new old; do run $side decode_8b_tp1 0 --tensor-parallel-size 1 --methods bf16,oscar; done
for m in bf16 oscar; do for side in new old; do
  run $side decode_8b_tp2_one_shot_$m 0,1 --tensor-parallel-size 2 --all-reduce one_shot --methods $m; done; done
{ nvidia-smi --query-gpu=name --format=csv,noheader | head -1
  for side in new old; do echo; echo "#### $side"; PYTHONPATH=. python3 -m lab.scripts.tp_speed_table "$W/$side.json" "$W/$side"/decode_*.json
    PYTHONPATH=. python3 -m lab.scripts.tp_full_summary "$W/$side" | grep -v "no JSON"; done; } > "$OUT/summary.txt" 2>&1
tar -czf "$OUT/ab.tgz" -C "$W" .
cat "$OUT/summary.txt"
