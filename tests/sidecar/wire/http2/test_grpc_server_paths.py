"""The gRPC receiver's error paths leave nothing behind: the real receiver in-process
(so that its in-flight count and connections can be read) on a real socket, a raw HTTP/2
client (``tests/support/h2client.py``, run in a thread) or grpc.aio as the client.

A call holds one of ``limits.grpc_max_concurrent_requests`` slots from its HEADERS until
its answer is decided; every way a call can end must give it back exactly once: the
client resetting the stream mid-message, the connection lost mid-message or while the
pipeline has the data, the pipeline's Backpressure, a stage raising, the client's
GOAWAY. Each test runs with one slot, so that a slot kept would refuse the next call.
The event loop's exception handler must see nothing (a task dying unanswered).
Also here: the output bound (``Http2Bounds.max_write_buffer``, made small so that a
test can exceed it) and the constant-time frame reprs.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import grpc
import pytest
from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.stage import Backpressure, Batch, Stage
from gym_sidecar.receiver.grpc import GrpcReceiver
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.http2.connection import quiet_frame_reprs
from gym_sidecar.wire.http2.guard import ControlBudget, Http2Bounds
from hyperframe.frame import DataFrame, ExtensionFrame, GoAwayFrame, HeadersFrame

from testkit.otlp_samples import SERVICES, trace_request
from tests.support.h2client import H2Client, grpc_frame, request_headers

VALID = trace_request("paths", 2).SerializeToString()
EXPORT = f"/{SERVICES['traces']}/Export"


class ScriptedStage(Stage):
    """Records batches; ``behaviour`` may hold them, raise Backpressure, or fail."""

    name = "scripted"

    def __init__(self, metrics: SelfMetrics) -> None:
        super().__init__(None, metrics)
        self.batches: list[Batch] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.behaviour = "accept"

    async def consume(self, batch: Batch) -> None:
        self.entered.set()
        await self.release.wait()
        if self.behaviour == "backpressure":
            raise Backpressure(2.5, "queue_full")
        if self.behaviour == "fail":
            raise RuntimeError("a stage bug")
        self.batches.append(batch)


class Harness:
    def __init__(self, receiver: GrpcReceiver, stage: ScriptedStage, errors: list[Any]) -> None:
        self.receiver = receiver
        self.stage = stage
        self.errors = errors
        self.port = receiver.bound_port or 0
        self.metrics = receiver.shared.metrics

    async def settled(self, connections: int | None = None) -> None:
        """Wait until no call holds a slot (and ``connections`` are open), 10 s at most."""
        for _ in range(1000):
            if self.receiver.in_flight == 0 and (
                connections is None or self.receiver.connections == connections
            ):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(
            f"in_flight={self.receiver.in_flight} connections={self.receiver.connections}"
        )

    async def grpc_call(self) -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            try:
                await channel.unary_unary(EXPORT)(VALID, timeout=10)
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK


@asynccontextmanager
async def harness(
    bounds: Http2Bounds | None = None, limits: LimitsConfig | None = None
) -> AsyncIterator[Harness]:
    """The receiver (one slot, unless ``limits`` say otherwise) in front of a
    :class:`ScriptedStage`; the loop's unhandled errors must stay none."""
    errors: list[Any] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
    metrics = SelfMetrics()
    stage = ScriptedStage(metrics)
    limits = limits or LimitsConfig(grpc_max_concurrent_requests=1, grpc_message_timeout_s=30)
    receiver = GrpcReceiver("127.0.0.1:0", stage, limits, metrics, bounds)
    await receiver.start()
    try:
        yield Harness(receiver, stage, errors)
    finally:
        await receiver.stop(1)
    assert not errors, errors


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def test_a_stream_reset_mid_message_gives_back_its_slot() -> None:
    async def scenario() -> None:
        async with harness() as h:

            def reset_three_times() -> None:
                with H2Client(h.port) as client:
                    for _ in range(3):
                        stream_id = client.start(request_headers())
                        client.send(stream_id, grpc_frame(VALID)[:20], end_stream=False)
                        client.conn.reset_stream(stream_id)
                        client.flush()

            await asyncio.to_thread(reset_three_times)
            await h.settled(connections=0)
            assert await h.grpc_call() == grpc.StatusCode.OK
            assert len(h.stage.batches) == 1  # none of the reset calls got through

    run(scenario)


def test_a_connection_lost_mid_message_gives_back_its_slot() -> None:
    async def scenario() -> None:
        async with harness() as h:

            def half_then_gone() -> None:
                client = H2Client(h.port)
                stream_id = client.start(request_headers())
                client.send(stream_id, grpc_frame(VALID)[:20], end_stream=False)
                client.read_until(lambda: bool(client.remote_settings))
                client.close()

            await asyncio.to_thread(half_then_gone)
            await h.settled(connections=0)
            assert await h.grpc_call() == grpc.StatusCode.OK

    run(scenario)


