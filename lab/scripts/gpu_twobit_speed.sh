#!/usr/bin/env bash
# Decode speed of the two-bit allocations (issue 26) at real shapes, one GPU, < 4 min: `oscarkv bench decode`
# (random weights, qwen3-8b, CUDA graphs, the engine's step) for BF16, OSCAR INT2+win and OSCAR with each
# allocation recipe (--layer-key-bits: the recipe's share of 4-bit-key layers spread over the 36 layers, its
# windows), with the codec's bits per element beside each row.
#
#   bash lab/scripts/gpu_twobit_speed.sh
#
# 1. batch 1 at 102400 tokens: bf16, oscar, the recipes (~100 s);
# 2. batch 8 at 102400 tokens: oscar and the recipes (BF16 does not fit one GPU there: 8 × 102400 tokens ×
#    144 KiB = 113 GiB), and at 32768 tokens, where it does, bf16 too (~120 s).
# Then one table (merged JSON rows): ms per step, tokens/s and tokens/s against BF16 at the same context and batch.
# Environment: OUT (default runs/gpu_twobit_speed), PY (python), RECIPES (comma-separated recipe JSONs or
# fractions; default the 8K development recipe within INT2's bytes and the 8K budget recipe of 3.5 BPE).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
PY="${PY:-python}"
OUT="${OUT:-runs/gpu_twobit_speed}"; mkdir -p "$OUT"
RECIPES="${RECIPES:-lab/scripts/twobit_recipe_cpu_8192_dev8k.json,lab/scripts/twobit_recipe_8192_b3.5.json}"
BENCH=("$PY" -m oscarkv.cli bench decode --shapes qwen3-8b --steps 16 --layer-key-bits "$RECIPES")
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 150 "${BENCH[@]}" --contexts 102400 --batch 1 --methods bf16,oscar --out "$OUT/b1.json" 2>&1 \
    | grep "^|\|bandwidth" || status=1
timeout 150 "${BENCH[@]}" --contexts 32768,102400 --batch 8 --methods oscar --kv-gib 40 --out "$OUT/b8.json" 2>&1 \
    | grep "^|\|bandwidth" || status=1
timeout 60 "$PY" -m oscarkv.cli bench decode --shapes qwen3-8b --steps 16 --contexts 32768 --batch 8 --methods bf16 \
    --kv-gib 40 --out "$OUT/b8_bf16.json" 2>&1 | grep "^|\|bandwidth" || status=1
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = [json.loads(f.read_text()) for f in sorted(out.glob("b*.json"))]
rows = [r for run in runs for r in run["rows"]]
bf16 = {(r["context"], r["batch"]): r["tokens_per_s"] for r in rows if r["method"] == "bf16"}
lines = [f"device: {runs[0]['device'] if runs else '?'}; qwen3-8b, random weights; bash lab/scripts/gpu_twobit_speed.sh",
         "| batch | context | kv | BPE | ms/step | tok/s | tok/s vs bf16 |", "|---:|---:|---|---:|---:|---:|---:|"]
for r in sorted(rows, key=lambda r: (r["batch"], r["context"], -r["bpe"])):
    ref = bf16.get((r["context"], r["batch"]))
    vs = f"{r['tokens_per_s'] / ref:.2f}x" if ref and r["method"] != "bf16" else ("—" if ref else "BF16 does not fit")
    lines.append(f"| {r['batch']} | {r['context']} | {r['method']} | {r['bpe']:.2f} | {r['step_us'] / 1e3:.2f} | "
                 f"{r['tokens_per_s']:.1f} | {vs} |")
print("\n".join(lines))
(out / "summary.md").write_text("\n".join(lines) + "\n")
(out / "summary.json").write_text(json.dumps({"device": runs[0]["device"] if runs else None, "rows": rows}, indent=1))
EOF
echo "gpu_twobit_speed: $([ $status = 0 ] && echo ok || echo FAILED) (JSON in $OUT)"
exit $status
