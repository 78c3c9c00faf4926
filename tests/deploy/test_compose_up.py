"""``docker compose up --build`` of the repository's docker-compose.yml, for real.

On a Docker engine the tests start themselves (:mod:`tests.support.docker_daemon`), with
every third-party image stood in by a local build under its exact tag
(:mod:`tests.support.docker_images`), the stack users run is brought up with Docker
enrichment on (``deploy/compose/docker-socket.yaml``) and ``tests/deploy/compose_e2e.yaml``
(which only moves the two published ports to free 127.0.0.1 ports). Then, only through
those two published ports (and the docker CLI for the containers' own facts):

- the rollout driver's rollouts are each one trace in Jaeger across the three Gym
  services, with every sidecar's resource attributes (Docker enrichment from the real
  Engine API: ``container.id``/``name``/``image`` equal to ``docker inspect``'s);
- Prometheus scraped every sidecar: ``gym_verify_count_total`` by ``succeeded`` equals
  the verifications driven, and its exemplars open those rollouts' traces in Jaeger;
- ``docker compose restart`` of the resources server's sidecar while rollouts run loses
  no span the sidecar answered OK (the compose stack's sidecars use the in-memory queue,
  drained on SIGTERM; the sidecar's own counters say so), and rollouts after it are whole;
- no service logged a traceback, and ``docker compose down`` leaves no container,
  network or volume of the project behind.

Skipped (with the daemon's reason) where no engine can start; failed on CI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest

from testkit.wait import wait_for
from tests.deploy.support import REPO
from tests.support.docker_daemon import Engine
from tests.support.jaeger import JaegerTrace, same_trace_id
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(5400),
]  # a cold first run builds Compose and images

FILES = [
    REPO / "docker-compose.yml",
    REPO / "deploy" / "compose" / "docker-socket.yaml",
    REPO / "tests" / "deploy" / "compose_e2e.yaml",
]
SERVERS = {  # compose service -> Gym server name (the config's top-level key)
    "stub-model": "policy_model",
    "tool-server": "example_single_tool_call",
    "simple-agent": "example_single_tool_call_simple_agent",
}
SIDECARS = {f"{service}-sidecar": service for service in SERVERS}
DRIVER_ROLLOUTS = 5  # docker-compose.yml's ROLLOUTS
RESTART_ROLLOUTS = 12
AFTER_ROLLOUTS = 3
ENRICH_TASKS = 10  # task indexes of the enrichment test's rollouts
#: Generous: the machine is shared; a wait whose condition holds ends at once.
WAIT_S = 300.0


def service_name(server: str) -> str:
    return f"nemo-gym/{server}"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=20) as resp:
        return json.loads(resp.read())


@dataclass
class Stack:
    engine: Engine
    project: str
    env: dict[str, str]
    jaeger_url: str
    prometheus_url: str
    down_done: bool = False
    driven: list[str] = field(default_factory=lambda: [f"0-{i}" for i in range(DRIVER_ROLLOUTS)])
    """Every rollout id driven so far (the driver service's, then the tests' own)."""
    timings: dict[str, float] = field(default_factory=dict)

    def compose(self, *args: str, timeout_s: float = 600, check: bool = True) -> str:
        files = [a for f in FILES for a in ("-f", str(f))]
        try:
            done = self.engine.compose(
                ["-p", self.project, *files, *args],
                cwd=REPO,
                env=self.env,
                timeout_s=timeout_s,
                check=check,
            )
        except subprocess.CalledProcessError as exc:
            raise AssertionError(
                f"docker compose {' '.join(args)} exited {exc.returncode}:\n"
                f"{(exc.stdout or '')[-3000:]}\n{(exc.stderr or '')[-6000:]}"
            ) from None
        return done.stdout + done.stderr

    def container(self, service: str) -> dict[str, Any]:
        ids = self.compose("ps", "-a", "-q", service).split()
        assert len(ids) == 1, (service, ids)
        return self.engine.inspect(ids[0])

    def logs(self, *services: str) -> str:
        return self.compose("logs", "--no-color", *services)

    # -- Jaeger's query API (the UI's), through the published port ------------------------
    def traces(self, server: str, tags: dict[str, str] | None = None) -> list[dict[str, Any]]:
        params = {"service": service_name(server), "limit": "1000"}
        if tags:
            params["tags"] = json.dumps(tags)
        found = get_json(f"{self.jaeger_url}/api/traces?{urllib.parse.urlencode(params)}")
        return list(found["data"] or [])

    def rollout_trace(self, rollout_id: str) -> dict[str, Any] | None:
        found = self.traces(SERVERS["simple-agent"], {semconv.ROLLOUT_ID: rollout_id})
        if len(found) != 1:
            return None
        data = get_json(f"{self.jaeger_url}/api/traces/{found[0]['traceID']}")["data"]
        return dict(data[0]) if data else None

    # -- Prometheus's HTTP API, through the published port --------------------------------
    def promql(self, query: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        return list(get_json(url)["data"]["result"])


def _driver_rollouts(log: str, task: int) -> dict[str, str]:
    """rollout id -> its line's verdict, from the rollout driver's output."""
    out = {}
    for line in log.splitlines():
        _, sep, rest = line.partition(f"rollout {task}-")
        if sep:
            index, _, verdict = rest.partition(": ")
            out[f"{task}-{index}"] = verdict.strip()
    return out


@pytest.fixture(scope="module")
def stack(docker_engine: Engine) -> Iterator[Stack]:
    engine = docker_engine
    socket_gid = os.stat("/var/run/docker.sock").st_gid
    jaeger_port, prometheus_port = free_port(), free_port()
    env = {
        "DOCKER_GID": str(socket_gid),
        "GYM_E2E_JAEGER_PORT": str(jaeger_port),
        "GYM_E2E_PROMETHEUS_PORT": str(prometheus_port),
    }
    stack = Stack(
        engine,
        f"gym-telemetry-e2e-{os.getpid()}",
        env,
        f"http://127.0.0.1:{jaeger_port}",
        f"http://127.0.0.1:{prometheus_port}",
    )
    try:
        up = time.monotonic()
        stack.compose("up", "--build", "--detach", timeout_s=3000)
        stack.timings["up --build"] = time.monotonic() - up

        def driver_exited() -> bool:
            return stack.container("rollout-driver")["State"]["Status"] == "exited"  # type: ignore[no-any-return]

        assert wait_for(driver_exited, WAIT_S, 1.0), stack.logs()[-8000:]
        stack.timings["rollouts driven"] = time.monotonic() - up
        yield stack
    finally:
        if not stack.down_done:
            stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "30", check=False)


# -- the rollouts, as the rollout driver saw them -----------------------------------------


def test_the_rollout_driver_completed_its_rollouts(stack: Stack) -> None:
    state = stack.container("rollout-driver")["State"]
    log = stack.logs("rollout-driver")
    assert state["ExitCode"] == 0, log[-4000:]
    rollouts = _driver_rollouts(log, 0)
    assert sorted(rollouts) == [f"0-{i}" for i in range(DRIVER_ROLLOUTS)], log[-4000:]
    assert all(v == "reward=1.0" for v in rollouts.values()), rollouts


def test_images_run_as_non_root_and_report_healthy(stack: Stack) -> None:
    for service in [*SERVERS, *SIDECARS]:
        doc = stack.container(service)
        assert doc["Config"]["User"] == "10001:10001", (service, doc["Config"]["User"])
        health = doc["State"].get("Health") or {}
        assert wait_for(
            lambda s=service: stack.container(s)["State"]["Health"]["Status"] == "healthy",
            WAIT_S,
            1.0,
        ), (service, health)


# -- Jaeger ------------------------------------------------------------------------------


def _complete_traces(stack: Stack, rollout_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each rollout's one trace, once it holds spans of all three Gym services."""
    traces: dict[str, dict[str, Any]] = {}

    def complete() -> bool:
        for rollout_id in rollout_ids:
            trace = stack.rollout_trace(rollout_id)
            if trace is None:
                return False
            services = {p["serviceName"] for p in trace["processes"].values()}
            if services != {service_name(s) for s in SERVERS.values()}:
                return False
            traces[rollout_id] = trace
        return True

    assert wait_for(complete, WAIT_S, 1.0), (sorted(traces), stack.logs()[-6000:])
    return traces


def test_jaeger_holds_one_trace_per_rollout_across_the_three_services(stack: Stack) -> None:
    rollout_ids = [f"0-{i}" for i in range(DRIVER_ROLLOUTS)]
    traces = _complete_traces(stack, rollout_ids)
    trace_ids = {t["traceID"] for t in traces.values()}
    assert len(trace_ids) == DRIVER_ROLLOUTS
    for rollout_id, raw in traces.items():
        trace = JaegerTrace.parse(raw)
        # the same one trace whichever service the search names
        for server in SERVERS.values():
            found = stack.traces(server, {semconv.ROLLOUT_ID: rollout_id})
            assert [t["traceID"] for t in found] == [raw["traceID"]], (rollout_id, server)
        assert trace.orphans() == [] and len(trace.roots()) == 1, rollout_id
        [rollout] = trace.named(semconv.SPAN_ROLLOUT)
        assert rollout.service == service_name(SERVERS["simple-agent"])
        [verify] = trace.named(semconv.SPAN_VERIFY)
        assert verify.service == service_name(SERVERS["tool-server"])
        assert verify.tags[semconv.VERIFY_SUCCEEDED] is True
    # a rollout never driven finds nothing
    assert stack.traces(SERVERS["simple-agent"], {semconv.ROLLOUT_ID: "999-0"}) == []


