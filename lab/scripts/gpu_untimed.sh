#!/usr/bin/env bash
# What the ninth session built without a GPU, timed on one (Hopper). Parts, each under its own timeout; at most
# ~9 min a call, so: call 1 `tests span chunk`, call 2 `followup d8 d4`, call 3 `mib` (`tp2` on two GPUs).
#   tests: weight prefetch into L2 (EngineConfig.l2_prefetch): outputs with prefetch equal those without (eager
#      and CUDA graphs), the kernel on the device
#   d8, d4: decode at 100K, batch 1, Qwen3-8B and Qwen3-4B shapes: bf16 and oscar under each variant (off, attn,
#      attn+reduce+next, all; 24 MiB a point); mib: Qwen3-8B with 12 and 40 MiB at the variant `all`
#   span: decode attention over pages of 16 in tiles of one page or several (decode._config SPAN_PAGES; its GPU
#      tests, then python -m lab.scripts.page_span_sweep, ~2 min)
#   chunk: short chunks over 100K timed on the GPU alone (CUDA-graph replays; the tables of chunk_splitk were set
#      from eager timings, ~0.2 ms of host per call): chunk_attention bench, then chunk_sweep for k = 1, 8, 16 (INT2)
#   followup: the first step of a follow-up on a cached 32K / 100K prompt as served (512-token chunks), resuming
#      where the cached prompt ended (EngineConfig.resume_turns, chat follow-ups) and not (the previous behaviour)
#   (tenth session) vprof: where a verify step's time goes (lab.scripts.verify_profile: Qwen3-4B shape, 100K,
#      K = 2 and 8, oscar and bf16); fprof: the follow-up step alone under the profiler (lab.scripts.followup_profile,
#      oscar, k = 8 and 64); gtests: the decode kernel's GPU tests and the engine's graph / prefetch GPU tests
#   ftests: extend steps of <= 16 tokens through the fused input maps (TritonAttention.fused_extend_tokens, built
#      without a GPU): the fusion, speculation and extend-graph GPU tests; then vprofo (its verify-step profile)
#   sprof: the as-served follow-up (512-token chunks) under the profiler, resumed and not, k = 1 and 512 (OSCAR's
#      k = 512 read 162-175 ms resumed against 138 not); cs17 / cs33 / cs64: chunk_sweep with one-warp tiles at
#      chunks over 16 tokens (the table there is still the eager-timed one); cs9b: BF16-only caches at 3 and 9 tokens
#      (a BF16 K = 8 verify chunk spent 23.6 ms in the chunk kernel at 100K)
#   (eleventh session) bprof: the as-served follow-up at 32K, k = 64 and 512, bf16 and oscar, under the profiler
#      (BF16 k = 64 took 68 ms at 32K and 66 at 100K: near-constant in the context)
#   cs64s: chunk_sweep at k = 64 on a grid that fits (cs64's timed out at 400 s): rows 16 / 64, 1-4 warps
#   tp2 (2 GPUs or more): Qwen3-8B at tp 2, one-shot all-reduce, off and all (each engine its own process: a
#      symmetric-memory engine is one per process)
#   (twelfth session) c64a / c64b: chunk_sweep at k = 64 over 32K / 100K, rows 16 and 32, 1-2 warps, 6-12 splits per
#      row block (the k = 64 follow-up at 32K is 1.3x its target, its chunk kernel 8.4 of 15 ms)
#   arnorm (2+ GPUs): lab.scripts.tp_ar_norm_check, the fused one-shot all-reduce + residual + RMSNorm (built on the
#      CPU, never run on a GPU): correct under concurrency, and µs against one_shot / nccl + rms_norm in CUDA graphs
#   vsmol: lab.scripts.verify_profile at the default model's shape (smollm2-135m, random weights),
#      6K context, K = 2, 4, 8, bf16 and oscar: kernels and host functions of plain and verify steps (the served default
#      model's verify step cost ~2.7 plain steps)
#   (thirteenth session) tptests (2 GPUs): the tp GPU tests (tokens equal tp = 1, symmetric-memory kinds, a dying
#      worker); symmtests: those of the symmetric-memory kinds (one_shot_norm: the all-reduce fused into the norms); tp2n: Qwen3-8B
#      decode at tp 2, one_shot against one_shot_norm, bf16 and oscar (one process each, in the order ABBA); tp4n
#      (4 GPUs): the same at tp 4 for Qwen3-8B and -32B (then SYMM_MEM_WINS[4]); tp2prof: the per-rank profile with
#      one_shot_norm; f512: the 32K follow-up of 512 tokens under the profiler (after the map and cast changes);
#      pwtests: the piecewise graphs' GPU tests (oscarkv.engine.piecewise, built without a GPU: never captured yet);
#      pwfollow: follow-ups of 128 / 512 tokens, eager against piecewise graphs (bucket 512), two rounds; pwcheck:
#      lab.scripts.pieces_check (one engine a method, pieces off / on interleaved: follow-ups and a cold 32K prompt
#      in 512-token chunks, TTFT as served); etests: the engine's GPU tests and the extend-graph tests (fused maps now cover 512-token chunks)
# Usage: bash lab/scripts/gpu_untimed.sh [PART ...]  (default: tests span chunk). Out ($OUT): *.log, *.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_untimed}; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
V=off,attn,attn+reduce+next,all
bench() { name=$1; shift; timeout 300 python3 -m oscarkv.cli bench decode --contexts 102400 "$@" --out "$OUT/$name.json" \
  > "$OUT/$name.log" 2>&1; echo "== $name: exit $?"; grep -v "^{" "$OUT/$name.log" | tail -n 25; }
