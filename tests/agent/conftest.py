"""Fixtures for the agent's tests: an in-memory span exporter on the global provider,
the enabled span groups restored after each test, and real uvicorn servers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
import uvicorn
from gym_telemetry import span_groups
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.ports import free_port

_EXPORTER = InMemorySpanExporter()
_INSTALLED: list[bool] = []


def _install_exporter() -> None:
    """Record every span of this process in ``_EXPORTER`` (once per session).

    The global provider can be set only once per process: set an SDK provider if none
    is there, otherwise add the in-memory processor to the SDK provider that is.
    """
    if _INSTALLED:
        return
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider(shutdown_on_exit=False))
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    span_groups.reset_tracers()
    _INSTALLED.append(True)


class Spans:
    """The gym_telemetry spans finished since the test started (FastAPI's own and
    other foreign scopes are left out)."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def all(self) -> list[ReadableSpan]:
        return [
            s
            for s in self.exporter.get_finished_spans()
            if s.instrumentation_scope is not None
            and semconv.group_of_scope(s.instrumentation_scope.name) is not None
        ]

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, [s.name for s in self.all()]
        return found[0]

    def clear(self) -> None:
        self.exporter.clear()


@pytest.fixture
def spans() -> Iterator[Spans]:
    _install_exporter()
    _EXPORTER.clear()
    yield Spans(_EXPORTER)
    _EXPORTER.clear()


@pytest.fixture(autouse=True)
def _restore_span_groups() -> Iterator[None]:
    before = span_groups.enabled_groups()
    yield
    span_groups.set_enabled(before)


class ServedApp:
    """An ASGI app served by a real uvicorn server on a free loopback port, in a thread."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    def start(self) -> ServedApp:
        self.thread.start()
        for _ in range(400):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                break
            threading.Event().wait(0.025)
        raise RuntimeError(f"uvicorn did not start on port {self.port}")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def __enter__(self) -> ServedApp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(app) -> ServedApp`` (started); every server is stopped after the test."""
    started: list[ServedApp] = []

    def _serve(app: Any) -> ServedApp:
        served = ServedApp(app).start()
        started.append(served)
        return served

    yield _serve
    for served in started:
        served.stop()
