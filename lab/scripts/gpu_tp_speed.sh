# Tensor parallelism at full speed (one call, <= 9 min, 2 GPUs; 4 work too): correctness, then what crosses
# between ranks, then decode at 100K with each all-reduce. Every step has a timeout inside one overall budget,
# so the script always finishes; what did not fit says "skipped". JSON and logs under $OUT.
# Usage: bash lab/scripts/gpu_tp_speed.sh [comm] [tests] [decode]     (default: all three, in that order)
# NOTE: NVLink multicast stays off (the lending workplace's rule: it can take a shared host's GPUs down);
# the symmetric-memory all-reduces use peer-to-peer loads and stores only (no multimem operations).
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/tp_speed}; mkdir -p "$OUT"
parts="${*:-comm tests decode}"
BUDGET=${BUDGET:-520}; START=$(date +%s)
OSC="python3 -m oscarkv.cli.main"
DECODE="bench decode --shapes qwen3-8b --contexts 102400 --methods bf16,oscar --steps 16"
# step NAME CAP CMD...: run CMD with timeout min(CAP, what is left of BUDGET); skip when under 45 s are left
step() { local name=$1 cap=$2; shift 2; local left=$((BUDGET - ($(date +%s) - START)))
  local t=$(( cap < left ? cap : left )); if [ "$t" -lt 45 ]; then echo "== $name: skipped (${left}s left)"; return; fi
  echo "== $name (timeout ${t}s)"; timeout "$t" "$@"; echo "== $name: exit $? at $(( $(date +%s) - START ))s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'symm_mem ops', [o for o in ('one_shot_all_reduce_copy_out', 'two_shot_all_reduce_out') if hasattr(torch.ops.symm_mem, o)])"
case " $parts " in *" comm "*) nvidia-smi topo -m | head -6
  step comm 100 python3 -m lab.scripts.tp_comm_bench --ranks "$(nvidia-smi -L | wc -l)" --out "$OUT";; esac
case " $parts " in *" tests "*)
  step tests 220 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/engine/test_tensor_parallel_gpu.py > "$OUT/pytest_tp.txt" 2>&1
  tail -12 "$OUT/pytest_tp.txt";; esac
case " $parts " in *" decode "*)
  step decode_tp1 110 $OSC $DECODE --tensor-parallel-size 1 --out "$OUT/decode_tp1.json" 2>&1 | grep -v "^{" | tail -6
  step decode_tp2_nccl 120 $OSC $DECODE --tensor-parallel-size 2 --all-reduce nccl --out "$OUT/decode_tp2_nccl.json" 2>&1 | grep -v "^{" | tail -6
  for ar in one_shot two_shot; do  # NOTE: one symmetric-memory engine per process (oscarkv.models.allreduce)
    for m in bf16 oscar; do
      step "decode_tp2_${ar}_$m" 70 $OSC $DECODE --methods $m --tensor-parallel-size 2 --all-reduce $ar --out "$OUT/decode_tp2_${ar}_$m.json" 2>&1 | grep -v "^{" | tail -4
    done
  done
  python3 -m lab.scripts.tp_speed_table "$OUT/tp_speed.json" "$OUT"/decode_tp1.json "$OUT"/decode_tp2_*.json;; esac
echo "== done in $(( $(date +%s) - START ))s; files: $(ls "$OUT" | tr '\n' ' ')"