tests() { timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/models/test_prefetch.py \
  tests/engine/test_gpu_engine.py -k "prefetch or graph_matches" > "$OUT/gpu_tests.log" 2>&1; tail -n 12 "$OUT/gpu_tests.log"; }
span() { timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_decode.py -k pages_of_16 \
  > "$OUT/span_tests.log" 2>&1; tail -n 3 "$OUT/span_tests.log"
  timeout 300 python3 -m lab.scripts.page_span_sweep --out "$OUT/page_span.json" > "$OUT/page_span.log" 2>&1; tail -n 6 "$OUT/page_span.log"; }
chunk() { timeout 240 python3 -m lab.benchmarks.chunk_attention "$OUT/chunk_attention.json" > "$OUT/chunk_attention.log" 2>&1
  tail -n 18 "$OUT/chunk_attention.log"; timeout 300 python3 -m lab.scripts.chunk_sweep --out "$OUT/chunk_sweep" \
  --chunks 1,8,16 --kinds int2 > "$OUT/chunk_sweep.log" 2>&1; tail -n 4 "$OUT/chunk_sweep.log"; }
followup() { for r in ${FOLLOWUP_MODES:-resume-turns no-resume-turns}; do timeout 280 python3 -m oscarkv.cli bench followup --shapes qwen3-4b \
  --contexts 32768,102400 --new-tokens 1,64,512 --methods bf16,oscar --prefill-chunk 512 --$r \
  --out "$OUT/followup_$r.json" > "$OUT/followup_$r.log" 2>&1; echo "== followup --$r: exit $?"
  grep "^|" "$OUT/followup_$r.log"; done; }
vprof() { timeout 400 python3 -m lab.scripts.verify_profile --out "$OUT/vprof" > "$OUT/vprof.log" 2>&1
  echo "== vprof: exit $?"; cat "$OUT/vprof/verify_profile.txt" 2>/dev/null || tail -n 30 "$OUT/vprof.log"; }
c64() { timeout 280 python3 -m lab.scripts.chunk_sweep --out "$OUT/c64_$1" --chunks 64 --kinds int2 --warps 1,2 \
  --mults 6,8,12 --rows 16,32 --context "$1" > "$OUT/c64_$1.log" 2>&1; echo "== c64 $1: exit $?"; tail -n 2 "$OUT/c64_$1.log"; }
