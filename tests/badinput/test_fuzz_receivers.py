"""Property-based bad input against both receivers of one real ``gym-sidecar`` process.

Hypothesis generates random bytes, truncated and garbled protobuf, deeply nested and
oversized values, invalid UTF-8, bad JSON, wrong content types and encodings; fixed
cases add 100k attributes and gzip bombs. Every input must be accepted (HTTP 200, gRPC
OK) or answered with a clear refusal (HTTP 400/413/415, gRPC INVALID_ARGUMENT; a gRPC
message that grpc core itself refuses while inflating is RESOURCE_EXHAUSTED, see
docs/sidecar.md). After each input ``/healthz`` answers; at the end the process's peak
memory growth is bounded and canary spans accepted *before* the fuzzing (held in the
queue by a backend that refuses them for a while) and after it arrive intact.

Example counts are bounded (``GYM_BADINPUT_EXAMPLES`` scales them; default 8) so the
module runs in one to two minutes.
"""

from __future__ import annotations

import gzip
import json
import os
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import SERVICES, deep_json_text, trace_request, trace_request_json
from testkit.sink import RecordingSink
from tests.faults.support import rss_kib
from tests.support.sidecar_proc import SidecarProcess

KiB = 1024
MiB = 1024 * KiB
SCALE = float(os.environ.get("GYM_BADINPUT_EXAMPLES", "8"))
LIMITS = {
    "http_max_body_bytes": 4 * MiB,
    "http_max_decompressed_bytes": 16 * MiB,
    "grpc_max_message_bytes": 16 * MiB,
    "grpc_transport_max_bytes": 32 * MiB,
}
RSS_GROWTH_LIMIT_KIB = 8 * LIMITS["grpc_transport_max_bytes"] // KiB
"""Peak memory the suite may add: 8x the gRPC transport limit (grpc core's buffers, the
Python copy, and the allocator's per-thread arenas each hold large messages; a 20 MiB
refused message costs ~180 MiB of peak RSS here). Before the receiver stopped using
``context.abort`` for refusals, refused messages piled up to ~800 MiB."""

HTTP_OK = {200}
HTTP_REFUSED = {400, 413, 415}
HTTP_BACKPRESSURE = 429
"""Accepted inputs pile up in the queue while the backend refuses the first exports, and
large ones can fill it: then the documented answer is 429 with Retry-After (queue full),
which ``post`` accepts only with that header and counts apart."""
GRPC_REFUSED = {grpc.StatusCode.INVALID_ARGUMENT}

