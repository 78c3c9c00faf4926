#!/usr/bin/env bash
# Make sure uv exists and the workspace environment (.venv) matches uv.lock.
# Needs only Python 3.11+ and pip on the machine; everything else is installed here.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1; then
    echo "bootstrap: uv not found, installing it with pip (user site)" >&2
    python3 -m pip install --user --quiet uv
    export PATH="$HOME/.local/bin:$PATH"
fi
uv sync --frozen --quiet
