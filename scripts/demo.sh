#!/usr/bin/env bash
# README command 1: the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"
# The demo needs this source tree (examples/gym_stack, scripts/gym_env.py): say which.
exec uv run --frozen python -m gym_telemetry_demo --repo "$PWD" "$@"