TRIED: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def fuzz_settings(n: int) -> Any:
    return settings(
        max_examples=examples(n),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


class Target:
    """The sidecar under test, its sink and clients."""

    def __init__(self, sc: SidecarProcess, sink: RecordingSink) -> None:
        self.sc = sc
        self.sink = sink
        self.http = httpx.Client(base_url=sc.http_url, timeout=30)
        self.channel = grpc.insecure_channel(
            sc.grpc_endpoint, options=[("grpc.max_send_message_length", 128 * MiB)]
        )
        assert sc.proc is not None
        self.pid = sc.proc.pid
        self.base_hwm_kib = 0
        self.base_rss_kib = 0

    def post(
        self,
        category: str,
        body: bytes,
        content_type: str | bytes,
        *,
        signal: str = "traces",
        **h: str,
    ) -> int:
        headers: dict[str, str | bytes] = {"Content-Type": content_type, **h}
        response = self.http.post(f"/v1/{signal}", content=body, headers=headers)
        status = response.status_code
        TRIED[category] += 1
        OUTCOMES[f"http {status}"] += 1
        if status == HTTP_BACKPRESSURE:
            assert float(response.headers["Retry-After"]) > 0, (category, response.headers)
        else:
            assert status in HTTP_OK | HTTP_REFUSED, (category, status)
        self.assert_up()
        return status

    def grpc(
        self,
        category: str,
        body: bytes,
        *,
        signal: str = "traces",
        compression: grpc.Compression | None = None,
        allowed: set[grpc.StatusCode] = GRPC_REFUSED,
    ) -> grpc.StatusCode:
        call = self.channel.unary_unary(f"/{SERVICES[signal]}/Export")
        try:
            call(body, timeout=30, compression=compression)
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
            assert code in allowed, (category, code, err.details())
            assert err.details(), "a refusal says why"
        TRIED[category] += 1
        OUTCOMES[f"grpc {code.name}"] += 1
        self.assert_up()
        return code

    def post_until_accepted(self, category: str, body: bytes, content_type: str) -> int:
        """``post``, retried after Retry-After while the queue pushes back, as a client does."""
        for _ in range(30):
            status = self.post(category, body, content_type)
            if status != HTTP_BACKPRESSURE:
                return status
            time.sleep(2)
        return status

    def grpc_until_accepted(self, category: str, body: bytes) -> grpc.StatusCode:
        """``grpc``, retried while the queue pushes back (RESOURCE_EXHAUSTED), as a client does."""
        allowed = GRPC_REFUSED | {grpc.StatusCode.RESOURCE_EXHAUSTED}
        for _ in range(30):
            code = self.grpc(category, body, allowed=allowed)
            if code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                return code
            time.sleep(2)
        return code

    def assert_up(self) -> None:
        assert self.sc.proc is not None and self.sc.proc.poll() is None, "sidecar died"
        assert self.sc.admin_get("/healthz")[0] == 200


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with RecordingSink() as sink:
        # The backend refuses the first exports for a while: the canaries accepted
        # before the fuzzing sit in the queue while it runs.
        sink.fail_next(2, grpc.StatusCode.UNAVAILABLE, retry_after_s=8)
        config = {"limits": LIMITS, "queue": {"retry_max_interval_s": 8}}
        with SidecarProcess(backend=sink.endpoint, config=config) as sc:
            t = Target(sc, sink)
            t.base_hwm_kib = rss_kib(t.pid, "VmHWM")
            t.base_rss_kib = rss_kib(t.pid)
            assert t.post("canary", CANARY_BEFORE.SerializeToString(), PB) == 200
            assert t.grpc("canary", CANARY_BEFORE_GRPC.SerializeToString()) == grpc.StatusCode.OK
            yield t
            t.http.close()
            t.channel.close()
        assert sc.returncode == 0, sc.log_text()[-3000:]


PB = "application/x-protobuf"
JSON = "application/json"
CANARY_BEFORE = trace_request("canary-before-http", 20)
CANARY_BEFORE_GRPC = trace_request("canary-before-grpc", 20)
VALID = trace_request("valid", 30).SerializeToString()


# -- encoders for inputs the protobuf library will not build -----------------------------
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def nested_any_value(depth: int) -> bytes:
    """AnyValue{kvlist{KeyValue{key, AnyValue{kvlist{...}}}}} ``depth`` levels deep."""
    value = field(1, b"leaf")  # AnyValue.string_value
    for _ in range(depth):
        kv = field(1, b"k") + field(2, value)  # KeyValue.key, KeyValue.value
        value = field(6, field(1, kv))  # AnyValue.kvlist_value.values
    return value


def request_with_attribute_value(any_value: bytes, name: bytes = b"s") -> bytes:
    """ExportTraceServiceRequest{resource_spans{scope_spans{spans{name, attributes}}}}."""
    span = (
        field(1, bytes(16))
        + field(2, (1).to_bytes(8, "big"))
        + field(5, name)
        + field(9, field(1, b"attr") + field(2, any_value))
    )
    return field(1, field(2, field(2, span)))


# -- properties ---------------------------------------------------------------------------
@fuzz_settings(150)
@given(body=st.binary(max_size=4096), signal=st.sampled_from(["traces", "metrics", "logs"]))
def test_random_bytes(target: Target, body: bytes, signal: str) -> None:
    target.post("random bytes", body, PB, signal=signal)
    target.post("random bytes", body, JSON, signal=signal)
    target.grpc("random bytes", body, signal=signal)


@fuzz_settings(150)
@given(data=st.data())
def test_truncated_and_garbled_protobuf(target: Target, data: st.DataObject) -> None:
    body = bytearray(VALID)
    how = data.draw(st.sampled_from(["truncate", "flip", "splice"]))
    if how == "truncate":
        body = body[: data.draw(st.integers(0, len(body) - 1))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(body) - 1))
            body[i] ^= data.draw(st.integers(1, 255))
    else:
        i = data.draw(st.integers(0, len(body)))
        body[i:i] = data.draw(st.binary(min_size=1, max_size=64))
    target.post("garbled protobuf", bytes(body), PB)
    target.grpc("garbled protobuf", bytes(body))


