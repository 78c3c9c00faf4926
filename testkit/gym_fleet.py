"""Real Gym servers on NeMo Gym's *own* telemetry (``nemo_gym.telemetry`` on nemo-lens),
alone or mixed with this project's agent, through a real ``gym-sidecar run``.

The scenario of docs/nemo-gym.md ("Gym's own telemetry"): the stub model, the
``failing_weather`` resources server (the shipped ``example_single_tool_call`` whose
verifier raises on request) and ``simple_agent`` in front of it, started as Gym's
launcher starts them from the ``lens`` environment (``scripts/gym_env.py --recipe
lens``: Gym 0.7.0 and PyPI's nemo-lens 0.1.0 on Python 3.13) with the environment Gym's
own ``configure_telemetry_env`` writes for a ``telemetry: {enabled: true, span_groups:
per_rollout}`` block, plus the test-only Lens stand-in on ``PYTHONPATH``
(``testkit/lens_standin``). Servers named in ``agent_servers`` also get
``GYM_TELEMETRY=1``: this project's agent then runs in them beside Gym's live telemetry
(the mixed fleet). Their OTLP goes to one sidecar with default settings, except that it
forwards to a recording sink *and* keeps its local store (``--local-store``). N
rollouts, the last few with a verifier that raises, then everything is stopped and read
back: the sink's spans and metric requests, the store's ``rollouts`` listing and the
sidecar's own counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gym_telemetry_demo.sidecar import SidecarProcess

from testkit.gym_stack import (
    FAILING_AGENT,
    FAILING_RESOURCES,
    MODEL,
    REPO,
    GymStack,
    load_configs,
    post_json,
    run_body,
    telemetry_env,
)
from testkit.sink import RecordedSpan, RecordingSink
from testkit.wait import wait_for

LENS_STANDIN: Final = REPO / "testkit" / "lens_standin"
"""The test-only stand-in for what PyPI's nemo-lens 0.1.0 lacks (its module doc)."""
FLEET: Final = (MODEL, FAILING_RESOURCES, FAILING_AGENT)
"""The three servers of one rollout: model, resources server (failing on request), agent."""
ENV_BUILD_TIMEOUT_S: Final = 1800
METRIC_SETTLE_S: Final = 3.0
"""After the spans settle: three of Gym's 1 s metric export intervals."""
#: Environment variables Gym's own telemetry reads; cleared before its env is computed so
#: a developer's shell cannot leak in.
_GYM_ENV_PREFIXES: Final = ("NEMO_GYM_OTEL_", "NEMO_LENS_", "OTEL_")

_CONFIGURE: Final = """
import json, os, sys
before = dict(os.environ)
from nemo_gym.telemetry import TelemetryConfig, configure_telemetry_env
configure_telemetry_env(TelemetryConfig(enabled=True, span_groups=sys.argv[1],
                                        otlp_endpoint=sys.argv[2]))
print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))
"""


def lens_python() -> Path:
    """The ``lens`` environment's python, built on first use (about 4 minutes), with this
    tree's agent installed. RuntimeError with the build's output when it cannot be made."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gym_env.py"), "--recipe", "lens", "install-agent"],
        check=False,
        capture_output=True,
        text=True,
        timeout=ENV_BUILD_TIMEOUT_S,
    )
    if result.returncode != 0:
        raise RuntimeError(f"could not prepare the lens environment:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def gym_own_env(
    python: Path, otlp_endpoint: str, span_groups: str = "per_rollout"
) -> dict[str, str]:
    """The environment Gym's own launcher gives its servers for ``telemetry: {enabled:
    true, span_groups: ..., otlp_endpoint: ...}`` (computed by Gym's own
    ``configure_telemetry_env`` in ``python``), plus the Lens stand-in on
    ``PYTHONPATH`` and short export intervals (spans 200 ms, metrics 1 s)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_GYM_ENV_PREFIXES)}
    out = subprocess.run(
        [str(python), "-c", _CONFIGURE, span_groups, otlp_endpoint],
        check=True,
        capture_output=True,
        text=True,
        env=clean,
        timeout=120,
    )
    env: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    env.update(
        {
            "PYTHONPATH": str(LENS_STANDIN),
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        }
    )
    return env


