"""Hypothesis strategies for ExportTraceServiceRequests written at the wire level, so
that they hold what an SDK never sends but a valid request may: unknown fields of every
wire type (groups included) at every level the scanner indexes, known field numbers
with another wire type (unknown fields to the parser), repeated ``resource`` and
``scope`` fields (which merge), schema URLs, empty and absent resources and scopes,
fields in any order, and spans with every attribute value kind and duplicate keys,
with and without exception events (Gym's own telemetry's failures) in Gym's own scope
(``nemo.lens.helpers``, which the gate splits span by span).

Used by the scanner tests (``test_wire.py``) and the pipeline equivalence tests
(``tests/sidecar/test_trace_pipeline_wire.py``).
"""

from __future__ import annotations

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import gym_dialect
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

ROLLOUT_SCOPE = semconv.scope_name(semconv.GROUP_ROLLOUT)
VERIFY_SCOPE = semconv.scope_name(semconv.GROUP_VERIFY)
SANDBOX_SCOPE = semconv.scope_name(semconv.GROUP_SANDBOX)
GYM_SCOPE = gym_dialect.SCOPE_LENS_HELPERS
SCOPE_NAMES = (
    ROLLOUT_SCOPE,
    VERIFY_SCOPE,
    GYM_SCOPE,
    SANDBOX_SCOPE,
    semconv.scope_name(semconv.GROUP_MODEL_CALL),
    semconv.scope_name(semconv.GROUP_HTTP_CLIENT),
    "fastapi",
    "opentelemetry.instrumentation.aiohttp_client",
    "my.lib",
    "",
)
SERVICES = ("svc-a", "svc-b", "nemo-gym/simple_agent")
SPAN_NAMES = (
    semconv.SPAN_ROLLOUT,
    semconv.SPAN_VERIFY,
    semconv.SPAN_ENV_STEP,
    semconv.SPAN_AGENT_RESPONSES,
    semconv.SPAN_MODEL_RESPONSES,
    "POST /run",
)
SPAN_KEYS = (
    semconv.ROLLOUT_NESTED,
    semconv.VERIFY_SUCCEEDED,
    semconv.ERROR_TYPE,
    semconv.ROLLOUT_ID,
    semconv.HTTP_REQUEST_RESEND_COUNT,
    semconv.TARGET_SERVER_NAME,
    semconv.REWARD,
    "x",
)


EVENT_ATTR_KEYS = (gym_dialect.EXCEPTION_TYPE, "exception.message", "x")


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def ld(field: int, body: bytes) -> bytes:
    """A length-delimited field."""
    return tag(field, 2) + varint(len(body)) + body


# -- unknown fields ----------------------------------------------------------------


def _scalar_unknown(field: int) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.integers(0, 2**64 - 1).map(lambda v: tag(field, 0) + varint(v)),
        st.binary(min_size=8, max_size=8).map(lambda b: tag(field, 1) + b),
        st.binary(min_size=4, max_size=4).map(lambda b: tag(field, 5) + b),
        st.binary(max_size=12).map(lambda b: ld(field, b)),
    )


def unknown_field(known: tuple[int, ...]) -> st.SearchStrategy[bytes]:
    """An unknown field: an unused field number of any wire type (a group with fields
    inside too), or one of the message's ``known`` field numbers with a wire type that
    is not its own (length-delimited fields only, in this schema: so a scalar type)."""
    unused = st.integers(16, 3000)
    group = st.tuples(unused, st.lists(unused.flatmap(_scalar_unknown), max_size=2)).map(
        lambda fg: tag(fg[0], 3) + b"".join(fg[1]) + tag(fg[0], 4)
    )
    wrong_type = st.sampled_from(known).flatmap(
        lambda f: st.one_of(
            st.integers(0, 300).map(lambda v: tag(f, 0) + varint(v)),
            st.binary(min_size=4, max_size=4).map(lambda b: tag(f, 5) + b),
        )
    )
    return st.one_of(unused.flatmap(_scalar_unknown), group, wrong_type)


# -- values ------------------------------------------------------------------------


def any_value() -> st.SearchStrategy[AnyValue]:
    return st.one_of(
        st.just(AnyValue()),
        st.booleans().map(lambda v: AnyValue(bool_value=v)),
        st.integers(-(2**63), 2**63 - 1).map(lambda v: AnyValue(int_value=v)),
        st.floats(allow_nan=False).map(lambda v: AnyValue(double_value=v)),
        st.text(max_size=6).map(lambda v: AnyValue(string_value=v)),
        st.binary(max_size=4).map(lambda v: AnyValue(bytes_value=v)),
        st.just(AnyValue(string_value="E" * 300)),
        st.builds(lambda: AnyValue(array_value={"values": [AnyValue(int_value=1)]})),
        st.builds(
            lambda: AnyValue(
                kvlist_value={"values": [KeyValue(key="k", value=AnyValue(bool_value=True))]}
            )
        ),
    )


