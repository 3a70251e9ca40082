#!/usr/bin/env bash
# The per-head recipe within INT2+win's bytes (28 heads) on the 4K multi-needle tasks (three tasks, 20 per haystack
# each: 120 a cell), paired against the unquantized cache; after `bash lab/scripts/gpu_served_lanes.sh keep` on the
# same warm machine (carry .spec_model/b here). Out ($OUT): results.md, results.json, samples.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.."
source lab/scripts/gpu_model_env.sh
OUT=${OUT:-/tmp/heads_multi4k} SAMPLES=20 CONFIGS= RECIPES=h28=lab/scripts/twobit_recipe_8192_heads28.json \
  timeout 400 bash lab/scripts/gpu_twobit.sh eval 4096 multi 2>&1 | tail -25
find "${OUT:-/tmp/heads_multi4k}" -name "*.safetensors" -delete
