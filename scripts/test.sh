#!/usr/bin/env bash
# The project's test command (README command 2): lint, format check, types, tests.
# Works from a fresh clone: it bootstraps uv and the environment itself.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"

# The sidecar's native scanner (sidecar-native/, docs/native.md) is built from source with
# the machine's cargo (rustup) and crates.io, into a target directory under the cache: a
# warm run reuses uv's cached wheel and builds nothing. Its tests then run instead of
# skipping (GYM_TEST_NATIVE=required turns a missing module into an error).
export PATH="$PATH:${CARGO_HOME:-$HOME/.cargo}/bin"
export CARGO_TARGET_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/gym-telemetry/native/target"
if ! command -v cargo >/dev/null 2>&1; then
    echo "make test builds the native scanner with cargo: install Rust (rustup) first" >&2
    exit 1
fi
echo "== native scanner: cargo fmt --check, clippy, build"
(cd sidecar-native && cargo fmt --check && cargo clippy --locked --quiet -- -D warnings)
uv sync --frozen --quiet --group native
# Every later sync in this run (scripts/demo.sh sources bootstrap.sh) keeps it installed.
export GYM_TELEMETRY_SYNC_ARGS="--group native"
export GYM_TEST_NATIVE=required

echo "== ruff check" && uv run --frozen ruff check semconv agent sidecar sidecar-native demo tests testkit bench deploy scripts examples
echo "== ruff format --check" && uv run --frozen ruff format --check semconv agent sidecar sidecar-native demo tests testkit bench deploy scripts examples
echo "== mypy --strict" && uv run --frozen mypy
echo "== pytest"
# exec: SIGTERM and SIGHUP sent to this script reach pytest, which tears its fixtures down
# (tests/conftest.py); a shell waiting in between would die and leave pytest running.
exec uv run --frozen pytest "$@"