def test_a_connection_lost_while_the_pipeline_has_the_call_hands_its_data_over() -> None:
    async def scenario() -> None:
        async with harness() as h:
            h.stage.release.clear()
            client = await asyncio.to_thread(H2Client, h.port)
            stream_id = client.start(request_headers())
            await asyncio.to_thread(client.send, stream_id, grpc_frame(VALID))
            await asyncio.wait_for(h.stage.entered.wait(), 10)
            client.close()
            await asyncio.sleep(0.2)  # the receiver sees the connection lost
            h.stage.release.set()
            await h.settled(connections=0)
            assert len(h.stage.batches) == 1
            assert await h.grpc_call() == grpc.StatusCode.OK

    run(scenario)


@pytest.mark.parametrize(
    ("behaviour", "code"),
    [
        ("backpressure", grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("fail", grpc.StatusCode.INTERNAL),
    ],
)
def test_a_refusal_from_the_pipeline_gives_back_the_slot(
    behaviour: str, code: grpc.StatusCode, caplog: pytest.LogCaptureFixture
) -> None:
    """Backpressure: RESOURCE_EXHAUSTED (with RetryInfo, tested elsewhere); a stage that
    raises: INTERNAL and a log line, the task does not die with the call unanswered."""

    async def scenario() -> None:
        async with harness() as h:
            h.stage.behaviour = behaviour
            assert await h.grpc_call() == code
            assert await h.grpc_call() == code  # the one slot was given back
            await h.settled()

    run(scenario)
    if behaviour == "fail":
        assert "call failed in the pipeline" in caplog.text


def test_a_client_goaway_lets_its_call_in_the_pipeline_be_answered() -> None:
    """RFC 9113 6.8: the client's GOAWAY ends nothing in progress. Its call, held in the
    pipeline meanwhile, is answered OK; then the receiver closes the connection."""

    async def scenario() -> None:
        async with harness() as h:
            h.stage.release.clear()
            client = await asyncio.to_thread(H2Client, h.port)
            stream_id = client.start(request_headers())
            await asyncio.to_thread(client.send, stream_id, grpc_frame(VALID))
            await asyncio.wait_for(h.stage.entered.wait(), 10)
            client.send_raw(GoAwayFrame(0, last_stream_id=0).serialize())
            await asyncio.sleep(0.2)
            h.stage.release.set()
            out = await asyncio.to_thread(client.wait, stream_id)
            assert out.grpc_status == 0, out
            assert await asyncio.to_thread(client.wait_closed)
            client.close()
            await h.settled(connections=0)

    run(scenario)


def test_a_client_that_does_not_read_is_closed_once_its_output_passes_the_bound() -> None:
    """2,000 small calls pipelined by a client that never reads, its receive buffer and
    the server's send buffer made small: the answers pile up in the receiver's transport
    past ``max_write_buffer`` (1 KiB here): the connection is aborted and counted. Without
    the bound it would hold the answers for as long as the client keeps the socket. (The
    control-frame budget and the stream and call limits are out of the way here: the
    bound under test is the output's.)"""
    bounds = Http2Bounds(max_write_buffer=1024, control=ControlBudget(burst=1e9))
    limits = LimitsConfig(
        grpc_max_concurrent_requests=100_000, grpc_max_streams_per_connection=100_000
    )

    async def scenario() -> None:
        async with harness(bounds, limits) as h:
            client = await asyncio.to_thread(H2Client, h.port, rcvbuf=2048)
            for _ in range(100):
                if h.receiver.connections:
                    break
                await asyncio.sleep(0.01)
            for conn in h.receiver.shared.connections:
                assert conn.transport is not None
                conn.transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
                )

            def pipeline_calls() -> None:
                # The handshake only (the windows it opens); nothing is read after it.
                client.read_until(lambda: client.conn.outbound_flow_control_window > 65535)
                for _ in range(2000):
                    stream_id = client.conn.get_next_available_stream_id()
                    client.conn.send_headers(stream_id, request_headers())
                    client.conn.send_data(stream_id, grpc_frame(VALID), end_stream=True)
                with suppress(BrokenPipeError, ConnectionResetError):
                    client.flush()

            await asyncio.to_thread(pipeline_calls)
            await h.settled(connections=0)
            client.close()
            assert h.metrics.http2_refusals.labels("not_reading").value == 1

    run(scenario)


def test_frame_reprs_are_constant_time_and_show_no_body() -> None:
    """h2 builds repr(frame) for every frame it receives; none may encode a body."""
    quiet_frame_reprs()
    frames = [
        DataFrame(1, data=b"\xab" * (1024 * 1024)),
        HeadersFrame(1, data=b"\xab" * 4096),
        ExtensionFrame(0xFA, 0, body=b"\xab" * 4096),
        GoAwayFrame(0, last_stream_id=7, additional_data=b"\xab" * 4096),
    ]
    for frame in frames:
        text = repr(frame)
        assert len(text) < 64 and "ab" not in text, text
