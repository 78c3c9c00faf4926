r"""Child server processes: started in a process group of their own that dies with the
parent, stopped as a group with a grace period, and the end of their logs.

The one way the demo's launchers (:mod:`~gym_telemetry_demo.sidecar`,
:mod:`~gym_telemetry_demo.webview`, :mod:`~gym_telemetry_demo.gym_servers`,
:mod:`~gym_telemetry_demo.jaeger`), ``testkit`` and the test suite's Prometheus runner
start and stop a long-running child:

:func:`spawn`
    ``subprocess.Popen`` with two settings. The child leads a new session and process
    group (``new_session``, the default): a terminal's Ctrl-C reaches the parent alone,
    which then stops every child once and in order, and :func:`stop_process` can signal
    whatever the child started in turn (Ray workers, pip, ``go build``), which stays in
    its group. And on Linux the kernel sends the child SIGTERM when its parent dies
    without stopping it (``PR_SET_PDEATHSIG``; a SIGKILL, a crash): the safety net for
    what no signal handler can catch. It is set by util-linux's ``setpriv --pdeathsig
    TERM``, which the command is started through and which then execs it (same pid),
    rather than by a ``preexec_fn``: that makes Python ``fork()`` instead of ``vfork()``,
    which runs every library's fork handlers (gRPC's pause its threads) in a process
    full of threads. Without ``setpriv`` (not Linux, or not installed) children do not
    die with their parent. A stop signal that arrives while the child is being started
    (:func:`gym_telemetry_demo.stopsignals.deferred`) is raised once it is, and the
    child is stopped again before ``spawn`` lets it out: no child is started that its
    caller does not hold.

:func:`stop_process` / :func:`stop_processes`
    SIGTERM to the child's group (or the child alone when it does not lead one), a
    bounded grace period, then SIGKILL to the group; whatever else of the group is still
    running once the child has exited gets the rest of the grace period, then SIGKILL.

:func:`run_in_group`
    ``subprocess.run`` for a command that starts children of its own (a build).

:func:`run_passing_signals`
    ``subprocess.run`` for a step that stops its own children on a stop signal (a
    benchmark run by ``python -m bench``): the signal is passed on and the step waited for.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

from gym_telemetry_demo.stopsignals import Stopped, deferred

#: util-linux's ``setpriv`` (Linux), which sets ``PR_SET_PDEATHSIG`` and execs.
_SETPRIV: Final = shutil.which("setpriv") if sys.platform.startswith("linux") else None
#: After SIGKILL, how long to wait for the kernel to reap a child (s).
_KILL_WAIT_S: Final = 10.0
#: The grace period of a child stopped because a stop signal came while it started (s).
_SPAWN_STOP_GRACE_S: Final = 10.0


def _die_with_parent_prefix() -> list[str]:
    """``setpriv --pdeathsig TERM --``: the command then gets SIGTERM when this process
    dies. Empty off Linux, without ``setpriv``, and outside the main thread: the kernel
    ties the setting to the *thread* that forks, so a child forked by a worker thread
    would be signalled when that thread ends."""
    if _SETPRIV is None or threading.current_thread() is not threading.main_thread():
        return []
    return [_SETPRIV, "--pdeathsig", "TERM", "--"]


def _program(cmd: Sequence[str], env: Mapping[str, str] | None, cwd: str | Path | None) -> str:
    """``cmd[0]`` resolved as ``subprocess.Popen`` resolves it (``env``'s PATH); raises
    FileNotFoundError as Popen does, which ``setpriv`` in front would turn into an exit
    status."""
    name = cmd[0]
    if os.sep in name:
        path = Path(cwd or ".") / name
        if os.access(path, os.X_OK) and path.is_file():
            return name
    else:
        search = (env if env is not None else os.environ).get("PATH", os.defpath)
        found = shutil.which(name, path=search)
        if found is not None:
            return found
    raise FileNotFoundError(errno.ENOENT, f"No such file or directory: {name!r}", name)


def spawn(
    cmd: Sequence[str],
    *,
    stdout: IO[bytes] | int | None = None,
    stderr: IO[bytes] | int | None = subprocess.STDOUT,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    new_session: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` as a long-running child (see the module doc); binary pipes.

    ``new_session=False`` keeps the child in this process group (a terminal's Ctrl-C
    reaches it directly); it still dies with its parent on Linux.
    """
    prefix = _die_with_parent_prefix()
    argv = [*prefix, _program(cmd, env, cwd), *cmd[1:]] if prefix else list(cmd)
    proc: subprocess.Popen[bytes] | None = None
    try:
        with deferred():
            proc = subprocess.Popen(
                argv,
                stdout=stdout,
                stderr=stderr,
                env=None if env is None else dict(env),
                cwd=cwd,
                start_new_session=new_session,
            )
    except Stopped:
        # the signal came while it was being started, and is raised now: the caller
        # never gets this child, so it is stopped here
        stop_process(proc, _SPAWN_STOP_GRACE_S)
        raise
    return proc


def log_tail(path: Path, chars: int = 4000) -> str:
    """The last ``chars`` characters of the log at ``path`` ("" if it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _signal(pid: int, group: bool, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie (a zombie whose
    parent died waits for init to reap it, which a container's init may never do)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal is still a member
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # after the command's ")": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _group_outlives(pgid: int, deadline: float) -> bool:
    """Wait until group ``pgid`` is empty or ``deadline`` passes; whether it still has
    members. What a child started may outlive it (a worker that ignored SIGTERM). The
    group id stays reserved while any member is alive, so it cannot name someone else's."""
    while _group_alive(pgid):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


def stop_processes(
    procs: Sequence[subprocess.Popen[Any] | None], grace_s: float
) -> list[int | None]:
    """Stop every process of ``procs`` at once (see the module doc); their exit codes.

    Each running one gets SIGTERM (its whole group when it leads one) at the same time;
    all share one deadline ``grace_s`` from now, after which what is left gets SIGKILL.
    Blocks until every one has been reaped (at most ``grace_s`` plus the kill). Safe to
    call twice; None entries (never started) give None.
    """
    deadline = time.monotonic() + grace_s
    # Whether each leads its own group is read before it is reaped (returncode still
    # None): once reaped, its pid may name someone else's process.
    groups = [
        proc is not None and proc.returncode is None and _leads_group(proc.pid) for proc in procs
    ]
    for proc, group in zip(procs, groups, strict=True):
        if proc is not None and proc.poll() is None:
            _signal(proc.pid, group, signal.SIGTERM)
    for proc, group in zip(procs, groups, strict=True):
        if proc is None:
            continue
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(proc.pid, group, signal.SIGKILL)
            proc.wait(timeout=_KILL_WAIT_S)
        if group and _group_outlives(proc.pid, deadline):
            _signal(proc.pid, True, signal.SIGKILL)
            # SIGKILL is delivered asynchronously: return once the group is gone
            _group_outlives(proc.pid, time.monotonic() + _KILL_WAIT_S)
    return [None if proc is None else proc.returncode for proc in procs]


def stop_process(proc: subprocess.Popen[Any] | None, grace_s: float) -> int | None:
    """Stop ``proc`` (its group when it leads one): SIGTERM, then SIGKILL if it has not
    exited within ``grace_s`` seconds. Returns its exit code, None when there is no
    process (never started)."""
    return stop_processes([proc], grace_s)[0]


def run_in_group(
    cmd: Sequence[str], timeout_s: float, grace_s: float = 10.0
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)`` for a
    command that starts children of its own (a build): it runs in its own process group
    (:func:`spawn`), which is stopped as a whole (:func:`stop_process`) when the call
    ends by a timeout (``subprocess.TimeoutExpired`` is raised) or is interrupted (a
    stop signal); the plain ``run`` would kill the command alone and leave its children
    running. Output is decoded as UTF-8 with replacement."""
    proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        stop_process(proc, grace_s)
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    )


def run_passing_signals(
    cmd: Sequence[str], grace_s: float, *, capture: bool = False
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd)`` (``capture``: output captured as text) for a child that
    handles stop signals itself (it runs with
    :func:`gym_telemetry_demo.stopsignals.run_main`).

    The child stays in this process group, so a terminal's Ctrl-C reaches it directly.
    A stop signal received meanwhile (:class:`~gym_telemetry_demo.stopsignals.Stopped`,
    e.g. a SIGTERM sent to this process alone) is passed on to the child, which gets
    ``grace_s`` to stop its own children (then SIGKILL); then ``Stopped`` propagates.
    ``subprocess.run`` would SIGKILL the child at once and orphan what it started.
    """
    pipe = subprocess.PIPE if capture else None
    proc = spawn(cmd, stdout=pipe, stderr=pipe, new_session=False)
    try:
        out, err = proc.communicate()
    except Stopped as stop:
        # a second copy when the child got the signal too (Ctrl-C): it ignores repeats
        _signal(proc.pid, False, stop.signo)
        try:
            proc.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=_KILL_WAIT_S)
        raise
    return subprocess.CompletedProcess(
        proc.args,
        proc.returncode,
        None if out is None else out.decode(errors="replace"),
        None if err is None else err.decode(errors="replace"),
    )
