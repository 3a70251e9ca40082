#!/usr/bin/env bash
# Eighteenth session (one GPU, ~4 min): the BF16 64-row chunk configuration (chunk_splitk._config: 2 warps, 4 per SM,
# 3 stages) on the GPU: the chunk kernel's GPU tests, chunk_sweep at 9 tokens with more splits (16-256), and the
# Qwen3-4B verify steps at 32K and 100K (BF16, K = 4 and 8) against gpu_bf16_verify_rows.sh's cap64 run.
# Out ($OUT): vc.tgz.
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/o}; mkdir -p $O
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_chunk_splitk.py 2>&1 | tail -n 3
timeout 100 python3 -m lab.scripts.chunk_sweep --out $O/cs --chunks 9 --kinds bf16 --rows 64 --warps 2 --stages 3 \
  --block-n 64 --mults 1,2,4,8,16 2>&1 | grep -v -i warn | grep -v capture_end
for c in 102400 32768; do timeout 110 python3 -m lab.scripts.verify_profile --shape qwen3-4b --context $c --ks 4,8 \
  --methods bf16 --steps 6 --kv-gib 24 --out $O/vp_$c > $O/vp_$c.log 2>&1; echo "== $c exit $?"; grep -E "K=" $O/vp_$c.log; done
cd $O && tar -czf vc.tgz vp_* cs && rm -rf vp_* cs
