#!/usr/bin/env bash
# One GPU, ~6 min: TTFT as served (serve's 512-token chunks) before and after a host change, in one run on one
# machine: `bench prefill` at 32K and 100K, BF16 and OSCAR, for the working tree ("after") and for the tree in
# $BEFORE (a copy of the previous `oscarkv/`, e.g. `git archive HEAD oscarkv | tar -x -C .ab_before`); then a host
# profile of the after tree (lab/scripts/prefill_host_profile.py; PROFILE=0 skips it) and the engine and prefill GPU tests.
# Usage (repository root, a CUDA torch): BEFORE=.ab_before bash lab/scripts/gpu_prefill_host.sh
# Out ($OUT): after.json, before.json, prefill_host_profile.json, host_oscar.txt, gpu_tests.log, summary.txt
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_prefill_host}; mkdir -p "$OUT"
CTX=${CTX:-32768,102400}
ROOT=$PWD; case $OUT in /*) ;; *) OUT=$ROOT/$OUT;; esac
# NOTE: `python -m` puts the working directory ahead of PYTHONPATH, so a tree is run from inside it (until
# 2026-11-28 this passed the tree on PYTHONPATH from the root: both sides imported the working tree)
bench() {  # $1: tree holding oscarkv/, $2: output name
  (cd "$1" && PYTHONPATH=$ROOT python3 -c "import oscarkv; print('$2 imports', oscarkv.__file__)" &&
   PYTHONPATH=$ROOT timeout 200 python3 -m oscarkv.cli bench prefill --shapes qwen3-4b --contexts "$CTX" --chunks 512 \
    --methods bf16,oscar --profile-context 0 --out "$OUT/$2.json" 2>&1 | grep -e '^|' -e imports)
}
{ nvidia-smi --query-gpu=name --format=csv,noheader
  PYTHONPATH=. python3 - <<'EOF'
import torch
x = torch.randn(512, 8, 128, device="cuda"); r = torch.randn(8, 128, 128, device="cuda")
a = torch.einsum("thd,hde->the", x, r); b = torch.matmul(x.transpose(0, 1), r).transpose(0, 1)
q = torch.randn(512, 8, 4, 128, device="cuda", dtype=torch.bfloat16); rb = r.bfloat16()
c = torch.einsum("thrd,hde->thre", q, rb).reshape(512, 32, 128)
d = torch.matmul(q.transpose(0, 1).reshape(8, -1, 128), rb).view(8, 512, 4, 128).transpose(0, 1).reshape(512, 32, 128)
print("einsum == matmul (fp32 keys, bf16 queries):", torch.equal(a, b), torch.equal(c, d))
EOF
  echo "== after"; bench . after
  [ -n "${BEFORE:-}" ] && { echo "== before"; bench "$BEFORE" before; }
  [ "${PROFILE:-1}" = 1 ] && PYTHONPATH=. timeout 150 python3 -m lab.scripts.prefill_host_profile --methods oscar --out "$OUT" | grep -v Warn
  PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_prefill.py tests/engine/test_gpu_engine.py \
    tests/engine/test_extend_graphs_gpu.py tests/engine/test_speculative_gpu.py > "$OUT/gpu_tests.log" 2>&1
  tail -3 "$OUT/gpu_tests.log"
} 2>&1 | tee "$OUT/summary.txt"
