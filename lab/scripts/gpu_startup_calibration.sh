#!/usr/bin/env bash
# Start-up calibration on a GPU (oscarkv.calibrate.default): a model without an artifact, served with --kv oscar.
#
#   1. the start-up tests, GPU-marked included: streamed one decoder layer at a time on the GPU, the same artifact
#      as the whole-model calibration on that device; calibrated once, cached, reused; serve/generate/LLM on the
#      tiny model (which then runs on the GPU);
#   2. one real start-up: `oscarkv generate --kv oscar` of the default model saved as a transformers directory
#      (to the artifact lookup another model: the shipped artifact is for `--model default` only) with a fresh
#      --cache-dir, twice: the first start calibrates (streamed on the GPU, the model in bfloat16), the second
#      reuses the cache; wall times and the start-up lines on stdout, JSON.
#
# Usage (repository root, a CUDA torch):  bash lab/scripts/gpu_startup_calibration.sh [PYTHON]
# Writes pytest.log, startup.json, generate_{1,2}.log under $OUT (default runs/gpu_startup).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${1:-python}"
OUT="${OUT:-runs/gpu_startup}"
mkdir -p "$OUT"
status=0

"$PY" -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/calibrate/test_startup.py tests/calibrate/test_stream.py \
    tests/cli/test_serve.py tests/cli/test_generate.py 2>&1 | tee "$OUT/pytest.log" || status=1

MODEL_DIR="$OUT/default-model"
CACHE="$OUT/cache"
rm -rf "$CACHE" "$OUT/times.txt"
"$PY" - "$MODEL_DIR" <<'PYEOF' || status=1
"""The default model as a transformers directory (what `--model DIR` loads: no shipped artifact for it)."""
import sys
from oscarkv.models.loader import load_model
loaded = load_model("default")
loaded.model.save_pretrained(sys.argv[1]); loaded.tokenizer.save_pretrained(sys.argv[1])
PYEOF
for run in 1 2; do
    start=$(date +%s%N)
    "$PY" -m oscarkv.cli generate --model "$MODEL_DIR" --kv oscar --cache-dir "$CACHE" --prompt "Name three colours." \
        --max-tokens 16 > "$OUT/generate_$run.log" 2>&1 || status=1
    echo "$run $(( ($(date +%s%N) - start) / 1000000 ))" >> "$OUT/times.txt"  # milliseconds
done
"$PY" - "$OUT" <<'PYEOF' || status=1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
times = dict(line.split() for line in (out / "times.txt").read_text().splitlines())
logs = {r: (out / f"generate_{r}.log").read_text() for r in times}
rows = {r: {"seconds": int(t) / 1000, "calibrated": "calibrating once" in logs[r],
            "reused": "the cached artifact" in logs[r]} for r, t in times.items()}
print("start  wall s  calibrated  reused cache")
for r, row in rows.items():
    print(f"{r:>5}  {row['seconds']:6.1f}  {row['calibrated']!s:>10}  {row['reused']!s:>12}")
for r in logs:
    print(f"--- start {r} (OSCAR lines)")
    print("\n".join(line for line in logs[r].splitlines() if "OSCAR rotations" in line))
(out / "startup.json").write_text(json.dumps(rows, indent=2))
PYEOF
exit $status
