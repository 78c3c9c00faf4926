#!/usr/bin/env bash
# README command 1: the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"
# `exec` the environment's python itself (bootstrap.sh synced it): this script's pid
# becomes the demo's, so SIGTERM and SIGHUP sent to it (a process manager, `timeout`, a
# closed terminal) reach the demo, which stops everything it started, and a terminal's
# Ctrl-C reaches it once (`uv run` in between would forward a second copy, and its own
# death would leave the demo without a parent). The demo needs this source tree
# (examples/gym_stack, scripts/gym_env.py): say which.
exec "${UV_PROJECT_ENVIRONMENT:-.venv}/bin/python" -m gym_telemetry_demo --repo "$PWD" "$@"
