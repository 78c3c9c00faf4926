"""A real Prometheus (Debian's ``prometheus`` package) on a free loopback port, for tests.

:func:`prometheus_binary` returns ``/usr/bin/prometheus`` (or the one on PATH). When the
package is absent it installs it the way CI machines are provisioned: as root,
``apt-get update`` then ``apt-get install -y prometheus``, once per machine (a lock file
serialises parallel callers). Anything else (not root, no apt) fails with a message
saying what to install. The package may ship a service definition; nothing here relies
on it: each test runs its own process.

:class:`PrometheusServer` runs it with its own TSDB directory, the compose stack's
scrape config pointed at the given targets with a 1 s interval, and exemplar storage on
(``--enable-feature=exemplar-storage``, the flag's name in 2.42 and 3.x). Prometheus
asks its targets for the OpenMetrics exposition first, the only one that carries
exemplars. Queries go through its HTTP API: :meth:`PrometheusServer.query`,
:meth:`PrometheusServer.query_exemplars`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from gym_telemetry_demo.procs import log_tail, stop_process

from testkit.wait import wait_for
from tests.support.ports import free_port, wait_listening

REPO = Path(__file__).resolve().parents[2]
COMPOSE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
APT_TIMEOUT_S = 900
EXEMPLAR_FLAG = "--enable-feature=exemplar-storage"


def _peers_dir() -> Path:
    default = Path.home() / ".cache" / "gym-telemetry" / "peers"
    return Path(os.environ.get("GYM_TELEMETRY_PEERS_DIR", default)).expanduser()


def _installed() -> Path | None:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    return Path(found) if found else None


def prometheus_binary() -> Path:
    """The Prometheus server binary, installed from Debian's package when absent.

    Raises RuntimeError with what to do when it cannot be installed here."""
    found = _installed()
    if found is not None:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            "Prometheus is not installed and cannot be installed from here (needs root and "
            "apt-get): run `apt-get install -y prometheus` (Debian's package, 2.42 on "
            "bookworm) and re-run the tests"
        )
    lock_path = _peers_dir() / "prometheus-apt.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = _installed()  # another caller may have installed it meanwhile
            if found is None:
                _apt_install()
                found = _installed()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if found is None:
        raise RuntimeError("apt-get installed prometheus but no prometheus binary was found")
    return found


def _apt_install() -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    started = time.monotonic()
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "prometheus"]):
        result = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed ({result.returncode}); Prometheus is needed by "
                f"the backend tests:\n{(result.stdout + result.stderr)[-3000:]}"
            )
    print(f"installed Debian's prometheus in {time.monotonic() - started:.0f} s", flush=True)


def scrape_config(targets: Sequence[str], interval_s: int = 1) -> str:
    """The compose stack's Prometheus config (``deploy/prometheus/prometheus.yml``) with
    its scrape targets replaced by ``targets`` (host:port) and a short interval; its rule
    files are the repository's (``rule_files`` made absolute: the config is written
    elsewhere)."""
    config: dict[str, Any] = yaml.safe_load(COMPOSE_CONFIG.read_text())
    config["rule_files"] = [str(COMPOSE_CONFIG.parent / p) for p in config.get("rule_files", [])]
    config["global"].update(
        scrape_interval=f"{interval_s}s",
        scrape_timeout=f"{interval_s}s",
        evaluation_interval=f"{interval_s}s",
    )
    [job] = config["scrape_configs"]
    job["static_configs"] = [{"targets": list(targets)}]
    return yaml.safe_dump(config, sort_keys=False)


class PrometheusServer:
    """A Prometheus process scraping ``targets`` (context manager). ``start`` blocks until
    ``/-/ready`` answers 200; ``stop`` sends SIGTERM (kills after 30 s)."""

    def __init__(self, workdir: Path, targets: Sequence[str], binary: Path | None = None) -> None:
        self.binary = binary or prometheus_binary()
        self.workdir = workdir
        self.targets = list(targets)
        self.port = free_port()
        self.config_path = workdir / "prometheus.yml"
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.binary),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            EXEMPLAR_FLAG,
        ]

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(scrape_config(self.targets))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        try:
            wait_listening(self.port, timeout_s=timeout_s)
            if not wait_for(self._ready, timeout_s):
                raise TimeoutError("/-/ready did not answer 200")
        except (TimeoutError, OSError) as exc:
            self.stop()
            raise RuntimeError(
                f"Prometheus did not start ({exc}); log:\n{self.log_tail()}"
            ) from None
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise OSError(f"Prometheus exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=5) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a ``success`` answer (else ValueError)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise ValueError(f"{path} {params}: {exc.code} {exc.read()[:500]!r}") from None
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant PromQL query (``/api/v1/query``); its vector result."""
        data = self.api("query", query=promql)
        return list(data["result"])

    def query_exemplars(self, promql: str, window_s: float = 3600) -> list[dict[str, Any]]:
        """``/api/v1/query_exemplars`` over the last ``window_s`` seconds: one entry per
        series, each with its ``exemplars`` (labels such as ``trace_id``, value, time)."""
        now = time.time()
        data = self.api(
            "query_exemplars", query=promql, start=f"{now - window_s:.3f}", end=f"{now + 60:.3f}"
        )
        return list(data)

    def targets_health(self) -> list[str]:
        """The ``health`` of every active scrape target (``up``, ``down``, ``unknown``)."""
        return [t["health"] for t in self.api("targets")["activeTargets"]]

    def log_tail(self, chars: int = 4000) -> str:
        return log_tail(self.log_path, chars)

    def stop(self) -> int | None:
        return stop_process(self.proc, grace_s=30)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