c64a() { c64 32768; }; c64b() { c64 102400; }
arnorm() { [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "== arnorm: one GPU, skipped"; return; }
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 240 python3 -m lab.scripts.tp_ar_norm_check --ranks 2 \
  --out "$OUT/arnorm" > "$OUT/arnorm.log" 2>&1; echo "== arnorm: exit $?"; tail -n 8 "$OUT/arnorm.log"; }
vsmol() { timeout 300 python3 -m lab.scripts.verify_profile --shape smollm2-135m --context 6144 --ks 2,4,8 --steps 8 \
  --methods bf16,oscar --kv-gib 4 --out "$OUT/vsmol" > "$OUT/vsmol.log" 2>&1; echo "== vsmol: exit $?"
  grep -E "K=|^\{" "$OUT/vsmol.log" | head -n 20; }
vprofo() { timeout 300 python3 -m lab.scripts.verify_profile --methods oscar --out "$OUT/vprof" > "$OUT/vprof.log" 2>&1
  echo "== vprof oscar: exit $?"; grep -A6 "K=" "$OUT/vprof/verify_profile.txt" 2>/dev/null || tail -n 30 "$OUT/vprof.log"; }
ftests() { timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_decode_qk_fusion.py \
  tests/engine/test_speculative_gpu.py tests/engine/test_extend_graphs_gpu.py tests/kernels/test_chunk_splitk.py \
  > "$OUT/ftests.log" 2>&1; echo "== ftests: exit $?"; tail -n 6 "$OUT/ftests.log"; }
sprof() { for r in resume no-resume; do timeout 200 python3 -m lab.scripts.followup_profile --methods oscar --new-tokens \
  1,512 --prefill-chunk 512 --$r --out "$OUT/sprof_$r" > "$OUT/sprof_$r.log" 2>&1; echo "== sprof --$r: exit $?"
  grep -E "^==|^ +[0-9.]+ ms" "$OUT/sprof_$r.log"; done; }
bprof() { for m in bf16 oscar; do timeout 150 python3 -m lab.scripts.followup_profile --methods $m --context 32768 \
  --new-tokens 64,512 --prefill-chunk 512 --resume --out "$OUT/bprof_$m" > "$OUT/bprof_$m.log" 2>&1; echo "== bprof $m: exit $?"
  grep -E "^==|^ +[0-9.]+ ms" "$OUT/bprof_$m.log" | head -n 24; done; }
cs64s() { timeout 300 python3 -m lab.scripts.chunk_sweep --out "$OUT/csweep64s" --chunks 64 --kinds int2 --warps 1,2,4 \
  --mults 4,8,16 --rows 16,64 > "$OUT/csweep64s.log" 2>&1; echo "== csweep 64 (small grid): exit $?"; tail -n 2 "$OUT/csweep64s.log"; }
cs17() { csweep 17; }; cs33() { csweep 33; }
cs9b() { timeout 400 python3 -m lab.scripts.chunk_sweep --out "$OUT/csweep9b" --chunks 3,9 --kinds bf16 --warps 1,2,4 \
  --mults 1,2,4,8,16 > "$OUT/csweep9b.log" 2>&1; echo "== csweep bf16 3,9: exit $?"; tail -n 3 "$OUT/csweep9b.log"; }
cs64() { timeout 400 python3 -m lab.scripts.chunk_sweep --out "$OUT/csweep64" --chunks 64 --kinds int2 --warps 1,2,4,8 \
  --mults 1,2,4,8 --rows 16,32,64,128 > "$OUT/csweep64.log" 2>&1; echo "== csweep 64: exit $?"; tail -n 2 "$OUT/csweep64.log"; }
ctests() { timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_chunk_splitk.py \
  tests/engine/test_extend_graphs_gpu.py tests/engine/test_speculative_gpu.py > "$OUT/ctests.log" 2>&1
  echo "== ctests: exit $?"; tail -n 4 "$OUT/ctests.log"; }
