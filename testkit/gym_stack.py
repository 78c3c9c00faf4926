"""Real NeMo Gym servers as processes.

:mod:`gym_telemetry_demo.gym_servers` starts Gym servers the way Gym's launcher does (it
moved there from this module so that ``make demo`` uses the same code as the real-Gym
tests); this module keeps the names the tests and the benchmarks import.
:func:`gym_env_start` runs Gym's official launcher itself, ``gym-telemetry-run gym env
start``, for the tests that go through it (``test_gym_env_start``, ``test_gym_semantics``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from gym_telemetry_demo.gym_servers import (
    AGENT,
    EXAMPLE_TASK,
    FAILING_AGENT,
    FAILING_RESOURCES,
    MODEL,
    RESOURCES,
    SERVERS,
    GymProcess,
    examples_dir,
    load_configs,
    post_json,
    repo_root,
    run_body,
    server_location,
    site_packages,
    telemetry_env,
)
from gym_telemetry_demo.gym_servers import GymServers as GymStack
from gym_telemetry_demo.ports import free_port, wait_listening

REPO = repo_root(Path(__file__).resolve().parents[1])
EXAMPLES = examples_dir(REPO)
CONFIGS = EXAMPLES / "configs"


class GymStackError(RuntimeError):
    """The Gym servers did not come up (the launcher's log tail is in the message)."""


def launcher_config(
    config: dict[str, Any], servers: Iterable[str], work_dir: Path, env_root: Path
) -> tuple[Path, dict[str, int]]:
    """Write ``config`` as ``work_dir/stack.yaml`` for ``gym env start``, offline.

    The head server and each of ``servers`` get a free loopback port; each server's
    ``<uv_venv_dir>/<type>/<name>/.venv`` is a symlink to the cached Gym environment
    ``env_root``, and ``skip_venv_if_present`` makes the launcher use it as is. Returns
    the config's path and server name -> port. ``config`` is changed in place.
    """
    venvs = work_dir / "venvs"
    config["head_server"]["port"] = free_port()
    ports: dict[str, int] = {}
    for name in servers:
        first, second, block = server_location(config, name)
        block["port"] = ports[name] = free_port()
        venv = venvs / first / second
        venv.mkdir(parents=True, exist_ok=True)
        if not (venv / ".venv").exists():
            (venv / ".venv").symlink_to(env_root, target_is_directory=True)
    config["skip_venv_if_present"] = True
    config["uv_venv_dir"] = str(venvs)
    config_path = work_dir / "stack.yaml"
    config_path.write_text(yaml.safe_dump(config))
    return config_path, ports


def launcher_env(grpc_endpoint: str, admin_url: str) -> dict[str, str]:
    """This process's environment for the launcher, pointed at a sidecar (``per_rollout``)."""
    env = {k: v for k, v in os.environ.items() if k != "GYM_TELEMETRY"}
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": grpc_endpoint,
            "GYM_TELEMETRY_SPAN_GROUPS": "per_rollout",
            "GYM_TELEMETRY_SIDECAR_ADMIN_URL": admin_url,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "NEMO_GYM_EXTRA_ROOTS": str(EXAMPLES),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    return env


@dataclass
class Launched:
    """A running ``gym env start``: its process, log, ports and (once stopped) exit code."""

    process: subprocess.Popen[bytes]
    log_path: Path
    ports: dict[str, int]
    exit_code: int | None = None

    def url(self, server: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[server]}{path}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _reap_group(pgid: int) -> None:
    """Kill what Ray left behind in the launcher's own process group (its agents)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(2)


#: Ray's own start-up limit (30 s, fixed in Ray) can pass on a loaded machine; the launcher
#: then exits with this message before any Gym server starts, and is started again.
RAY_START_TIMEOUT: Final = "The current node timed out during startup"
#: How many times a launch that failed in Ray's start-up is tried.
LAUNCH_ATTEMPTS: Final = 5


def _start_launcher(
    env_root: Path, config_path: Path, env: Mapping[str, str], work_dir: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [
                str(env_root / "bin" / "gym-telemetry-run"),
                str(env_root / "bin" / "gym"),
                "env",
                "start",
                f"+config_paths=[{config_path}]",
            ],
            cwd=work_dir,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_up(launched: Launched, deadline: float) -> str | None:
    """None once every port listens; else why not (the launcher exited, or the deadline)."""
    for port in launched.ports.values():
        while True:
            code = launched.process.poll()
            if code is not None:
                return f"gym env start exited with {code} before the servers were up"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "gym env start did not bring the servers up in time"
            try:
                wait_listening(port, timeout_s=min(5.0, remaining))
                break
            except TimeoutError:
                continue
    return None


@contextmanager
def gym_env_start(
    env_root: Path,
    config_path: Path,
    ports: Mapping[str, int],
    env: Mapping[str, str],
    work_dir: Path,
    *,
    up_timeout_s: float = 400,
    stop_timeout_s: float = 90,
) -> Iterator[Launched]:
    """Run ``gym-telemetry-run gym env start`` (which sets ``GYM_TELEMETRY=1``) in
    ``work_dir`` (hydra writes ``outputs/`` there) in its own session; yield once every
    port listens (the test fails with the log's tail if not, at once when the launcher
    exits first). A launch that failed in Ray's own start-up (``RAY_START_TIMEOUT``, a
    fixed 30 s in Ray that a loaded machine can miss) is tried again, up to
    ``LAUNCH_ATTEMPTS`` times. On exit: SIGTERM, as an operator would, SIGKILL after
    ``stop_timeout_s``, then whatever Ray left in the launcher's process group is killed;
    ``exit_code`` is set.
    """
    log_path = work_dir / "gym-env-start.log"
    for attempt in range(1, LAUNCH_ATTEMPTS + 1):
        process = _start_launcher(env_root, config_path, env, work_dir, log_path)
        launched = Launched(process, log_path, dict(ports))
        problem = _wait_up(launched, time.monotonic() + up_timeout_s)
        if problem is None:
            break
        _stop(launched, stop_timeout_s)
        if RAY_START_TIMEOUT in launched.log() and attempt < LAUNCH_ATTEMPTS:
            (work_dir / f"gym-env-start.attempt{attempt}.log").write_text(launched.log())
            continue
        raise GymStackError(f"{problem}:\n{launched.log()[-6000:]}")
    try:
        yield launched
    finally:
        _stop(launched, stop_timeout_s)


def _stop(launched: Launched, stop_timeout_s: float) -> None:
    process = launched.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        launched.exit_code = process.wait(timeout=stop_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        launched.exit_code = process.wait(timeout=10)
    _reap_group(process.pid)


__all__ = [
    "AGENT",
    "CONFIGS",
    "EXAMPLES",
    "EXAMPLE_TASK",
    "FAILING_AGENT",
    "FAILING_RESOURCES",
    "MODEL",
    "REPO",
    "RESOURCES",
    "SERVERS",
    "GymProcess",
    "GymStack",
    "Launched",
    "gym_env_start",
    "launcher_config",
    "launcher_env",
    "load_configs",
    "post_json",
    "run_body",
    "server_location",
    "site_packages",
    "telemetry_env",
]
