"""``gym-sidecar ui`` as a process: what it prints, loopback by default, bad arguments."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from gym_sidecar.webui.command import DEFAULT_LISTEN


def _ui(*args: str) -> list[str]:
    return [sys.executable, "-m", "gym_sidecar.cli", "ui", *args]


def test_it_prints_its_url_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        _ui("--listen", "127.0.0.1:0", "--store-dir", str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"web view: (http://127\.0\.0\.1:\d+)/\n", line)
        assert match, line
        # no store yet: a clear page, not an error
        try:
            urllib.request.urlopen(match.group(1) + "/rollouts", timeout=30)
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and "No local store at" in exc.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_loopback_by_default() -> None:
    assert DEFAULT_LISTEN.startswith("127.0.0.1:")


def test_bad_arguments_exit_2() -> None:
    for args in (
        ("--jaeger-url", "javascript:alert(1)"),
        ("--listen", "nowhere"),
        ("--settle-s", "-1"),
    ):
        result = subprocess.run(_ui(*args), capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.strip(), args