@dataclass
class FleetRun:
    """What one run of the scenario left behind (see the module doc)."""

    results: dict[str, tuple[int, Any]]
    """Rollout id (``<task>-<rollout>``) -> the agent's answer (status, body)."""
    failing: frozenset[str]
    """The ids of the rollouts whose verifier was asked to raise."""
    spans: list[RecordedSpan]
    metric_requests: list[Any]
    listed: list[Any]
    """``gym_sidecar.store.queries.rollouts`` over the sidecar's store (what ``gym-sidecar
    rollouts`` prints), every row."""
    counters: dict[str, float] = field(default_factory=dict)
    """The sidecar's own ``/metrics`` samples named in ``run_fleet(counters=...)``,
    read just before it stopped (summed over labels; ``name{label=value}`` picks some)."""
    sidecar_exit: int | None = None
    sidecar_log: str = ""
    server_logs: dict[str, str] = field(default_factory=dict)


def _wait_quiet(sink: RecordingSink, quiet_s: float = 2.0) -> None:
    """Until no span arrived for ``quiet_s`` seconds, then ``METRIC_SETTLE_S`` more, so
    that every server's periodic metric export (each second, ``gym_own_env``) has run
    once after the last rollout (metric requests keep coming: no quiet to wait for)."""
    last = -1
    while sink.span_count != last:
        last = sink.span_count
        time.sleep(quiet_s)
    time.sleep(METRIC_SETTLE_S)


def _counter(sidecar: Any, spec: str) -> float:
    name, _, rest = spec.partition("{")
    labels: dict[str, str] = {}
    if rest:
        for pair in rest.rstrip("}").split(","):
            key, _, value = pair.partition("=")
            labels[key.strip()] = value.strip().strip('"')
    return float(sidecar.metric(name, **labels))


def run_fleet(
    python: Path,
    workdir: Path,
    *,
    agent_servers: Iterable[str] = (),
    rollouts: int = 20,
    failing: int = 4,
    concurrency: int = 5,
    sidecar_env: Mapping[str, str] | None = None,
    counters: Iterable[str] = (),
) -> FleetRun:
    """Run the scenario once (module doc): ``rollouts`` rollouts ``concurrency`` at a
    time, the last ``failing`` of them with ``fail_verify``; servers in
    ``agent_servers`` run this project's agent too. ``sidecar_env`` is added to the
    sidecar's environment (e.g. ``PYTHONPATH`` to run another tree's sidecar)."""
    from gym_sidecar.store import db, queries  # the sidecar under test's own reader

    agent_servers = frozenset(agent_servers)
    workdir.mkdir(parents=True, exist_ok=True)
    with RecordingSink() as sink:
        sidecar = SidecarProcess(
            backend=sink.endpoint,
            extra_args=["--local-store"],
            env=dict(sidecar_env or {}),
            log_dir=workdir,
        ).start()
        store_dir = workdir / "xdg-data" / "gym-sidecar"
        own = gym_own_env(python, "http://" + sidecar.grpc_endpoint)
        server_env = {
            name: telemetry_env(sidecar.grpc_endpoint, sidecar.admin_url) for name in agent_servers
        }
        for env in server_env.values():
            env.pop("GYM_TELEMETRY_SPAN_GROUPS")  # the sidecar's policy, as in production
        stack = GymStack(
            python,
            load_configs("stack.yaml", "failing_verifier.yaml"),
            list(FLEET),
            own,
            workdir / "servers",
            server_env=server_env,
        )
        results: dict[str, tuple[int, Any]] = {}
        failing_ids = frozenset(f"{i}-0" for i in range(rollouts - failing, rollouts))
        counter_values: dict[str, float] = {}
        try:
            with stack:
                url = stack.url(FAILING_AGENT) + "/run"
                bodies = {
                    f"{i}-0": run_body(i, 0, fail_verify=f"{i}-0" in failing_ids)
                    for i in range(rollouts)
                }
                with ThreadPoolExecutor(concurrency) as pool:
                    answers = pool.map(lambda body: post_json(url, body), bodies.values())
                    results = dict(zip(bodies, answers, strict=True))
                # gym.rollout is forwarded by default (group rollout: on)
                wait_for(
                    lambda: (
                        sum(1 for s in sink.spans() if s.span.name == "gym.rollout") >= rollouts
                    ),
                    60,
                )
                _wait_quiet(sink)
            server_logs = {
                name: process.log_path.read_text(errors="replace")
                for name, process in stack.processes.items()
            }
            counter_values = {spec: _counter(sidecar, spec) for spec in counters}
        finally:
            stack.stop()
            exit_code = sidecar.stop()
        conn = db.connect(store_dir / "traces.db", readonly=True)
        try:
            listed = queries.rollouts(conn, limit=10 * rollouts + 100)
        finally:
            conn.close()
        return FleetRun(
            results=results,
            failing=failing_ids,
            spans=sink.spans(),
            metric_requests=sink.metric_requests(),
            listed=listed,
            counters=counter_values,
            sidecar_exit=exit_code,
            sidecar_log=sidecar.log_text(),
            server_logs=server_logs,
        )


