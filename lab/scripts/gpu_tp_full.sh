#!/usr/bin/env bash
# Tensor parallelism at full speed (issue 27), one call on 4 GPUs (2 work: the tp 4 steps are skipped and the
# two-GPU pairs run one after the other), <= 560 s in all: every step is timed out inside one budget and
# skipped when under 40 s are left, so the script always finishes and says what it skipped.
# Usage: bash lab/scripts/gpu_tp_full.sh [PART ...]   (default: all, in this order of importance)
#   s1  qwen3-8b tp 2 one_shot (bf16, then oscar + per-rank profile)  ||  the tp GPU tests (-v, 200 s)
#       then qwen3-8b tp 1 (bf16, oscar) on the first GPU
#   s2  qwen3-8b tp 4 one_shot (bf16, then oscar + per-rank profile)
#   s3  qwen3-32b tp 2 one_shot (bf16, oscar)  ||  qwen3-8b tp 2 nccl (bf16, oscar; the comparison)
#   s4  qwen3-32b tp 4 one_shot (bf16, oscar)
#   s6  qwen3-32b tp 2 one_shot (bf16, oscar)  ||  qwen3-32b tp 1 (bf16, oscar; needs ~100 GB: H200)
#   s5  TTFT at 100K, qwen3-8b tp 2 (bf16, oscar; chunk 8192)  ||  whole jobs at tp 2 (qwen3-8b, 4 x 100K)
#   kill  the dying-worker tp test alone (not in the default list; s1 runs it with the others)
# "||": on 4 GPUs the two run at once on GPUs 0,1 and 2,3 (disjoint NVLink pairs; decode is GPU-bound);
# on 2 GPUs one after the other. Decode: 102400 tokens, batch 1 (bench decode; graph ms and floors).
# NOTE: a symmetric-memory engine runs one method per process (oscarkv.models.allreduce: torch numbers its
# rendezvous per process), so bf16 and oscar are separate runs; tp_speed_table pairs them.
# NOTE: NVLink multicast stays off (the lending workplace's rule); symmetric memory uses peer-to-peer only.
# A step that times out gets SIGUSR1 first: every rank's Python stacks land in its log (lab.scripts.with_stacks).
# Out ($OUT, 5 files): summary.txt (the tables), tp_speed.json, steps.txt (each step's exit and seconds),
# pytest_tp.txt, tp_full.tgz (every JSON and log).
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/tp_full}; W=$(mktemp -d "${TMPDIR:-/tmp}/tp_full_work.XXXX"); mkdir -p "$OUT"  # NOTE: $W outside $OUT: <= 8 files come back
parts="${*:-s1 s2 s3 s4 s5}"
BUDGET=${BUDGET:-560}; START=$(date +%s)
NGPU=$(nvidia-smi -L | wc -l)
OSC="python3 -m lab.scripts.with_stacks oscarkv.cli.main"
DEC="bench decode --contexts 102400 --steps 12 --kv-gib 16"

MARGIN=15 MIN_STEP=40; . "$(dirname "$0")/budget_steps.sh"  # left, step
# decode NAME CAP GPUS SHAPE TP ALLREDUCE METHODS [FLAGS]
decode() { local name=$1 cap=$2 gpus=$3 shape=$4 tp=$5 ar=$6 methods=$7; shift 7
  step "$name" "$cap" "$gpus" $OSC $DEC --shapes "$shape" --tensor-parallel-size "$tp" --all-reduce "$ar" \
    --methods "$methods" --out "$W/$name.json" "$@"; }
# symm NAME CAP GPUS SHAPE TP [FLAGS for oscar]: bf16 then oscar, each in its own process, one_shot
symm() { local name=$1 cap=$2 gpus=$3 shape=$4 tp=$5; shift 5
  decode "${name}_bf16" "$cap" "$gpus" "$shape" "$tp" one_shot bf16
  decode "${name}_oscar" "$cap" "$gpus" "$shape" "$tp" one_shot oscar "$@"; }
# both A B: two shell functions at once on GPUs 0,1 and 2,3 (4 GPUs), else one after the other on 0,1
both() { if [ "$NGPU" -ge 4 ]; then A=0,1 $1 & B=2,3 $2 & wait; else A=0,1 $1; B=0,1 $2; fi; }
quad() { if [ "$NGPU" -ge 4 ]; then "$@"; else echo "== $1: skipped (needs 4 GPUs)" | tee -a "$W/steps.txt"; fi; }

s1a() { symm decode_8b_tp2_one_shot 100 "$A" qwen3-8b 2 --profile
        decode decode_8b_tp1 130 "${A%%,*}" qwen3-8b 1 nccl bf16,oscar; }
s1b() { step pytest_tp 210 "$B" python3 -m pytest -v -x -p no:cacheprovider -m gpu -rA \
          tests/engine/test_tensor_parallel_gpu.py; cp "$W/pytest_tp.log" "$OUT/pytest_tp.txt"; }
s2() { symm decode_8b_tp4_one_shot 100 0,1,2,3 qwen3-8b 4 --profile; }
s3a() { symm decode_32b_tp2_one_shot 150 "$A" qwen3-32b 2; }
s3b() { decode decode_8b_tp2_nccl 150 "$B" qwen3-8b 2 nccl bf16,oscar; }
s4() { symm decode_32b_tp4_one_shot 130 0,1,2,3 qwen3-32b 4; }
s6b() { decode decode_32b_tp1 240 "${B%%,*}" qwen3-32b 1 nccl bf16,oscar --kv-gib 32; }
s5a() { step prefill_tp2 170 "$A" $OSC bench prefill --shapes qwen3-8b --contexts 102400 --chunks 8192 \
          --methods bf16,oscar --kv-gib 16 --profile-context 0 --tensor-parallel-size 2 --out "$W/prefill_tp2.json"; }
kill() { step pytest_tp_kill 150 0,1 python3 -m pytest -v -x -p no:cacheprovider -m gpu -rA -k "dying_worker and kill" \
          tests/engine/test_tensor_parallel_gpu.py; cp "$W/pytest_tp_kill.log" "$OUT/pytest_tp_kill.txt"; }
s5b() { step jobs_tp2 200 "$B" $OSC bench jobs --shape qwen3-8b --kv-gib 24 --requests 4 --new-tokens 256 \
          --methods bf16,oscar --tensor-parallel-size 2 --out "$W/jobs_tp2.json"; }

{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; nvidia-smi topo -m | head -6
  python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"; } > "$W/machine.txt" 2>&1
for p in $parts; do
  case $p in s1) both s1a s1b;; s2) quad s2;; s3) both s3a s3b;; s4) quad s4;; s6) both s3a s6b;; s5) both s5a s5b;; kill) kill;;
    *) echo "unknown part $p";; esac
done
{ cat "$W/machine.txt"; echo; cat "$W/steps.txt"; echo
  python3 -m lab.scripts.tp_speed_table "$OUT/tp_speed.json" "$W"/decode_*.json
  echo; python3 -m lab.scripts.tp_full_summary "$W"
  echo; grep -hE "PASSED|FAILED|ERROR|passed|failed" "$W/pytest_tp.log" 2>/dev/null | tail -12
} > "$OUT/summary.txt" 2>&1
cp "$W/steps.txt" "$OUT/steps.txt" 2>/dev/null
tar -czf "$OUT/tp_full.tgz" -C "$(dirname "$W")" "$(basename "$W")"
cat "$OUT/summary.txt" | head -120
echo "== done in $(( $(date +%s) - START ))s; files: $(ls "$OUT" | tr '\n' ' ')"
