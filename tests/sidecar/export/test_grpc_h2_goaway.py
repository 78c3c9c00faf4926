"""The h2 exporter and a backend that drains: a GOAWAY arriving while a call is in the
server's hands. The call is below the GOAWAY's last stream id, so the server still
answers it (RFC 9113, 6.8); the exporter must read that answer: plain ``h2`` refused
every frame after a GOAWAY, and the call failed as INTERNAL, a permanent error that
dropped its batch (gym_sidecar/wire/http2/connection.py). Two real servers: grpc core (grpc.aio's
``stop(grace)``: two GOAWAYs and a PING) and the sidecar's own receiver (``stop``).
The next export after the drain opens a new connection.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.exporter import ExportResult, Outcome
from gym_sidecar.core.stage import Batch, Signal, Stage
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.grpc_h2 import GrpcH2Exporter
from gym_sidecar.receiver.grpc import GrpcReceiver
from gym_sidecar.selfmetrics import SelfMetrics

from tests.sidecar.export.helpers import run, trace_request
from tests.sidecar.export.test_otlp_grpc_exporter import TRACES
from tests.support.ports import free_port

PAYLOAD = trace_request("drain", 2).SerializeToString()


class HoldingStage(Stage):
    name = "holding"

    def __init__(self, metrics: SelfMetrics) -> None:
        super().__init__(None, metrics)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.batches: list[Batch] = []

    async def consume(self, batch: Batch) -> None:
        self.entered.set()
        await self.release.wait()
        self.batches.append(batch)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_call_in_flight_when_grpc_core_drains_is_answered(compression: str) -> None:
    async def body() -> None:
        entered, release = asyncio.Event(), asyncio.Event()

        async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            entered.set()
            await release.wait()
            return b""

        srv = grpc.aio.server()
        srv.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    TRACES, {"Export": grpc.unary_unary_rpc_method_handler(traces)}
                ),
            )
        )
        port = free_port()
        srv.add_insecure_port(f"127.0.0.1:{port}")
        await srv.start()
        exporter = GrpcH2Exporter(
            BackendConfig(url=f"http://127.0.0.1:{port}", compression=compression)
        )
        try:
            call = asyncio.ensure_future(exporter.export(Signal.TRACES, PAYLOAD, 2))
            await asyncio.wait_for(entered.wait(), 10)
            stopping = asyncio.ensure_future(srv.stop(10))
            await asyncio.sleep(0.5)  # the GOAWAYs reach the exporter
            release.set()
            result: ExportResult = await asyncio.wait_for(call, 10)
            assert result.outcome is Outcome.SUCCESS, result
            await stopping
        finally:
            await exporter.close()

    run(body())


def test_a_call_in_flight_when_the_sidecar_receiver_drains_is_answered() -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        stage = HoldingStage(metrics)
        receiver = GrpcReceiver("127.0.0.1:0", stage, LimitsConfig(), metrics)
        await receiver.start()
        exporter = GrpcH2Exporter(BackendConfig(url=f"http://127.0.0.1:{receiver.bound_port}"))
        try:
            call = asyncio.ensure_future(exporter.export(Signal.TRACES, PAYLOAD, 2))
            await asyncio.wait_for(stage.entered.wait(), 10)
            stopping = asyncio.ensure_future(receiver.stop(10))
            await asyncio.sleep(0.3)  # the GOAWAY reaches the exporter
            stage.release.set()
            result = await asyncio.wait_for(call, 10)
            assert result.outcome is Outcome.SUCCESS, result
            await stopping
            assert len(stage.batches) == 1
            # The drained connection is not reused: a restarted receiver gets a new one.
            receiver = GrpcReceiver(
                f"127.0.0.1:{receiver.bound_port}", stage, LimitsConfig(), metrics
            )
            await receiver.start()
            again = await exporter.export(Signal.TRACES, PAYLOAD, 2)
            assert again.outcome is Outcome.SUCCESS, again
            assert len(stage.batches) == 2
        finally:
            await exporter.close()
            await receiver.stop(1)

    run(body())
