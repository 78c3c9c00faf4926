"""How the long-running ``gym-sidecar`` commands answer SIGHUP (SIGTERM: test_lifecycle).

``gym-sidecar run`` reloads on an operator's SIGHUP but stops, as on SIGTERM, when the
SIGHUP comes from its terminal closing; under ``nohup`` it survives the terminal and
reloads. Each case runs the sidecar as the session leader of a real pseudo-terminal
(``setsid --ctty``, util-linux), as a shell in a terminal window runs its foreground job's
session; closing the terminal's master side is what closing the window does: the kernel
hangs the terminal up and sends SIGHUP.

``gym-sidecar ui`` and ``gym-sidecar webhook`` have nothing to reload: SIGHUP stops them
cleanly (exit 0), as SIGTERM and SIGINT do.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.wait import wait_for
from tests.deploy.support import write_self_signed
from tests.support.ports import free_port, wait_listening

SETSID = shutil.which("setsid")
needs_pty = pytest.mark.skipif(
    SETSID is None or not sys.platform.startswith("linux"), reason="needs util-linux setsid"
)


class TerminalSidecar:
    """``gym-sidecar run`` as the session leader of a pseudo-terminal it controls."""

    def __init__(self, tmp: Path, *, nohup: bool = False) -> None:
        assert SETSID is not None
        self.log_path = tmp / "sidecar.log"
        self.admin_port = free_port()
        cmd = [
            SETSID,
            "--ctty",  # stdin (the terminal below) becomes its controlling terminal
            *(["nohup"] if nohup else []),
            sys.executable, "-m", "gym_sidecar.cli", "run",
            "--grpc-listen", f"127.0.0.1:{free_port()}",
            "--http-listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
            "--log-level", "info",
        ]  # fmt: skip
        self.master, slave = os.openpty()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
        env["XDG_DATA_HOME"] = str(tmp / "xdg")  # no backend: the local store, kept here
        try:
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    cmd, stdin=slave, stdout=log, stderr=subprocess.STDOUT, env=env
                )
        finally:
            os.close(slave)  # the child holds the terminal now
        wait_listening(self.admin_port, timeout_s=180)
        assert wait_for(lambda: "gym-sidecar ready" in self.log(), timeout_s=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close_terminal(self) -> None:
        """Close the master side: the terminal window goes away."""
        if self.master >= 0:
            os.close(self.master)
            self.master = -1

    def stop(self) -> None:
        self.close_terminal()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)


@pytest.fixture
def terminal_sidecar(tmp_path: Path) -> Iterator[TerminalSidecar]:
    sc = TerminalSidecar(tmp_path)
    try:
        yield sc
    finally:
        sc.stop()


@needs_pty
def test_run_reloads_on_sighup_and_stops_when_its_terminal_closes(
    terminal_sidecar: TerminalSidecar,
) -> None:
    sc = terminal_sidecar
    # an operator's SIGHUP, terminal still open: reload, keep serving
    sc.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "reload hook(s)" in sc.log(), timeout_s=60, describe=sc.log)
    assert sc.proc.poll() is None
    # the terminal closes: the kernel sends SIGHUP; a clean stop, as on SIGTERM
    sc.close_terminal()
    assert sc.proc.wait(timeout=120) == 0, sc.log()
    log = sc.log()
    assert "the controlling terminal is gone, shutting down" in log
    assert "gym-sidecar stopped" in log  # the whole shutdown sequence ran


@needs_pty
def test_run_under_nohup_outlives_its_terminal(tmp_path: Path) -> None:
    sc = TerminalSidecar(tmp_path, nohup=True)
    try:
        sc.close_terminal()
        # the hangup's SIGHUP is a reload under nohup; it keeps serving
        assert wait_for(lambda: "reload hook(s)" in sc.log(), timeout_s=60, describe=sc.log)
        assert sc.proc.poll() is None
        sc.proc.send_signal(signal.SIGTERM)
        assert sc.proc.wait(timeout=120) == 0, sc.log()
        assert "terminal is gone" not in sc.log()
    finally:
        sc.stop()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_ui_stops_cleanly_on(sig: signal.Signals, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gym_sidecar.cli", "ui", "--listen", "127.0.0.1:0",
         "--store-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"web view: http://127\.0\.0\.1:(\d+)/\n", line)
        assert match, line
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0  # before: SIGHUP killed it (-1), no clean stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


def test_webhook_stops_cleanly_on_sighup(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")  # the webhook extra
    cert, key = write_self_signed(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gym_sidecar.cli", "webhook",
         "--listen", f"127.0.0.1:{port}", "--cert", str(cert), "--key", str(key),
         "--kubernetes-version", "v1.29.4", "--image", "sidecar:test"],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_listening(port, timeout_s=60)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