def _process_tags(trace: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """service name -> its resource attributes (Jaeger's process tags)."""
    out: dict[str, dict[str, Any]] = {}
    for process in trace["processes"].values():
        tags = {t["key"]: t["value"] for t in process.get("tags") or []}
        out.setdefault(process["serviceName"], {}).update(tags)
    return out


def test_spans_carry_each_sidecars_docker_enrichment_from_the_real_engine(stack: Stack) -> None:
    """deploy/compose/docker-socket.yaml: the Docker source asks the real Engine API.

    A lookup never blocks a request: the first spans of a resource go out without Docker
    data while the lookup runs, later ones carry it. So rollouts are driven (tasks 10+),
    one at a time, until one's trace carries it for all three services."""
    expected: dict[str, dict[str, Any]] = {}
    for service, server in SERVERS.items():
        doc = stack.container(service)
        image, tag = doc["Config"]["Image"].rsplit(":", 1)
        expected[service_name(server)] = {
            semconv.SERVER_NAME: server,
            "container.id": doc["Id"],
            "container.name": doc["Name"].lstrip("/"),
            "container.image.name": image,
            "container.image.tag": tag,
            "container.label.com.docker.compose.service": service,
            "container.label.com.docker.compose.project": stack.project,
        }
    seen: dict[str, dict[str, Any]] = {}
    driven = 0

    def enriched() -> bool:
        nonlocal driven
        task = ENRICH_TASKS + driven  # a new rollout id each time: <task>-0
        driven += 1
        stack.driven.append(f"{task}-0")
        stack.compose(
            "run", "--rm", "--no-deps", "-T", "-e", "ROLLOUTS=1", "-e", f"TASK_INDEX={task}",
            "rollout-driver", timeout_s=600,
        )  # fmt: skip
        [trace] = _complete_traces(stack, [f"{task}-0"]).values()
        tags = _process_tags(trace)
        seen.clear()
        seen.update(tags)
        return all(
            {k: tags.get(name, {}).get(k) for k in want} == want for name, want in expected.items()
        )

    assert wait_for(enriched, WAIT_S, 1.0), (
        expected,
        seen,
        [ln for ln in stack.logs(*SIDECARS).splitlines() if "ocker" in ln][-20:],
    )


# -- Prometheus ---------------------------------------------------------------------------


def test_prometheus_scrapes_every_sidecar(stack: Stack) -> None:
    def targets() -> list[str]:
        data = get_json(f"{stack.prometheus_url}/api/v1/targets")["data"]["activeTargets"]
        return sorted(f"{t['labels']['instance']}={t['health']}" for t in data)

    expected = sorted(f"{s}:13133=up" for s in SERVERS)
    assert wait_for(lambda: targets() == expected, WAIT_S, 1.0), targets()


def test_every_sidecar_runs_the_native_scanner(stack: Stack, staged_native_wheel: Path) -> None:
    """The compose stack's sidecars (built by ``up --build`` with the staged wheel) run
    the fast path, as Prometheus sees it on each one's /metrics."""

    def scanners() -> list[tuple[str, str]]:
        found = stack.promql("gym_sidecar_trace_scanner_info == 1")
        return sorted((r["metric"]["instance"], r["metric"]["scanner"]) for r in found)

    expected = sorted((f"{s}:13133", "native") for s in SERVERS)
    assert wait_for(lambda: scanners() == expected, WAIT_S, 1.0), scanners()


def test_verify_count_by_succeeded_equals_the_verifications_driven(stack: Stack) -> None:
    promql = "sum by (succeeded) (gym_verify_count_total)"

    def counts() -> dict[str, float]:
        return {r["metric"]["succeeded"]: float(r["value"][1]) for r in stack.promql(promql)}

    expected = {"true": float(len(stack.driven))}  # the driver's and the enrichment test's
    assert wait_for(lambda: counts() == expected, WAIT_S, 1.0), (counts(), expected)


def test_exemplars_open_the_rollouts_traces_in_jaeger(stack: Stack) -> None:
    traces = _complete_traces(stack, stack.driven)
    by_trace = {raw["traceID"]: rollout_id for rollout_id, raw in traces.items()}
    now = time.time()
    query = urllib.parse.urlencode(
        {"query": "gym_rollout_duration_ms_bucket", "start": now - 3600, "end": now + 60}
    )

    def exemplars() -> list[dict[str, Any]]:
        found = get_json(f"{stack.prometheus_url}/api/v1/query_exemplars?{query}")["data"]
        return [e for series in found or [] for e in series["exemplars"]]

    assert wait_for(exemplars, WAIT_S, 1.0)
    for exemplar in exemplars():
        trace_id = exemplar["labels"]["trace_id"]
        [rollout_id] = [r for t, r in by_trace.items() if same_trace_id(t, trace_id)]
        raw = get_json(f"{stack.jaeger_url}/api/traces/{trace_id}")["data"][0]
        [rollout] = JaegerTrace.parse(raw).named(semconv.SPAN_ROLLOUT)
        assert rollout.span_id.lstrip("0") == exemplar["labels"]["span_id"].lstrip("0")
        assert rollout.tags[semconv.ROLLOUT_ID] == rollout_id


# -- a sidecar restarted while rollouts run -----------------------------------------------


def _span_counts(trace: dict[str, Any]) -> dict[str, int]:
    services = {pid: p["serviceName"] for pid, p in trace["processes"].items()}
    counts: dict[str, int] = {}
    for span in trace["spans"]:
        name = services[span["processID"]]
        counts[name] = counts.get(name, 0) + 1
    return counts


_SIDECAR_TOTALS = re.compile(r"traces: received=(\d+) exported=(\d+) dropped=(\d+)")
AGENT_SERVICE = service_name(SERVERS["tool-server"])  # its sidecar is the one restarted


def test_restarting_a_sidecar_mid_run_loses_no_span(stack: Stack) -> None:
    """``docker compose restart tool-server-sidecar`` while the driver runs rollouts.

    The compose stack's sidecars keep the export queue in memory (sidecar.yaml sets no
    ``queue.persistent``): on SIGTERM the sidecar stops receiving, drains the pipeline
    and the queue to Jaeger, logs its totals, then exits. What must hold is the issue's
    requirement: no span the sidecar answered OK is lost. The sidecar's own counters
    say it (its shutdown line ``traces: received=R exported=E dropped=D``: ``received``
    counts only spans answered OK, ``exported`` only what Jaeger acknowledged,
    ``dropped`` what a stage dropped on purpose, ``could not be sent`` what the drain
    deadline cut): R == E + D, nothing cut.

    The agent in tool-server is the SDK's OTLP/gRPC exporter: a batch refused while
    the sidecar is down is retried with back-off (1, 2, 4 s, +-20 %) within
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s) and then dropped by the agent, so a batch
    that meets an outage longer than ~7 s is never offered to the sidecar again
    (docs/deployment.md). On a loaded machine the restart window (drain, exit, a
    Python start) can exceed that: those spans of the rollouts run during the window
    are the agent's, and only tool-server's may be missing; every other service's
    spans, and every rollout after the restart, are whole.
    """
    driver: dict[str, Any] = {}

    def drive() -> None:
        driver["out"] = stack.compose(
            "run", "--rm", "--no-deps", "-T", "-e", f"ROLLOUTS={RESTART_ROLLOUTS}",
            "-e", "TASK_INDEX=1", "rollout-driver",
            timeout_s=1800, check=False,
        )  # fmt: skip

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    # restart once a few rollouts are through (the ids 1-* in Jaeger)
    assert wait_for(lambda: stack.rollout_trace("1-2") is not None, WAIT_S, 0.5)
    stack.compose("restart", "tool-server-sidecar", timeout_s=600)
    thread.join(1800)
    assert not thread.is_alive()
    restarted = _driver_rollouts(driver["out"], 1)
    assert len(restarted) == RESTART_ROLLOUTS and set(restarted.values()) == {"reward=1.0"}, driver[
        "out"
    ][-4000:]
    # the sidecar's own account of its first life: every span it answered OK went to
    # Jaeger (acknowledged) or was dropped on purpose; the drain cut nothing
    log = stack.logs("tool-server-sidecar")
    assert "export queue drained" in log, log[-4000:]
    assert "could not be sent" not in log, log[-4000:]
    assert "were not sent to the backend" not in log, log[-4000:]
    [(received, exported, dropped)] = [
        tuple(int(n) for n in m.groups()) for m in _SIDECAR_TOTALS.finditer(log)
    ]
    assert received > 0 and received == exported + dropped, (received, exported, dropped)
    # rollouts after the restart, on the restarted sidecar: all whole
    after = stack.compose(
        "run", "--rm", "--no-deps", "-T", "-e", f"ROLLOUTS={AFTER_ROLLOUTS}",
        "-e", "TASK_INDEX=2", "rollout-driver", timeout_s=1800,
    )  # fmt: skip
    after_ids = list(_driver_rollouts(after, 2))
    assert set(_driver_rollouts(after, 2).values()) == {"reward=1.0"}, after[-4000:]
    ids = [*restarted, *after_ids]
    traces: dict[str, dict[str, Any]] = {}
    baseline: dict[str, int] = {}

    def as_expected() -> bool:
        # an undisturbed rollout of the first run, read again: when this test starts,
        # its last spans may still be on their way
        undisturbed = stack.rollout_trace("0-0")
        baseline.clear()
        baseline.update(_span_counts(undisturbed) if undisturbed else {})
        if len(baseline) != len(SERVERS):
            return False
        for rollout_id in ids:
            trace = stack.rollout_trace(rollout_id)
            counts = _span_counts(trace) if trace else {}
            traces[rollout_id] = trace or {}
            if rollout_id in after_ids or counts.get(AGENT_SERVICE, 0) == baseline[AGENT_SERVICE]:
                if counts != baseline:
                    return False
            elif {k: v for k, v in counts.items() if k != AGENT_SERVICE} != {
                k: v for k, v in baseline.items() if k != AGENT_SERVICE
            }:
                return False  # only the restarted sidecar's agent may have lost spans
        return True

    assert wait_for(as_expected, WAIT_S, 1.0), (
        baseline,
        {r: _span_counts(t) for r, t in traces.items() if t and _span_counts(t) != baseline},
    )
    # a rollout short of tool-server spans: its agent said it gave up on a batch (its
    # queue is FIFO with one worker, so once the 2-* rollouts are whole every 1-* span
    # was either sent or given up on)
    if any(_span_counts(traces[r]) != baseline for r in restarted):
        agent_log = stack.logs("tool-server")
        assert "Failed to export traces" in agent_log, agent_log[-4000:]
    assert stack.container("tool-server-sidecar")["RestartCount"] == 0  # restarted, not crashed


# -- logs and teardown (last: they end the stack) -----------------------------------------


def test_no_service_logged_a_traceback(stack: Stack) -> None:
    logs = stack.logs()
    assert "Traceback" not in logs, logs[logs.index("Traceback") - 2000 :][:6000]


def test_down_leaves_no_container_network_or_volume(stack: Stack) -> None:
    stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "30")
    stack.down_done = True
    label = f"label=com.docker.compose.project={stack.project}"
    assert stack.engine.docker("ps", "-a", "-q", "--filter", label).stdout.split() == []
    assert stack.engine.docker("network", "ls", "-q", "--filter", label).stdout.split() == []
    assert stack.engine.docker("volume", "ls", "-q", "--filter", label).stdout.split() == []
    print(f"compose e2e timings (s): {json.dumps({k: round(v) for k, v in stack.timings.items()})}")
