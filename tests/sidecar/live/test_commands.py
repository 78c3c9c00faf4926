"""The commands' own settings: ``gym-sidecar ui`` and ``gym-sidecar live`` read their
``GYM_SIDECAR_UI_*`` / ``GYM_SIDECAR_LIVE_*`` variables and do not take them for config
keys (which the loader refuses); without ``--admin-url``, the admin URL is the
configuration's ``admin_listen``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from gym_telemetry_demo.ports import free_port


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    return {**env, **extra}


def test_the_ui_reads_its_own_variables(tmp_path: Path) -> None:
    env = _env(
        GYM_SIDECAR_UI_LISTEN="127.0.0.1:0",
        GYM_SIDECAR_UI_ADMIN_URL="http://127.0.0.1:9",
        GYM_SIDECAR_UI_JAEGER_URL="http://jaeger.example:16686",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gym_sidecar.cli", "ui", "--store-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until it listens, or exits
        assert first.startswith("web view: http://127.0.0.1:"), proc.stderr.read()  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_live_defaults_to_the_configured_admin_listener() -> None:
    port = free_port()  # nothing listens there
    result = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "live"],
        capture_output=True,
        text=True,
        env=_env(GYM_SIDECAR_ADMIN_LISTEN=f"0.0.0.0:{port}"),
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert f"http://127.0.0.1:{port} is not reachable" in result.stdout


def test_live_refuses_a_bad_url_or_limit() -> None:
    for args in (["--admin-url", "ftp://x"], ["--limit", "0"], ["--watch", "-1"]):
        result = subprocess.run(
            [sys.executable, "-m", "gym_sidecar.cli", "live", *args],
            capture_output=True,
            text=True,
            env=_env(GYM_SIDECAR_LIVE_ADMIN_URL="http://127.0.0.1:9"),
            timeout=120,
            check=False,
        )
        assert result.returncode == 2, (args, result.stderr)
