"""The Jaeger-compatible query API over a store, read over real HTTP: the JSON shape
Jaeger's UI and Grafana's Jaeger data source read, and each search parameter.

(The same API against the same assertions as the real Jaeger v2, after a real Gym run:
tests/backends/test_jaeger_prometheus.py.)"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.query.search import SearchError, parse_go_duration
from gym_sidecar.webui.app import ViewConfig

from tests.sidecar.webui.data import AGENT, MODEL, RESOURCES, gym_trace, request, write
from tests.sidecar.webui.serve import get, serve

NOW = time.time_ns()
S = 1_000_000_000


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    path = tmp_path_factory.mktemp("query") / "traces.db"
    ids: dict[str, str] = {}
    payloads = []
    for i in range(6):
        tid, specs = gym_trace(f"{i}-0", NOW - (100 - i) * S, fail_verify=i >= 4)
        if i == 0:
            tid, specs = gym_trace("0-0", NOW - 100 * S, trace_id=bytes(2) + tid[2:])
        ids[f"{i}-0"] = tid.hex()
        payloads.append(request(tid, specs))
    write(path, payloads)
    with serve(ViewConfig(path)) as url:
        yield url, ids


def _get(url: str, path: str, **params: str) -> tuple[int, Any]:
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    answer = get(url + path + query)
    assert answer.headers["content-type"].startswith("application/json")
    return answer.status, answer.json()


def _search(url: str, **params: str) -> set[str]:
    status, body = _get(url, "/api/traces", **params)
    assert status == 200, body
    return {t["traceID"] for t in body["data"]}


def test_services_and_operations(api: tuple[str, dict[str, str]]) -> None:
    url, _ = api
    status, body = _get(url, "/api/services")
    assert status == 200
    assert body["data"] == sorted([AGENT, MODEL, RESOURCES]) and body["total"] == 3
    assert body["errors"] is None
    _, ops = _get(url, f"/api/services/{urllib.parse.quote(RESOURCES, safe='')}/operations")
    assert ops["data"] == ["POST /verify", semconv.SPAN_VERIFY]
    _, ops2 = _get(url, "/api/operations", service=AGENT, spanKind="client")
    assert {o["name"] for o in ops2["data"]} == {"POST /v1/responses", "POST /verify"}
    assert {o["spanKind"] for o in ops2["data"]} == {"client"}


def test_trace_shape(api: tuple[str, dict[str, str]]) -> None:
    url, ids = api
    status, body = _get(url, f"/api/traces/{ids['4-0']}")
    assert status == 200 and set(body) == {"data", "total", "limit", "offset", "errors"}
    [trace] = body["data"]
    assert trace["traceID"] == ids["4-0"] and len(trace["spans"]) == 7
    services = {p["serviceName"] for p in trace["processes"].values()}
    assert services == {AGENT, MODEL, RESOURCES}
    spans = {s["operationName"]: s for s in trace["spans"] if s["operationName"].startswith("gym.")}
    verify = spans[semconv.SPAN_VERIFY]
    assert set(verify) >= {
        "traceID",
        "spanID",
        "flags",
        "operationName",
        "references",
        "startTime",
        "duration",
        "tags",
        "logs",
        "processID",
        "warnings",
    }
    tags = {t["key"]: t for t in verify["tags"]}
    assert tags["error"] == {"key": "error", "type": "bool", "value": True}
    assert tags["otel.status_code"]["value"] == "ERROR"
    assert tags["otel.status_description"]["value"] == "VerifierCrash: on purpose"
    assert tags[semconv.VERIFY_SUCCEEDED] == {"key": "succeeded", "type": "bool", "value": False}
    assert tags["otel.scope.name"]["value"] == semconv.scope_name(semconv.GROUP_VERIFY)
    [ref] = verify["references"]
    assert ref["refType"] == "CHILD_OF" and ref["traceID"] == ids["4-0"]
    assert trace["processes"][verify["processID"]]["serviceName"] == RESOURCES
    assert isinstance(verify["startTime"], int) and verify["duration"] == 24_000  # µs
    run = next(s for s in trace["spans"] if s["operationName"] == "POST /run")
    assert run["references"] == []
    assert {t["key"]: t["value"] for t in run["tags"]}["span.kind"] == "server"


def test_unknown_and_malformed_trace_ids(api: tuple[str, dict[str, str]]) -> None:
    url, ids = api
    status, body = _get(url, "/api/traces/" + "ab" * 16)
    assert status == 404 and body["data"] is None
    assert body["errors"] == [{"code": 404, "msg": "trace not found"}]
    assert _get(url, "/api/traces/not-hex")[0] == 400
    # Jaeger drops leading zeros: both spellings name the trace
    assert _get(url, "/api/traces/" + ids["0-0"].lstrip("0"))[0] == 200


def test_search_by_tags_operation_durations_time_and_limit(api: tuple[str, dict[str, str]]) -> None:
    url, ids = api
    assert _search(url, service=AGENT, tags=json.dumps({semconv.ROLLOUT_ID: "3-0"})) == {ids["3-0"]}
    assert _search(url, service=AGENT, tag=f"{semconv.ROLLOUT_ID}:3-0") == {ids["3-0"]}
    # the rollout id is on the agent's rollout span: the model server has no such span
    assert _search(url, service=MODEL, tags=json.dumps({semconv.ROLLOUT_ID: "3-0"})) == set()
    failing = {ids["4-0"], ids["5-0"]}
    assert _search(url, service=RESOURCES, tags='{"error":"true"}') == failing
    assert _search(url, service=AGENT, tags='{"error":"true"}') == failing
    assert _search(url, service=MODEL, tags='{"error":"true"}') == set()
    ok = set(ids.values()) - failing
    # error=false: traces with a span that is not an error (every trace has one)
    assert _search(url, service=MODEL, tags='{"error":"false"}') == set(ids.values())
    assert _search(url, service=RESOURCES, tags='{"succeeded":"true"}') == ok
    assert (
        _search(url, service=RESOURCES, tags=json.dumps({semconv.ERROR_TYPE: "VerifierCrash"}))
        == failing
    )
    assert _search(url, service=AGENT, operation=semconv.SPAN_ROLLOUT) == set(ids.values())
    assert _search(url, service=AGENT, operation="nope") == set()
    # the agent's /run lasts 100 ms, its model call 58 ms
    assert _search(url, service=AGENT, minDuration="99ms") == set(ids.values())
    assert _search(url, service=AGENT, minDuration="101ms") == set()
    assert _search(url, service=MODEL, maxDuration="50ms") == set()
    assert _search(url, service=MODEL, maxDuration="0.06s") == set(ids.values())
    start_us = (NOW - 97 * S) // 1000
    assert _search(url, service=AGENT, start=str(start_us)) == {ids[f"{i}-0"] for i in (3, 4, 5)}
    assert _search(url, service=AGENT, end=str(start_us)) == {ids[f"{i}-0"] for i in (0, 1, 2)}
    _, body = _get(url, "/api/traces", service=AGENT, limit="2")
    assert len(body["data"]) == 2
    assert {t["traceID"] for t in body["data"]} == {ids["5-0"], ids["4-0"]}  # newest first


def test_bad_search_parameters_are_400_with_a_message(api: tuple[str, dict[str, str]]) -> None:
    url, _ = api
    for params, text in (
        ({}, "'service' is required"),
        ({"service": AGENT, "tags": "{not json"}, "malformed 'tags'"),
        ({"service": AGENT, "minDuration": "fast"}, "not a duration"),
        ({"service": AGENT, "limit": "many"}, "limit must be an integer"),
    ):
        status, body = _get(url, "/api/traces", **params)
        assert status == 400 and text in body["errors"][0]["msg"], (params, body)


def test_go_durations() -> None:
    assert parse_go_duration("1h2m3.5s") == (3600 + 120 + 3.5) * S
    assert parse_go_duration("250us") == parse_go_duration("250µs") == 250_000
    assert parse_go_duration("1.5ms") == 1_500_000
    for bad in ("", "5", "1x", "ms"):
        with pytest.raises(SearchError):
            parse_go_duration(bad)


def test_search_by_trace_ids_needs_no_service(api: tuple[str, dict[str, str]]) -> None:
    url, ids = api
    query = urllib.parse.urlencode([("traceID", ids["1-0"]), ("traceID", ids["4-0"].upper())])
    status, body = _get(url, "/api/traces?" + query)
    assert status == 200 and body["errors"] is None
    assert [t["traceID"] for t in body["data"]] == [ids["1-0"], ids["4-0"]]
    assert all(len(t["spans"]) == 7 for t in body["data"])
    # an id that is not stored: the others are still answered, with Jaeger's error entry
    unknown = "ab" * 16
    query = urllib.parse.urlencode([("traceID", unknown), ("traceID", ids["0-0"].lstrip("0"))])
    status, body = _get(url, "/api/traces?" + query)
    assert status == 200 and [t["traceID"] for t in body["data"]] == [ids["0-0"]]
    assert body["errors"] == [{"msg": "trace not found", "traceID": unknown}]
    status, body = _get(url, "/api/traces?traceID=zz")
    assert status == 400 and "cannot parse traceID param" in body["errors"][0]["msg"]
    too_many = urllib.parse.urlencode([("traceID", f"{i:x}") for i in range(1501)])
    status, body = _get(url, "/api/traces?" + too_many)
    assert status == 400 and "at most 1500 traceID" in body["errors"][0]["msg"]


def test_dependencies_are_the_service_maps_calls(api: tuple[str, dict[str, str]]) -> None:
    url, _ = api
    end_ms = str(time.time_ns() // 1_000_000 + 60_000)
    status, body = _get(url, "/api/dependencies", endTs=end_ms, lookback="3600000")
    assert status == 200 and set(body) == {"data", "total", "limit", "offset", "errors"}
    # every rollout: the agent calls the model once and the resources server once
    assert body["data"] == [
        {"parent": AGENT, "child": MODEL, "callCount": 6},
        {"parent": AGENT, "child": RESOURCES, "callCount": 6},
    ]
    _, body = _get(url, "/api/dependencies", endTs=end_ms, lookback="3600000", service=MODEL)
    assert body["data"] == [{"parent": AGENT, "child": MODEL, "callCount": 6}]
    # no parameters: the last 24 hours up to now
    assert len(_get(url, "/api/dependencies")[1]["data"]) == 2
    # the window is on stored times: nothing was stored an hour ago
    old_ms = str(int(end_ms) - 3_600_000)
    assert _get(url, "/api/dependencies", endTs=old_ms, lookback="60000")[1]["data"] == []
    for params, text in (
        ({"endTs": "now"}, "unable to parse param 'endTs'"),
        ({"lookback": "1h"}, "unable to parse param 'lookback'"),
        ({"lookback": "0"}, "must be positive"),
    ):
        status, body = _get(url, "/api/dependencies", **params)
        assert status == 400 and text in body["errors"][0]["msg"], params


def test_dependencies_say_when_their_trace_bound_cut_them(
    api: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_sidecar.query import dependencies

    url, _ = api
    monkeypatch.setattr(dependencies, "DEPENDENCY_TRACES", 2)
    answer = get(url + "/api/dependencies")
    calls = {(d["parent"], d["child"]): d["callCount"] for d in answer.json()["data"]}
    assert calls == {(AGENT, MODEL): 2, (AGENT, RESOURCES): 2}
    assert answer.headers["x-gym-limit-hit"] == "dependency_traces=2"
    monkeypatch.setattr(dependencies, "DEPENDENCY_TRACES", 500)
    assert "x-gym-limit-hit" not in get(url + "/api/dependencies").headers
