"""Stopping a child server process and reading the end of its log.

Shared by the demo's Jaeger runner (:mod:`gym_telemetry_demo.jaeger`) and the test suite's
Prometheus runner (``tests/support/prometheus.py``), which start their servers the same way:
output to a log file, stopped with SIGTERM and a grace period.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


def log_tail(path: Path, chars: int = 4000) -> str:
    """The last ``chars`` characters of the log at ``path`` ("" if it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float) -> int | None:
    """Stop ``proc``: SIGTERM, then SIGKILL if it has not exited within ``grace_s`` seconds.

    Returns its exit code, or None when there is no process (never started)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode
