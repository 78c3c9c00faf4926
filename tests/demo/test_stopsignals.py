"""``gym_telemetry_demo.stopsignals`` and ``procs``: a stop signal stops the children.

In process (the handler is installed in pytest's main thread and removed again): the
first signal raises ``Stopped``, later ones are noted; ``deferred`` holds one back to the
end of its block. As programs: a small program built like the demo (children spawned in
their own groups, a grandchild in one of them, a ``finally`` that stops them) is sent
SIGTERM, SIGHUP or SIGINT and must stop every one and die by the signal; a child whose
parent is SIGKILLed gets SIGTERM from the kernel (Linux); ``stop_process`` kills what
ignores SIGTERM once the grace period is over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from gym_telemetry_demo import procs
from gym_telemetry_demo.procs import spawn, stop_process
from gym_telemetry_demo.stopsignals import Stopped, deferred, received, stop_on_signals

from testkit.wait import wait_for
from tests.support.proctree import marked_env, marked_processes

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, prctl")

#: A child that starts a grandchild in its group, prints the grandchild's pid, waits.
#: With IGNORE, the grandchild ignores SIGTERM.
CHILD = """
import subprocess, sys, time
grand = subprocess.Popen([sys.executable, "-c", {grand!r}], stdout=subprocess.PIPE)
assert grand.stdout is not None and grand.stdout.readline() == b"ready\\n"
print(grand.pid, flush=True)
time.sleep(600)
"""
GRAND = "import signal, time\n{ignore}print('ready', flush=True)\ntime.sleep(600)\n"
IGNORE = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"

#: Built like the demo: children kept as they start, stopped in a finally; a stop
#: signal raises Stopped; the exit code 128+N becomes death by N.
PROGRAM = """
import subprocess, sys, time
from gym_telemetry_demo.procs import spawn, stop_processes
from gym_telemetry_demo.stopsignals import Stopped, exit_with, stop_on_signals

def main() -> int:
    children = []
    with stop_on_signals():
        try:
            for _ in range(2):
                child = spawn([sys.executable, "-c", {child!r}], stdout=subprocess.PIPE)
                children.append(child)
                print(child.pid, child.stdout.readline().decode().strip(), flush=True)
            print("up", flush=True)
            while True:
                time.sleep(3600)
        except Stopped as stop:
            print("stopped by", stop, flush=True)
            return stop.exit_code
        finally:
            print("exit codes", stop_processes(children, 30), flush=True)

exit_with(main())
"""


def _child(ignore: bool = False) -> str:
    return CHILD.format(grand=GRAND.format(ignore=IGNORE if ignore else ""))


class Program:
    """``PROGRAM`` (or ``source``) run with a marker; its stdout lines, read as they come."""

    def __init__(self, source: str) -> None:
        env, self.marker = marked_env(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, text: str) -> None:
        assert wait_for(lambda: text in self.lines, timeout_s=120, describe=lambda: self.lines)

    def pids(self) -> list[int]:
        return [int(p) for line in self.lines if line[:1].isdigit() for p in line.split()]

    def finish(self) -> int:
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        return code

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
        for p in marked_processes(self.marker).values():
            os.kill(p.pid, signal.SIGKILL)


@linux
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name
)
def test_a_stop_signal_stops_every_child_then_kills_the_program(sig: signal.Signals) -> None:
    program = Program(PROGRAM.format(child=_child()))
    try:
        program.wait_line("up")
        before = marked_processes(program.marker)
        assert set(program.pids()) < set(before)  # 2 children, 2 grandchildren, and it
        program.proc.send_signal(sig)  # to the program alone, as `kill` does
        assert program.finish() == -sig
        assert f"stopped by {sig.name}" in program.lines
        assert "exit codes [-15, -15]" in program.lines  # each child by SIGTERM
        # stop_processes returned only once each group was empty: nothing is left
        assert [p.pid for p in before.values() if p.running()] == []
        assert marked_processes(program.marker) == {}
    finally:
        program.cleanup()


#: Built like ``python -m bench``: a step run with run_passing_signals, under run_main.
ORCHESTRATOR = """
import sys
from gym_telemetry_demo.procs import run_passing_signals
from gym_telemetry_demo.stopsignals import run_main

def main() -> int:
    done = run_passing_signals([sys.executable, "-c", {step!r}], grace_s=60)
    print("step exit", done.returncode, flush=True)
    return 0

