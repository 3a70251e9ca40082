#!/usr/bin/env bash
# Speculative decoding and follow-up turns on one GPU (issue 29), in two calls on the same warm machine: the default
# model travels as two halves (lab/scripts/pack_default_model.sh; 64 MiB per call), joined in /tmp between calls.
#
#   part1 (carry .spec_model/a; ~5 min): keeps the first half; the GPU tests (speculation with Triton and CUDA graphs
#          ≡ without, up to a near-tie; the bench tests); the follow-up-turn table (qwen3-4b, random weights, 32K and
#          100K cached, k = 1, 8, 64, 512, bf16 and oscar, beside a decode step)           -> followup.json/.md
#   part2 (carry .spec_model/b; ~4 min): joins and checks the GGUF, installs gguf into /tmp/site; bench speculative:
#          the default model (bf16 weights on the GPU, a 6K-token document; copy and no-copy tasks; K = 0, 2, 4, 8;
#          bf16 and oscar) and the verify-step cost at qwen3-4b 32K and 100K, then the projection -> spec.json/.md
#          (its tables: the verify steps' extend-graph share, graphs captured while timed — 0 expected — and, where
#          a K's tokens differ from K = 0, the first differing position, the log-prob drift before it and the margin)
#          Without the first half (a cold machine: part1 ran on another), it says so and stops.
#
# Usage (repository root, a CUDA torch): bash lab/scripts/gpu_spec.sh part1|part2 [PYTHON]
# SPEC_ARGS: more flags for part2's bench (later ones win), e.g. "--methods oscar --sink 16 --shapes="
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGE="${1:?part1 or part2}"
PY="${2:-python3}"
OUT="${OUT:-runs/gpu_spec}"
MODEL=/tmp/oscarkv_spec_model
mkdir -p "$OUT" "$MODEL"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device_$STAGE.txt"

if [ "$STAGE" = part1 ]; then
    cp .spec_model/a*/* "$MODEL/" 2>/dev/null || echo "no .spec_model/a*: part2 will run without the default model"
    timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/engine/test_speculative_gpu.py \
        tests/engine/test_extend_graphs_gpu.py tests/bench/test_followup.py tests/bench/test_speculative_bench.py 2>&1 | tee "$OUT/pytest.log" || status=1
    timeout 330 "$PY" -m oscarkv.cli bench followup --shapes qwen3-4b --contexts 32768,102400 --new-tokens 1,8,64,512 \
        --methods bf16,oscar --kv-gib 24 --out "$OUT/followup.json" 2>&1 | tee "$OUT/followup.log" || status=1
    grep '^|' "$OUT/followup.log" > "$OUT/followup.md"
    exit $status
fi

GGUF="$MODEL/SmolLM2-135M-Instruct.Q4_1.gguf"  # NOTE: the file name makes it the default model (shipped artifact)
if [ -f "$MODEL/model.part0" ] && [ -f .spec_model/b/model.sha256 ]; then
    bash lab/scripts/gpu_model_join.sh "$GGUF" || exit 1
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$MODEL"/gguf-*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
else
    echo "the default model is not here (part1 on this warm machine carries its first half): stopping"; exit 1
fi
timeout 500 "$PY" -m oscarkv.cli bench speculative --model "$GGUF" --device cuda --methods bf16,oscar \
    --num-speculative-tokens 2,4,8 --document-tokens 6144 --max-tokens 128 --repeats 3 --shapes qwen3-4b \
    --contexts 32768,102400 --steps 16 --kv-gib 24 ${SPEC_ARGS:-} --out "$OUT/spec.json" 2>&1 | tee "$OUT/spec.log" || status=1
grep '^|\|^measured\|^projected' "$OUT/spec.log" > "$OUT/spec.md"
exit $status
