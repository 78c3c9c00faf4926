"""A real Docker engine for the tests: installed, started and stopped by the tooling.

The API (also meant for other suites, e.g. a Docker sandbox provider's tests)::

    engine = ensure_engine()          # or the ``docker_engine`` fixture (tests/deploy)
    engine.docker("ps", "-a")         # the docker CLI against this engine
    engine.compose(["-f", "docker-compose.yml", "up", "-d"], cwd=REPO)
    engine.env                        # DOCKER_HOST / DOCKER_CONFIG for own subprocesses
    engine.release()                  # stops the daemon only if the tooling started it

What :func:`ensure_engine` does, in order, each step once per machine and cached:

1. ``docker`` (the client) and ``dockerd``: when ``dockerd`` is absent and we are root,
   ``apt-get install docker.io`` (Debian's engine, 20.10 on bookworm; the apt lock is
   waited for, as everyone on the machine uses apt).
2. A daemon: when one already answers on ``/var/run/docker.sock`` it is used as it is and
   never stopped. Otherwise ``dockerd`` is started by hand with its own data root
   (``<cache>/docker/data``, so images and build cache survive between runs), exec root
   (``/run/gym-telemetry-docker``), pid file and log (``<cache>/docker/dockerd.log``),
   listening on the default socket (the compose file's ``docker-socket.yaml`` mounts
   that path). A marker file records that the tooling started it.
3. Compose v2: a ``docker compose`` that already answers ``v2`` is used; else the
   plugin from :mod:`scripts.compose_build` (built once from the Go module proxy) is
   installed under a ``DOCKER_CONFIG`` the tooling owns (``<cache>/docker/config``), so
   the user's own ``~/.docker`` is never written.

Sharing: every user of the engine holds a shared lock on ``<cache>/docker/users.lock``
while it uses it; :meth:`Engine.release` stops a daemon the tooling started only when it
can take that lock exclusively (no other test process of this machine still uses it).
A daemon the tooling did not start is never signalled.

When the engine cannot start, :class:`EngineUnavailable` carries the daemon's own error
(the tail of its log); :func:`skip_or_fail` turns it into a failure on CI (``CI=true``)
and a skip with that reason elsewhere.

Timings of every first-run step go to stderr as ``docker_daemon: ... in N s``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
SOCKET = Path("/var/run/docker.sock")
EXEC_ROOT = Path("/run/gym-telemetry-docker")
START_TIMEOUT_S = 180.0
APT_TIMEOUT_S = 1800


class EngineUnavailable(RuntimeError):
    """No Docker engine could be used; the message says why (the daemon's own words)."""


def log(msg: str) -> None:
    print(f"docker_daemon: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """``~/.cache/gym-telemetry/docker`` (or under ``$GYM_TELEMETRY_CACHE``)."""
    default = Path.home() / ".cache" / "gym-telemetry"
    return Path(os.environ.get("GYM_TELEMETRY_CACHE", default)).expanduser() / "docker"


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _docker_client() -> str | None:
    return shutil.which("docker")


def install_engine() -> None:
    """``apt-get install docker.io`` when ``dockerd`` is missing (root only)."""
    if shutil.which("dockerd") and _docker_client():
        return
    if os.geteuid() != 0:
        raise EngineUnavailable("dockerd is not installed and installing docker.io needs root")
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=900"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    started = time.monotonic()
    log("installing Debian's docker.io (once per machine)")
    cmd = [*apt, "install", "-y", "--no-install-recommends", "docker.io"]
    if subprocess.run(cmd, env=env, stdout=2, timeout=APT_TIMEOUT_S, check=False).returncode:
        subprocess.run([*apt, "update"], env=env, stdout=2, timeout=APT_TIMEOUT_S, check=False)
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False
        )
        if done.returncode:
            raise EngineUnavailable(f"apt-get install docker.io failed: {done.stderr[-2000:]}")
    log(f"docker.io installed in {time.monotonic() - started:.0f} s")
    if not (shutil.which("dockerd") and _docker_client()):
        raise EngineUnavailable("docker.io installed but dockerd/docker are not on PATH")


def _answers(env: Mapping[str, str]) -> str | None:
    """The server version when a daemon answers on the socket, else None."""
    client = _docker_client()
    if client is None:
        return None
    try:
        out = subprocess.run(
            [client, "version", "--format", "{{.Server.Version}}"],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a dockerd this process started and that exited is reaped
    here (else it would linger as a zombie, which ``kill(pid, 0)`` still finds)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: started by another test process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Engine:
    """A usable Docker engine: its client environment and whether the tooling owns it."""

    env: dict[str, str]
    server_version: str
    compose_plugin: Path | None
    started_here: bool
    _users: IO[str] | None = field(default=None, repr=False)

    # -- running the CLI -------------------------------------------------------------
    def docker(
        self,
        *args: str,
        timeout_s: float = 600,
        check: bool = True,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker ARGS`` against this engine; raise with its stderr when ``check``."""
        client = _docker_client()
        assert client is not None
        result = subprocess.run(
            [client, *args],
            env={**self.env, **(env or {})},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, result.args, result.stdout, result.stderr
            )
        return result

    def compose(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        timeout_s: float = 1800,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker compose ARGS`` in ``cwd``."""
        return self.docker("compose", *args, timeout_s=timeout_s, check=check, cwd=cwd, env=env)

    def image_exists(self, ref: str) -> bool:
        return self.docker("image", "inspect", ref, check=False, timeout_s=60).returncode == 0

    def inspect(self, ref: str) -> dict[str, object]:
        doc: list[dict[str, object]] = json.loads(self.docker("inspect", ref, timeout_s=60).stdout)
        return doc[0]

    # -- lifecycle ---------------------------------------------------------------------
    def release(self) -> None:
        """Stop using the engine; stop the daemon if the tooling started it and no other
        user of this machine holds it. A daemon the tooling did not start is left alone."""
        if self._users is None:
            return
        users, self._users = self._users, None
        marker = cache_dir() / "started-by-tooling"
        try:
            fcntl.flock(users, fcntl.LOCK_UN)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log("daemon left running: another test process still uses it")
                return
            try:
                pid = int(marker.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return  # not started by the tooling: never touched
            _stop_daemon(pid)
            marker.unlink(missing_ok=True)
        finally:
            users.close()


def _is_our_dockerd(pid: int) -> bool:
    """Whether ``pid`` is a dockerd with the tooling's exec root (a stale marker's pid may
    have been reused by anything else: that is never signalled)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and argv[0].endswith(b"dockerd") and str(EXEC_ROOT).encode() in argv


def _stop_daemon(pid: int) -> None:
    if not _pid_alive(pid) or not _is_our_dockerd(pid):
        return
    log(f"stopping dockerd (pid {pid}) that the tooling started")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.2)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _daemon_error(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no daemon log)"
    errors = [ln for ln in lines if "level=error" in ln or "level=fatal" in ln or "failed" in ln]
    return "\n".join((errors or lines)[-8:])


def _start_daemon(state: Path, env: Mapping[str, str]) -> None:
    """Start dockerd on the default socket with the tooling's own roots, pid file and log."""
    if os.geteuid() != 0:
        raise EngineUnavailable("no Docker daemon answers and starting dockerd needs root")
    data_root = state / "data"
    data_root.mkdir(parents=True, exist_ok=True)
    EXEC_ROOT.mkdir(parents=True, exist_ok=True)
    log_path = state / "dockerd.log"
    pid_file = EXEC_ROOT / "dockerd.pid"
    cmd = [
        shutil.which("dockerd") or "dockerd",
        "--data-root",
        str(data_root),
        "--exec-root",
        str(EXEC_ROOT),
        "--pidfile",
        str(pid_file),
        "--host",
        f"unix://{SOCKET}",
    ]
    started = time.monotonic()
    log("$ " + " ".join(cmd))
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the test process's own signals
        )  # fmt: skip
    (state / "started-by-tooling").write_text(f"{proc.pid}\n")
    deadline = started + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            (state / "started-by-tooling").unlink(missing_ok=True)
            raise EngineUnavailable(
                f"dockerd exited with {proc.returncode}: {_daemon_error(log_path)}"
            )
        if _answers(env):
            log(f"dockerd (pid {proc.pid}) answers after {time.monotonic() - started:.1f} s")
            return
        time.sleep(0.5)
    _stop_daemon(proc.pid)
    (state / "started-by-tooling").unlink(missing_ok=True)
    raise EngineUnavailable(
        f"dockerd did not answer within {START_TIMEOUT_S:.0f} s: {_daemon_error(log_path)}"
    )


