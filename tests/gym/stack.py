"""Real NeMo Gym servers as processes.

:mod:`gym_telemetry_demo.gym_servers` starts Gym servers the way Gym's launcher does (it
moved there from this module so that ``make demo`` uses the same code as the real-Gym
tests); this module keeps the names the tests import. :func:`gym_env_start` runs Gym's
official launcher itself, ``gym-telemetry-run gym env start``, for the tests that go
through it (``test_gym_env_start``, ``test_gym_semantics``).
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
from typing import Any

import pytest
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

from tests.support.ports import free_port, wait_listening

REPO = repo_root(Path(__file__).resolve().parents[2])
EXAMPLES = examples_dir(REPO)
CONFIGS = EXAMPLES / "configs"


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
    port listens (the test fails with the log's tail if not). On exit: SIGTERM, as an
    operator would, SIGKILL after ``stop_timeout_s``, then whatever Ray left in the
    launcher's process group is killed; ``exit_code`` is set.
    """
    log_path = work_dir / "gym-env-start.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
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
    launched = Launched(process, log_path, dict(ports))
    try:
        try:
            for port in ports.values():
                wait_listening(port, timeout_s=up_timeout_s)
        except TimeoutError:
            pytest.fail(f"gym env start did not bring the servers up:\n{launched.log()[-6000:]}")
        yield launched
    finally:
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
