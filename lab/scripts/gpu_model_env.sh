# Sourced by the GPU scripts that serve the default model (gpu_served_lanes.sh, gpu_heads.sh): the GGUF from its
# carried parts (lab/scripts/pack_default_model.sh; the first ones copied to $MODEL_DIR by earlier calls on the same
# warm machine: `bash lab/scripts/gpu_served_lanes.sh keep`, one per .spec_model/a*; lab/scripts/gpu_model_join.sh),
# the gguf wheel, and MODEL, PY, PYTHONPATH for the lanes.
MODEL_DIR=/tmp/oscarkv_spec_model
mkdir -p /tmp/lanes_model; GGUF=/tmp/lanes_model/SmolLM2-135M-Instruct.Q4_1.gguf  # NOTE: the name makes it the default
# model; its own folder, as gpu_spec.sh part2 rewrites the one in $MODEL_DIR while the other lanes read theirs
bash lab/scripts/gpu_model_join.sh "$GGUF" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$MODEL_DIR"/gguf-*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site" MODEL="$GGUF" PY=python3 PYTHONUNBUFFERED=1
