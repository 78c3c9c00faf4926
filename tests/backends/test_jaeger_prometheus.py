"""Real Gym servers -> a real sidecar -> a real Jaeger v2, scraped by a real Prometheus.

Five unmodified NeMo Gym server processes (the demo's stack: the stub model, the shipped
``example_single_tool_call`` and its ``simple_agent``, plus an agent in front of a
verifier that raises on request) send their spans to a ``gym-sidecar`` process, which
forwards them to Jaeger v2 built from the Go module proxy (``scripts/jaeger_build.py``),
running the traces pipeline of its all-in-one configuration (what compose runs) with
in-memory storage. Prometheus from Debian's package scrapes the sidecar's admin
``/metrics`` every second with exemplar storage on.

The whole run is done twice: the sidecar exporting over OTLP/gRPC (uncompressed, as in
compose) and over OTLP/HTTP with gzip. Each run has its own Jaeger and Prometheus.

Span groups are configured explicitly here (``per_rollout`` with ``verify`` forwarded, in
the sidecar and the agents), so the checks do not depend on the defaults, which decide
whether ``verify`` spans are forwarded or only counted into metrics.

Everything is checked only from the outside, as an operator would: Jaeger through the
HTTP query API its UI calls, Prometheus through PromQL and its HTTP API. The only value
read from the sidecar is its own ``gym_sidecar_exported_items_total{signal="traces"}``.

The sidecar also keeps its local store (``--local-store``), served by ``gym-sidecar ui``,
whose Jaeger-compatible query API answers the same calls. Every Jaeger assertion below
runs against both backends (the ``backend`` parameter: ``jaeger``, ``store``); where
Jaeger 2.13 itself answers wrongly (the ``error=true`` search), the test is marked a strict
xfail for Jaeger alone.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from google.protobuf import json_format
from gym_telemetry_demo.webview import WebViewChild
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from testkit.gym_stack import (
    AGENT,
    FAILING_AGENT,
    FAILING_RESOURCES,
    MODEL,
    RESOURCES,
    SERVERS,
    GymStack,
    load_configs,
    post_json,
    run_body,
    telemetry_env,
)
from testkit.wait import wait_for
from tests.support.jaeger import (
    JaegerAPI,
    JaegerQueryClient,
    JaegerServer,
    JaegerTrace,
    same_trace_id,
)
from tests.support.prometheus import PrometheusServer
from tests.support.sidecar_proc import SidecarProcess

pytestmark = [pytest.mark.gym, pytest.mark.backends, pytest.mark.timeout(3600)]

OK_ROLLOUTS = 6
FAILING_ROLLOUTS = 2
CONCURRENCY = 3
#: Generous: the machines running these tests are shared; a wait that holds ends at once.
WAIT_S = 120.0
EXPORTED = "gym_sidecar_exported_items_total"

TRANSPORTS = {
    "grpc": {"protocol": "grpc", "compression": "none"},
    "http-gzip": {"protocol": "http/protobuf", "compression": "gzip"},
}


def service(name: str) -> str:
    return f"nemo-gym/{name}"


@dataclass
class Run:
    jaeger: JaegerServer
    prometheus: PrometheusServer
    sidecar: SidecarProcess
    ok: dict[str, tuple[int, Any]]
    """Rollout id -> the agent's /run answer, for the rollouts whose verifier passes."""
    failing: dict[str, tuple[int, Any]]
    exported_spans: int
    """What the sidecar says it exported (its own counter) once everything settled."""
    traces: dict[str, JaegerTrace]
    """Rollout id -> its one trace, as Jaeger's ``/api/traces/{id}`` returns it."""
    store: JaegerAPI
    """The web view's Jaeger-compatible API over the sidecar's local store."""
    store_traces: dict[str, JaegerTrace]
    """Rollout id -> its one trace, as the store's ``/api/traces/{id}`` returns it."""


@dataclass
class Backend:
    """One of the two query APIs the Jaeger assertions run against."""

    name: str
    api: JaegerQueryClient
    traces: dict[str, JaegerTrace]


