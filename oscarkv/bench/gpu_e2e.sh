# One H100 call: GPU tests (kernels incl. the fused elementwise ones, Triton backend ≡ oracles,
# CUDA graph ≡ eager), `oscarkv bench decode`, `oscarkv bench capacity`, and the INT2 decode-kernel
# sweep / table of oscarkv.bench.variants (JSON and logs under $OUT).
# Usage: bash oscarkv/bench/gpu_e2e.sh [tests|decode|capacity|sweep|variants ...]  (default: the first three)
export PYTHONPATH=. PYTHONUNBUFFERED=1
parts="${*:-tests decode capacity}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
case " $parts " in *" tests "*) timeout 200 python3 -m pytest -q tests/engine/test_gpu_engine.py tests/kernels 2>&1 | tail -40 | tee $OUT/pytest.txt;; esac
case " $parts " in *" decode "*) timeout 240 python3 -m oscarkv.bench.cli decode --out $OUT/decode_h100.json 2>&1 | tee $OUT/decode.log;; esac
case " $parts " in *" capacity "*) timeout 200 python3 -m oscarkv.bench.cli capacity --out $OUT/capacity_h100.json 2>&1 | tee $OUT/capacity.log;; esac
case " $parts " in *" sweep "*) timeout 150 python3 -m oscarkv.bench.variants $OUT sweep 2>&1 | tee $OUT/sweep.log | grep -v "^sweep {";; esac
case " $parts " in *" variants "*) timeout 200 python3 -m oscarkv.bench.variants $OUT 2>&1 | tee $OUT/variants.log | grep -v "^point";; esac
