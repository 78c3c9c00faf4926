"""Real NeMo Gym servers as local processes, started the way Gym's launcher starts them.

:class:`GymServers` takes the YAML configs of ``examples/gym_stack/configs``, puts every
server on a free loopback port, resolves the whole config with Gym's own parser (run by
the Gym environment's python, as ``gym env start`` does) and starts the chosen servers
as ``<gym python> app.py`` in each server's directory with ``NEMO_GYM_CONFIG_DICT`` (the
resolved YAML), ``NEMO_GYM_CONFIG_PATH`` (the server's name) and the server directory
prepended to ``PYTHONPATH`` -- what Gym's ``run_command`` does.

Server directories resolve like Gym's launcher: ``examples/gym_stack`` first (the stub
model, the failing verifier), then the Gym install's ``site-packages``. Used by the demo
and by the real-Gym tests. It needs only the standard library and PyYAML here; Gym
itself runs in the other interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.procs import spawn, stop_processes

#: How long the Gym servers get to stop on SIGTERM before SIGKILL (s).
STOP_GRACE_S: Final = 15.0

EXAMPLE_TASK: Final[dict[str, Any]] = {
    "responses_create_params": {
        "input": [
            {"role": "developer", "content": "You are a helpful assistant."},
            {"role": "user", "content": "what's it like in sf?"},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "",
                "strict": True,
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "description": ""}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            }
        ],
    }
}
"""The body of one ``example_single_tool_call`` task (an agent ``/run`` request)."""

_RESOLVE: Final = """
import sys
from omegaconf import OmegaConf
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
cfg = OmegaConf.load(sys.argv[1])
parsed = GlobalConfigDictParser().parse(parse_config=GlobalConfigDictParserConfig(
    dotenv_path=None, initial_global_config_dict=cfg, skip_load_from_cli=True,
    skip_load_from_dotenv=True, offline=True))
