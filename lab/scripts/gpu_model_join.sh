#!/usr/bin/env bash
# Joins the default model's GGUF on the GPU machine: the parts earlier calls kept in /tmp/oscarkv_spec_model
# (`bash lab/scripts/gpu_served_lanes.sh keep`, one call per carried .spec_model/a*) and the last part this call
# carries (.spec_model/b), in part order, checked against the packed checksum (lab/scripts/pack_default_model.sh).
#   bash lab/scripts/gpu_model_join.sh OUT.gguf
set -uo pipefail
OUT_GGUF="${1:?output path}"
MODEL_DIR=/tmp/oscarkv_spec_model
parts=$(for f in "$MODEL_DIR"/model.part* .spec_model/b/model.part*; do [ -f "$f" ] && echo "$(basename "$f") $f"; done \
        | sort -V | cut -d' ' -f2)
cat $parts > "$OUT_GGUF" || exit 1
[ "$(sha256sum "$OUT_GGUF" | cut -d' ' -f1)" = "$(cat .spec_model/b/model.sha256)" ] || {
    echo "GGUF checksum mismatch (parts: $(echo $parts)): keep every .spec_model/a* first"; exit 1; }
