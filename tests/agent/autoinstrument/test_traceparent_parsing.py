"""``extract_parent`` parses the common ``traceparent`` form itself: it must accept and
reject exactly what the SDK's W3C propagator does, and give the same parent."""

from __future__ import annotations

import pytest
from gym_telemetry.autoinstrument.propagation import extract_parent
from hypothesis import given, settings
from hypothesis import strategies as st
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


_CHARS = "0123456789abcdefABCDEF-g ."


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    position=st.integers(min_value=0, max_value=54),
    char=st.sampled_from(_CHARS),
    trace=st.integers(min_value=0, max_value=2**128 - 1),
    span=st.integers(min_value=0, max_value=2**64 - 1),
    flags=st.integers(min_value=0, max_value=255),
    cut=st.integers(min_value=-2, max_value=2),
)
def test_one_changed_byte_is_parsed_as_the_sdk_propagator_does(
    position: int, char: str, trace: int, span: int, flags: int, cut: int
) -> None:
    """The version-00 form is read by position: any one byte changed (a dash, a letter's
    case, a non-hex digit, a space), or the header cut or lengthened, must be accepted or
    refused as the SDK's regex does."""
    header = f"00-{trace:032x}-{span:016x}-{flags:02x}"
    header = header[:position] + char + header[position + 1 :]
    header = header[: len(header) + cut] if cut < 0 else header + "0" * cut
    test_same_parent_as_the_sdk_propagator(header, None)
