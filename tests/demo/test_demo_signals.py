"""``bash scripts/demo.sh --keep`` stopped by SIGTERM or SIGHUP, as by Ctrl-C.

A process manager, ``timeout`` or ``kill`` sends SIGTERM to the script's pid alone; a
closed terminal sends SIGHUP. Either must stop everything the demo started (the sidecar,
the web view, five Gym servers) before the demo exits, and then the demo dies by that
signal. Each case starts the real demo with a marker in its environment
(:mod:`tests.support.proctree`), waits until it is up (the line it prints), records
every process carrying the marker and the ports they listen on, signals the script's pid
only, and checks that the demo died by the signal after a clean stop, that no process
with the marker is left anywhere (orphans included) and that every port is free.

One more case signals the demo while it is still starting its children.
Needs the cached Gym environment (built on first use). Linux (``/proc``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.wait import wait_for
from tests.support.demo import REPO, demo_env
from tests.support.proctree import Proc, listening_ports, marked_env, marked_processes, port_free

pytestmark = [
    pytest.mark.gym,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

#: First run: the cached Gym environment may still have to be built (minutes).
UP_TIMEOUT_S = 2200


class Demo:
    """``bash scripts/demo.sh --keep`` with a small run, output to a file."""

    def __init__(self, tmp: Path) -> None:
        env, self.marker = marked_env(demo_env())
        self.log_path = tmp / "demo.out"
        cmd = [
            "bash",
            str(REPO / "scripts" / "demo.sh"),
            "--keep",
            "--rollouts",
            "2",
            "--failing",
            "1",
            "--concurrency",
            "2",
            "--store-dir",
            str(tmp / "store"),
            "--workdir",
            str(tmp / "work"),
        ]
        self.workdir = tmp / "work"
        with self.log_path.open("wb") as log:
            # a session of its own: only what the test sends reaches it
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    @property
    def out(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_line(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.out:
            assert self.proc.poll() is None, f"the demo exited:\n{self.out[-6000:]}"
            assert time.monotonic() < deadline, f"no {text!r} from the demo:\n{self.out[-6000:]}"
            time.sleep(0.5)

    def cleanup(self) -> None:
        """After a failed assertion: stop whatever is left (the test's own processes)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)
        for p in marked_processes(self.marker).values():
            os.kill(p.pid, signal.SIGKILL)


def _left(before: dict[int, Proc], marker: str) -> list[str]:
    """What still runs: processes seen before the signal, and any other with the marker."""
    left = {p.pid: p.cmdline for p in before.values() if p.running()}
    left.update({pid: p.cmdline for pid, p in marked_processes(marker).items()})
    return [f"{pid} {cmd}" for pid, cmd in sorted(left.items())]


def _stop_and_check(demo: Demo, sig: signal.Signals, before: dict[int, Proc]) -> None:
    ports = listening_ports(before)
    os.kill(demo.proc.pid, sig)  # the script's pid alone, as `timeout` or `kill` does
    code = demo.proc.wait(timeout=300)
    out = demo.out
    assert code == -sig, f"exit {code}\n{out[-6000:]}"  # died by the signal, after...
    assert f"stopped by {sig.name}." in out, out[-6000:]
    assert "stopped cleanly." in out, out[-6000:]  # ...the sidecar exited 0
    # Everything the demo started was stopped before it exited; the wait is only for the
    # kernel to finish reaping.
    assert wait_for(
        lambda: not _left(before, demo.marker),
        timeout_s=60,
        describe=lambda: _left(before, demo.marker),
    )
    assert [p for p in sorted(ports) if not port_free(p)] == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_keep_stops_everything_it_started_on(sig: signal.Signals, tmp_path: Path) -> None:
    demo = Demo(tmp_path)
    try:
        demo.wait_for_line("--keep:", UP_TIMEOUT_S)
        before = marked_processes(demo.marker)
        # bash exec'd the demo's python: the script's pid is the demo itself
        assert "gym_telemetry_demo" in before[demo.proc.pid].cmdline
        cmds = [p.cmdline for p in before.values()]
        assert sum("gym_sidecar.cli run" in c for c in cmds) == 1, cmds
        assert sum("gym_sidecar.cli ui" in c for c in cmds) == 1, cmds
        assert sum(c.endswith("app.py") for c in cmds) == 5, cmds
        ports = listening_ports(before)
        assert len(ports) >= 3 + 1 + 5, (ports, cmds)  # sidecar, web view, Gym servers
        _stop_and_check(demo, sig, before)
        # the Gym servers stopped gracefully (uvicorn's own shutdown ran), not killed
        gym_logs = sorted((demo.workdir / "gym").glob("*.log"))
        assert len(gym_logs) == 5
        for log in gym_logs:
            assert "Finished server process" in log.read_text(), log.name
    finally:
        demo.cleanup()


def test_sigterm_while_it_starts_its_children_stops_those_started(tmp_path: Path) -> None:
    demo = Demo(tmp_path)
    try:
        # the sidecar is up; the web view and the Gym servers are being started
        demo.wait_for_line("sidecar: OTLP gRPC", UP_TIMEOUT_S)
        before = marked_processes(demo.marker)
        assert sum("gym_sidecar.cli run" in p.cmdline for p in before.values()) == 1
        _stop_and_check(demo, signal.SIGTERM, before)
        assert "--keep:" not in demo.out
    finally:
        demo.cleanup()
