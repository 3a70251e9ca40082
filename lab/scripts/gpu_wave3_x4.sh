#!/usr/bin/env bash
# One call on a host of 4 GPUs, or 2 (then the one-GPU lanes run first, side by side, and tp 4 is skipped) (<= 575 s) measuring three issues at once, in lanes that share no GPU:
#   lane 0,1  tensor parallel decode, Qwen3-8B at 100K batch 1: tp 2 one_shot (bf16; oscar + per-rank profile),
#             then tp 2 NCCL (bf16, oscar)
#   lane 2    extend graphs (issue 29): their GPU tests, then the follow-up step profile at 100K (qwen3-4b, k = 1, 8,
#             64; oscar and bf16) with the extend graphs on, then off
#   lane 3    Qwen3-8B tp 1 (bf16, oscar: the one-GPU baseline of the tp rows), then the two-bit allocations' decode
#             speed at 100K (issue 26: INT2 / the recipes at batch 1 and 8; BF16 at batch 1 is the tp 1 row)
#   then all 4 GPUs: tp 4 one_shot (bf16; oscar + per-rank profile)
# The lanes run at once (decode is GPU-bound; the host has 64 cores); every step has its own timeout inside one
# budget. Out ($OUT): summary.txt, the follow-up profiles, the two-bit speed JSON, all.tgz (every log and JSON).
# NOTE: NVLink multicast stays off (the lending workplace's rule); symmetric memory uses peer-to-peer only.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/wave3}; W=$(mktemp -d /tmp/wave3_work.XXXX); mkdir -p "$OUT"
BUDGET=${BUDGET:-575}; START=$(date +%s)
OSC="python3 -m lab.scripts.with_stacks oscarkv.cli.main"
DEC="bench decode --contexts 102400 --steps 12 --kv-gib 16 --shapes qwen3-8b"
RECIPES=lab/scripts/twobit_recipe_cpu_8192_dev8k.json,lab/scripts/twobit_recipe_8192_b3.7.json
MARGIN=10 MIN_STEP=30; . lab/scripts/budget_steps.sh  # left, step (after the cd above)
lane01() {
  step decode_8b_tp2_one_shot_bf16 90 0,1 $OSC $DEC --tensor-parallel-size 2 --all-reduce one_shot --methods bf16 --out "$W/decode_8b_tp2_one_shot_bf16.json"
  step decode_8b_tp2_one_shot_oscar 100 0,1 $OSC $DEC --tensor-parallel-size 2 --all-reduce one_shot --methods oscar --profile --out "$W/decode_8b_tp2_one_shot_oscar.json"
  step decode_8b_tp2_nccl 140 0,1 $OSC $DEC --tensor-parallel-size 2 --all-reduce nccl --methods bf16,oscar --out "$W/decode_8b_tp2_nccl.json"; }
lane2() {
  step extgraph_tests 110 ${G2:-2} python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/engine/test_extend_graphs_gpu.py tests/engine/test_extend_graphs.py tests/engine/test_speculative_gpu.py
  for mode in on off; do
    step "followup_$mode" 80 ${G2:-2} python3 -m lab.scripts.followup_profile --context 102400 --new-tokens 1,8,64 --methods oscar,bf16 --extend-graphs "$mode" --out "$W/followup_$mode"
    cp "$W/followup_$mode/followup_profile.json" "$OUT/followup_$mode.json" 2>/dev/null
  done; }
lane3() {
  step decode_8b_tp1 110 ${G3:-3} $OSC $DEC --tensor-parallel-size 1 --methods bf16,oscar --out "$W/decode_8b_tp1.json"
  step twobit_b1 90 ${G3:-3} $OSC $DEC --batch 1 --methods oscar --layer-key-bits "$RECIPES" --out "$W/twobit_b1.json"
  step twobit_b8 100 ${G3:-3} $OSC $DEC --batch 8 --kv-gib 40 --methods oscar --layer-key-bits "$RECIPES" --out "$W/twobit_b8.json"
  cp "$W"/twobit_b*.json "$OUT/" 2>/dev/null; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; nvidia-smi topo -m | head -6
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"; } > "$W/machine.txt" 2>&1
if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
  lane01 & lane2 & lane3 & wait
  step decode_8b_tp4_one_shot_bf16 90 0,1,2,3 $OSC $DEC --tensor-parallel-size 4 --all-reduce one_shot --methods bf16 --out "$W/decode_8b_tp4_one_shot_bf16.json"
  step decode_8b_tp4_one_shot_oscar 100 0,1,2,3 $OSC $DEC --tensor-parallel-size 4 --all-reduce one_shot --methods oscar --profile --out "$W/decode_8b_tp4_one_shot_oscar.json"
else  # 2 GPUs: the one-GPU lanes first, side by side, then tensor parallel on both; no tp 4
  G2=0 G3=1; lane2 & lane3 & wait; lane01
fi
{ cat "$W/machine.txt"; echo; cat "$W/steps.txt"; echo
  python3 -m lab.scripts.tp_speed_table "$OUT/tp_speed.json" "$W"/decode_8b_*.json
  echo; python3 -m lab.scripts.tp_full_summary "$W"
  echo; grep -h "^|" "$W"/twobit_b*.log
  echo; tail -3 "$W/extgraph_tests.log"; grep -h "^==" "$W"/followup_*.log
} > "$OUT/summary.txt" 2>&1
tar -czf "$OUT/all.tgz" -C "$(dirname "$W")" "$(basename "$W")"
head -c 11000 "$OUT/summary.txt"
echo "== done in $(( $(date +%s) - START ))s; files: $(ls "$OUT" | tr '\n' ' ')"
