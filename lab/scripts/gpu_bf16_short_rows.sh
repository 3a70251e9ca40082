#!/usr/bin/env bash
# Eighteenth session (one GPU, ~3 min): BF16 verify chunks of 3 and 5 tokens (K = 2, 4; 16 and 32 rows) over 100K:
# chunk_sweep (1-2 warps, 3 stages, 64-key tiles, 1-8 x the base splits), then the Qwen3-4B verify steps (BF16,
# K = 2 and 4) as is and with 1 warp, 8 programs per SM at 16 and 32 rows (the copy's chunk_splitk.py edited, then
# restored). Out ($OUT): vs.tgz.
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/o}; mkdir -p $O
timeout 150 python3 -m lab.scripts.chunk_sweep --out $O/cs --chunks 3,5 --kinds bf16 --rows 16,32 --warps 1,2 \
  --stages 3 --block-n 64 --mults 1,2,4,8 2>&1 | grep -v -i warn | grep -v capture_end
vp() { timeout 100 python3 -m lab.scripts.verify_profile --shape qwen3-4b --context 102400 --ks 2,4 --methods bf16 --steps 6 \
  --kv-gib 24 --out $O/vp_$1 > $O/vp_$1.log 2>&1; echo "== $1 exit $?"; grep -E "K=" $O/vp_$1.log; }
K=oscarkv/kernels/chunk_splitk.py; cp $K /tmp/chunk_splitk.py.orig
vp now
sed -i 's/16: (2, 4, 3, 64), 32: (2, 4, 3, 64)}/16: (1, 8, 3, 64), 32: (1, 8, 3, 64)}/' $K; grep -n "16: (1, 8" $K
vp w1s8
cp /tmp/chunk_splitk.py.orig $K
cd $O && tar -czf vs.tgz vp_* cs && rm -rf vp_* cs
