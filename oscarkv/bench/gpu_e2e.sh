# One H100 call: engine GPU tests (Triton backend ≡ oracles, CUDA graph ≡ eager), then
# `oscarkv bench decode` and `oscarkv bench capacity` (JSON and logs under $OUT).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 200 python3 -m pytest -q tests/engine/test_gpu_engine.py -m gpu 2>&1 | tail -25 | tee $OUT/pytest.txt
timeout 240 python3 -m oscarkv.bench.cli decode --out $OUT/decode_h100.json 2>&1 | tee $OUT/decode.log
timeout 150 python3 -m oscarkv.bench.cli capacity --out $OUT/capacity_h100.json 2>&1 | tee $OUT/capacity.log
