# Two-GPU calls (issue 15): tensor-parallel GPU tests, then decode, capacity and whole jobs at tp=2.
# NVLink multicast stays off (the lending workplace's rule: it can take a shared host's GPUs down).
# Usage: bash lab/benchmarks/gpu_tp.sh [tests|decode|profile|capacity|jobs ...]   (JSON and logs under $OUT)
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
parts="${*:-tests decode}"
OSC="python3 -m oscarkv.cli.main"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
case " $parts " in *" tests "*) nvidia-smi topo -m
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/engine/test_tensor_parallel_gpu.py 2>&1 | tail -30 | tee $OUT/pytest_tp.txt;; esac
case " $parts " in *" decode "*)
  timeout 150 $OSC bench decode --shapes qwen3-8b --contexts 102400 --methods bf16,oscar --out $OUT/decode_tp1.json 2>&1 | grep -v "^{" | tail -6
  timeout 330 $OSC bench decode --shapes qwen3-8b,qwen3-32b --contexts 102400 --methods bf16,oscar --tensor-parallel-size 2 --out $OUT/decode_tp2.json 2>&1 | grep -v "^{" | tail -8;; esac
case " $parts " in *" profile "*)
  timeout 240 $OSC bench decode --shapes qwen3-8b,qwen3-32b --contexts 102400 --methods bf16,oscar --steps 8 --tensor-parallel-size 2 --profile --out $OUT/decode_tp2_profile.json 2>&1 | grep -v "^{" | tail -8;; esac
case " $parts " in *" capacity "*)
  timeout 300 $OSC bench capacity --shape qwen3-32b --tensor-parallel-size 2 --kv-gib 32 --methods bf16,oscar --out $OUT/capacity_tp2.json 2>&1 | grep -v "^{" | tail -8;; esac
case " $parts " in *" jobs "*)
  timeout 570 $OSC bench jobs --shape qwen3-32b --tensor-parallel-size 2 --kv-gib 32 --requests ${JOBS_REQUESTS:-8} --new-tokens 2048 --methods ${JOBS_METHODS:-bf16,oscar} --out $OUT/jobs_tp2.json 2>&1 | grep -v "^{" | tail -8;; esac
