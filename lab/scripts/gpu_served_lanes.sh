#!/usr/bin/env bash
# The default model served on one GPU, three lanes at once (the model is small: each lane is host-bound), <= 540 s:
#   fallback  8K single needle, 40 samples per haystack (80 a cell): the unquantized cache, 27 layers of 4-bit keys
#             with a 128-token window (3.75 BPE), 4-bit keys and values everywhere (k4v4_r64) and K4V2+win:
#             which is the cheapest recipe that keeps >= 95% of the unquantized cache at 8K (issue 26's fallback)
#   multi     the shipped recipe's multi-needle mean at 4K, then at 8K (three tasks, 20 per haystack each); MULTI_SEED,
#             MULTI_HAYSTACKS, MULTI_SAMPLES (default SEED, HAYSTACKS, SAMPLES) set its needles apart from fallback's
#   multieval the evaluation (EVAL_SET multi or single) of EVAL_RECIPES (NAME=FILE,...) at EVAL_CONTEXTS, one process each
#   gate      spec once per "|"-separated entry of GATE_ARGS (each a SPEC_ARGS), in turn
#   spec      lab/scripts/gpu_spec.sh part2 (speculative decoding on the default model; verify-step cost)
#   spectests spec, then the GPU tests of speculation;  gputests  those tests alone
#   rq        --resume-questions' answers on development needles (lab/scripts/resume_questions_ab.py): RQ_SAMPLES
#             (default 160) single needles at 4K and 8K, then RQ_MULTI (default 80) multi-key needles at 4K
#   rqcold    rq's single needles, each request cold (--no-prefix-caching)
#   text      free-running text after development documents per KV configuration (below)
#   textpar   text, one process per configuration, results straight into $OUT
#   timing    spec, then bench followup --prefill-chunk 512 (follow-up turns as served): run it as the only lane
# FALLBACK_RECIPES (NAME=FILE,...) and FALLBACK_CONFIGS (default k4v2) set the fallback lane.
# The GGUF travels in parts (lab/scripts/pack_default_model.sh): each of .spec_model/a, a2 carried by a call of its own
# and copied to /tmp/oscarkv_spec_model (`bash lab/scripts/gpu_served_lanes.sh keep`), then, on the same warm machine,
# a call carrying .spec_model/b runs the lanes (`bash lab/scripts/gpu_served_lanes.sh run [LANE ...]`, default all three).
# MULTI_CONTEXTS (default "4096 8192") and MULTI_RECIPES (NAME=FILE,...; default the shipped recipe) set the multi lane.
# Out ($OUT): lanes.tgz (every result and log), summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=/tmp/oscarkv_spec_model
if [ "${1:-run}" = keep ]; then mkdir -p "$MODEL_DIR" && cp .spec_model/a*/* "$MODEL_DIR/" && ls -la "$MODEL_DIR"; exit; fi
W=$(mktemp -d /tmp/lanes.XXXX); OUT=${OUT:-/tmp/served_lanes}; mkdir -p "$OUT"
source lab/scripts/gpu_model_env.sh
R=lab/scripts/twobit_recipe_8192
fallback() { OUT=$W/fallback SAMPLES=${FALLBACK_SAMPLES:-40} CONFIGS=${FALLBACK_CONFIGS-k4v2} \
  RECIPES=${FALLBACK_RECIPES:-b3.7=${R}_b3.7.json,k4v4_r64=${R}_k4v4_r64.json} \
  timeout "$T" bash lab/scripts/gpu_twobit.sh eval 8192 single > "$W/fallback.log" 2>&1; }
multi() { for c in ${MULTI_CONTEXTS:-4096 8192}; do OUT=$W/multi CONFIGS= RECIPES=${MULTI_RECIPES:-shipped=oscarkv/data/default_recipe.json} \
  SEED=${MULTI_SEED:-${SEED:-0}} HAYSTACKS=${MULTI_HAYSTACKS:-${HAYSTACKS:-eval,gazetteer}} SAMPLES=${MULTI_SAMPLES:-${SAMPLES:-20}} \
  timeout $(( T - ($(date +%s) - START) )) bash lab/scripts/gpu_twobit.sh eval $c multi > "$W/multi_$c.log" 2>&1; done; }
# multieval: the evaluation (seed 0, eval + gazetteer; EVAL_SET multi or single) of EVAL_RECIPES at each of EVAL_CONTEXTS,
# all at once; EVAL_SAMPLES per haystack (default 20)
multieval() { local c; for c in ${EVAL_CONTEXTS:-4096 8192}; do OUT=$W/multieval CONFIGS= RECIPES=$EVAL_RECIPES SEED=0 \
  HAYSTACKS=eval,gazetteer SAMPLES=${EVAL_SAMPLES:-20} timeout "$T" bash lab/scripts/gpu_twobit.sh eval $c ${EVAL_SET:-multi} \
  > "$W/multieval_$c.log" 2>&1 & done; wait; }
T=${LANE_TIMEOUT:-520}  # each lane's limit, seconds (the call's must exceed it: the results are packed after)
spec() { OUT=$W/spec timeout "$T" bash lab/scripts/gpu_spec.sh part2 > "$W/spec.log" 2>&1; }
# gate: spec once per entry of GATE_ARGS ("|"-separated SPEC_ARGS), one after the other, into $W/gate_N (run it alone),
# each table copied to $OUT/gate_N.md as it ends (a call cut short keeps those; a cold machine's first run compiles)
gate() { local i=0 a; IFS='|' read -ra GA <<< "$GATE_ARGS"; for a in "${GA[@]}"; do i=$((i + 1)); SPEC_ARGS="$a" OUT=$W/gate_$i \
  timeout $(( T - ($(date +%s) - START) )) bash lab/scripts/gpu_spec.sh part2 > "$W/gate_$i.log" 2>&1
  cp "$W/gate_$i/spec.md" "$OUT/gate_$i.md" 2>/dev/null; done; }
# spectests: spec, then the GPU tests of speculation and extend graphs in what is left of the lane's time
spectests() { spec; local l=$(( T - ($(date +%s) - START) )); [ "$l" -gt 20 ] && timeout "$l" python3 -m pytest -q \
  -p no:cacheprovider -m gpu -rA tests/engine/test_speculative_gpu.py tests/engine/test_extend_graphs_gpu.py > "$W/gpu_tests.log" 2>&1; }
# gputests: the GPU tests of speculation and extend graphs alone (beside evaluation lanes: no timing in them)
gputests() { timeout "$T" python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/engine/test_speculative_gpu.py \
  tests/engine/test_extend_graphs_gpu.py > "$W/gpu_tests.log" 2>&1; }
# timing: speculation (spec), then follow-up turns as a server chunks them (--prefill-chunk 512: the cached prompt
# half a chunk past a multiple, so the follow-up recomputes that partial chunk), one after the other and alone
timing() { spec; mkdir -p "$W/followup"; timeout $(( T - ($(date +%s) - START) )) python3 -m oscarkv.cli bench followup \
  --shapes qwen3-4b --contexts 32768,102400 --new-tokens 1,8,64,512 --methods bf16,oscar --kv-gib 24 \
  --prefill-chunk 512 --out "$W/followup/followup_served.json" > "$W/followup.log" 2>&1; }
rq() { mkdir -p "$W/rq"; timeout "$T" $PY -m lab.scripts.resume_questions_ab --model "$MODEL" --contexts 4096,8192 \
    --samples "${RQ_SAMPLES:-160}" --out "$W/rq/single" > "$W/rq.log" 2>&1
  timeout $(( T - ($(date +%s) - START) )) $PY -m lab.scripts.resume_questions_ab --model "$MODEL" --contexts 4096 \
    --samples "${RQ_MULTI:-80}" --tasks niah_multikey --out "$W/rq/multi" >> "$W/rq.log" 2>&1; }
# rqcold: rq's single needles with prefix caching off (each request cold; the split made all the same)
rqcold() { mkdir -p "$W/rq"; timeout "$T" $PY -m lab.scripts.resume_questions_ab --model "$MODEL" --contexts 4096,8192 \
    --samples "${RQ_SAMPLES:-160}" --no-prefix-caching --out "$W/rq/cold" > "$W/rq.log" 2>&1; }
# text: free-running text after development documents (lab.scripts.free_text_quality) at TEXT_TOKENS (default 4096 6144),
# TEXT_CONFIGS (default bf16, the shipped recipe, it with sinks of 16 and 64, uniform INT2 + windows)
text() { mkdir -p "$W/text"; for n in ${TEXT_TOKENS:-4096 6144}; do timeout $(( T - ($(date +%s) - START) )) $PY -m \
  lab.scripts.free_text_quality --model "$MODEL" --tokens "$n" --gazetteers "${TEXT_GAZ:-12}" --prose "${TEXT_PROSE:-4}" \
  --configs "${TEXT_CONFIGS:-bf16,shipped,shipped+sink16,shipped+sink64,int2+win}" --out "$W/text/t$n" >> "$W/text.log" 2>&1; done; }
# textpar: text's documents, one process per configuration of TEXT_CONFIGS (NAME or NAME=FILE), all at once, each
# writing into $OUT/textpar/tN/NAME as it goes (a lane cut short keeps what it wrote); TEXT_MAX (default 64) tokens,
# TEXT_FIRST the first gazetteer's development seed (default 1; fresh documents: past 36, the twenty-fifth session's)
textpar() { local c n; mkdir -p "$OUT/textpar"; for c in ${TEXT_CONFIGS//,/ }; do ( for n in ${TEXT_TOKENS:-4096}; do
  timeout -k 5 $(( T - ($(date +%s) - START) )) $PY -m lab.scripts.free_text_quality --model "$MODEL" --tokens "$n" \
  --gazetteers "${TEXT_GAZ:-12}" --first-gazetteer "${TEXT_FIRST:-1}" --prose "${TEXT_PROSE:-4}" --max-tokens "${TEXT_MAX:-64}" --kv-gib 8 --configs "$c" \
  --out "$OUT/textpar/t$n/${c%%=*}" >> "$OUT/textpar/${c%%=*}.log" 2>&1; done ) & done; wait
  tar czf "$OUT/textpar.tgz" -C "$OUT" textpar; }  # NOTE: nested folders and "+" in names do not come back from a device
START=$(date +%s)
shift; for lane in ${*:-fallback multi spec}; do $lane & done; wait
{ nvidia-smi --query-gpu=name --format=csv,noheader; for f in "$W"/*/eval_*/results.md "$W"/spec/spec.md "$W"/gate_*/spec.md; do
    echo "== $f"; cat "$f"; done; echo "== followup"; grep '^|' "$W/followup.log" 2>/dev/null
  echo "== rq"; grep '^{' "$W/rq.log" 2>/dev/null; echo "== text"; grep ': n ' "$W/text.log" 2>/dev/null
  echo "== tails"; tail -n 3 "$W"/*.log; } > "$OUT/summary.txt" 2>&1
find "$W" -name "*.safetensors" -delete
tar -czf "$OUT/lanes.tgz" -C /tmp "$(basename "$W")"
cat "$OUT/summary.txt"; echo "== done in $(( $(date +%s) - START ))s"