def _sidecar_config(
    jaeger: JaegerServer, transport: dict[str, str], store_dir: Path
) -> dict[str, Any]:
    grpc = transport["protocol"] == "grpc"
    return {
        "backend": {
            "url": jaeger.otlp_grpc_endpoint if grpc else jaeger.otlp_http_endpoint,
            **transport,
        },
        # the same spans into the local store too: the second backend of the API suite
        "local_store": {"enabled": True, "data_dir": str(store_dir)},
        # explicit, so a change of the defaults does not change what reaches Jaeger
        "span_groups": {"spec": "per_rollout", "modes": {semconv.GROUP_VERIFY: "on"}},
        # The success-rate gauge (and a bucket's exemplar) shows one exported window and is
        # gone after the next: 5 s windows give a 1 s scrape several chances even when the
        # machine is loaded and scrapes come late.
        "metrics": {"interval_s": 5},
    }


def _rollout_trace_ids(jaeger: JaegerQueryClient, rollout_id: str, svc: str) -> set[str]:
    found = jaeger.find_traces(service(svc), {semconv.ROLLOUT_ID: rollout_id})
    return {t.trace_id for t in found}


def _drive(stack: GymStack) -> tuple[dict[str, tuple[int, Any]], dict[str, tuple[int, Any]]]:
    agent_url = stack.url(AGENT) + "/run"
    jobs = {f"{t}-0": run_body(t, 0) for t in range(OK_ROLLOUTS)}
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = pool.map(lambda body: post_json(agent_url, body), jobs.values())
        ok = dict(zip(jobs, answers, strict=True))
    failing_url = stack.url(FAILING_AGENT) + "/run"
    failing = {
        f"{100 + i}-0": post_json(failing_url, run_body(100 + i, 0, fail_verify=True))
        for i in range(FAILING_ROLLOUTS)
    }
    return ok, failing


def _settled_export_count(sidecar: SidecarProcess) -> int:
    """Wait until every span the sidecar accepted was exported or dropped; the exported."""

    def settled() -> bool:
        received = sidecar.metric("gym_sidecar_received_items_total", signal="traces")
        done = sidecar.metric(EXPORTED, signal="traces") + sidecar.metric(
            "gym_sidecar_dropped_items_total", signal="traces"
        )
        return received > 0 and done == received

    assert wait_for(settled, WAIT_S, 0.2), sidecar.log_text()[-4000:]
    return int(sidecar.metric(EXPORTED, signal="traces"))


def _wait_for_traces(
    api: JaegerQueryClient,
    what: str,
    ok: dict[str, tuple[int, Any]],
    failing: dict[str, tuple[int, Any]],
    exported: int,
) -> dict[str, JaegerTrace]:
    """Rollout id -> its one trace, once ``api`` holds every exported span."""
    traces: dict[str, JaegerTrace] = {}

    def all_there() -> bool:
        for rollout_id, agent in [
            *((r, AGENT) for r in ok),
            *((r, FAILING_AGENT) for r in failing),
        ]:
            if rollout_id not in traces:
                ids = _rollout_trace_ids(api, rollout_id, agent)
                if len(ids) != 1:
                    return False
                found = api.trace(ids.pop())
                if found is None:
                    return False
                traces[rollout_id] = found
        total = sum(len(t.spans) for t in traces.values())
        if total < exported:  # spans of a trace still arriving: read them again
            traces.clear()
        return total >= exported

    if not wait_for(all_there, WAIT_S, 0.5):
        seen = {r: len(t.spans) for r, t in traces.items()}
        log = api.log_tail() if isinstance(api, JaegerServer) else ""
        pytest.fail(
            f"{what} never held one trace per rollout with {exported} spans in all: "
            f"spans by rollout {seen}; answers {ok} {failing}\n{log}"
        )
    return traces


