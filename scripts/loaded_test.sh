#!/usr/bin/env bash
# The test suite on a loaded machine: every test must pass however slow the machine is.
#
#   bash scripts/loaded_test.sh [pytest args...]     (default: the whole suite, -q)
#
# While pytest runs, a CPU hog keeps one core busy: `stress-ng --cpu 1` when installed
# (installed with apt-get when missing and running as root), else a Python busy loop. The hog is bounded
# twice: it is given a time limit (GYM_LOADED_HOG_S, default 3600 s) and it is stopped
# as soon as pytest ends. Prints how long the loaded run took and pytest's exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

HOG_S="${GYM_LOADED_HOG_S:-3600}"
if ! command -v stress-ng >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [ "$(id -u)" -eq 0 ]; then
    echo "loaded_test: installing stress-ng with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null 2>&1 \
        || echo "loaded_test: apt-get failed; using a Python busy loop" >&2
fi
if command -v stress-ng >/dev/null 2>&1; then
    stress-ng --cpu 1 --timeout "${HOG_S}s" --quiet &
    hog_kind="stress-ng --cpu 1 --timeout ${HOG_S}s"
else
    python3 -c '
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
' "$HOG_S" &
    hog_kind="python busy loop (${HOG_S}s limit)"
fi
hog=$!
stop_hog() { kill "$hog" 2>/dev/null || true; wait "$hog" 2>/dev/null || true; }
trap stop_hog EXIT

echo "== loaded run: $(nproc) cores, hog: $hog_kind (pid $hog)"
start=$(date +%s)
set +e
if [ "$#" -eq 0 ]; then set -- -q; fi
# pytest in the background so that Ctrl-C, SIGTERM or SIGHUP sent to this script is
# passed on at once (bash runs a trap only once its foreground child has exited), as
# SIGTERM: pytest then tears its fixtures down (tests/conftest.py) before the hog is
# stopped. (A background job starts with SIGINT ignored, so Ctrl-C goes through here.)
uv run --frozen pytest "$@" &
pytest_pid=$!
trap 'kill -TERM "$pytest_pid" 2>/dev/null' INT TERM HUP
while :; do
    wait "$pytest_pid"
    status=$?
    kill -0 "$pytest_pid" 2>/dev/null || break  # else `wait` returned early for a trap
done
set -e
elapsed=$(( $(date +%s) - start ))
stop_hog
printf '== loaded run took %dm%02ds (pytest exit %d, load average now: %s)\n' \
    $((elapsed / 60)) $((elapsed % 60)) "$status" "$(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
