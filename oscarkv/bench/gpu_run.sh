# One H100 call: GPU kernel tests, a tile sweep of the INT2 decode kernel, the attention table.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
python3 -m pytest -q -x tests/kernels -m gpu 2>&1 | tail -15 | tee $OUT/pytest.txt
python3 -m oscarkv.bench.sweep $OUT/sweep.json ${SWEEP:-int2} 2>&1 | grep -v "^$" | tail -12
python3 -m oscarkv.bench.cli attention --out $OUT/attention.json
