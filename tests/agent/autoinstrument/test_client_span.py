"""The CLIENT span of a Gym hop: named and given its status by the HTTP semconv.

Each test drives ``client_span`` the way Gym 0.7.0's ``server_utils._traced_request``
does: open ``HTTP <METHOD>``, set ``http.request.method`` / ``url.full`` (query already
stripped by Gym), run the request, then set ``http.response.status_code``.
"""

from __future__ import annotations

from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry.autoinstrument.gym_primitives import (
    MAX_ROUTE_CHARS,
    client_span,
    safe_set_span_attributes,
    url_template,
)
from opentelemetry.trace import SpanKind, StatusCode

from tests.agent.conftest import Spans

BASE = "http://127.0.0.1:8000"


def _hop(url: str, status: int | None, method: str = "POST", exc: Exception | None = None) -> None:
    with client_span(f"HTTP {method}") as span:
        safe_set_span_attributes(span, {semconv.HTTP_REQUEST_METHOD: method, semconv.URL_FULL: url})
        if exc is not None:
            raise exc
        if status is not None:
            safe_set_span_attributes(span, {semconv.HTTP_RESPONSE_STATUS_CODE: status})


def _client(spans: Spans) -> Any:
    [span] = [s for s in spans.all() if s.kind == SpanKind.CLIENT]
    return span


@pytest.mark.parametrize("status", [400, 404, 500, 503])
def test_4xx_and_5xx_responses_mark_the_client_span_as_an_error(spans: Spans, status: int) -> None:
    _hop(f"{BASE}/verify", status)
    span = _client(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[semconv.ERROR_TYPE] == str(status)
    assert span.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == status


@pytest.mark.parametrize("status", [200, 204, 302])
def test_other_responses_leave_the_status_unset(spans: Spans, status: int) -> None:
    _hop(f"{BASE}/verify", status)
    span = _client(spans)
    assert span.status.status_code == StatusCode.UNSET
    assert semconv.ERROR_TYPE not in span.attributes


def test_a_transport_error_keeps_the_exception_type(spans: Spans) -> None:
    with pytest.raises(ConnectionResetError):
        _hop(f"{BASE}/verify", None, exc=ConnectionResetError("peer went away"))
    span = _client(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[semconv.ERROR_TYPE] == "ConnectionResetError"
    assert span.name == "POST /verify"


@pytest.mark.parametrize(
    ("path", "name", "template"),
    [
        ("/verify", "POST /verify", "/verify"),
        ("/seed_session", "POST /seed_session", "/seed_session"),
        ("/get_weather", "POST /get_weather", "/get_weather"),
        ("/v1/responses", "POST /v1/responses", "/v1/responses"),
        (
            "/ng-rollout/r-42.a_b/v1/responses",
            "POST /ng-rollout/{rollout_id}/v1/responses",
            "/ng-rollout/{rollout_id}/v1/responses",
        ),
        (
            "/ng-rollout/7/verify",
            "POST /ng-rollout/{rollout_id}/verify",
            "/ng-rollout/{rollout_id}/verify",
        ),
    ],
)
def test_gym_routes_name_the_span_method_and_template(
    spans: Spans, path: str, name: str, template: str
) -> None:
    _hop(BASE + path, 200)
    span = _client(spans)
    assert span.name == name
    assert span.attributes[semconv.URL_TEMPLATE] == template
    assert span.kind == SpanKind.CLIENT


@pytest.mark.parametrize(
    "path",
    [
        "/v1/files/file-abc123",  # an id
        "/items/12345",
        "/sessions/3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b",
        "/verify?task=1",  # a query
        "/verify#frag",
        "/verify/",  # empty segment
        "/",
        "/ng-rollout/abc",  # prefix without a route
        "/ng-rollout//verify",  # empty id
        "/ng-rollout/abc/items/99",
        "/a/b/c/d/e",  # too many segments
        "/" + "x" * MAX_ROUTE_CHARS,  # too long
        "/caf\u00e9",
    ],
)
def test_other_paths_fall_back_to_the_method(spans: Spans, path: str) -> None:
    _hop(BASE + path, 200)
    span = _client(spans)
    assert span.name == "POST"
    assert semconv.URL_TEMPLATE not in span.attributes


def test_url_template_edges() -> None:
    assert url_template("http://127.0.0.1:8000") is None
    assert url_template("/verify") == "/verify"
    assert url_template("verify") is None


def test_an_unknown_method_reads_http(spans: Spans) -> None:
    _hop(f"{BASE}/verify", 200, method="FROB")
    assert _client(spans).name == "HTTP /verify"


def test_a_span_without_url_keeps_its_name(spans: Spans) -> None:
    with client_span("custom call") as span:
        safe_set_span_attributes(span, {semconv.HTTP_RESPONSE_STATUS_CODE: 500})
    span_data = _client(spans)
    assert span_data.name == "custom call"
    assert span_data.status.status_code == StatusCode.ERROR


def test_odd_attribute_values_never_raise(spans: Spans) -> None:
    with client_span("HTTP POST") as span:
        span.set_attributes(
            {
                semconv.HTTP_REQUEST_METHOD: "POST",
                semconv.URL_FULL: "http://h/verify",
                semconv.HTTP_RESPONSE_STATUS_CODE: "500",  # not an int: no status
            }
        )
    span_data = _client(spans)
    assert span_data.name == "POST /verify"
    assert span_data.status.status_code == StatusCode.UNSET
