"""``extract_parent`` parses the common ``traceparent`` form itself: it must accept and
reject exactly what the SDK's W3C propagator does, and give the same parent."""

from __future__ import annotations

import pytest
from gym_telemetry.autoinstrument.propagation import extract_parent
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
HEADERS = [
    f"00-{TRACE}-{SPAN}-01",
    f"00-{TRACE}-{SPAN}-00",
    f"00-{TRACE}-{SPAN}-03",
    f"00-{TRACE}-{SPAN}-ff",
    f"00-{'0' * 32}-{SPAN}-01",
    f"00-{TRACE}-{'0' * 16}-01",
    f"00-{TRACE.upper()}-{SPAN}-01",
    f"00-{TRACE}-{SPAN}-01-extra",
    f"01-{TRACE}-{SPAN}-01-extra",
    f"ff-{TRACE}-{SPAN}-01",
    f" 00-{TRACE}-{SPAN}-01 ",
    f"00-{TRACE[:-1]}-{SPAN}-01",
    f"00-{TRACE}-{SPAN}-1",
    "garbage",
    "",
]


@pytest.mark.parametrize("header", HEADERS)
@pytest.mark.parametrize("tracestate", [None, b"vendor=value"])
def test_same_parent_as_the_sdk_propagator(header: str, tracestate: bytes | None) -> None:
    carrier = {"traceparent": header}
    if tracestate:
        carrier["tracestate"] = tracestate.decode()
    expected = get_current_span(TraceContextTextMapPropagator().extract(carrier))
    expected_context = expected.get_span_context()
    parent = extract_parent(header.encode(), tracestate)
    if not expected_context.is_valid:
        assert parent is None
        return
    assert parent is not None
    got = get_current_span(parent).get_span_context()
    assert got == expected_context
    assert got.is_remote and int(got.trace_flags) == int(expected_context.trace_flags)
    assert got.trace_state.to_header() == expected_context.trace_state.to_header()
