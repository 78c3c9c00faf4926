"""The Monitor tab's metrics API over a store whose spans end at known times, read over
real HTTP and parsed strictly as Jaeger's ``MetricFamily``: call rates, error fractions
and latency quantiles per step and rate window, grouping by operation, span kinds,
several services, what a window without spans answers, the bounds, and bad input."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from gym_sidecar.query import spm
from gym_sidecar.webui.app import ViewConfig
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.sidecar.query.jaeger_schema import parse
from tests.sidecar.webui.data import SpanSpec, new_id, request, write
from tests.sidecar.webui.serve import get, serve

MS = 1_000_000
S = 1_000_000_000
END_MS = time.time_ns() // MS
END = END_MS * MS
SERVER, CLIENT = Span.SpanKind.SPAN_KIND_SERVER, Span.SpanKind.SPAN_KIND_CLIENT
# 6 points, one a minute from END - 5 min to END, each over the minute before it
WINDOW = {"endTs": str(END_MS), "lookback": "300000", "step": "60000", "ratePer": "60000"}


def _span(
    service: str, name: str, end_ns: int, ms: int, kind: int = SERVER, error: bool = False
) -> SpanSpec:
    start_ns = end_ns - ms * MS
    spec = SpanSpec(service, name, new_id(), start_ns=start_ns, end_ns=end_ns, kind=kind)
    spec.error = "boom" if error else None
    return spec


def rfc3339(ns: int) -> str:
    """proto3 JSON's Timestamp: 0, 3, 6 or 9 fraction digits, as few as exact."""
    text = datetime.fromtimestamp(ns // S, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    frac = ns % S
    if frac:
        digits = 3 if frac % 1_000_000 == 0 else 6 if frac % 1000 == 0 else 9
        text += "." + f"{frac:09d}"[:digits]
    return text + "Z"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("spm") / "traces.db"
    last = [_span("a", "GET /x", END - 30 * S, ms, error=ms == 40) for ms in (10, 20, 30, 40)]
    last.append(_span("a", "GET /y", END, 5))  # ends exactly at END: in
    before = [_span("a", "GET /x", END - 90 * S, ms) for ms in (100, 300)]
    others = [
        _span("a", "GET /x", END + MS, 7),  # ends after END: out
        _span("a", "GET /x", END - 360 * S, 7),  # ends at the first window's start: out
        _span("a", "POST /out", END - 10 * S, 50, kind=CLIENT),
        _span("b", "GET /z", END - 10 * S, 8),
    ]
    tid = new_id(16)
    payloads = [request(tid, [*last, *before, *others])]
    payloads.append(request(tid, last[:1]))  # one span exported twice: counted once
    write(path, payloads, stored_ns=END)
    with serve(ViewConfig(path)) as base:
        yield base


def _get(url: str, metric: str, params: list[tuple[str, str]]) -> tuple[int, Any]:
    answer = get(f"{url}/api/metrics/{metric}?{urllib.parse.urlencode(params)}")
    assert answer.headers["content-type"].startswith("application/json")
    return answer.status, answer.json()


def _family(url: str, metric: str, *extra: tuple[str, str], service: str = "a") -> Any:
    status, body = _get(url, metric, [("service", service), *WINDOW.items(), *extra])
    assert status == 200, body
    parse("MetricFamily", body)  # Jaeger's shape, strictly
    return body


def _values(metric: dict[str, Any]) -> list[float | str]:
    return [p["gaugeValue"]["doubleValue"] for p in metric["metricPoints"]]


def test_calls_errors_and_latencies_per_window(url: str) -> None:
    calls = _family(url, "calls")
    assert (calls["name"], calls["type"]) == ("service_call_rate", "GAUGE")
    assert calls["help"] == "calls/sec, grouped by service"
    [series] = calls["metrics"]
    assert series["labels"] == [{"name": "service_name", "value": "a"}]
    stamps = [p["timestamp"] for p in series["metricPoints"]]
    expected = [END - (300 - 60 * i) * S for i in range(6)]
    assert stamps == [rfc3339(t) for t in expected]
    # last minute: 4 + 1 server spans; the minute before: 2; earlier: none
    assert _values(series) == [0.0, 0.0, 0.0, 0.0, 2 / 60, 5 / 60]
    errors = _family(url, "errors")
    assert errors["name"] == "service_error_rate"
    assert _values(errors["metrics"][0]) == ["NaN"] * 4 + [0.0, 1 / 5]
    median = _family(url, "latencies", ("quantile", "0.5"))
    assert median["name"] == "service_latencies"
    assert median["help"] == "0.50th quantile latency, grouped by service"
    # last minute: 5, 10, 20, 30, 40 ms; the one before: 100, 300 ms
    assert _values(median["metrics"][0]) == ["NaN"] * 4 + [200.0, 20.0]
    p95 = _family(url, "latencies", ("quantile", "0.95"))
    assert _values(p95["metrics"][0])[4:] == [290.0, pytest.approx(38.0)]


def test_group_by_operation_span_kinds_and_services(url: str) -> None:
    grouped = _family(url, "calls", ("groupByOperation", "true"))
    assert grouped["name"] == "service_operation_call_rate"
    assert grouped["help"].endswith("grouped by service & operation")
    by_op = {m["labels"][1]["value"]: _values(m)[-1] for m in grouped["metrics"]}
    assert [m["labels"][0] for m in grouped["metrics"]] == [
        {"name": "service_name", "value": "a"}
    ] * 2
    assert by_op == {"GET /x": 4 / 60, "GET /y": 1 / 60}
    latencies = _family(url, "latencies", ("quantile", "0.5"), ("groupByOperation", "1"))
    assert latencies["name"] == "service_operation_latencies"
    client = _family(url, "calls", ("spanKind", "client"), ("groupByOperation", "true"))
    assert [m["labels"][1]["value"] for m in client["metrics"]] == ["POST /out"]
    both = _family(url, "calls", ("spanKind", "client"), ("spanKind", "server"))
    assert _values(both["metrics"][0])[-1] == 6 / 60
    status, body = _get(url, "calls", [("service", "a"), ("service", "b"), *WINDOW.items()])
    assert status == 200
    assert [(m["labels"][0]["value"], _values(m)[-1]) for m in body["metrics"]] == [
        ("a", 5 / 60),
        ("b", 1 / 60),
    ]
    # a service with no spans: no series
    assert _family(url, "calls", service="nope")["metrics"] == []


def test_minstep_and_defaults(url: str) -> None:
    status, body = _get(url, "minstep", [])
    assert status == 200 and body["data"] == 1 and body["errors"] is None
    # no endTs, lookback, step, ratePer: now, 1 h, 5 s, 10 min (721 points)
    status, body = _get(url, "calls", [("service", "a")])
    assert status == 200 and len(body["metrics"][0]["metricPoints"]) == 721


def test_bad_parameters_are_400_with_a_message(url: str) -> None:
    for metric, params, text in (
        ("calls", [], "please provide at least one service name"),
        ("latencies", [("service", "a")], "unable to parse param 'quantile'"),
        ("latencies", [("service", "a"), ("quantile", "2")], "must be in [0, 1]"),
        ("calls", [("service", "a"), ("spanKind", "sideways")], "unsupported span kind"),
        ("calls", [("service", "a"), ("groupByOperation", "maybe")], "groupByOperation"),
        ("calls", [("service", "a"), ("step", "0")], "'step': must be positive"),
        ("calls", [("service", "a"), ("lookback", "1h")], "'lookback': not an integer"),
        ("calls", [("service", "a"), ("endTs", "now")], "'endTs': not an integer"),
        (
            "calls",
            [("service", "a"), ("lookback", "11000000"), ("step", "1000")],
            "exceeded maximum resolution of 11000 points",
        ),
    ):
        status, body = _get(url, metric, params)
        assert status == 400 and text in body["errors"][0]["msg"], (params, body)
        assert body["data"] is None
    assert _get(url, "sideways", [("service", "a")])[0] == 404


def test_the_span_bound_is_said(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spm, "MAX_SPANS", 3)
    answer = get(f"{url}/api/metrics/calls?{urllib.parse.urlencode({'service': 'a', **WINDOW})}")
    assert answer.headers["x-gym-limit-hit"] == "metrics_spans=3"
    assert sum(_values(answer.json()["metrics"][0])) * 60 <= 3
    monkeypatch.setattr(spm, "MAX_SPANS", 1000)
    answer = get(f"{url}/api/metrics/calls?{urllib.parse.urlencode({'service': 'a', **WINDOW})}")
    assert "x-gym-limit-hit" not in answer.headers
