#!/usr/bin/env bash
# Eighteenth session (one GPU, ~5 min): BF16 verify chunks of 9-16 tokens (K = 8-15) run the split-K chunk kernel in
# one 64-row program per KV head and split (chunk_splitk._rows caps BF16 at 64 rows, INT2 at 16); the Qwen3-4B 100K
# verify step at K = 8 read 4x a decode step. chunk_sweep at 9 and 16 tokens over BF16, then verify_profile (BF16,
# K = 4 and 8) with the cap at 64 (as is), 32 and 16 (the copy's chunk_splitk.py edited, then restored).
# Out ($OUT): vp.tgz (the sweep's JSON, each profile).
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/o}; mkdir -p $O
timeout 170 python3 -m lab.scripts.chunk_sweep --out $O/cs --chunks 9,16 --kinds bf16 --rows 16,32,64 --warps 1,2,4 \
  --stages 3 --block-n 64 --mults 1,2,4 2>&1 | grep -v -i warn | grep -v capture_end
vp() { timeout 120 python3 -m lab.scripts.verify_profile --shape qwen3-4b --context 102400 --ks 4,8 --methods bf16 --steps 6 \
  --kv-gib 24 --out $O/vp_$1 > $O/vp_$1.log 2>&1; echo "== $1 exit $?"; grep -E "K=" $O/vp_$1.log; }
K=oscarkv/kernels/chunk_splitk.py; cp $K /tmp/chunk_splitk.py.orig
vp cap64
sed -i 's/    cap = 64 if device.type == "cuda" and not int2 else 16/    cap = 32 if device.type == "cuda" and not int2 else 16/' $K; grep -n "cap = " oscarkv/kernels/chunk_splitk.py
vp cap32
sed -i 's/    cap = 32 if device.type == "cuda" and not int2 else 16/    cap = 16/' $K; grep -n "cap = " oscarkv/kernels/chunk_splitk.py
vp cap16
cp /tmp/chunk_splitk.py.orig $K
cd $O && tar -czf vp.tgz vp_* cs && rm -rf vp_* cs
