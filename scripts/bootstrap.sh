#!/usr/bin/env bash
# Make sure uv exists and the workspace environment (.venv) matches uv.lock.
# Needs only Python 3.11+ and pip on the machine; everything else is installed here.
# Sourced by test.sh and demo.sh (so the PATH below reaches them) or run on its own.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Where uv goes when it is missing. `pip install --target` works where `--user` does not:
# a distribution's "externally managed" Python (Debian, Ubuntu: PEP 668) and an active
# virtualenv.
UV_BOOTSTRAP_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/gym-telemetry/uv"
export PATH="$UV_BOOTSTRAP_DIR/bin:$HOME/.local/bin:$PATH"
if ! command -v uv >/dev/null 2>&1; then
    echo "bootstrap: uv not found, installing it with pip into $UV_BOOTSTRAP_DIR" >&2
    python3 -m pip install --quiet --disable-pip-version-check --target "$UV_BOOTSTRAP_DIR" uv
fi
# uv sync is exact: it removes what the default groups do not name. A caller that has more
# installed says which groups to keep: make test keeps the native scanner
# (GYM_TELEMETRY_SYNC_ARGS="--group native"), so the demo it runs mid-suite does not strip it
# from .venv under the tests that start sidecars after it.
# shellcheck disable=SC2086
uv sync --frozen --quiet ${GYM_TELEMETRY_SYNC_ARGS:-}
