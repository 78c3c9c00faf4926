"""Real Gym servers -> a sidecar each -> gateway tier 1 -> two tier-2 collectors -> Jaeger.

Three NeMo Gym server processes (the stub model, the ``failing_weather`` resources server
whose verifier raises or waits on request, and its ``simple_agent``) each send their spans
to a ``gym-sidecar`` of their own, as in a pod per server. Every sidecar forwards to one
tier-1 gateway Collector (``deploy/gateway/tier1.yaml``: ``load_balancing`` by trace id,
static resolver) in front of two tier-2 Collectors (``deploy/gateway/tier2.yaml``:
``tail_sampling`` with Gym's policies), which export to Jaeger v2. Prometheus scrapes the
three sidecars. The gateway binary is the project's distribution
(``scripts/otelcol_build.py``), built on first use.

Driven: ``ROLLOUTS`` rollouts through the agent's ``/run``; about 10% with a verifier that
raises (``fail_verify``), a few whose verifier waits ``SLOW_DELAY_S`` (well above the
slow-rollout threshold ``SLOW_THRESHOLD_S``, itself well above an ordinary rollout, so
no machine speed decides which policy applies), and a few that carry a trainer-style
``traceparent`` (the agent's ``link`` mode). What the sidecars exported is read from
their own local stores (each sidecar writes every request it exports to its store as
well: backend and store behind one fan-out).

Checked, from the outside (Jaeger's query API, Prometheus's HTTP API):

- every failed and every slow rollout is in Jaeger whole: as many spans as the sidecars
  exported for its trace, all three services, one root;
- no trace in Jaeger is partial;
- the kept fraction of the ordinary rollouts lies inside the 99.9% binomial interval
  of the configured ``KEEP_PERCENT`` (trace ids are random; the policy hashes them);
- ``gym_verify_count_total`` and ``gym_rollout_duration_ms_count`` (the sidecars'
  derived metrics, scraped) count every rollout driven, not the sampled part;
- a rollout sent with a trainer's ``traceparent`` is a trace of its own whose root has a
  span link (Jaeger: a ``FOLLOWS_FROM`` reference) to the trainer's span.

No check depends on timing: every wait polls for a condition with a generous deadline,
and the tier-2 decisions are awaited through the Collectors' own counters.
"""

from __future__ import annotations

import math
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest

from testkit.gym_stack import (
    FAILING_AGENT,
    FAILING_RESOURCES,
    MODEL,
    GymStack,
    load_configs,
    post_json,
    run_body,
    telemetry_env,
)
from testkit.otelcol import TIER1, TIER2, Collector
from testkit.wait import wait_for
from tests.support.jaeger import JaegerServer, JaegerTrace
from tests.support.prometheus import PrometheusServer
from tests.support.sidecar_proc import SidecarProcess

pytestmark = [
    pytest.mark.gym,
    pytest.mark.backends,
    pytest.mark.gateway,
    pytest.mark.timeout(3600),
]

ROLLOUTS = 220
FAILING = 22  # ~10%
SLOW = 6
LINKED = 3  # failing too, so that the errors policy keeps them
KEEP_PERCENT = 25.0
SLOW_THRESHOLD_S = 10.0
SLOW_DELAY_S = 30.0
CONCURRENCY = 4
WAIT_S = 600.0
SERVERS = (MODEL, FAILING_RESOURCES, FAILING_AGENT)
EXPORTED = "gym_sidecar_exported_items_total"


@dataclass
class Driven:
    rollout_id: str
    kind: str  # ordinary | failing | slow | linked
    status: int = 0
    wall_s: float = 0.0
    trainer: tuple[str, str] | None = None  # (trace id, span id) of the trainer's span


@dataclass
class Truth:
    """What the sidecars exported, from their stores."""

    spans: dict[str, int] = field(default_factory=dict)  # trace id (hex) -> spans
    services: dict[str, set[str]] = field(default_factory=dict)
    rollout_trace: dict[str, str] = field(default_factory=dict)  # rollout id -> trace id


