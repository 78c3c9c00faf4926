"""API v3 over a store, read over real HTTP and parsed with protobuf's own JSON parser
into Jaeger's message shapes (:mod:`.jaeger_schema`) and OTLP's ``TracesData``: services,
operations, one trace, the traces search, trace summaries, each parameter (canonical and
deprecated names), raw traces, the errors, and the search bound."""

from __future__ import annotations

import base64
import copy
import json
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.query import search
from gym_sidecar.webui.app import ViewConfig
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from tests.sidecar.query.jaeger_schema import parse
from tests.sidecar.webui.data import (
    AGENT,
    MODEL,
    RESOURCES,
    SpanSpec,
    gym_trace,
    new_id,
    request,
    write,
)
from tests.sidecar.webui.serve import get, serve

NOW = time.time_ns()
S = 1_000_000_000
MS = 1_000_000
Api = tuple[str, dict[str, str]]


def iso(ns: int) -> str:
    """An RFC 3339 time with nanoseconds."""
    return datetime.fromtimestamp(ns // S, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ns % S:09d}Z"


WINDOW = {"query.startTimeMin": iso(NOW - 3600 * S), "query.startTimeMax": iso(NOW + 60 * S)}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    path = tmp_path_factory.mktemp("v3") / "traces.db"
    ids: dict[str, str] = {}
    payloads = []
    for i in range(6):
        tid, specs = gym_trace(f"{i}-0", NOW - (100 - i) * S, fail_verify=i >= 4)
        if i == 0:
            tid, specs = gym_trace("0-0", NOW - 100 * S, trace_id=bytes(2) + tid[2:])
        ids[f"{i}-0"] = tid.hex()
        payloads.append(request(tid, specs))
    # a trace exported twice (the same span in two requests) whose root never arrived
    tid, lost_parent = new_id(16), new_id()
    orphan = SpanSpec(MODEL, "orphan", new_id(), lost_parent, NOW - 50 * S, NOW - 50 * S + MS)
    payloads += [request(tid, [orphan]), request(tid, [orphan])]
    ids["orphan"] = tid.hex()
    write(path, payloads)
    with serve(ViewConfig(path)) as url:
        yield url, ids


def _get(url: str, path: str, params: dict[str, str] | None = None) -> tuple[int, Any]:
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    answer = get(url + path + query)
    assert answer.headers["content-type"].startswith("application/json"), answer.headers
    return answer.status, answer.json()


def _error(url: str, path: str, params: dict[str, str] | None, status: int) -> str:
    code, body = _get(url, path, params)
    assert code == status, body
    error = parse("GRPCGatewayError", body).error  # type: ignore[attr-defined]
    assert error.httpCode == status
    return str(error.message)


def otlp(body: dict[str, Any]) -> TracesData:
    """An answer ``{"result": TracesData}`` parsed with protobuf's JSON parser, strictly,
    as Jaeger's ``GRPCGatewayWrapper`` around OTLP's ``TracesData``. The OTLP spec's one
    exception to proto3 JSON, ids as hex rather than base64, is undone first (after
    checking that they are lower-case hex of the right length)."""
    doc = copy.deepcopy(body)
    for rs in doc["result"].get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key, size in (("traceId", 32), ("spanId", 16), ("parentSpanId", 16)):
                    if key in span:
                        assert len(span[key]) == size and span[key] == span[key].lower()
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    data = TracesData()
    data.CopyFrom(parse("GRPCGatewayWrapper", doc).result)  # type: ignore[attr-defined]
    return data


def _spans(data: TracesData) -> list[tuple[str, Any]]:
    out = []
    for rs in data.resource_spans:
        service = next(
            a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
        )
        out.extend((service, span) for ss in rs.scope_spans for span in ss.spans)
    return out


def _found(url: str, **params: str) -> set[str]:
    status, body = _get(url, "/api/v3/traces", {**WINDOW, **params})
    if status == 404:
        assert body == {"error": {"httpCode": 404, "message": "No traces found"}}
        return set()
    assert status == 200, body
    return {span.trace_id.hex() for _, span in _spans(otlp(body))}


def test_services_and_operations(api: Api) -> None:
    url, _ = api
    _, body = _get(url, "/api/v3/services")
    assert list(parse("GetServicesResponse", body).services) == sorted([AGENT, MODEL, RESOURCES])  # type: ignore[attr-defined]
    _, body = _get(url, "/api/v3/operations", {"service": RESOURCES})
    ops = parse("GetOperationsResponse", body).operations  # type: ignore[attr-defined]
    assert {(o.name, o.span_kind) for o in ops} == {
        ("POST /verify", "server"),
        (semconv.SPAN_VERIFY, "internal"),
    }
    for name in ("spanKind", "span_kind"):
        _, body = _get(url, "/api/v3/operations", {"service": AGENT, name: "client"})
        assert {o["name"] for o in body["operations"]} == {"POST /v1/responses", "POST /verify"}
    # no service (or an unknown one): an empty list, written out
    assert _get(url, "/api/v3/operations") == (200, {"operations": []})
    assert _get(url, "/api/v3/operations", {"service": "nope"}) == (200, {"operations": []})


def test_services_of_an_empty_store_is_an_empty_list(tmp_path: Path) -> None:
    write(tmp_path / "traces.db", [])
    with serve(ViewConfig(tmp_path / "traces.db")) as url:
        assert _get(url, "/api/v3/services") == (200, {"services": []})
        assert _get(url, "/api/v3/trace-summaries", WINDOW) == (200, {"summaries": []})


def test_one_trace_is_otlp_json(api: Api) -> None:
    url, ids = api
    status, body = _get(url, f"/api/v3/traces/{ids['4-0']}")
    assert status == 200 and set(body) == {"result"}
    # what Jaeger's grpc-gateway writes: hex ids, enums as integers, 64-bit ints as strings
    first = body["result"]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert isinstance(first["kind"], int) and isinstance(first["startTimeUnixNano"], str)
    data = otlp(body)
    spans = _spans(data)
    assert len(spans) == 7 and {s.trace_id.hex() for _, s in spans} == {ids["4-0"]}
    assert {service for service, _ in spans} == {AGENT, MODEL, RESOURCES}
    verify = next(s for _, s in spans if s.name == semconv.SPAN_VERIFY)
    assert verify.status.code == 2 and verify.status.message == "VerifierCrash: on purpose"
    attrs = {a.key: a.value for a in verify.attributes}
    assert attrs[semconv.ROLLOUT_ID].string_value == "4-0"
    assert attrs[semconv.VERIFY_SUCCEEDED].bool_value is False
    assert verify.end_time_unix_nano - verify.start_time_unix_nano == 24 * MS
    run = next(s for service, s in spans if s.name == "POST /run")
    assert run.kind == 2 and run.parent_span_id == b""
    # the scope is kept with its spans
    scopes = {ss.scope.name for rs in data.resource_spans for ss in rs.scope_spans}
    assert semconv.scope_name(semconv.GROUP_VERIFY) in scopes


def test_trace_id_forms_and_errors(api: Api) -> None:
    url, ids = api
    b64 = base64.b64encode(bytes.fromhex(ids["3-0"])).decode()
    for form in (ids["3-0"].upper(), b64, b64.rstrip("="), ids["0-0"].lstrip("0")):
        assert _get(url, f"/api/v3/traces/{urllib.parse.quote(form, safe='')}")[0] == 200, form
    assert _error(url, "/api/v3/traces/" + "ab" * 16, None, 404) == "No traces found"
    assert "malformed parameter trace_id" in _error(url, "/api/v3/traces/not-an-id!", None, 400)
    path = f"/api/v3/traces/{ids['3-0']}"
    assert _get(url, path, {"startTime": iso(NOW), "end_time": iso(NOW)})[0] == 200
    assert "startTime" in _error(url, path, {"startTime": "yesterday"}, 400)
    assert "start_time" in _error(url, path, {"start_time": "2026-02-30T00:00:00Z"}, 400)
    assert "rawTraces" in _error(url, path, {"rawTraces": "maybe"}, 400)


def test_raw_traces_keeps_every_stored_copy(api: Api) -> None:
    url, ids = api
    path = f"/api/v3/traces/{ids['orphan']}"
    assert len(_spans(otlp(_get(url, path)[1]))) == 1
    for name in ("rawTraces", "raw_traces"):
        assert len(_spans(otlp(_get(url, path, {name: "true"})[1]))) == 2
    _, body = _get(url, "/api/v3/traces", {**WINDOW, "query.operationName": "orphan"})
    assert len(_spans(otlp(body))) == 1
    _, body = _get(
        url, "/api/v3/traces", {**WINDOW, "query.operationName": "orphan", "query.rawTraces": "1"}
    )
    assert len(_spans(otlp(body))) == 2


def test_search_parameters(api: Api) -> None:
    url, ids = api
    rollouts = {ids[f"{i}-0"] for i in range(6)}
    failing = {ids["4-0"], ids["5-0"]}
    rollout = json.dumps({semconv.ROLLOUT_ID: "3-0"})
    assert _found(url, **{"query.serviceName": AGENT, "query.attributes": rollout}) == {ids["3-0"]}
    # no service: any service's span may match
    assert _found(url, **{"query.attributes": rollout}) == {ids["3-0"]}
    assert _found(url, **{"query.service_name": MODEL, "query.attributes": rollout}) == set()
    errors = json.dumps({"error": "true"})
    assert _found(url, **{"query.serviceName": RESOURCES, "query.attributes": errors}) == failing
    no_errors = json.dumps({"error": "false"})
    assert _found(url, **{"query.serviceName": AGENT, "query.attributes": no_errors}) == rollouts
    assert _found(url, **{"query.attributes": json.dumps({"span.status": "ERROR"})}) == failing
    kind = json.dumps({"span.kind": "client", "url.template": "/verify"})
    assert _found(url, **{"query.attributes": kind}) == rollouts
    scope = json.dumps({"scope.name": semconv.scope_name(semconv.GROUP_VERIFY)})
    assert _found(url, **{"query.attributes": scope}) == rollouts
    resource = json.dumps({"resource.service.name": MODEL})
    assert _found(url, **{"query.attributes": resource}) == rollouts | {ids["orphan"]}
    op = {"query.serviceName": AGENT, "query.operationName": semconv.SPAN_ROLLOUT}
    assert _found(url, **op) == rollouts
    assert _found(url, **{"query.operation_name": "nope"}) == set()
    # the agent's /run lasts 100 ms
    assert _found(url, **{"query.serviceName": AGENT, "query.durationMin": "99ms"}) == rollouts
    assert _found(url, **{"query.serviceName": AGENT, "query.duration_min": "101ms"}) == set()
    # the model call lasts 56 ms, the orphan 1 ms
    short = {"query.serviceName": MODEL, "query.durationMax": "0.06s"}
    assert _found(url, **short) == rollouts | {ids["orphan"]}
    # the window is on span start times: rollouts 3, 4 and 5 start after NOW - 97 s
    late = {"query.serviceName": AGENT, "query.startTimeMin": iso(NOW - 97 * S)}
    assert _found(url, **late) == {ids[f"{i}-0"] for i in (3, 4, 5)}
    # both bounds are inclusive, to the nanosecond
    early = {"query.serviceName": AGENT, "query.start_time_max": iso(NOW - 97 * S - 1)}
    early["query.startTimeMax"] = ""  # empty canonical: the deprecated name is read
    assert _found(url, **early) == {ids[f"{i}-0"] for i in (0, 1, 2)}
    for depth in ("query.searchDepth", "query.search_depth", "query.num_traces"):
        _, body = _get(url, "/api/v3/traces", {**WINDOW, "query.serviceName": AGENT, depth: "2"})
        assert {s.trace_id.hex() for _, s in _spans(otlp(body))} == failing


def test_trace_summaries(api: Api) -> None:
    url, ids = api
    status, body = _get(url, "/api/v3/trace-summaries", WINDOW)
    assert status == 200
    summaries = {s.trace_id: s for s in parse("FindTraceSummariesResponse", body).summaries}  # type: ignore[attr-defined]
    assert set(summaries) == set(ids.values())
    failed = summaries[ids["4-0"]]
    start = NOW - 96 * S
    assert (failed.root_service_name, failed.root_operation_name) == (AGENT, "POST /run")
    assert failed.min_start_time_unix_nano == start
    assert failed.max_end_time_unix_nano == start + 100 * MS
    assert (failed.span_count, failed.error_span_count, failed.orphan_span_count) == (7, 5, 0)
    # per service, sorted by name
    assert [(s.name, s.span_count, s.error_span_count) for s in failed.services] == sorted(
        [(AGENT, 4, 3), (MODEL, 1, 0), (RESOURCES, 2, 2)]
    )
    ok = summaries[ids["1-0"]]
    # a count at zero is left out, as proto3 JSON (and Jaeger) writes it
    ok_json = next(s for s in body["summaries"] if s["traceId"] == ids["1-0"])
    assert ok.error_span_count == 0 and "errorSpanCount" not in ok_json
    orphan = summaries[ids["orphan"]]
    assert (orphan.root_service_name, orphan.span_count, orphan.orphan_span_count) == ("", 1, 1)
    # the same search parameters as /traces
    errors = {"query.attributes": json.dumps({"error": "true"})}
    _, body = _get(url, "/api/v3/trace-summaries", {**WINDOW, **errors})
    assert {s["traceId"] for s in body["summaries"]} == {ids["4-0"], ids["5-0"]}


def test_bad_search_parameters_are_400_with_jaegers_message(api: Api) -> None:
    url, _ = api
    for params, text in (
        ({**WINDOW, "query.startTimeMin": "2026-01-01"}, "malformed parameter query.startTimeMin"),
        ({**WINDOW, "query.startTimeMax": "2026-13-01T00:00:00Z"}, "query.startTimeMax"),
        (
            {**WINDOW, "query.startTimeMin": WINDOW["query.startTimeMax"]},
            "query.startTimeMin must be before query.startTimeMax",
        ),
        ({**WINDOW, "query.searchDepth": "many"}, "malformed parameter query.searchDepth"),
        ({**WINDOW, "query.searchDepth": "0"}, "query.searchDepth must be 1 to 1500"),
        ({**WINDOW, "query.search_depth": "1501"}, "query.search_depth must be 1 to 1500"),
        ({**WINDOW, "query.durationMin": "fast"}, "malformed parameter query.durationMin"),
        ({**WINDOW, "query.duration_max": "5"}, "malformed parameter query.duration_max"),
        ({**WINDOW, "query.attributes": "{not json"}, "malformed parameter query.attributes"),
        ({**WINDOW, "query.attributes": '{"a": 1}'}, "malformed parameter query.attributes"),
        ({**WINDOW, "query.attributes": "[]"}, "malformed parameter query.attributes"),
        ({**WINDOW, "query.rawTraces": "yes"}, "malformed parameter query.rawTraces"),
        ({**WINDOW, "query.filter": "{}"}, "query.filter"),
    ):
        for path in ("/api/v3/traces", "/api/v3/trace-summaries"):
            assert text in _error(url, path, params, 400), (path, params)


def test_a_search_without_times_has_no_time_bound(api: Api) -> None:
    # Jaeger answers 400 here; its 2.x UI sends no times for /search?service=S
    url, ids = api
    status, body = _get(url, "/api/v3/trace-summaries", {"query.serviceName": AGENT})
    assert status == 200 and {s["traceId"] for s in body["summaries"]} == {
        ids[f"{i}-0"] for i in range(6)
    }
    only_min = {"query.serviceName": AGENT, "query.startTimeMin": iso(NOW - 97 * S)}
    _, body = _get(url, "/api/v3/trace-summaries", only_min)
    assert {s["traceId"] for s in body["summaries"]} == {ids[f"{i}-0"] for i in (3, 4, 5)}


def test_a_search_says_when_its_scan_bound_stopped_it(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = api
    monkeypatch.setattr(search, "SCAN_TRACES", 3)
    params = {**WINDOW, "query.operationName": "nope"}
    answer = get(f"{url}/api/v3/trace-summaries?{urllib.parse.urlencode(params)}")
    assert answer.json() == {"summaries": []}
    assert answer.headers["x-gym-limit-hit"] == "search_traces=3"
    # as many found as asked for before the bound: not cut
    params.update({"query.operationName": "POST /run", "query.searchDepth": "2"})
    answer = get(f"{url}/api/v3/trace-summaries?{urllib.parse.urlencode(params)}")
    assert len(answer.json()["summaries"]) == 2 and "x-gym-limit-hit" not in answer.headers
    monkeypatch.setattr(search, "SCAN_TRACES", 10_000)
    answer = get(f"{url}/api/v3/trace-summaries?{urllib.parse.urlencode(WINDOW)}")
    assert "x-gym-limit-hit" not in answer.headers