@fuzz_settings(40)
@given(depth=st.integers(1, 2000))
def test_deeply_nested_values(target: Target, depth: int) -> None:
    body = request_with_attribute_value(nested_any_value(depth))
    target.post("deeply nested", body, PB)
    target.grpc("deeply nested", body)


PARSER_MAX_LEVELS = {"kvlist": 31, "array": 47}
"""The deepest span-attribute nesting within the default ``max_message_depth`` (100
message levels, upb's own bound): 31 kvlists (3 levels each) or 47 arrays (2 each)."""


@fuzz_settings(40)
@given(
    depth=st.integers(1, 3000),
    shape=st.sampled_from(["kvlist", "array", "raw arrays", "raw objects"]),
)
def test_deeply_nested_json(target: Target, depth: int, shape: str) -> None:
    """OTLP/JSON nested up to 3000 levels (json.loads alone stops near 1000 with a
    RecursionError, once answered 500): accepted within the limit, 400 beyond it."""
    status = target.post("deeply nested (json)", deep_json_text(depth, shape), JSON)
    if shape in PARSER_MAX_LEVELS and depth <= PARSER_MAX_LEVELS[shape]:
        assert status in {200, HTTP_BACKPRESSURE}, (shape, depth, status)
    elif shape in PARSER_MAX_LEVELS or depth > 2 * 100:
        assert status == 400, (shape, depth, status)


@fuzz_settings(12)
@given(size=st.integers(1, 24 * MiB), where=st.sampled_from(["value", "name"]))
def test_oversized_values(target: Target, size: int, where: str) -> None:
    big = b"v" * size
    if where == "value":
        body = request_with_attribute_value(field(1, big))
    else:
        body = request_with_attribute_value(field(1, b"x"), name=big)
    status = target.post("oversized value", body, PB)
    assert status in {200, 413, HTTP_BACKPRESSURE}
    code = target.grpc(
        "oversized value",
        body,
        allowed={grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED},
    )
    if size > LIMITS["grpc_max_message_bytes"]:
        assert code != grpc.StatusCode.OK


def _invalid_utf8() -> st.SearchStrategy[bytes]:
    def bad(b: bytes) -> bool:
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False

    return st.binary(min_size=1, max_size=32).filter(bad)


@fuzz_settings(80)
@given(raw=_invalid_utf8(), where=st.sampled_from(["value", "name", "key"]))
def test_invalid_utf8_strings(target: Target, raw: bytes, where: str) -> None:
    if where == "value":
        body = request_with_attribute_value(field(1, raw))
    elif where == "name":
        body = request_with_attribute_value(field(1, b"ok"), name=raw)
    else:
        span = field(1, bytes(16)) + field(2, bytes(8)) + field(9, field(1, raw))
        body = field(1, field(2, field(2, span)))
    target.post("invalid utf-8 (protobuf)", body, PB)
    target.grpc("invalid utf-8 (protobuf)", body)
    doc = json.dumps(trace_request_json("utf8", 1)).encode()
    target.post("invalid utf-8 (json)", doc.replace(b"utf8-0", raw), JSON)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=40,
)


@fuzz_settings(150)
@given(data=st.data())
def test_bad_json(target: Target, data: st.DataObject) -> None:
    how = data.draw(st.sampled_from(["value", "otlp-shaped", "text", "cut"]))
    if how == "value":
        body = json.dumps(data.draw(_json_values)).encode()
    elif how == "otlp-shaped":
        doc: Any = trace_request_json("j", 2)
        span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        key = data.draw(st.sampled_from(sorted(span)))
        span[key] = data.draw(_json_values)
        body = json.dumps(doc).encode()
    elif how == "text":
        body = data.draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    else:
        full = json.dumps(trace_request_json("j", 3)).encode()
        body = full[: data.draw(st.integers(0, len(full) - 1))]
    target.post("bad json", body, JSON)


@fuzz_settings(100)
@given(
    content_type=st.binary(max_size=40).map(
        # bytes an HTTP client can put in a header value (visible ASCII, space, obs-text)
        lambda b: bytes(c for c in b if c == 0x20 or 0x21 <= c <= 0x7E or c >= 0x80).strip()
    ),
    encoding=st.sampled_from(["", "gzip", "br", "deflate", "zstd", "GZIP", "gzip, gzip", "x"]),
)
def test_wrong_content_type_and_encoding(
    target: Target, content_type: bytes, encoding: str
) -> None:
    body = gzip.compress(VALID) if encoding.lower().startswith("gzip") else VALID
    headers = {"Content-Encoding": encoding} if encoding else {}
    target.post("content type / encoding", body, content_type, **headers)


