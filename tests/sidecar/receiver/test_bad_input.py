"""Bad input gets a clear 4xx / INVALID_ARGUMENT, is counted, and costs nothing else.

One real sidecar process with small limits; after every bad request a good one must
still be accepted and forwarded to the sink.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import grpc
import httpx
import pytest
from google.rpc import code_pb2, status_pb2

from testkit.otlp_samples import deep_json_text, grpc_export, http_post, trace_request
from testkit.sink import RecordingSink
from tests.badinput.test_fuzz_receivers import nested_any_value, request_with_attribute_value
from tests.support.sidecar_proc import SidecarProcess

KiB = 1024
MiB = 1024 * KiB
LIMITS = {
    "GYM_SIDECAR_LIMITS__HTTP_MAX_BODY_BYTES": str(2 * MiB),
    "GYM_SIDECAR_LIMITS__HTTP_MAX_DECOMPRESSED_BYTES": str(256 * KiB),
    "GYM_SIDECAR_LIMITS__GRPC_MAX_MESSAGE_BYTES": str(256 * KiB),
    "GYM_SIDECAR_LIMITS__GRPC_TRANSPORT_MAX_BYTES": str(1 * MiB),
}


@pytest.fixture(scope="module")
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture(scope="module")
def sidecar(sink: RecordingSink) -> Iterator[SidecarProcess]:
    with SidecarProcess(backend=sink.endpoint, env=LIMITS) as sc:
        yield sc
    assert sc.returncode == 0, sc.log_text()


_good_counter = iter(range(10_000))


def assert_still_serving(sc: SidecarProcess, sink: RecordingSink) -> None:
    """The process is alive and a valid request still goes all the way through."""
    assert sc.proc is not None and sc.proc.poll() is None
    tag = f"alive{next(_good_counter)}"
    resp = http_post(sc.http_url, "traces", trace_request(tag, 1).SerializeToString())
    assert resp.status_code == 200
    grpc_export(sc.grpc_endpoint, "traces", trace_request(tag + "g", 1))
    assert sink.wait_for(lambda: {tag + "-0", tag + "g-0"} <= {s.span.name for s in sink.spans()})


def vm_hwm_kib(sc: SidecarProcess) -> int:
    """Peak resident memory of the sidecar process (Linux /proc)."""
    assert sc.proc is not None
    with open(f"/proc/{sc.proc.pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def gzip_bomb(inflated_bytes: int) -> bytes:
    """A gzip stream of ``inflated_bytes`` zeros (about 1000:1)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(MiB)
    parts = [comp.compress(chunk) for _ in range(inflated_bytes // MiB)]
    parts.append(comp.flush())
    return b"".join(parts)


VALID = trace_request("valid", 50).SerializeToString()
PB = "application/x-protobuf"


@pytest.mark.parametrize(
    ("name", "body", "content_type", "status", "needle"),
    [
        ("garbage", b"\xff\xfe not protobuf \x00\x01", "application/x-protobuf", 400, "valid"),
        ("truncated", VALID[: len(VALID) // 2], "application/x-protobuf", 400, "valid"),
        ("invalid-json", b'{"resourceSpans": [', "application/json", 400, "JSON"),
        ("json-not-object", b"[1, 2]", "application/json", 400, "object"),
        (
            "json-bad-hex",
            b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}',
            "application/json",
            400,
            "hex",
        ),
        (
            "json-wrong-type",
            b'{"resourceSpans": {"no": "list"}}',
            "application/json",
            400,
            "OTLP/JSON",
        ),
        ("wrong-content-type", VALID, "text/plain", 415, "content type"),
    ],
)
def test_http_bad_body_answered_with_status(
    sidecar: SidecarProcess,
    sink: RecordingSink,
    name: str,
    body: bytes,
    content_type: str,
    status: int,
    needle: str,
) -> None:
    resp = http_post(sidecar.http_url, "traces", body, content_type=content_type)
    assert resp.status_code == status, resp.content
    if content_type == "application/json":
        assert resp.headers["content-type"] == "application/json"
        message = resp.json()["message"]
        assert resp.json()["code"] == code_pb2.INVALID_ARGUMENT
    else:
        assert resp.headers["content-type"] == "application/x-protobuf"
        message = status_pb2.Status.FromString(resp.content).message
    assert needle in message
    assert_still_serving(sidecar, sink)


def test_http_unsupported_encoding_and_method(sidecar: SidecarProcess) -> None:
    resp = http_post(sidecar.http_url, "traces", VALID, headers={"Content-Encoding": "br"})
    assert resp.status_code == 415
    assert httpx.get(sidecar.http_url + "/v1/traces").status_code == 405
    assert http_post(sidecar.http_url, "spans", VALID).status_code == 404


def test_http_oversized_body_413_declared_and_streamed(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="http_max_body_bytes")
    big = bytes(3 * MiB)
    resp = http_post(sidecar.http_url, "traces", big)
    assert resp.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for _ in range(3):
            yield bytes(MiB)

    resp = httpx.post(
        sidecar.http_url + "/v1/traces",
        content=chunks(),
        headers={"Content-Type": "application/x-protobuf"},
        timeout=10,
    )
    assert resp.status_code == 413
    assert "limit" in status_pb2.Status.FromString(resp.content).message
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="http_max_body_bytes")
    assert after - before == 2
    assert_still_serving(sidecar, sink)


def test_http_gzip_bomb_is_harmless(sidecar: SidecarProcess, sink: RecordingSink) -> None:
    bomb = gzip_bomb(1024 * MiB)
    assert len(bomb) < 2 * MiB  # passes the body limit; only inflation can stop it
    hwm_before = vm_hwm_kib(sidecar)
    resp = httpx.post(
        sidecar.http_url + "/v1/traces",
        content=bomb,
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert resp.status_code == 413
    assert "inflates beyond" in status_pb2.Status.FromString(resp.content).message
    # Inflating 1 GiB would need 1 GiB; the limit keeps it to a few MiB.
    assert vm_hwm_kib(sidecar) - hwm_before < 64 * 1024
    assert sidecar.metric("gym_sidecar_limit_hits_total", limit="http_max_decompressed_bytes") >= 1
    assert_still_serving(sidecar, sink)


def test_http_broken_gzip_400(sidecar: SidecarProcess, sink: RecordingSink) -> None:
    resp = http_post(
        sidecar.http_url, "traces", b"not gzip at all", headers={"Content-Encoding": "gzip"}
    )
    assert resp.status_code == 400
    full = zlib.compress(VALID, wbits=16 + zlib.MAX_WBITS)
    resp = http_post(
        sidecar.http_url, "traces", full[: len(full) // 2], headers={"Content-Encoding": "gzip"}
    )
    assert resp.status_code == 400
    assert "truncated" in status_pb2.Status.FromString(resp.content).message
    assert_still_serving(sidecar, sink)


@pytest.mark.parametrize(
    ("name", "payload", "needle"),
    [
        ("garbage", b"\xff\xfe not protobuf \x00\x01", "not a valid ExportTraceServiceRequest"),
        ("truncated", VALID[: len(VALID) // 2], "not a valid ExportTraceServiceRequest"),
        ("oversized", bytes(300 * KiB), "exceeds the limit"),
    ],
)
def test_grpc_bad_message_invalid_argument(
    sidecar: SidecarProcess, sink: RecordingSink, name: str, payload: bytes, needle: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        grpc_export(sidecar.grpc_endpoint, "traces", payload)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (info.value.details() or "")
    assert_still_serving(sidecar, sink)


def test_grpc_oversized_counted(sidecar: SidecarProcess) -> None:
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="grpc_max_message_bytes")
    with pytest.raises(grpc.RpcError):
        grpc_export(sidecar.grpc_endpoint, "traces", bytes(300 * KiB))
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="grpc_max_message_bytes")
    assert after - before == 1


def test_grpc_compressed_bomb_is_harmless(sidecar: SidecarProcess, sink: RecordingSink) -> None:
    """A gzip-compressed gRPC message inflating far past the transport limit."""
    hwm_before = vm_hwm_kib(sidecar)
    with pytest.raises(grpc.RpcError) as info:
        # 120 s: the client compresses 256 MiB first; with the default 10 s a loaded
        # machine's client ran out of time before the sidecar could refuse
        # (DEADLINE_EXCEEDED from the client, seen at load average 10).
        grpc_export(
            sidecar.grpc_endpoint, "traces", bytes(256 * MiB), grpc.Compression.Gzip, timeout_s=120
        )
    # grpc core refuses it while inflating, before the sidecar's handler runs.
    assert info.value.code() in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert vm_hwm_kib(sidecar) - hwm_before < 64 * 1024
    assert_still_serving(sidecar, sink)


def test_bad_requests_counted(sidecar: SidecarProcess) -> None:
    before = sidecar.metric("gym_sidecar_bad_requests_total", transport="http")
    http_post(sidecar.http_url, "traces", b"\x01garbage")
    http_post(sidecar.http_url, "traces", VALID, content_type="text/csv")
    after = sidecar.metric("gym_sidecar_bad_requests_total", transport="http")
    assert after - before == 2


@pytest.mark.parametrize(
    ("name", "body", "content_type"),
    [
        ("json arrays 100k deep", b"[" * 100_000, "application/json"),
        ("json kvlist 900 deep", deep_json_text(900), "application/json"),
        ("json kvlist 40 deep", deep_json_text(40), "application/json"),
        ("protobuf kvlist 2000 deep", request_with_attribute_value(nested_any_value(2000)), PB),
    ],
)
def test_http_deep_nesting_400_counted(
    sidecar: SidecarProcess, sink: RecordingSink, name: str, body: bytes, content_type: str
) -> None:
    """Nesting past ``max_message_depth`` (100 message levels, the parsers' own bound):
    400 naming the limit, counted as a refusal and a limit hit; never a 500."""
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="max_message_depth")
    resp = http_post(sidecar.http_url, "traces", body, content_type=content_type)
    assert resp.status_code == 400, resp.content[:300]
    if content_type == PB:
        message = status_pb2.Status.FromString(resp.content).message
    else:
        message = resp.json()["message"]
    assert "deeper than 100 message levels" in message
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="max_message_depth")
    assert after - before == 1
    assert sidecar.metric("gym_sidecar_bad_requests_total", transport="http", reason="too_deep")
    assert_still_serving(sidecar, sink)


def test_grpc_deep_nesting_invalid_argument_counted(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="max_message_depth")
    with pytest.raises(grpc.RpcError) as info:
        grpc_export(
            sidecar.grpc_endpoint, "traces", request_with_attribute_value(nested_any_value(40))
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "deeper than 100 message levels" in (info.value.details() or "")
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="max_message_depth")
    assert after - before == 1
    assert_still_serving(sidecar, sink)


def test_lowered_depth_limit_applies_to_json_and_protobuf(sink: RecordingSink) -> None:
    """``max_message_depth: 12`` allows two kvlist levels in a span attribute (6 + 3 x 2)
    and refuses three, over both encodings and both transports."""
    two, three = (request_with_attribute_value(nested_any_value(n)) for n in (2, 3))
    with SidecarProcess(backend=sink.endpoint, config={"limits": {"max_message_depth": 12}}) as sc:
        assert http_post(sc.http_url, "traces", two).status_code == 200
        assert http_post(sc.http_url, "traces", three).status_code == 400
        assert (
            http_post(sc.http_url, "traces", deep_json_text(2), "application/json").status_code
            == 200
        )
        assert (
            http_post(sc.http_url, "traces", deep_json_text(3), "application/json").status_code
            == 400
        )
        grpc_export(sc.grpc_endpoint, "traces", two)
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(sc.grpc_endpoint, "traces", three)
        assert "deeper than 12 message levels" in (info.value.details() or "")
        assert sc.metric("gym_sidecar_limit_hits_total", limit="max_message_depth") == 3
    assert sc.returncode == 0
