# One H100 call: GPU kernel tests, a latency sweep of the raw INT2 decode kernel, then the
# decode table (CUDA-graph timings, BF16 vs INT2 vs SDPA) and a prefill timing.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 150 python3 -m pytest -q tests/kernels -m gpu 2>&1 | tail -15 | tee $OUT/pytest.txt
timeout 200 python3 -m lab.benchmarks.variants $OUT sweep 2>&1 | tee $OUT/sweep.log | grep -v "^sweep {"
timeout 200 python3 -m lab.benchmarks.variants $OUT 2>&1 | tee $OUT/variants.log | grep -v "^point"