run_main(main)
"""


@linux
def test_a_stop_signal_is_passed_on_to_the_running_step() -> None:
    """SIGTERM to the orchestrator alone: its step stops its own children, then both
    die by the signal (``subprocess.run`` would SIGKILL the step and orphan them)."""
    program = Program(ORCHESTRATOR.format(step=PROGRAM.format(child=_child())))
    try:
        program.wait_line("up")
        before = marked_processes(program.marker)
        assert len(before) == 6  # orchestrator, step, 2 children, 2 grandchildren
        program.proc.send_signal(signal.SIGTERM)
        assert program.finish() == -signal.SIGTERM
        assert "stopped by SIGTERM" in program.lines  # the step's own handler
        assert "exit codes [-15, -15]" in program.lines
        assert "step exit -15" not in program.lines  # the orchestrator did not carry on
        assert [p.cmdline for p in before.values() if p.running()] == []
    finally:
        program.cleanup()


@linux
def test_a_child_gets_sigterm_when_its_parent_is_killed() -> None:
    """What no handler can catch (SIGKILL, a crash): PR_SET_PDEATHSIG (Linux only)."""
    source = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from gym_telemetry_demo.procs import spawn
        child = spawn([sys.executable, "-c", {GRAND.format(ignore="")!r}],
                      stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline() == b"ready\\n"
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )
    program = Program(source)
    try:
        assert wait_for(program.pids, timeout_s=120, describe=lambda: program.lines)
        [pid] = program.pids()
        child = marked_processes(program.marker)[pid]
        assert child.running()
        program.proc.kill()
        assert program.finish() == -signal.SIGKILL
        assert wait_for(lambda: not child.running(), timeout_s=60)
    finally:
        program.cleanup()


@linux
def test_what_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    env, marker = marked_env(os.environ)
    child = spawn([sys.executable, "-c", _child(ignore=True)], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        tree = marked_processes(marker)
        assert {child.pid, grandchild} <= set(tree)
        # the child dies by SIGTERM; its grandchild, which ignores it, gets SIGKILL once
        # the grace period is over: stop_process returns only when the group is empty
        assert stop_process(child, grace_s=2) == -signal.SIGTERM
        assert not tree[grandchild].running()
        assert stop_process(child, grace_s=2) == -signal.SIGTERM  # safe twice
    finally:
        for p in marked_processes(marker).values():
            os.kill(p.pid, signal.SIGKILL)


def test_a_child_that_leads_no_group_is_signalled_alone(tmp_path: Path) -> None:
    child = spawn([sys.executable, "-c", "import time; time.sleep(600)"], new_session=False)
    assert os.getpgid(child.pid) == os.getpgrp()  # ours: a group signal would reach us
    assert stop_process(child, grace_s=30) == -signal.SIGTERM


def test_die_with_parent_is_set_from_the_main_thread_only() -> None:
    """The kernel signals the child when the thread that forked it ends: from a worker
    thread, that would be long before the parent dies."""
    if procs._SETPRIV is None:
        pytest.skip("no setpriv: not Linux, or util-linux's setpriv is not installed")
    assert procs._die_with_parent_prefix() == [procs._SETPRIV, "--pdeathsig", "TERM", "--"]
    found: list[object] = []
    worker = threading.Thread(target=lambda: found.append(procs._die_with_parent_prefix()))
    worker.start()
    worker.join()
    assert found == [[]]


def test_a_missing_program_raises_as_popen_does(tmp_path: Path) -> None:
    """``setpriv`` in front must not turn a missing program into an exit status."""
    with pytest.raises(FileNotFoundError):
        spawn([str(tmp_path / "no-such-program")])
    with pytest.raises(FileNotFoundError):
        spawn(["no-such-program-anywhere"], env={"PATH": str(tmp_path)})


def test_a_signal_while_a_child_starts_stops_that_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal lands between the fork and ``spawn`` returning: the caller would never
    hold the child, so ``spawn`` stops it before raising."""
    real_popen = subprocess.Popen
    started: list[subprocess.Popen[bytes]] = []

    def popen_then_signal(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = real_popen(*args, **kwargs)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGTERM)  # the real child runs; the signal is held
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    with stop_on_signals(), pytest.raises(Stopped):
        spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    monkeypatch.undo()
    [child] = started
    assert child.returncode == -signal.SIGTERM  # stopped and reaped before Stopped


def test_first_signal_raises_stopped_and_later_ones_are_noted() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    with stop_on_signals():
        with pytest.raises(Stopped) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
        assert stopped.value.signo == signal.SIGTERM and stopped.value.exit_code == 143
        assert isinstance(stopped.value, KeyboardInterrupt)  # Ctrl-C's handling applies
        os.kill(os.getpid(), signal.SIGHUP)  # while stopping: noted, nothing raised
        os.kill(os.getpid(), signal.SIGINT)
        assert received() == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == previous  # put back


def test_deferred_holds_a_signal_back_to_the_end_of_its_block() -> None:
    reached_end = False
    with stop_on_signals():
        with pytest.raises(Stopped) as stopped, deferred():
            os.kill(os.getpid(), signal.SIGHUP)
            with deferred():  # nested: the outer block's end raises
                pass
            reached_end = True
        assert reached_end and stopped.value.signo == signal.SIGHUP
    # a block already leaving with an error keeps its error
    with stop_on_signals():
        with pytest.raises(ValueError), deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            raise ValueError("the block's own error")
        assert received() == signal.SIGTERM


@pytest.mark.parametrize(("code", "returncode"), [(143, -15), (129, -1), (130, -2), (3, 3)])
def test_exit_with_turns_128_plus_a_stop_signal_into_death_by_it(
    code: int, returncode: int
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gym_telemetry_demo.stopsignals import exit_with\n"
            f"sys.stdout.write('flushed'); exit_with({code})",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == returncode
    assert done.stdout == "flushed"  # a death by signal flushes nothing by itself