@dataclass
class Run:
    driven: dict[str, Driven]
    truth: Truth
    jaeger: dict[str, JaegerTrace]  # trace id -> trace, for every trace Jaeger holds
    raw: dict[str, dict[str, Any]]  # trace id -> the API's JSON of it
    metrics: dict[str, float]
    tier2_sent: int
    agent_log: dict[str, list[str]] = field(default_factory=dict)
    """Per Gym server, its log's lines from the agent and the SDK's export machinery
    (export failures, shutdown warnings): what a span lost before its sidecar left."""
    sidecar_drops: dict[str, list[str]] = field(default_factory=dict)
    """Per Gym server, its sidecar's ``gym_sidecar_dropped_items_total`` samples: a span
    a sidecar dropped before its fan-out is in neither its store nor the gateway."""


def _tier2_env(jaeger: JaegerServer) -> dict[str, str]:
    return {
        "GATEWAY_BACKEND_OTLP_GRPC": jaeger.otlp_grpc_endpoint.removeprefix("http://"),
        "GATEWAY_KEEP_PERCENT": str(KEEP_PERCENT),
        "GATEWAY_SLOW_ROLLOUT_NS": str(int(SLOW_THRESHOLD_S * 1e9)),
        # every rollout here ends within SLOW_DELAY_S + a loaded machine's slack; the
        # decision waits for the root plus the spread of the three sidecars' exports
        "GATEWAY_DECISION_WAIT": "240s",
        "GATEWAY_DECISION_WAIT_AFTER_ROOT": "20s",
        "GATEWAY_MAX_ORDINARY_SPANS_PER_S": "1000000",
        "GATEWAY_NUM_TRACES": "20000",
        "GATEWAY_EXPECTED_NEW_TRACES_PER_S": "100",
    }


def _sidecar_config(tier1: Collector, store: Path) -> dict[str, Any]:
    return {
        "backend": {"url": f"http://{tier1.grpc_endpoint}", "protocol": "grpc"},
        "local_store": {"enabled": True, "data_dir": str(store)},
        "span_groups": {"spec": "per_rollout", "modes": {semconv.GROUP_VERIFY: "on"}},
        "metrics": {"interval_s": 5},
    }


def _plan() -> list[Driven]:
    plan: list[Driven] = []
    for i in range(ROLLOUTS):
        if i < SLOW:
            kind = "slow"
        elif i < SLOW + LINKED:
            kind = "linked"
        elif i < SLOW + FAILING:
            kind = "failing"
        else:
            kind = "ordinary"
        plan.append(Driven(f"{i}-0", kind))
    return plan


def _drive(stack: GymStack, plan: list[Driven]) -> None:
    url = stack.url(FAILING_AGENT) + "/run"

    def one(item: Driven) -> None:
        task = int(item.rollout_id.split("-")[0])
        extra: dict[str, Any] = {}
        headers: dict[str, str] = {}
        if item.kind in ("failing", "linked"):
            extra["fail_verify"] = True
        if item.kind == "slow":
            extra["verify_delay_s"] = SLOW_DELAY_S
        if item.kind == "linked":
            item.trainer = (secrets.token_hex(16), secrets.token_hex(8))
            headers["traceparent"] = f"00-{item.trainer[0]}-{item.trainer[1]}-01"
        started = time.monotonic()
        item.status, _ = post_json(url, run_body(task, 0, **extra), timeout_s=300, headers=headers)
        item.wall_s = time.monotonic() - started

    slow = [p for p in plan if p.kind == "slow"]
    rest = [p for p in plan if p.kind != "slow"]
    with ThreadPoolExecutor(SLOW) as slow_pool, ThreadPoolExecutor(CONCURRENCY) as pool:
        waits = [slow_pool.submit(one, p) for p in slow]
        list(pool.map(one, rest))
        for w in waits:
            w.result()


def _settled(sidecar: SidecarProcess) -> bool:
    received = sidecar.metric("gym_sidecar_received_items_total", signal="traces")
    done = sidecar.metric(EXPORTED, signal="traces") + sidecar.metric(
        "gym_sidecar_dropped_items_total", signal="traces"
    )
    return received > 0 and done == received


def _read_truth(stores: list[Path]) -> Truth:
    truth = Truth()
    for store in stores:
        db = sqlite3.connect(f"file:{store / 'traces.db'}?mode=ro", uri=True)
        try:
            for trace_id, spans, services in db.execute(
                "SELECT trace_id, spans, services FROM traces"
            ):
                key = bytes(trace_id).hex()
                truth.spans[key] = truth.spans.get(key, 0) + int(spans)
                truth.services.setdefault(key, set()).update(
                    s for s in str(services).split(",") if s
                )
            for trace_id, rollout_id in db.execute(
                "SELECT trace_id, rollout_id FROM gym_spans WHERE name = ? AND rollout_id "
                "IS NOT NULL",
                (semconv.SPAN_ROLLOUT,),
            ):
                truth.rollout_trace[str(rollout_id)] = bytes(trace_id).hex()
        finally:
            db.close()
    return truth


