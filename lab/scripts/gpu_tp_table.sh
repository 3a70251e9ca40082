#!/usr/bin/env bash
# Issue 27's decode table on one machine kind (4 GPUs): Qwen3-8B and -32B, batch 1, 100K, tp 1 / 2 / 4, the
# all-reduce `auto` picks at tp 2 (one_shot_norm) and $AR4 at tp 4 (default one_shot_norm; `auto` there is NCCL).
# <= $BUDGET s (default 560) for each call; every step timed out inside it (budget_steps.sh).
# Usage: bash lab/scripts/gpu_tp_table.sh PART ...
#   a  [0,1] 8B tp 2 (bf16 then oscar, one process each)  ||  [2] 8B tp 1  ||  [3] 32B tp 1 (bf16,oscar)
#   b  [0,1] 32B tp 2 (bf16, oscar)  ||  [2,3] 8B tp 2 one_shot (the kind before one_shot_norm)
#   c  8B tp 4, then 32B tp 4 (bf16, oscar)
#   d  pieces GPU tests; 8B tp 2 oscar; 8B and 32B tp 4; 8B tp 1 (one at a time)
#   e  the 4-rank one_shot_norm test; 8B tp 4 under the per-rank profile
#   f  whole jobs (bench jobs: 8B, 4 x 100K prompts, 256 new tokens) at tp 1, 2, 4, one method a process (`auto`)
#   g  f's OSCAR rows with 8192-token chunks, as BF16's (--chunk; s17_call4 ran it as lab.scripts.jobs_chunk)
# Out ($OUT): summary.txt (steps and the table), tp_table.json, tp_table.tgz (every JSON and log).
export OMP_NUM_THREADS=8 PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/tp_table}; W=$(mktemp -d "${TMPDIR:-/tmp}/tp_table_work.XXXX"); mkdir -p "$OUT"
BUDGET=${BUDGET:-560}; START=$(date +%s); AR4=${AR4:-one_shot_norm}
OSC="python3 -m lab.scripts.with_stacks oscarkv.cli.main"
. "$(dirname "$0")/budget_steps.sh"  # left, step
# dec NAME CAP GPUS SHAPE TP ALLREDUCE METHODS [FLAGS]
dec() { local name=$1 cap=$2 gpus=$3 shape=$4 tp=$5 ar=$6 methods=$7; shift 7
  step "$name" "$cap" "$gpus" $OSC bench decode --contexts 102400 --steps 12 --kv-gib 16 --shapes "$shape" \
    --tensor-parallel-size "$tp" --all-reduce "$ar" --methods "$methods" --out "$W/decode_$name.json" "$@"; }
pair() { dec "${1}_bf16" "$2" "$3" "$4" "$5" "$6" bf16; dec "${1}_oscar" "$2" "$3" "$4" "$5" "$6" oscar; }
a() { pair 8b_tp2 100 0,1 qwen3-8b 2 auto & dec 8b_tp1 130 2 qwen3-8b 1 nccl bf16,oscar &
      dec 32b_tp1 260 3 qwen3-32b 1 nccl bf16,oscar --kv-gib 32 & wait; }
b() { pair 32b_tp2 150 0,1 qwen3-32b 2 auto & pair 8b_tp2_one_shot 100 2,3 qwen3-8b 2 one_shot & wait; }
c() { pair 8b_tp4 100 0,1,2,3 qwen3-8b 4 "$AR4"; pair 32b_tp4 130 0,1,2,3 qwen3-32b 4 "$AR4"; }
# d: one after another (call 2's concurrent start-ups timed out three runs): the pieces GPU tests, then what a and
# c lacked, in order of need
d() { step pwtests 90 0 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/engine/test_piecewise_gpu.py
      dec 8b_tp2_oscar 120 0,1 qwen3-8b 2 auto oscar; pair 8b_tp4 120 0,1,2,3 qwen3-8b 4 "$AR4"
      pair 32b_tp4 170 0,1,2,3 qwen3-32b 4 "$AR4"; dec 8b_tp1 150 0 qwen3-8b 1 nccl bf16,oscar; }
# e: the fused kind's 4-rank GPU test (then SYMM_MEM_WINS[4]); 8B tp 4 oscar and bf16 under the per-rank profile
e() { step tp4test 200 0,1,2,3 python3 -m pytest -q -p no:cacheprovider -m gpu -rA -k tp4 tests/engine/test_tensor_parallel_gpu.py
      for m in oscar bf16; do dec "8b_tp4_prof_$m" 120 0,1,2,3 qwen3-8b 4 "$AR4" $m --profile; done; }
# f: as users run them; one method a process, so `auto` takes the symmetric-memory kind (one such engine a process)
jobs() { local tp=$1 m=$2 cap=$3 gpus=$4; shift 4
         step "jobs_tp${tp}_$m${1:+_chunk}" "$cap" "$gpus" $OSC bench jobs --shape qwen3-8b --kv-gib 24 --requests 4 \
           --new-tokens 256 --methods "$m" --tensor-parallel-size "$tp" --out "$W/jobs_tp${tp}_$m${1:+_chunk}.json" "$@"; }
f() { for m in bf16 oscar; do jobs 1 $m 150 0; jobs 2 $m 120 0,1; jobs 4 $m 120 0,1,2,3; done; }
g() { for tp in 1 2 4; do jobs "$tp" oscar 120 "$(seq -s, 0 $((tp - 1)))" --chunk 8192; done; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > "$W/machine.txt" 2>&1
for p in "$@"; do $p; done
{ cat "$W/machine.txt"; cat "$W/steps.txt"; tail -n 8 "$W/pwtests.log" "$W/tp4test.log" 2>/dev/null; echo
  python3 -m lab.scripts.tp_speed_table "$OUT/tp_table.json" "$W"/decode_*.json
  python3 -m lab.scripts.tp_jobs_table "$W"/jobs_*.json; } > "$OUT/summary.txt" 2>&1
tar -czf "$OUT/tp_table.tgz" -C "$(dirname "$W")" "$(basename "$W")"
cat "$OUT/summary.txt"; echo "== done in $(( $(date +%s) - START ))s"
