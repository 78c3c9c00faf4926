#!/usr/bin/env bash
# The project's test command (README command 2): lint, format check, types, tests.
# Works from a fresh clone: it bootstraps uv and the environment itself.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"

echo "== ruff check" && uv run --frozen ruff check semconv agent sidecar demo tests testkit bench deploy scripts examples
echo "== ruff format --check" && uv run --frozen ruff format --check semconv agent sidecar demo tests testkit bench deploy scripts examples
echo "== mypy --strict" && uv run --frozen mypy
echo "== pytest" && uv run --frozen pytest "$@"