@pytest.fixture(params=["jaeger", "store"])
def backend(request: pytest.FixtureRequest, run: Run) -> Backend:
    """Jaeger's query API, or the web view's Jaeger-compatible one over the local store
    (same spans, same calls, same assertions)."""
    if request.param == "jaeger":
        return Backend("jaeger", run.jaeger, run.traces)
    return Backend("store", run.store, run.store_traces)


@pytest.fixture(scope="module", params=list(TRANSPORTS))
def run(
    request: pytest.FixtureRequest,
    gym_python: Path,
    jaeger_bin: Path,
    prometheus_bin: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp(f"backends-{request.param}")
    jaeger = JaegerServer(workdir / "jaeger", jaeger_bin).start()
    sidecar: SidecarProcess | None = None
    prometheus: PrometheusServer | None = None
    webview: WebViewChild | None = None
    store_dir = workdir / "store"
    try:
        sidecar = SidecarProcess(
            config=_sidecar_config(jaeger, TRANSPORTS[request.param], store_dir), log_dir=workdir
        ).start()
        webview = WebViewChild(store_dir, workdir).start(timeout_s=60)
        store = JaegerAPI(webview.url)
        admin = sidecar.admin_url.removeprefix("http://")
        prometheus = PrometheusServer(workdir / "prometheus", [admin], prometheus_bin).start()
        env = telemetry_env(sidecar.grpc_endpoint, sidecar.admin_url)
        config = load_configs("stack.yaml", "failing_verifier.yaml")
        with GymStack(gym_python, config, list(SERVERS), env, workdir / "gym") as stack:
            ok, failing = _drive(stack)
        # the servers flushed their last spans when they stopped (SIGTERM)
        exported = _settled_export_count(sidecar)
        traces = _wait_for_traces(jaeger, "Jaeger", ok, failing, exported)
        store_traces = _wait_for_traces(store, "the local store", ok, failing, exported)
        yield Run(jaeger, prometheus, sidecar, ok, failing, exported, traces, store, store_traces)
    finally:
        if webview is not None:
            webview.stop()
        if prometheus is not None:
            prometheus.stop()
        if sidecar is not None:
            sidecar.stop()
        jaeger.stop()


# -- Jaeger, through the query API the UI calls -------------------------------------------


def test_every_rollout_answered(run: Run) -> None:
    assert all(status == 200 for status, _ in run.ok.values()), run.ok
    assert all(status == 500 for status, _ in run.failing.values()), run.failing


def test_services_are_the_gym_server_names(run: Run, backend: Backend) -> None:
    # only the servers that took part in a rollout send spans
    assert sorted(backend.api.services()) == sorted(service(name) for name in SERVERS)


def test_tag_search_finds_exactly_one_trace_per_rollout(run: Run, backend: Backend) -> None:
    for rollout_id in run.ok:
        # the same one trace, whichever of its three services the search names
        found = [_rollout_trace_ids(backend.api, rollout_id, s) for s in (AGENT, MODEL, RESOURCES)]
        assert len(found[0]) == 1 and found[0] == found[1] == found[2], (rollout_id, found)
    for rollout_id in run.failing:
        assert len(_rollout_trace_ids(backend.api, rollout_id, FAILING_AGENT)) == 1
    # and no trace beyond those: every trace of every service belongs to a driven rollout
    every = {t.trace_id for name in SERVERS for t in backend.api.find_traces(service(name))}
    assert every == {t.trace_id for t in backend.traces.values()}
    assert len(every) == OK_ROLLOUTS + FAILING_ROLLOUTS


def test_a_rollout_never_driven_finds_nothing(run: Run, backend: Backend) -> None:
    for name in (AGENT, MODEL, RESOURCES, FAILING_AGENT):
        assert _rollout_trace_ids(backend.api, "999999-0", name) == set()


def test_trace_holds_all_three_services_with_cross_process_edges(
    run: Run, backend: Backend
) -> None:
    for rollout_id in run.ok:
        trace = backend.traces[rollout_id]
        assert trace.services() == {service(MODEL), service(RESOURCES), service(AGENT)}
        assert trace.tag_values(semconv.ROLLOUT_ID) == {rollout_id}
        assert trace.orphans() == [] and trace.warnings == [], rollout_id
        [root] = trace.roots()
        assert (root.operation, root.service, root.kind) == ("POST /run", service(AGENT), "server")
        [rollout] = trace.named(semconv.SPAN_ROLLOUT)
        assert trace.parent(rollout) == root
        crossings = 0
        for span in trace.spans:
            if span.kind != "server" or span is root:
                continue
            # every server span is the child of one of the agent's client spans
            parent = trace.parent(span)
            assert parent is not None and parent.kind == "client", span
            assert parent.service == service(AGENT), span
            # named by the HTTP semconv: "{method} {url.template}", the server's route
            assert parent.operation == f"POST {parent.tags[semconv.URL_TEMPLATE]}", parent
            assert parent.operation.endswith(span.operation.split(" ", 1)[1]), parent
            crossings += span.service != parent.service
        # the model twice, the resources server for the tool call, seeding and /verify
        assert crossings >= 5, rollout_id
        models = trace.named("gym.model.responses")
        assert {m.service for m in models} == {service(MODEL)}
        [verify] = trace.named(semconv.SPAN_VERIFY)
        assert verify.service == service(RESOURCES)
        assert verify.tags[semconv.VERIFY_SUCCEEDED] is True


def test_span_count_equals_what_the_sidecar_exported(run: Run, backend: Backend) -> None:
    assert run.exported_spans > 0
    assert sum(len(t.spans) for t in backend.traces.values()) == run.exported_spans
    # and each trace read through the search equals the same trace read by id
    for rollout_id in run.ok:
        [searched] = backend.api.find_traces(service(AGENT), {semconv.ROLLOUT_ID: rollout_id})
        assert len(searched.spans) == len(backend.traces[rollout_id].spans)


#: Why the UI's ``error=true`` search finds nothing in the Jaeger these tests run.
JAEGER_ERROR_SEARCH_BUG = (
    "Jaeger 2.13.0 (module v1.76.0, the newest on the Go module proxy here), in-memory "
    "storage: the query's tags become string attributes (jptrace.PlainMapToPcommonMap) "
    "and internal/storage/v2/memory/tenant.go validSpan reads `error` with Value.Bool(), "
    "which is false for a string, so error=true (like error=false) matches only spans "
    "whose status is OK; a failed rollout's spans are ERROR (or unset)"
)


def test_failed_verifications_are_found_by_error_true(
    run: Run, backend: Backend, request: pytest.FixtureRequest
) -> None:
    if backend.name == "jaeger":
        # strict: once a fixed Jaeger is pinned this passes, and the marker must go
        request.applymarker(pytest.mark.xfail(strict=True, reason=JAEGER_ERROR_SEARCH_BUG))
    failing = {backend.traces[r].trace_id for r in run.failing}
    for name in (FAILING_AGENT, FAILING_RESOURCES):
        found = backend.api.find_traces(service(name), {"error": "true"})
        assert {t.trace_id for t in found} == failing, name


def test_failed_verifications_are_marked_as_errors_and_found_by_error_type(
    run: Run, backend: Backend
) -> None:
    """What the UI shows instead: the failed verifications' spans carry ``error=true``
    (drawn red), no successful rollout's span does, and a tag search on the verify
    span's ``error.type`` finds exactly the failed rollouts."""
    failing = {backend.traces[r].trace_id for r in run.failing}
    for rollout_id in run.failing:
        trace = backend.traces[rollout_id]
        [verify] = trace.named(semconv.SPAN_VERIFY)
        assert verify.tags["error"] is True and verify.tags["otel.status_code"] == "ERROR"
        assert verify.tags[semconv.VERIFY_SUCCEEDED] is False
        assert verify.service == service(FAILING_RESOURCES)
        [rollout] = trace.named(semconv.SPAN_ROLLOUT)
        assert rollout.tags["error"] is True
        # the agent's hop that got the 500 is red too (HTTP semconv: 5xx = ERROR)
        route = trace.parent(verify)
        call = trace.parent(route) if route is not None else None
        assert call is not None and call.kind == "client", verify
        assert call.tags["error"] is True and call.tags[semconv.ERROR_TYPE] == "500"
    for rollout_id in run.ok:
        assert True not in backend.traces[rollout_id].tag_values("error"), rollout_id
    # the attribute is on the verify span, so the search names the resources server
    found = backend.api.find_traces(
        service(FAILING_RESOURCES), {semconv.ERROR_TYPE: "VerifierCrash"}
    )
    assert {t.trace_id for t in found} == failing
    assert backend.api.find_traces(service(RESOURCES), {semconv.ERROR_TYPE: "VerifierCrash"}) == []


# -- Prometheus, through PromQL and its HTTP API ------------------------------------------


def test_sidecar_serves_openmetrics_with_exemplars_on_request(run: Run) -> None:
    def get(accept: str | None) -> tuple[str, str]:
        req = urllib.request.Request(run.sidecar.admin_url + "/metrics")
        if accept:
            req.add_header("Accept", accept)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.headers["Content-Type"], resp.read().decode()

    # what Prometheus 2.42 sends when exemplar storage is on
    kind, body = get("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
    assert kind.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    kind, plain = get(None)
    assert kind.startswith("text/plain")
    assert "# {" not in plain  # the classic text format has no exemplars
    assert "gym_rollout_duration_ms_bucket" in plain


def test_verify_count_by_succeeded_equals_the_verifications_driven(run: Run) -> None:
    expected = {"true": float(OK_ROLLOUTS), "false": float(FAILING_ROLLOUTS)}
    promql = "sum by (succeeded) (gym_verify_count_total)"

    def counts() -> dict[str, float]:
        return {
            r["metric"]["succeeded"]: float(r["value"][1]) for r in run.prometheus.query(promql)
        }

    assert wait_for(lambda: counts() == expected, WAIT_S, 0.5), (
        counts(),
        run.prometheus.log_tail(),
    )
    assert run.prometheus.targets_health() == ["up"]


def test_rollout_duration_quantile_answers(run: Run) -> None:
    rollouts = OK_ROLLOUTS + FAILING_ROLLOUTS
    assert wait_for(
        lambda: (
            run.prometheus.query("sum(gym_rollout_duration_ms_count)")
            and float(run.prometheus.query("sum(gym_rollout_duration_ms_count)")[0]["value"][1])
            == rollouts
        ),
        WAIT_S,
        0.5,
    )
    [p90] = run.prometheus.query(
        "histogram_quantile(0.9, sum by (le) (gym_rollout_duration_ms_bucket))"
    )
    value = float(p90["value"][1])
    assert math.isfinite(value) and value > 0, p90


def test_verify_success_rate_is_a_fraction(run: Run) -> None:
    # the gauge covers the last exported window only, so look back over the run
    promql = "last_over_time(gym_verify_success_rate[1h])"
    assert wait_for(lambda: run.prometheus.query(promql), WAIT_S, 0.5)
    for series in run.prometheus.query(promql):
        assert 0.0 <= float(series["value"][1]) <= 1.0, series


def test_exemplars_lead_from_a_bucket_to_the_rollouts_trace_in_jaeger(
    run: Run, backend: Backend
) -> None:
    by_trace = {t.trace_id: rollout_id for rollout_id, t in backend.traces.items()}

    def exemplars() -> list[dict[str, Any]]:
        found = run.prometheus.query_exemplars("gym_rollout_duration_ms_bucket")
        return [e for series in found for e in series["exemplars"]]

    assert wait_for(exemplars, WAIT_S, 0.5), run.prometheus.log_tail()
    for exemplar in exemplars():
        trace_id = exemplar["labels"]["trace_id"]
        trace = backend.api.trace(trace_id)
        assert trace is not None, trace_id
        [rollout_id] = [r for t, r in by_trace.items() if same_trace_id(t, trace_id)]
        # the exemplar's span is that rollout's rollout span
        [rollout] = trace.named(semconv.SPAN_ROLLOUT)
        assert rollout.span_id.lstrip("0") == exemplar["labels"]["span_id"].lstrip("0")
        assert rollout.tags[semconv.ROLLOUT_ID] == rollout_id


# -- API v3, side by side: the real Jaeger v2 and the local store -------------------------


def _v3(base: str, path: str, params: dict[str, str] | None = None) -> tuple[int, Any]:
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _v3_spans(body: dict[str, Any]) -> set[tuple[str, str, str, str, int, int]]:
    """(trace id, span id, parent id, name, kind, status) of an API v3 trace answer, read
    by protobuf's JSON parser (strictly) into OTLP's ``TracesData`` once the OTLP/JSON
    hex ids are checked and turned into proto3 JSON's base64."""
    doc = copy.deepcopy(body["result"])
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key, size in (("traceId", 32), ("spanId", 16), ("parentSpanId", 16)):
                    if key in span:
                        assert len(span[key]) == size, (key, span[key])
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    data = json_format.ParseDict(doc, TracesData())
    return {
        (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name, s.kind, s.status.code)
        for rs in data.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }


def test_api_v3_answers_as_jaeger_v2_does(run: Run) -> None:
    """Services, operations, a search by rollout id, one trace and the errors of API v3,
    from the real Jaeger v2 and from the store, over the same spans: the same answers."""
    jaeger, store = run.jaeger.query_url, run.store.query_url
    both = [(jaeger, "Jaeger"), (store, "store")]
    services = [_v3(base, "/api/v3/services") for base, _ in both]
    assert services[0][0] == services[1][0] == 200
    assert sorted(services[0][1]["services"]) == sorted(services[1][1]["services"])
    for name in (AGENT, RESOURCES):
        ops = [_v3(base, "/api/v3/operations", {"service": service(name)})[1] for base, _ in both]
        pairs = [{(o["name"], o.get("spanKind", "")) for o in a["operations"]} for a in ops]
        assert pairs[0] == pairs[1], (name, pairs)
    rollout_id = next(iter(run.ok))
    now = time.time()
    window = {
        "query.start_time_min": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600)),
        "query.start_time_max": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 60)),
    }
    # Jaeger 2.13's HTTP gateway reads no query.attributes, and has no default depth (0:
    # its store refuses, 500), so the search is by service and span name, with a depth
    search = {
        **window,
        "query.service_name": service(AGENT),
        "query.operation_name": semconv.SPAN_ROLLOUT,
        "query.num_traces": "1500",
    }
    found = [_v3(base, "/api/v3/traces", search) for base, _ in both]
    assert found[0][0] == found[1][0] == 200, found
    spans = [_v3_spans(body) for _, body in found]
    expected = {run.traces[r].trace_id for r in run.ok}
    assert spans[0] == spans[1] and {s[0] for s in spans[0]} == expected
    trace_id = run.traces[rollout_id].trace_id
    one = [_v3(base, f"/api/v3/traces/{trace_id}") for base, _ in both]
    assert one[0][0] == one[1][0] == 200
    assert _v3_spans(one[0][1]) == _v3_spans(one[1][1])
    assert _v3_spans(one[0][1]) == {s for s in spans[0] if s[0] == trace_id}
    # the errors: the same status, Jaeger's grpc-gateway shape
    for path, params, status in (
        ("/api/v3/traces/" + "ab" * 16, None, 404),
        ("/api/v3/traces", {**search, "query.start_time_min": "yesterday"}, 400),
        ("/api/v3/traces", {**search, "query.num_traces": "many"}, 400),
    ):
        answers = [_v3(base, path, params) for base, _ in both]
        for (code, body), (_, who) in zip(answers, both, strict=True):
            assert code == status and body["error"]["httpCode"] == status, (who, path, body)
            assert isinstance(body["error"]["message"], str), (who, body)