def _compose_v2(env: Mapping[str, str]) -> bool:
    client = _docker_client()
    assert client is not None
    out = subprocess.run(
        [client, "compose", "version", "--short"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return out.returncode == 0 and out.stdout.strip().lstrip("v").startswith("2.")


def _install_compose(state: Path, env: dict[str, str]) -> Path | None:
    """Use a working ``docker compose`` v2, else install the built plugin; return it."""
    if _compose_v2(env):
        return None
    sys.path.insert(0, str(REPO / "scripts"))
    import compose_build

    binary = compose_build.ensure()
    config = state / "config"
    plugins = config / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    target = plugins / "docker-compose"
    if not target.exists() or target.resolve() != binary.resolve():
        target.unlink(missing_ok=True)
        target.symlink_to(binary)
    env["DOCKER_CONFIG"] = str(config)
    if not _compose_v2(env):
        raise EngineUnavailable(f"the Compose plugin {binary} does not answer `docker compose`")
    return target


def ensure_engine() -> Engine:
    """Install, start or reuse a Docker engine and Compose v2; see the module docstring.

    Blocks for the first-run steps (minutes); later calls take seconds. Raises
    :class:`EngineUnavailable` with the reason when no engine can be used.
    """
    state = cache_dir()
    state.mkdir(parents=True, exist_ok=True)
    install_engine()
    env = {k: v for k, v in os.environ.items() if k not in {"DOCKER_HOST", "DOCKER_CONTEXT"}}
    env["DOCKER_HOST"] = f"unix://{SOCKET}"
    if "DOCKER_CONFIG" not in os.environ:
        env["DOCKER_CONFIG"] = str(state / "config")
        (state / "config").mkdir(parents=True, exist_ok=True)
    users = (state / "users.lock").open("a+")
    with (state / "engine.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            version = _answers(env)
            if version is None:
                _start_daemon(state, env)
                version = _answers(env) or "?"
            fcntl.flock(users, fcntl.LOCK_SH)
        except BaseException:
            users.close()
            raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    marker = state / "started-by-tooling"
    try:
        started_here = _is_our_dockerd(int(marker.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        started_here = False
    try:
        plugin = _install_compose(state, env)
    except BaseException:
        Engine(env, version, None, started_here, users).release()
        raise
    return Engine(env, version, plugin, started_here, users)


def skip_or_fail(exc: EngineUnavailable) -> None:
    """On CI a missing engine fails the test (with the daemon's error); elsewhere it skips."""
    import pytest

    if on_ci():
        pytest.fail(f"Docker engine unavailable on CI: {exc}", pytrace=False)
    pytest.skip(f"Docker engine unavailable: {exc}")


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.docker_daemon up|down``: start for manual use / stop."""
    import argparse

    parser = argparse.ArgumentParser(description="the tests' Docker engine")
    parser.add_argument("command", choices=["up", "down"])
    args = parser.parse_args(argv)
    if args.command == "up":
        engine = ensure_engine()
        print(f"export DOCKER_HOST={engine.env['DOCKER_HOST']}")
        print(f"export DOCKER_CONFIG={engine.env['DOCKER_CONFIG']}")
        return 0
    marker = cache_dir() / "started-by-tooling"
    if marker.exists():
        _stop_daemon(int(marker.read_text().split()[0]))
        marker.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