@st.composite
def spans(draw: st.DrawFn) -> bytes:
    """One serialized Span, sometimes followed by unknown fields."""
    span = Span(name=draw(st.sampled_from(SPAN_NAMES)))
    span.trace_id = draw(st.sampled_from([b"", b"\x01" * 16, bytes(range(16))]))
    span.span_id = draw(st.sampled_from([b"", b"\x02" * 8, bytes(range(8))]))
    start = draw(st.sampled_from([0, 1_700_000_000_000_000_000]))
    span.start_time_unix_nano = start
    span.end_time_unix_nano = start + draw(st.sampled_from([0, 5_000_000, 90_000_000_000]))
    if draw(st.booleans()):
        span.end_time_unix_nano = draw(st.sampled_from([0, 1]))  # before the start
    status = draw(st.sampled_from([None, 0, 1, 2]))
    if status is not None:
        span.status.code = status  # type: ignore[assignment]
        span.status.message = draw(st.sampled_from(["", "boom"]))
    for key in draw(st.lists(st.sampled_from(SPAN_KEYS), max_size=4)):
        span.attributes.append(KeyValue(key=key, value=draw(any_value())))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        event = span.events.add(
            name=draw(st.sampled_from([gym_dialect.EXCEPTION_EVENT, "exception", "log", ""]))
        )
        for key in draw(st.lists(st.sampled_from(EVENT_ATTR_KEYS), max_size=3)):
            event.attributes.append(KeyValue(key=key, value=draw(any_value())))
    data = span.SerializeToString()
    if draw(st.booleans()):
        data += draw(unknown_field((1, 2)))
    return data


@st.composite
def resources(draw: st.DrawFn) -> bytes:
    """One serialized Resource: service.name (a string, another kind, twice or not at
    all) and other keys, sometimes unknown fields."""
    res = Resource()
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(SERVICES))
        value = draw(st.sampled_from(["str", "str", "int"]))
        res.attributes.append(
            KeyValue(
                key=semconv.SERVICE_NAME,
                value=AnyValue(string_value=name) if value == "str" else AnyValue(int_value=7),
            )
        )
    for key in draw(st.lists(st.sampled_from(["team", "k", "deployment.environment.name"]))):
        res.attributes.append(KeyValue(key=key, value=AnyValue(string_value="agent")))
    if draw(st.booleans()):
        res.dropped_attributes_count = draw(st.integers(0, 3))
    data = res.SerializeToString()
    if draw(st.integers(0, 3)) == 0:
        data += draw(unknown_field((1, 2)))
    return data


def _shuffled(draw: st.DrawFn, fields: list[bytes]) -> bytes:
    return b"".join(draw(st.permutations(fields))) if fields else b""


@st.composite
def scope_spans(draw: st.DrawFn) -> bytes:
    """A ScopeSpans body: 0-2 ``scope`` fields (they merge), 0-4 spans, schema_url and
    unknown fields, in any order."""
    fields: list[bytes] = []
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):
        scope = ld(1, draw(st.sampled_from(SCOPE_NAMES)).encode())
        if draw(st.booleans()):
            scope += ld(2, b"1.0")  # version
        fields.append(ld(1, scope))
    fields += [ld(2, s) for s in draw(st.lists(spans(), max_size=4))]
    if draw(st.booleans()):
        fields.append(ld(3, b"https://opentelemetry.io/schemas/1.27.0"))
    fields += draw(st.lists(unknown_field((1, 2, 3)), max_size=2))
    return _shuffled(draw, fields)


@st.composite
def resource_spans(draw: st.DrawFn) -> bytes:
    """A ResourceSpans body: 0-2 ``resource`` fields (they merge), 0-4 ScopeSpans,
    schema_url and unknown fields, in any order."""
    fields = [ld(1, r) for r in draw(st.lists(resources(), max_size=2))]
    fields += [ld(2, s) for s in draw(st.lists(scope_spans(), max_size=4))]
    if draw(st.booleans()):
        fields.append(ld(3, b"https://opentelemetry.io/schemas/1.26.0"))
    fields += draw(st.lists(unknown_field((1, 2, 3)), max_size=2))
    return _shuffled(draw, fields)


@st.composite
def trace_requests(draw: st.DrawFn) -> bytes:
    """A whole ExportTraceServiceRequest: 0-4 ResourceSpans and unknown fields."""
    fields = [ld(1, rs) for rs in draw(st.lists(resource_spans(), max_size=4))]
    fields += draw(st.lists(unknown_field((1,)), max_size=2))
    return _shuffled(draw, fields)
