# Sourced by the multi-step GPU scripts (gpu_tp_full.sh, gpu_wave3_x4.sh): every step timed out inside one budget.
# Needs BUDGET, START (date +%s) and W (the work folder, where each step's log and steps.txt go); MARGIN (s kept
# back from the budget and given to a step's kill after SIGUSR1) and MIN_STEP (a step with less is skipped).
MARGIN=${MARGIN:-15}; MIN_STEP=${MIN_STEP:-40}
left() { echo $((BUDGET - ($(date +%s) - START))); }
# step NAME CAP GPUS CMD...: CMD on GPUS with timeout min(CAP, what is left - MARGIN); its output in $W/NAME.log
step() { local name=$1 cap=$2 gpus=$3; shift 3; local l; l=$(left); local t=$(( cap < l - MARGIN ? cap : l - MARGIN ))
  if [ "$t" -lt "$MIN_STEP" ]; then echo "== $name: skipped (${l}s left)" | tee -a "$W/steps.txt"; return; fi
  local s; s=$(date +%s)
  CUDA_VISIBLE_DEVICES=$gpus timeout -s USR1 -k "$MARGIN" "$t" "$@" > "$W/$name.log" 2>&1
  echo "== $name: exit $? in $(( $(date +%s) - s ))s (cap ${t}s, GPUs $gpus, at $(( $(date +%s) - START ))s)" | tee -a "$W/steps.txt"; }