def _decided(tier2: list[Collector]) -> float:
    return sum(
        c.metric("otelcol_processor_tail_sampling_global_count_traces_sampled") for c in tier2
    )


def _sent(tier2: list[Collector]) -> float:
    return sum(
        c.metric("otelcol_exporter_sent_spans") + c.metric("otelcol_exporter_send_failed_spans")
        for c in tier2
    )


def _exporter_snapshot(tier2: list[Collector]) -> list[tuple[float, ...]]:
    # the batch processor reports what it sent on as the sum of its send sizes (it
    # has no outgoing_items counter); the exporter's queue and in-flight requests
    # must be empty too
    return [
        (
            c.metric("otelcol_processor_batch_batch_send_size_sum", processor="batch"),
            c.metric("otelcol_exporter_sent_spans")
            + c.metric("otelcol_exporter_send_failed_spans"),
            c.metric("otelcol_exporter_queue_size", data_type="traces"),
            c.metric("otelcol_exporter_in_flight_requests", data_type="traces"),
        )
        for c in tier2
    ]


def _exporter_settled(tier2: list[Collector], quiet_s: float = 5.0) -> Callable[[], bool]:
    """Every span the batch processor let out was sent (or failed), nothing is queued
    or in flight, and that has held unchanged for ``quiet_s`` (over the batch
    timeout, 1 s, so that nothing still waits in a batch)."""
    last: dict[str, Any] = {}

    def settled() -> bool:
        snap = _exporter_snapshot(tier2)
        now = time.monotonic()
        drained = all(out == done and queued == 0 and busy == 0 for out, done, queued, busy in snap)
        if not drained or snap != last.get("snap"):
            last.update(snap=snap, since=now)
            return False
        return now - last["since"] >= quiet_s

    return settled


# the agent's own lines ("gym_telemetry: ..."), the SDK exporter's and batch worker's;
# not the frames of the failing verifier's tracebacks (they run through the agent's code)
AGENT_LOG_MARKS = ("gym_telemetry:", "Failed to export", "Transient error", "opentelemetry.")


def _agent_log(gym_dir: Path) -> dict[str, list[str]]:
    lines: dict[str, list[str]] = {}
    for name in SERVERS:
        path = gym_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        lines[name] = [
            ln
            for ln in text.splitlines()
            if 'File "' not in ln and any(m in ln for m in AGENT_LOG_MARKS)
        ][-40:]
    return lines


def _jaeger_contents(jaeger: JaegerServer, truth: Truth) -> tuple[dict[str, JaegerTrace], dict]:
    traces: dict[str, JaegerTrace] = {}
    raw: dict[str, dict[str, Any]] = {}
    for trace_id in truth.spans:
        try:
            found = jaeger.api(f"/api/traces/{trace_id}")
        except OSError as exc:  # urllib's HTTPError is an OSError: 404 = not kept
            if getattr(exc, "code", None) == 404:
                continue
            raise
        data = found.get("data") or []
        if data:
            traces[trace_id] = JaegerTrace.parse(data[0])
            raw[trace_id] = data[0]
    return traces, raw


