"""``gym-telemetry-run``: its help says what it does and what it reads; it passes every
other argument, ``--help`` included, to the command it runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from gym_telemetry.autoinstrument import launcher


def test_help_says_what_it_does_and_which_variables_it_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert launcher.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gym-telemetry-run <command>")
    assert "auto-instrumentation" in out
    for name in (
        "GYM_TELEMETRY",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_SDK_DISABLED",
        "GYM_TELEMETRY_SPAN_GROUPS",
        "GYM_TELEMETRY_SIDECAR_ADMIN_URL",
        "GYM_TELEMETRY_SERVICE_PREFIX",
    ):
        assert f"\n  {name}" in out, name


def test_version_and_missing_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert launcher.main(["--version"]) == 0
    assert "gym-telemetry-agent 0." in capsys.readouterr().out
    assert launcher.main([]) == 2
    assert "usage:" in capsys.readouterr().err


def test_a_later_help_belongs_to_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gym_telemetry.autoinstrument.launcher", sys.executable,
         "-c", "import os, sys; print(os.environ['GYM_TELEMETRY'], sys.argv[1:])", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "GYM_TELEMETRY"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "1 ['--help']"
