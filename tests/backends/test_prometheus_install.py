"""tests/support/prometheus.py's install path, without touching the machine: a missing
``prometheus`` is installed with apt as root, once; anything else is a clear error."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import prometheus


@pytest.fixture
def absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Prometheus absent until ``apt-get install`` runs; records the commands run."""
    monkeypatch.setenv("GYM_TELEMETRY_PEERS_DIR", str(tmp_path / "peers"))
    ran: list[list[str]] = []
    binary = tmp_path / "prometheus"
    monkeypatch.setattr(
        prometheus, "_installed", lambda: binary if ran[-1][:2] == ["apt-get", "install"] else None
    )
    monkeypatch.setattr(prometheus.shutil, "which", lambda name: f"/usr/bin/{name}")
    ran.append([])

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert kwargs["env"]["DEBIAN_FRONTEND"] == "noninteractive"
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(prometheus.subprocess, "run", fake_run)
    return ran


def test_installed_from_debian_as_root(
    absent: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus.os, "geteuid", lambda: 0)
    assert prometheus.prometheus_binary().name == "prometheus"
    assert absent[1:] == [["apt-get", "update"], ["apt-get", "install", "-y", "prometheus"]]


def test_not_root_says_what_to_install(
    absent: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus.os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="apt-get install -y prometheus"):
        prometheus.prometheus_binary()
    assert absent[1:] == []  # nothing was run


def test_a_failed_apt_step_is_named(
    absent: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        prometheus.subprocess,
        "run",
        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 100, "", "E: Unable to locate"),
    )
    with pytest.raises(RuntimeError, match=r"`apt-get update` failed \(100\)"):
        prometheus.prometheus_binary()