fprof() { timeout 300 python3 -m lab.scripts.followup_profile --methods oscar --new-tokens 8,64 --out "$OUT/fprof" \
  > "$OUT/fprof.log" 2>&1; echo "== fprof: exit $?"; grep -E "^==|^ +[0-9.]+ ms" "$OUT/fprof.log"; }
gtests() { timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_decode.py \
  tests/engine/test_gpu_engine.py > "$OUT/gtests.log" 2>&1; echo "== gtests: exit $?"; tail -n 8 "$OUT/gtests.log"; }
csweep() { timeout 400 python3 -m lab.scripts.chunk_sweep --out "$OUT/csweep$1" --chunks "$1" --kinds int2 --warps 1,2,4 \
  --mults 1,2,4,8,16 --maxnreg 168 > "$OUT/csweep$1.log" 2>&1; echo "== csweep $1: exit $?"; tail -n 2 "$OUT/csweep$1.log"; }
cs1() { csweep 1; }; cs3() { csweep 3; }; cs9() { csweep 9; }
tp2s() { [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "== tp2s: one GPU, skipped"; return; }
  for mv in bf16:off oscar:off oscar:attn oscar:all; do m=${mv%%:*}; v=${mv##*:}; timeout 130 python3 -m oscarkv.cli bench \
    decode --contexts 102400 --shapes qwen3-8b --methods $m --tensor-parallel-size 2 --all-reduce one_shot --steps 12 \
    --kv-gib 16 --l2-prefetch $v --out "$OUT/tp2_${m}_$v.json" > "$OUT/tp2_${m}_$v.log" 2>&1; echo "== tp2 $m $v: exit $?"
    grep "^| qwen" "$OUT/tp2_${m}_$v.log"; done; }
d8() { bench d8 --shapes qwen3-8b --methods bf16,oscar --l2-prefetch "$V"; }
d4() { bench d4 --shapes qwen3-4b --methods bf16,oscar --l2-prefetch "$V"; }
mib() { for m in 12 40; do bench "d8_mib$m" --shapes qwen3-8b --methods bf16,oscar --l2-prefetch off,all --l2-prefetch-mib $m; done; }
tp2() { [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "== tp2: one GPU, skipped"; return; }
  for m in bf16 oscar; do for v in off all; do bench "tp2_${m}_$v" --shapes qwen3-8b --methods $m \
    --tensor-parallel-size 2 --all-reduce one_shot --l2-prefetch $v; done; done; }
symmtests() { NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu \
  -rA tests/engine/test_tensor_parallel_gpu.py -k symm > "$OUT/symmtests.log" 2>&1; echo "== symmtests: exit $?"; tail -n 5 "$OUT/symmtests.log"; }
tp2n() { [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "== tp2n: one GPU, skipped"; return; }
  i=0; for mk in oscar:one_shot oscar:one_shot_norm bf16:one_shot_norm bf16:one_shot oscar:one_shot_norm oscar:one_shot; do
    m=${mk%%:*}; k=${mk##*:}; i=$((i+1)); NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 120 python3 -m oscarkv.cli \
    bench decode --contexts 102400 --shapes qwen3-8b --methods $m --tensor-parallel-size 2 --all-reduce $k --steps 12 \
    --kv-gib 16 --out "$OUT/tp2n_${i}_${m}_$k.json" > "$OUT/tp2n_${i}_${m}_$k.log" 2>&1; echo "== tp2n $i $m $k: exit $?"
    grep "^| qwen" "$OUT/tp2n_${i}_${m}_$k.log"; done; }
tp4n() { [ "$(nvidia-smi -L | wc -l)" -ge 4 ] || { echo "== tp4n: fewer than 4 GPUs, skipped"; return; }
  i=0; for sk in qwen3-8b:oscar:one_shot qwen3-8b:oscar:one_shot_norm qwen3-8b:bf16:one_shot_norm qwen3-8b:bf16:one_shot \
      qwen3-32b:oscar:one_shot_norm qwen3-32b:oscar:one_shot qwen3-32b:bf16:one_shot qwen3-32b:bf16:one_shot_norm; do
    IFS=: read -r s m k <<< "$sk"; i=$((i+1)); NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 150 python3 -m \
    oscarkv.cli bench decode --contexts 102400 --shapes $s --methods $m --tensor-parallel-size 4 --all-reduce $k --steps 12 \
    --kv-gib 16 --out "$OUT/tp4n_${i}_${s}_${m}_$k.json" > "$OUT/tp4n_${i}_${s}_${m}_$k.log" 2>&1; echo "== tp4n $i $s $m $k: exit $?"
    grep "^| qwen" "$OUT/tp4n_${i}_${s}_${m}_$k.log"; done; }
tp2prof() { [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "== tp2prof: one GPU, skipped"; return; }
  for m in oscar bf16; do NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 200 python3 -m oscarkv.cli bench decode \
    --contexts 102400 --shapes qwen3-8b --methods $m --tensor-parallel-size 2 --all-reduce one_shot_norm --steps 12 --kv-gib 16 \
    --profile --out "$OUT/tp2prof_$m.json" > "$OUT/tp2prof_$m.log" 2>&1; echo "== tp2prof $m: exit $?"; grep "^| qwen" "$OUT/tp2prof_$m.log"; done; }
f512() { timeout 300 python3 -m lab.scripts.followup_profile --methods bf16,oscar --context 32768 --new-tokens 512 \
  --prefill-chunk 512 --resume --out "$OUT/f512" > "$OUT/f512.log" 2>&1; echo "== f512: exit $?"; grep "^==" "$OUT/f512.log"; }
pwtests() { timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/engine/test_piecewise_gpu.py \
  > "$OUT/pwtests.log" 2>&1; echo "== pwtests: exit $?"; grep -E "PASS|FAIL|Error|passed|failed" "$OUT/pwtests.log" | tail -n 8; }
pwfollow() { for i in 1 2; do for pw in "" 512; do timeout 280 python3 -m oscarkv.cli bench followup --shapes qwen3-4b \
  --contexts 32768,102400 --new-tokens 128,512 --methods bf16,oscar --prefill-chunk 512 --resume-turns --repeats 3 \
  --piecewise-graph-buckets "$pw" --out "$OUT/pwfollow_${i}_${pw:-eager}.json" > "$OUT/pwfollow_${i}_${pw:-eager}.log" 2>&1
  echo "== pwfollow $i ${pw:-eager}: exit $?"; grep "^| qwen" "$OUT/pwfollow_${i}_${pw:-eager}.log"; done; done; }
pwc100() { timeout 500 python3 -m lab.scripts.pieces_check --context 102400 --ks 64,512 --cold 8192 --methods bf16,oscar \
  --buckets 64,128,256,512 --kv-gib 48 --out "$OUT/pwc100" > "$OUT/pwc100.log" 2>&1; echo "== pwc100: exit $?"; grep "^{" "$OUT/pwc100.log"; }
pwcheck() { timeout 420 python3 -m lab.scripts.pieces_check --context 32768 --ks 64,128,512 --cold 32768 --methods bf16,oscar --buckets 64,128,256,512 \
  --out "$OUT/pwcheck" > "$OUT/pwcheck.log" 2>&1; echo "== pwcheck: exit $?"; grep "^{" "$OUT/pwcheck.log"; }
tptests() { [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "== tptests: one GPU, skipped"; return; }
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 360 python3 -m pytest -q -p no:cacheprovider -m gpu -rA \
  tests/engine/test_tensor_parallel_gpu.py > "$OUT/tptests.log" 2>&1; echo "== tptests: exit $?"; grep -E "PASS|FAIL|ERROR|passed|failed" "$OUT/tptests.log" | tail -n 14; }
#      (thirteenth session) tp2n: Qwen3-8B
#      decode at tp 2, one_shot against one_shot_norm, bf16 and oscar (one process each, in the order ABBA); tp4n
#      (4 GPUs): the same at tp 4 for Qwen3-8B and -32B (then SYMM_MEM_WINS[4]); tp2prof: the per-rank profile with
#      one_shot_norm; f512: the 32K follow-up of 512 tokens under the profiler (after the map and cast changes);
#      pwtests: the piecewise graphs' GPU tests (oscarkv.engine.piecewise, built without a GPU: never captured yet);
#      pwfollow: follow-ups of 128 / 512 tokens, eager against piecewise graphs (bucket 512), two rounds; pwcheck:
#      lab.scripts.pieces_check (one engine a method, pieces off / on interleaved: follow-ups and a cold 32K prompt
#      in 512-token chunks, TTFT as served); etests: the engine and extend-graph GPU tests
#   (fourteenth session) pwcheck with buckets 64-512 and k = 64 too; pwc100: the same over a cached 100K prompt
etests() { timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu_engine.py \
  tests/engine/test_extend_graphs_gpu.py > "$OUT/etests.log" 2>&1; echo "== etests: exit $?"; tail -n 6 "$OUT/etests.log"; }
#   ktests: the fused kernels' tests on the GPU; mapsw: lab.scripts.map_sweep; mtile: lab.scripts.map_tile (the map
#      as a tile of tokens against it: dot products at three precisions); fserved: bench followup as served (resumed
#      turns, 512-token chunks, the engine's default piecewise graphs), k = 1, 8, 64, 512 at 32K and 100K; pwtp (2
#      GPUs): lab.scripts.pieces_tp_check (pieces at tp 2: tokens against eager, follow-ups of 512, TTFT as served);
#      pwbatch: lab.scripts.pieces_batch_check (EngineConfig.piecewise_batches on a served mix: TTFT, decode latency)
ktests() { timeout 250 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_fused.py \
  > "$OUT/ktests.log" 2>&1; echo "== ktests: exit $?"; tail -n 6 "$OUT/ktests.log"; }
mapsw() { timeout 300 python3 -m lab.scripts.map_sweep --out "$OUT/mapsw" > "$OUT/mapsw.log" 2>&1; echo "== mapsw: exit $?"
  cat "$OUT/mapsw.log"; }
fserved() { timeout 500 python3 -m oscarkv.cli bench followup --shapes qwen3-4b --contexts 32768,102400 \
  --new-tokens ${FSERVED_KS:-1,8,64,512} --methods bf16,oscar --prefill-chunk 512 --resume-turns \
  --repeats ${FSERVED_REPEATS:-3} --out "$OUT/fserved.json" \
  > "$OUT/fserved.log" 2>&1; echo "== fserved: exit $?"; grep "^|" "$OUT/fserved.log"; }
pwtp() { [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "== pwtp: one GPU, skipped"; return; }
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 270 python3 -m lab.scripts.pieces_tp_check --tp 2 ${PWTP_ARGS:-} \
  --out "$OUT/pwtp" > "$OUT/pwtp.log" 2>&1; echo "== pwtp: exit $?"; grep -E "^\{|^==|Error|   host" "$OUT/pwtp.log"; }
pwbatch() { timeout 400 python3 -m lab.scripts.pieces_batch_check --prompts 2 --prompt-tokens 16384 \
  --out "$OUT/pwbatch" > "$OUT/pwbatch.log" 2>&1; echo "== pwbatch: exit $?"; grep -E "^\{|^==|Error" "$OUT/pwbatch.log"; }
mtile() { timeout 300 python3 -m lab.scripts.map_tile --out "$OUT/mtile" > "$OUT/mtile.log" 2>&1; echo "== mtile: exit $?"
  cat "$OUT/mtile.log"; }
#   (fifteenth session) tpprof (2 GPUs): lab.scripts.tp_prefill_profile, a cold 32K prompt at tp 1 and 2 (BF16, pieces
#      on): ms per chunk, rank 0's kernels and host (tp 2 took 2-3x one GPU's TTFT)
tpprof() { [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "== tpprof: one GPU, skipped"; return; }
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 300 python3 -m lab.scripts.tp_prefill_profile --tps 1,2 \
  ${TPPROF_ARGS:-} --out "$OUT/tpprof" > "$OUT/tpprof.log" 2>&1; echo "== tpprof: exit $?"; grep -E "^==|^   |Error" "$OUT/tpprof.log"; }
#      ptests: the prefill kernel's GPU tests (padded shapes, the merge shedding the padding, warm_cudnn)
ptests() { timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rf tests/kernels/test_prefill.py > "$OUT/ptests.log" 2>&1
  echo "== ptests: exit $?"; tail -n 4 "$OUT/ptests.log"; }
#   (nineteenth session) gsweep: lab.scripts.gather_sweep (the raw INT2 gather's rows first, then the element-wise
#      one's, then the staged step at k = 64 / 512 with either: set prefill.RAW_GATHER if it wins); aerr: bench attention
#      at 100K, batch 1 / 8 / 32 (each kind's error against the fp32 oracle beside its split count, after the drift fix);
#      stests: the kernel, prefill, speculation and extend-graph GPU tests (the chunk's K and V at their own strides)
gsweep() { timeout 280 python3 -m lab.scripts.gather_sweep --out "$OUT/gsweep" > "$OUT/gsweep.log" 2>&1
  echo "== gsweep: exit $?"; grep -E "raw BLOCK|BLOCK  32|staged|MISMATCH" "$OUT/gsweep.log"; }
aerr() { timeout 240 python3 -m oscarkv.cli bench attention --contexts 102400 --batches 1,8,32 --out "$OUT/aerr.json" \
  > "$OUT/aerr.log" 2>&1; echo "== aerr: exit $?"; tail -n 12 "$OUT/aerr.log"; }
stests() { timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_decode.py \
  tests/kernels/test_chunk_splitk.py tests/kernels/test_extend.py tests/kernels/test_prefill.py \
  tests/engine/test_speculative_gpu.py tests/engine/test_extend_graphs_gpu.py > "$OUT/stests.log" 2>&1
  echo "== stests: exit $?"; tail -n 4 "$OUT/stests.log"; }
#   (twentieth session) ksplit: lab.scripts.ksplit_sdpa (the staged prefix call with its keys cut into S spans as
#      the batch: cuDNN and FlashAttention, 64-2048 stacked rows over 32K / 100K); f1: the as-served follow-up of one
#      token at 32K under the profiler, bf16 and oscar (OSCAR's first step 7.7 ms against BF16's 7.1, decode 3.8 / 4.5)
ksplit() { timeout 280 python3 -m lab.scripts.ksplit_sdpa --out "$OUT/ksplit" > "$OUT/ksplit.log" 2>&1
  echo "== ksplit: exit $?"; cat "$OUT/ksplit.log" | grep -v "^ *$" | tail -n 100; }
f1() { timeout 200 python3 -m lab.scripts.followup_profile --methods bf16,oscar --context 32768 --new-tokens 1 \
  --prefill-chunk 512 --resume --out "$OUT/f1" > "$OUT/f1.log" 2>&1; echo "== f1: exit $?"; grep -E "^==|^ +[0-9.]+ ms" "$OUT/f1.log" | head -n 60; }
#      kspan: the prefill GPU tests (key spans), then lab.benchmarks.chunk_attention at k = 16-512 (the staged path with
#      its prefix keys in spans against the split-K kernel: SPLITK_SHAPES)
kspan() { ptests; timeout 400 python3 -m lab.benchmarks.chunk_attention "$OUT/chunk_attention.json" 16,32,64,128,256,512 \
  > "$OUT/chunk_attention.log" 2>&1; echo "== chunk_attention: exit $?"; cat "$OUT/chunk_attention.log" | tail -n 30; }
#      rtests: the GPU tests of the routes the key spans moved (extend graphs, piecewise graphs, split-K, speculation)
rtests() { timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_extend_graphs_gpu.py \
  tests/engine/test_piecewise_gpu.py tests/kernels/test_chunk_splitk.py tests/engine/test_speculative_gpu.py \
  > "$OUT/rtests.log" 2>&1; echo "== rtests: exit $?"; tail -n 4 "$OUT/rtests.log"; }
#      p256: the as-served follow-up (piecewise graphs) of 64 / 256 tokens at 32K under the profiler (host-bound between
#      the piecewise graphs?); xtests: the extend graphs' GPU tests
p256() { timeout 240 python3 -m lab.scripts.followup_profile --methods bf16,oscar --context 32768 --new-tokens 64,256 \
  --prefill-chunk 512 --resume --out "$OUT/p256" > "$OUT/p256.log" 2>&1; echo "== p256: exit $?"; grep -E "^== " "$OUT/p256.log"; }
xtests() { timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_extend_graphs_gpu.py \
  > "$OUT/xtests.log" 2>&1; echo "== xtests: exit $?"; tail -n 3 "$OUT/xtests.log"; }
#      sgtests: the GPU tests of extend graphs (staged graphs: ExtendGraphs.staged) and speculation; then
#      FSERVED_REPEATS=3 fserved (a third question on one cached document replays its staged graph)
sgtests() { timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_extend_graphs_gpu.py \
  tests/engine/test_speculative_gpu.py > "$OUT/sgtests.log" 2>&1; echo "== sgtests: exit $?"; tail -n 4 "$OUT/sgtests.log"; }
#   (twenty-first session) chat: lab.scripts.chat_followup (chat follow-ups sent as text, TokenMemo on and off;
#      carry .tok: the default model's tokenizer, save_pretrained); fold: fserved at 7920aed (before HeldIds and the
#      hit's page loops; carry ab_old: `git archive 7920aed oscarkv | tar -x -C ab_old`), run from ab_old
chat() { timeout 400 python3 -m lab.scripts.chat_followup --tokenizer .tok --out "$OUT/chat" > "$OUT/chat.log" 2>&1
  echo "== chat: exit $?"; grep "^|" "$OUT/chat.log"; }
fold() { (cd ab_old && timeout 300 python3 -m oscarkv.cli bench followup --shapes qwen3-4b --contexts 32768,102400 \
  --new-tokens ${FSERVED_KS:-1,8,64,512} --methods bf16,oscar --prefill-chunk 512 --resume-turns --repeats 3 \
  --out "$OUT/fold.json" > "$OUT/fold.log" 2>&1); echo "== fold: exit $?"; grep "^|" "$OUT/fold.log"; }
#      schat: lab.scripts.served_chat (the same turns through the server and the openai client; carry .tok and .wh:
#      `pip download` of the serve extra, the openai client and their dependencies for Python 3.12)
schat() { pip install -q --no-index --find-links .wh --target /tmp/sv fastapi uvicorn openai prometheus_client httpx \
  > "$OUT/schat_pip.log" 2>&1; PYTHONPATH=/tmp/sv:${PYTHONPATH:-} timeout 400 python3 -m lab.scripts.served_chat \
  --tokenizer .tok --out "$OUT/schat" > "$OUT/schat.log" 2>&1; echo "== schat: exit $?"; grep "^|" "$OUT/schat.log"
  tail -n 3 "$OUT/schat.log"; }
#   (twenty-third session) startup: the start-up calibration's GPU test alone (failed in s23_call12, its message cut);
#      suite1 / suite2: the GPU suite in two halves (calibration and the engine; the kernels and models), -rfE
startup() { timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -x -rfE tests/calibrate/test_startup.py \
  > "$OUT/startup.log" 2>&1; echo "== startup: exit $?"; grep -E "^E |passed|failed|Error" "$OUT/startup.log" | head -40; }
suite() { name=$1; shift; timeout "${SUITE_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -m gpu -rfE "$@" \
  > "$OUT/$name.log" 2>&1; echo "== $name: exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$name.log" | tail -20; }
suite1() { suite suite1 tests/calibrate tests/engine; }
suite2() { suite suite2 tests/kernels tests/models --ignore=tests/models/test_hub.py --ignore=tests/models/test_gemma_multimodal.py; }
nvidia-smi --query-gpu=name --format=csv,noheader
for part in ${*:-tests span chunk}; do $part; done