# --- the table ------------------------------------------------------------------

SIDECAR_SCOPE: Final = "gym_sidecar.derived"
"""The scope of the sidecar's derived metrics (``gym_sidecar.metrics.otlp.SCOPE_NAME``)."""
NOT_FORWARDED_BY_DEFAULT: Final = (
    "gym.verify",
    "gym.agent.responses",
    "gym.model.responses",
    "gym.model.chat_completions",
    "gym.model.messages",
)
"""Span names of the groups the default policy does not forward: ``verify`` and
``model_call`` (in ``metrics`` mode: derived, then dropped), ``agent`` (``off``)."""


def _key(attributes: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((kv.key, str(kv.value)) for kv in attributes))


def latest_points(requests: Iterable[Any], name: str, scope: str | None = None) -> list[Any]:
    """The latest data point of each series (resource, scope, attributes) of metric
    ``name`` (from scope ``scope`` only, when given) in ``requests``: what a backend
    shows for a cumulative series."""
    latest: dict[tuple[Any, ...], Any] = {}
    for request in requests:
        for rm in request.resource_metrics:
            resource = _key(rm.resource.attributes)
            for sm in rm.scope_metrics:
                if scope is not None and sm.scope.name != scope:
                    continue
                for metric in sm.metrics:
                    if metric.name != name:
                        continue
                    data = getattr(metric, metric.WhichOneof("data") or "sum")
                    for point in data.data_points:
                        key = (resource, sm.scope.name, _key(point.attributes))
                        old = latest.get(key)
                        if old is None or point.time_unix_nano >= old.time_unix_nano:
                            latest[key] = point
    return list(latest.values())


def producers(requests: Iterable[Any]) -> dict[str, set[str]]:
    """Metric name -> the instrumentation scopes that sent points of it (one producer per
    name means one scope)."""
    out: dict[str, set[str]] = {}
    for request in requests:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out.setdefault(metric.name, set()).add(sm.scope.name)
    return out


def _attr(point: Any, key: str) -> Any:
    for kv in point.attributes:
        if kv.key == key:
            value = kv.value
            return getattr(value, value.WhichOneof("value") or "string_value")
    return None


@dataclass
class Table:
    """The issue's table for one run."""

    listed: int
    rollout_points: int
    verify_points: int
    verify_failed: int
    failed_error_types: list[str]
    gated_past: dict[str, int]
    """Span name -> spans of groups the default policy does not forward that reached the
    backend."""
    rollout_duration_producers: set[str]
    shared_names: dict[str, set[str]]
    """Metric names sent by more than one scope."""

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("rollouts listed (store)", str(self.listed)),
            ("gym_rollout_duration_ms_count (sidecar)", str(self.rollout_points)),
            (
                "gym_verify_count_total (failed)",
                f"{self.verify_points} ({self.verify_failed}: "
                f"{sorted(set(self.failed_error_types))})",
            ),
            (
                "spans of not-forwarded groups past the gate",
                f"{sum(self.gated_past.values())} {dict(sorted(self.gated_past.items()))}",
            ),
            ("producers of gym.rollout.duration_ms", str(sorted(self.rollout_duration_producers))),
            ("metric names with several producers", str(sorted(self.shared_names))),
        ]


def fleet_table(run: FleetRun) -> Table:
    """The figures the scenario is judged by (docs/nemo-gym.md has them before/after)."""
    requests = run.metric_requests
    rollout = latest_points(requests, "gym.rollout.duration_ms", SIDECAR_SCOPE)
    verify = latest_points(requests, "gym.verify.count", SIDECAR_SCOPE)
    failed = [p for p in verify if _attr(p, "succeeded") is False]
    gated: dict[str, int] = {}
    for span in run.spans:
        if span.span.name in NOT_FORWARDED_BY_DEFAULT:
            gated[span.span.name] = gated.get(span.span.name, 0) + 1
    made_by = producers(requests)
    return Table(
        listed=len(run.listed),
        rollout_points=sum(int(p.count) for p in rollout),
        verify_points=sum(int(p.as_int) for p in verify),
        verify_failed=sum(int(p.as_int) for p in failed),
        failed_error_types=[
            str(_attr(p, "error.type")) for p in failed for _ in range(int(p.as_int))
        ],
        gated_past=gated,
        rollout_duration_producers=made_by.get("gym.rollout.duration_ms", set()),
        shared_names={name: scopes for name, scopes in made_by.items() if len(scopes) > 1},
    )
