# One H100 call: engine GPU tests (Triton backend ≡ oracles, CUDA graph ≡ eager), then
# `oscarkv bench decode` and `oscarkv bench capacity` (JSON and logs under $OUT).
# Usage: bash oscarkv/bench/gpu_e2e.sh [tests|decode|capacity ...]  (default: all three)
export PYTHONPATH=. PYTHONUNBUFFERED=1
parts="${*:-tests decode capacity}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
case " $parts " in *" tests "*) timeout 200 python3 -m pytest -q tests/engine/test_gpu_engine.py -m gpu 2>&1 | tail -40 | tee $OUT/pytest.txt;; esac
case " $parts " in *" decode "*) timeout 240 python3 -m oscarkv.bench.cli decode --out $OUT/decode_h100.json 2>&1 | tee $OUT/decode.log;; esac
case " $parts " in *" capacity "*) timeout 200 python3 -m oscarkv.bench.cli capacity --out $OUT/capacity_h100.json 2>&1 | tee $OUT/capacity.log;; esac