# -- fixed cases --------------------------------------------------------------------------
def test_100k_attributes(target: Target) -> None:
    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes(range(16)), bytes(range(8)), "wide"
    for i in range(100_000):
        kv = span.attributes.add()
        kv.key = f"attr.{i}"
        kv.value.string_value = f"value-{i}"
    body = req.SerializeToString()
    assert target.post_until_accepted("100k attributes", body, PB) == 200
    assert target.grpc_until_accepted("100k attributes", body) == grpc.StatusCode.OK
    assert target.sink.wait_for(
        lambda: sum(1 for s in target.sink.spans() if s.span.name == "wide") == 2, 30
    )
    wide = next(s for s in target.sink.spans() if s.span.name == "wide")
    assert len(wide.span.attributes) >= 100_000


def gzip_bomb(inflated: int) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(MiB)
    return b"".join([comp.compress(chunk) for _ in range(inflated // MiB)] + [comp.flush()])


def test_gzip_bombs(target: Target) -> None:
    bomb = gzip_bomb(1024 * MiB)  # 1 GiB of zeros in ~1 MiB
    assert target.post("gzip bomb", bomb, PB, **{"Content-Encoding": "gzip"}) == 413
    assert target.post("gzip bomb", bomb, JSON, **{"Content-Encoding": "gzip"}) == 413
    # gRPC: a 64 MiB message the client gzips; grpc core stops inflating at its limit.
    code = target.grpc(
        "gzip bomb",
        bytes(64 * MiB),
        compression=grpc.Compression.Gzip,
        allowed={grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT},
    )
    assert code != grpc.StatusCode.OK


def test_refused_large_grpc_messages_do_not_pile_up(target: Target) -> None:
    """30 messages just over ``grpc_max_message_bytes`` (under the transport limit), each
    refused INVALID_ARGUMENT: resident memory afterwards stays within the bound."""
    body = request_with_attribute_value(field(1, b"v" * (LIMITS["grpc_max_message_bytes"] + 1)))
    before = rss_kib(target.pid)
    for _ in range(30):
        assert target.grpc("large refused (grpc)", body) == grpc.StatusCode.INVALID_ARGUMENT
    growth = rss_kib(target.pid) - before
    print(f"\n30 refused {len(body) // MiB} MiB gRPC messages: RSS +{growth // 1024} MiB")
    assert growth <= RSS_GROWTH_LIMIT_KIB


def test_zz_sidecar_unharmed_and_earlier_data_intact(target: Target) -> None:
    """Runs last (file order): memory, canaries before and after, and the figures."""
    after = trace_request("canary-after", 10)
    assert target.post_until_accepted("canary", after.SerializeToString(), PB) == 200
    want = {
        sp.name: sp
        for req in (CANARY_BEFORE, CANARY_BEFORE_GRPC, after)
        for sp in req.resource_spans[0].scope_spans[0].spans
    }
    assert target.sink.wait_for(
        lambda: set(want) <= {s.span.name for s in target.sink.spans()}, 40
    ), "canaries accepted before/after the fuzzing did not all arrive"
    for s in target.sink.spans():
        if s.span.name in want:
            assert s.span == want[s.span.name]  # byte-for-byte the span that was sent
    growth = rss_kib(target.pid, "VmHWM") - target.base_hwm_kib
    now = rss_kib(target.pid) - target.base_rss_kib
    dropped = target.sc.metric("gym_sidecar_dropped_items_total")
    print(
        f"\nbad input: {sum(TRIED.values())} inputs "
        f"({', '.join(f'{k} {v}' for k, v in sorted(TRIED.items()))}); answers "
        f"{dict(sorted(OUTCOMES.items()))}; peak RSS growth {growth // 1024} MiB "
        f"(at the end +{now // 1024} MiB); "
        f"sidecar up throughout; canaries delivered intact; dropped {dropped:.0f}"
    )
    assert growth <= RSS_GROWTH_LIMIT_KIB
