"""The sender's repeating warnings: every drop counted, one line per message per 10 s."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
import pytest
from gym_sidecar.assemble import build_export_stage
from gym_sidecar.export import sender
from gym_sidecar.export.config import BackendConfig, QueueConfig
from gym_sidecar.export.stage import QueueStage
from gym_sidecar.selfmetrics import SelfMetrics

from testkit.sink import RecordingSink
from tests.sidecar.export.helpers import dropped, run, trace_batch, wait_until
from tests.support.ratelimit import hand_clock


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


def test_permanent_errors_are_counted_each_time_and_logged_once_per_interval(
    sink: RecordingSink, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = hand_clock(sender._failure_log.name, monkeypatch)

    async def body() -> None:
        metrics = SelfMetrics()
        backend = BackendConfig(url=f"http://{sink.endpoint}")
        stage = build_export_stage(backend, QueueConfig(batch_timeout_s=0.0), metrics)
        assert isinstance(stage, QueueStage)
        sink.fail_next(6, grpc.StatusCode.INVALID_ARGUMENT)
        await stage.start()
        for calls in range(1, 6):
            await stage.consume(trace_batch(f"bad{calls}", 2))
            # The sender's drop (counted just before its log line), not the sink's call:
            # the clock must not move before the fifth failure is logged or suppressed.
            assert await wait_until(lambda n=calls: dropped(metrics, "permanent_error") == 2 * n)
        clock.now += 10.1
        await stage.consume(trace_batch("bad6", 2))
        assert await wait_until(lambda: sink.calls == 6)
        assert await wait_until(lambda: dropped(metrics, "permanent_error") == 12)
        await stage.shutdown(5)

    with caplog.at_level(logging.WARNING, logger=sender.__name__):
        run(body())
    messages = [r.getMessage() for r in caplog.records if "permanent export error" in r.msg]
    assert len(messages) == 2
    assert messages[0].startswith("dropped 2 traces items, permanent export error")
    assert messages[1].endswith("[4 similar messages suppressed]")
