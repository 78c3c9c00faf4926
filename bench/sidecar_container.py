"""The sidecar image as a benchmark target: ``docker run`` of it, measured like a process.

A collector for :func:`bench.sidecar_vs_rotel.runs.run` (and ``bench.sidecar_memory
--container IMAGE``): the image's own entrypoint, ``gym-sidecar run --backend SINK``
with nothing else configured (the same defaults as the host process it is compared
with), on the host's network namespace (``--network host``), so it listens on free
loopback ports and reaches the benchmark's sink on loopback, with no Docker proxy or
NAT between the load and the sidecar. Its main process is a process of this machine:
its CPU and memory are read from ``/proc/<pid>`` exactly as a host process's are.

The ``docker`` CLI is used as the environment says (``DOCKER_HOST``; ``python -m
tests.support.docker_daemon up`` prints the tests' engine's).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from gym_telemetry_demo.ports import free_port

from bench.sidecar_vs_rotel.procs import status_mib

READY_TIMEOUT_S = 180.0


def docker(*args: str, timeout_s: float = 300) -> str:
    client = shutil.which("docker")
    if client is None:
        raise RuntimeError("the docker CLI is not on PATH")
    done = subprocess.run(
        [client, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode:
        raise RuntimeError(f"docker {' '.join(args[:2])} exited {done.returncode}: {done.stderr}")
    return done.stdout


class ContainerSidecar:
    """``docker run IMAGE run --backend SINK`` (see the module docstring)."""

    def __init__(
        self,
        image: str,
        sink_endpoint: str,
        env: dict[str, str],
        workdir: Path,
        name: str = "container",
    ) -> None:
        self.image, self.env = image, env
        self.sink_endpoint = sink_endpoint if "://" in sink_endpoint else f"http://{sink_endpoint}"
        self.name = name
        self.workdir = workdir
        self.grpc_port, self.http_port, self.admin_port = free_port(), free_port(), free_port()
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.http_target: str | None = f"http://127.0.0.1:{self.http_port}"
        self.pid: int | None = None
        self.container: str | None = None
        self.idle_mib: float | None = None
        self.startup_mib: float | None = None
        self.scanner: str | None = None

    def _admin(self, path: str) -> str | None:
        try:
            url = f"http://127.0.0.1:{self.admin_port}{path}"
            with urllib.request.urlopen(url, timeout=5) as resp:
                return str(resp.read().decode())
        except OSError:
            return None

    def start(self) -> None:
        env = {
            "GYM_SIDECAR_GRPC_LISTEN": self.grpc_target,
            "GYM_SIDECAR_HTTP_LISTEN": self.http_target.removeprefix("http://")
            if self.http_target
            else "",
            "GYM_SIDECAR_ADMIN_LISTEN": f"127.0.0.1:{self.admin_port}",
            **self.env,
        }
        flags = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
        self.container = docker(
            "run", "--detach", "--rm", "--network", "host", *flags, self.image,
            "run", "--backend", self.sink_endpoint, "--log-level", "warning",
        ).strip()  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._admin("/readyz") is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.image} not ready: {docker('logs', self.container)}")
            time.sleep(0.2)
        state = json.loads(docker("inspect", "--format", "{{json .State}}", self.container))
        self.pid = int(state["Pid"])
        for _ in range(50):  # a scrape can time out on a busy machine: try again
            metrics = self._admin("/metrics") or ""
            self.scanner = next(
                (
                    line.split('scanner="', 1)[1].split('"', 1)[0]
                    for line in metrics.splitlines()
                    if line.startswith("gym_sidecar_trace_scanner_info{")
                ),
                None,
            )
            if self.scanner is not None:
                break
            time.sleep(0.2)
        time.sleep(2.0)
        self.idle_mib = status_mib(self.pid, "VmRSS")
        self.startup_mib = status_mib(self.pid, "VmHWM")
        with open(f"/proc/{self.pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # from here VmHWM is the peak under load

    def stop(self) -> None:
        if self.container is not None:
            subprocess.run(
                [shutil.which("docker") or "docker", "stop", "--time", "30", self.container],
                capture_output=True,
                timeout=120,
                check=False,
            )
            self.container = None
