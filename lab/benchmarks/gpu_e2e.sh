# One H100 call: GPU tests (kernels incl. the fused elementwise ones, Triton backend ≡ oracles,
# CUDA graph ≡ eager), `oscarkv bench decode`, `oscarkv bench capacity`, a profiled decode run
# (per-kernel GPU time and host cProfile at 4B x 100K, in its own process: the profiler slows
# later graph launches), the INT2 decode-kernel sweep / table of lab.benchmarks.variants, the
# BF16-kernel config sweep vs SDPA (bf16) and the BF16 kernel next to SDPA at every kernel-table
# point (peer, lab.benchmarks.bf16_peer) (JSON and logs under $OUT).
# Usage: bash lab/benchmarks/gpu_e2e.sh [tests|decode|capacity|profile|sweep|bf16|peer|round6|round7|batch1|variants ...]  (default: the first four)
export PYTHONPATH=. PYTHONUNBUFFERED=1
parts="${*:-tests decode capacity profile}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
case " $parts " in *" tests "*) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu_engine.py tests/kernels 2>&1 | tail -40 | tee $OUT/pytest.txt;; esac
case " $parts " in *" decode "*) timeout 240 python3 -m oscarkv.cli.main bench decode --out $OUT/decode_h100.json 2>&1 | tee $OUT/decode.log | grep -v "^{";; esac
case " $parts " in *" capacity "*) timeout 330 python3 -m oscarkv.cli.main bench capacity --methods bf16,naive,oscar --out $OUT/capacity_h100.json 2>&1 | tee $OUT/capacity.log | grep -v "^{";; esac
case " $parts " in *" profile "*) timeout 120 python3 -m oscarkv.cli.main bench decode --shapes qwen3-4b --contexts 102400 --profile --out $OUT/decode_profile_h100.json 2>&1 | grep -v "^{" | tail -4;; esac
case " $parts " in *" sweep "*) timeout 150 python3 -m lab.benchmarks.variants $OUT sweep 2>&1 | tee $OUT/sweep.log | grep -v "^sweep {";; esac
case " $parts " in *" bf16 "*) timeout 330 python3 -m lab.benchmarks.variants $OUT bf16 2>&1 | tee $OUT/bf16.log | grep -v "^coarse\|^final";; esac
case " $parts " in *" peer "*) timeout 200 python3 -m lab.benchmarks.bf16_peer $OUT 2>&1 | tee $OUT/peer.log | grep -v "^point";; esac
case " $parts " in *" round6 "*) timeout 420 python3 -m lab.benchmarks.variants $OUT round6 2>&1 | tee $OUT/round6.log | grep -v "^point";; esac
case " $parts " in *" round7 "*) timeout 420 python3 -m lab.benchmarks.variants $OUT round7 2>&1 | tee $OUT/round7.log | grep -v "^point";; esac
case " $parts " in *" batch1 "*) timeout 200 python3 -m lab.benchmarks.batch1 $OUT 2>&1 | tee $OUT/batch1.log | grep -v "^point";; esac
case " $parts " in *" variants "*) timeout 300 python3 -m lab.benchmarks.variants $OUT 2>&1 | tee $OUT/variants.log | grep -v "^point";; esac