@pytest.fixture(scope="module")
def run(
    gateway_bin: Path,
    gym_python: Path,
    jaeger_bin: Path,
    prometheus_bin: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("gateway")
    started: list[Any] = []
    try:
        jaeger = JaegerServer(workdir / "jaeger", jaeger_bin).start()
        started.append(jaeger)
        tier2 = [
            Collector(gateway_bin, TIER2, workdir, f"tier2-{n}", _tier2_env(jaeger)).start()
            for n in "ab"
        ]
        started.extend(tier2)
        endpoints = ", ".join(c.grpc_endpoint for c in tier2)
        tier1 = Collector(
            gateway_bin, TIER1, workdir, "tier1", {"GATEWAY_TIER2_ENDPOINTS": f"[{endpoints}]"}
        ).start()
        started.append(tier1)
        stores = [workdir / f"store-{name}" for name in SERVERS]
        sidecars = {
            name: SidecarProcess(config=_sidecar_config(tier1, store), log_dir=workdir).start()
            for name, store in zip(SERVERS, stores, strict=True)
        }
        started.extend(sidecars.values())
        targets = [s.admin_url.removeprefix("http://") for s in sidecars.values()]
        prometheus = PrometheusServer(workdir / "prometheus", targets, prometheus_bin).start()
        started.append(prometheus)

        first = next(iter(sidecars.values()))
        env = telemetry_env(first.grpc_endpoint, first.admin_url)
        per_server = {
            name: {
                "OTEL_EXPORTER_OTLP_ENDPOINT": sc.grpc_endpoint,
                "GYM_TELEMETRY_SIDECAR_ADMIN_URL": sc.admin_url,
                # What is checked is the gateway's whole-trace keeping, not the agent's
                # bounds: a span the agent drops (queue full) or fails to export (the
                # SDK gives a batch up after OTEL_EXPORTER_OTLP_TIMEOUT, 10 s, which a
                # starved sidecar can exceed) never reaches a store, so it goes
                # unnoticed unless it was a root. Neither bound can be reached here.
                "OTEL_BSP_MAX_QUEUE_SIZE": "100000",
                "OTEL_EXPORTER_OTLP_TIMEOUT": "120",  # seconds (the Python SDK's unit)
                # the slow rollouts end last, just before SIGTERM: their roots are in the
                # stop flush, whose default 2 s a starved machine can pass (GymServers
                # waits 15 s before SIGKILL)
                "GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S": "10",
            }
            for name, sc in sidecars.items()
        }
        config = load_configs("stack.yaml", "failing_verifier.yaml")
        plan = _plan()
        stack = GymStack(gym_python, config, list(SERVERS), env, workdir / "gym")
        stack.server_env = per_server
        with stack:
            _drive(stack, plan)
        # the servers flushed their last spans when they stopped (SIGTERM)
        for name, sc in sidecars.items():
            assert wait_for(lambda sc=sc: _settled(sc), WAIT_S, 0.5), (
                f"{name}'s sidecar never exported everything:\n{sc.log_text()[-4000:]}"
            )

        sidecar_drops = {
            name: [
                ln
                for ln in sc.admin_get("/metrics")[1].splitlines()
                if ln.startswith("gym_sidecar_dropped_items_total")
            ]
            for name, sc in sidecars.items()
        }
        metrics: dict[str, float] = {}

        def counted() -> bool:
            for metric in ("gym_verify_count_total", "gym_rollout_duration_ms_count"):
                result = prometheus.query(f"sum({metric})")
                metrics[metric] = float(result[0]["value"][1]) if result else 0.0
            return all(v >= ROLLOUTS for v in metrics.values())

        wait_for(counted, WAIT_S, 1.0)  # the test compares: more than driven fails too
        for sc in sidecars.values():
            sc.stop()
        truth = _read_truth(stores)
        assert wait_for(lambda: _decided(tier2) >= len(truth.spans), WAIT_S, 1.0), (
            f"tier 2 decided {_decided(tier2)} of {len(truth.spans)} traces:\n"
            + "\n".join(c.log_tail() for c in tier2)
        )
        assert wait_for(_exporter_settled(tier2), WAIT_S, 1.0), (
            f"tier 2 never drained: {_exporter_snapshot(tier2)}"
        )
        sent = int(_sent(tier2))
        holder: dict[str, Any] = {}

        def jaeger_has_all() -> bool:
            traces, raw = _jaeger_contents(jaeger, truth)
            holder.update(traces=traces, raw=raw)
            return sum(len(t.spans) for t in traces.values()) >= sent

        assert wait_for(jaeger_has_all, WAIT_S, 2.0), (
            f"Jaeger holds fewer spans than tier 2 sent ({sent}):\n{jaeger.log_tail()}"
        )
        yield Run(
            {p.rollout_id: p for p in plan},
            truth,
            holder["traces"],
            holder["raw"],
            metrics,
            sent,
            _agent_log(workdir / "gym"),
            sidecar_drops,
        )
    finally:
        for proc in reversed(started):
            proc.stop()


def _trace_of(run: Run, rollout_id: str) -> str:
    trace_id = run.truth.rollout_trace.get(rollout_id)
    assert trace_id is not None, f"no sidecar exported a gym.rollout span for {rollout_id}"
    return trace_id


def test_every_rollout_answered(run: Run) -> None:
    by_kind: dict[str, set[int]] = {}
    for d in run.driven.values():
        by_kind.setdefault(d.kind, set()).add(d.status)
    assert by_kind["ordinary"] == {200}
    assert by_kind["slow"] == {200}
    assert by_kind["failing"] == {500}
    assert by_kind["linked"] == {500}
    assert all(d.wall_s >= SLOW_DELAY_S for d in run.driven.values() if d.kind == "slow")


def test_one_trace_per_rollout(run: Run) -> None:
    assert set(run.truth.rollout_trace) == set(run.driven)
    assert len(set(run.truth.rollout_trace.values())) == ROLLOUTS


@pytest.mark.parametrize("kind", ["failing", "slow", "linked"])
def test_failed_and_slow_rollouts_kept_whole(run: Run, kind: str) -> None:
    for d in run.driven.values():
        if d.kind != kind:
            continue
        trace_id = _trace_of(run, d.rollout_id)
        trace = run.jaeger.get(trace_id)
        assert trace is not None, f"{kind} rollout {d.rollout_id} ({trace_id}) not kept"
        assert len(trace.spans) == run.truth.spans[trace_id], d.rollout_id
        assert len(trace.services()) == len(SERVERS), trace.services()
        assert len(trace.roots()) == 1, (
            d.rollout_id,
            trace_id,
            [(s.operation, s.service, s.span_id, s.parent_id) for s in trace.spans],
            [s.span_id for s in trace.orphans()],
            run.raw[trace_id].get("warnings"),
            # a root the agent lost (queue full, failed export) never reached a sidecar,
            # so the counts above still agree: its server's log says why (and a
            # sidecar's drop before its store, its counter)
            run.agent_log,
            run.sidecar_drops,
        )


def test_no_partial_trace(run: Run) -> None:
    partial = {
        t: (len(trace.spans), run.truth.spans[t])
        for t, trace in run.jaeger.items()
        if len(trace.spans) != run.truth.spans[t]
    }
    assert not partial, partial
    assert sum(len(t.spans) for t in run.jaeger.values()) == run.tier2_sent


def _binomial_interval(n: int, p: float, confidence: float) -> tuple[int, int]:
    """The central ``confidence`` interval of Binomial(n, p): [lo, hi] with at most
    (1 - confidence) / 2 of the mass below lo and above hi."""
    tail = (1 - confidence) / 2
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    lo, acc = 0, 0.0
    while acc + pmf[lo] <= tail:
        acc += pmf[lo]
        lo += 1
    hi, acc = n, 0.0
    while acc + pmf[hi] <= tail:
        acc += pmf[hi]
        hi -= 1
    return lo, hi


def test_ordinary_fraction_inside_binomial_interval(run: Run) -> None:
    # An ordinary rollout that took longer than the slow threshold on a loaded machine
    # may rightly be kept as slow: it is left out of the population.
    ordinary = [
        d for d in run.driven.values() if d.kind == "ordinary" and d.wall_s < SLOW_THRESHOLD_S
    ]
    kept = sum(1 for d in ordinary if _trace_of(run, d.rollout_id) in run.jaeger)
    lo, hi = _binomial_interval(len(ordinary), KEEP_PERCENT / 100, 0.999)
    print(f"ordinary rollouts kept: {kept} of {len(ordinary)} (99.9% interval [{lo}, {hi}])")
    assert lo <= kept <= hi, (kept, len(ordinary), lo, hi)


def test_derived_metrics_count_every_rollout(run: Run) -> None:
    assert run.metrics == {
        "gym_verify_count_total": float(ROLLOUTS),
        "gym_rollout_duration_ms_count": float(ROLLOUTS),
    }


def test_trainer_traceparent_becomes_a_link(run: Run) -> None:
    for d in run.driven.values():
        if d.kind != "linked":
            continue
        assert d.trainer is not None
        trace_id = _trace_of(run, d.rollout_id)
        assert trace_id != d.trainer[0], "the rollout continued the trainer's trace"
        raw = run.raw[trace_id]
        [root] = [
            s
            for s in raw["spans"]
            if not any(r.get("refType") == "CHILD_OF" for r in s.get("references") or [])
        ]
        links = [
            (r["traceID"].rjust(32, "0"), r["spanID"].rjust(16, "0"))
            for r in root.get("references") or []
            if r.get("refType") == "FOLLOWS_FROM"
        ]
        assert links == [d.trainer], (root["operationName"], root.get("references"))