sys.stdout.write(OmegaConf.to_yaml(parsed))
"""


#: The servers of ``stack.yaml`` + ``failing_verifier.yaml``: a policy model, a resources
#: server and its agent, and a resources server whose verifier fails with its agent.
MODEL: Final = "policy_model"
RESOURCES: Final = "example_single_tool_call"
AGENT: Final = "example_single_tool_call_simple_agent"
FAILING_RESOURCES: Final = "failing_weather"
FAILING_AGENT: Final = "failing_weather_simple_agent"
SERVERS: Final = (MODEL, RESOURCES, AGENT, FAILING_RESOURCES, FAILING_AGENT)

REPO_ENV: Final = "GYM_TELEMETRY_REPO"
"""Environment variable naming the source tree (``scripts/demo.sh`` sets it)."""


def is_repo(path: Path) -> bool:
    """Whether ``path`` is a gym-telemetry source tree (it holds ``examples/gym_stack``)."""
    return (path / "examples" / "gym_stack").is_dir() and (path / "scripts").is_dir()


def repo_root(explicit: Path | None = None) -> Path:
    """The source tree holding ``examples/gym_stack`` and ``scripts/gym_env.py``.

    ``explicit`` (the demo's ``--repo``) wins, then ``$GYM_TELEMETRY_REPO``, then the
    nearest directory at or above the current one that is a source tree. The demo is a
    workspace member used from a checkout, so no position of this file is assumed.
    Raises RuntimeError naming what was tried when none qualifies.
    """
    named = explicit or (Path(os.environ[REPO_ENV]) if os.environ.get(REPO_ENV) else None)
    if named is not None:
        if not is_repo(named):
            raise RuntimeError(
                f"{named} is not a gym-telemetry source tree (no examples/gym_stack)"
            )
        return named.resolve()
    cwd = Path.cwd().resolve()
    for candidate in (cwd, *cwd.parents):
        if is_repo(candidate):
            return candidate
    raise RuntimeError(
        f"no gym-telemetry source tree at or above {cwd}: pass --repo DIR or set {REPO_ENV}"
    )


def examples_dir(repo: Path | None = None) -> Path:
    return (repo or repo_root()) / "examples" / "gym_stack"


def site_packages(python: Path) -> Path:
    """The purelib directory of the interpreter ``python``."""
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def load_configs(*names: str, repo: Path | None = None) -> dict[str, Any]:
    """Merge ``examples/gym_stack/configs/<name>`` files (later ones win per top key)."""
    merged: dict[str, Any] = {}
    for name in names:
        merged.update(yaml.safe_load((examples_dir(repo) / "configs" / name).read_text()))
    return merged


def telemetry_env(otlp_endpoint: str, admin_url: str) -> dict[str, str]:
    """The environment that turns the agent on in each Gym server: spans to the sidecar's
    OTLP gRPC ``otlp_endpoint``, one trace per rollout, the sidecar's admin URL, and a
    short batch delay (200 ms) so that spans reach the sidecar soon after each request."""
    return {
        "GYM_TELEMETRY": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
        "GYM_TELEMETRY_SPAN_GROUPS": "per_rollout",
        "GYM_TELEMETRY_SIDECAR_ADMIN_URL": admin_url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


def server_location(config: dict[str, Any], name: str) -> tuple[str, str, dict[str, Any]]:
    """(server-type dir, server dir, server block) of top-level server ``name``."""
    first = next(iter(config[name]))
    second = next(iter(config[name][first]))
    return first, second, config[name][first][second]


@dataclass
class GymProcess:
    """One started Gym server."""

    name: str
    directory: Path
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class GymServers:
    """Start/stop a set of Gym servers (see the module doc). A context manager.

    ``start`` blocks until every server listens (or raises RuntimeError with the failing
    server's log tail, after stopping the others; interrupted, it stops them too);
    ``stop`` sends SIGTERM to every server's process group at once (each server runs in a
    session of its own and, on Linux, dies with its parent), waits up to
    :data:`STOP_GRACE_S`, then kills what is left. Both are safe to call twice.
    """

    python: Path
    config: dict[str, Any]
    start_names: list[str]
    env: dict[str, str]
    workdir: Path
    processes: dict[str, GymProcess] = field(default_factory=dict)
    resolved_yaml: str = ""
    repo: Path | None = None
    """The source tree whose ``examples/gym_stack`` servers win (None: :func:`repo_root`)."""
    server_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per server name, environment added after ``env`` (a sidecar of its own per server,
    as in a pod per server)."""

    def _assign_ports(self) -> None:
        self.config.setdefault("head_server", {})
        self.config["head_server"].update({"host": "127.0.0.1", "port": free_port()})
        for name in self.config:
            if name == "head_server" or not isinstance(self.config[name], dict):
                continue
            _first, _second, block = server_location(self.config, name)
            block["host"] = "127.0.0.1"
            block["port"] = free_port()

    def resolve(self) -> str:
        """Assign ports and resolve the config with Gym's parser; returns the YAML.

        Raises RuntimeError (with Gym's error output) when Gym refuses the config."""
        self._assign_ports()
        self.workdir = self.workdir.resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        raw = self.workdir / "config.yaml"
        raw.write_text(yaml.safe_dump(self.config))
        out = subprocess.run(
            [str(self.python), "-c", _RESOLVE, str(raw)],
            check=False,
            capture_output=True,
            text=True,
            cwd=self.workdir,
            timeout=120,
        )
        if out.returncode != 0:
            raise RuntimeError(f"Gym could not resolve {raw}:\n{out.stderr[-4000:]}")
        self.resolved_yaml = out.stdout
        return self.resolved_yaml

    def start(self, timeout_s: float = 90.0) -> GymServers:
        try:
            return self._start(timeout_s)
        except BaseException:
            self.stop()  # a server that failed, or a stop signal meanwhile: none is left
            raise

    def _start(self, timeout_s: float) -> GymServers:
        resolved = self.resolve()
        packages = site_packages(self.python)
        examples = examples_dir(self.repo)
        for name in self.start_names:
            first, second, block = server_location(self.config, name)
            directory = examples / first / second
            if not directory.is_dir():
                directory = packages / first / second
            entrypoint = str(block.get("entrypoint", "app.py"))
            env = dict(os.environ)
            env.update(self.env)
            env.update(self.server_env.get(name, {}))
            env["NEMO_GYM_CONFIG_DICT"] = resolved
            env["NEMO_GYM_CONFIG_PATH"] = name
            env["PYTHONPATH"] = ":".join(p for p in (str(directory), env.get("PYTHONPATH")) if p)
            process = GymProcess(name, directory, int(block["port"]), self.workdir / f"{name}.log")
            self.processes[name] = process  # before it starts: stop() finds it either way
            with process.log_path.open("wb") as log:
                process.proc = spawn(
                    [str(self.python), entrypoint], stdout=log, env=env, cwd=directory
                )
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            try:
                wait_listening(process.port, timeout_s=max(1.0, deadline - time.monotonic()))
            except TimeoutError:
                raise RuntimeError(
                    f"{process.name} did not start; log:\n{process.log_path.read_text()[-4000:]}"
                ) from None
        return self

    def stop(self) -> None:
        stop_processes([p.proc for p in self.processes.values()], STOP_GRACE_S)

    def __enter__(self) -> GymServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, name: str) -> str:
        return self.processes[name].url


def post_json(
    url: str,
    body: dict[str, Any],
    timeout_s: float = 60.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """POST ``body`` as JSON (plus ``headers``, e.g. a caller's ``traceparent``); return
    (status, parsed JSON or text). Raises OSError when the server cannot be reached."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def run_body(task_index: int, rollout_index: int, **extra: Any) -> dict[str, Any]:
    """An agent ``/run`` body for the example task (Gym rollout id ``<task>-<rollout>``)."""
    body: dict[str, Any] = json.loads(json.dumps(EXAMPLE_TASK))
    return {**body, "_ng_task_index": task_index, "_ng_rollout_index": rollout_index, **extra}
