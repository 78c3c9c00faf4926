#!/usr/bin/env bash
# README command 1: the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"
exec uv run --frozen python -m gym_sidecar.demo "$@"
