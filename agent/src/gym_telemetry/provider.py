"""SDK setup for a Gym server process: ``init_telemetry`` / ``shutdown_telemetry``.

``init_telemetry`` installs, once per process:

- a ``TracerProvider`` with this server's resource (``service.name``,
  ``nemo.gym.server.name``, ``nemo.gym.server.type``, ``container.id`` when detected,
  merged with ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME``; see
  ``gym_telemetry.resource``), set as the global provider;
- one ``BatchSpanProcessor`` with a bounded queue (``OTEL_BSP_*`` honoured) feeding an
  OTLP exporter to the local sidecar: gRPC to ``localhost:4317`` by default, plaintext
  (``insecure``) unless the endpoint says ``https://``; the SDK's gRPC exporter with
  this package's batch encoder (``gym_telemetry._lean.grpc_exporter``).
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` / ``..._TRACES_PROTOCOL`` = ``http/protobuf`` selects
  the HTTP exporter when that package is installed;
- the W3C propagators (tracecontext + baggage) as the global text-map propagator,
  unless ``OTEL_PROPAGATORS`` chose others;
- the span groups: ``span_groups`` argument, else ``GYM_TELEMETRY_SPAN_GROUPS``, else
  ``"default"``; then the span-group poller (``gym_telemetry.remote_config``) follows
  the sidecar's configuration from its own daemon thread;
- export log lines of the SDK rate-limited (one per message per minute) so a sidecar
  that is down does not flood the log;
- the live events (``gym_telemetry._live``): a daemon thread sending, every
  ``GYM_TELEMETRY_LIVE_INTERVAL_S`` (default 2 s, ``0``: off), the rollouts in flight, their
  steps and a heartbeat as OTLP logs to where the spans go (same channel, headers,
  credentials); ``shutdown_telemetry`` sends its last word, ``gym.agent.stop``, first
  (at most a quarter of its budget, 1 s at most), while the exporter's channel is open.

Precedence everywhere: argument > environment (standard ``OTEL_*`` names) > default.
``OTEL_SDK_DISABLED=true`` makes ``init_telemetry`` a no-op that returns False.

Never raises, never blocks a handler on I/O. Export happens on the batch processor's
own thread; when the sidecar is down or not started yet, the exporter retries there
(bounded by its timeout, ``OTEL_EXPORTER_OTLP_TIMEOUT``, default 10 s) while handlers
keep appending to the bounded queue; when the queue is full the oldest span is dropped
and counted (``dropped_spans()``), without a log line per span.

Idempotent: a second call while active returns True and only applies a new
``span_groups`` if given. When a global SDK ``TracerProvider`` already exists (set by
someone else, or by ``opentelemetry-instrument``), it is **reused**: its resource and
sampler are kept and this module's processor is added to it, so the wrappers' spans
reach the sidecar too. A non-SDK global provider cannot take a processor; then
``init_telemetry`` returns False. The processor added to a provider is a small switch
that stays installed; ``shutdown_telemetry`` flushes and closes the exporter behind it,
and a later ``init_telemetry`` plugs a fresh exporter into the same switch (the global
provider cannot be replaced in OpenTelemetry).

FastAPI >= 0.165 has built-in telemetry that switches itself on for every ``FastAPI()``
app as soon as a global SDK TracerProvider exists (4 spans per request, ~3.4x a bare
request). ``init_telemetry`` does not change other code's apps; it leaves that decision
to whoever builds the app. ``fastapi_telemetry_off()`` returns the keyword arguments
(``{"telemetry": {...all off...}}`` on FastAPI versions that have the option, ``{}``
otherwise) to pass to ``FastAPI(...)``; Gym's apps are handled by the Gym integration.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import os
import threading
import time
from typing import Any, Final
from urllib.parse import urlsplit

from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gym_telemetry import _live
from gym_telemetry import environment_variables as env_vars
from gym_telemetry import span_groups as _span_groups
from gym_telemetry._export.processor import (
    GymSpanProcessor,
    TrackingExporter,
    rate_limit_export_logs,
)
from gym_telemetry._lean.sdk_hooks import batch_queue, shutdown_batch
from gym_telemetry.resource import build_resource

_log = logging.getLogger(__name__)


DEFAULT_GRPC_ENDPOINT: Final = "localhost:4317"
DEFAULT_HTTP_ENDPOINT: Final = "http://localhost:4318/v1/traces"
DEFAULT_MAX_QUEUE_SIZE: Final = 2048
DEFAULT_MAX_EXPORT_BATCH_SIZE: Final = 512
DEFAULT_SHUTDOWN_TIMEOUT_S: Final = 5.0
#: The part of ``shutdown_telemetry``'s budget the live events' stop may take, and its cap.
LIVE_STOP_SHARE: Final = 0.25
LIVE_STOP_MAX_S: Final = 1.0


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = False
        self.provider: TracerProvider | None = None
        self.owns_provider = False
        self.processor: GymSpanProcessor | None = None
        self.exporter: TrackingExporter | None = None  # the latest, kept for its counters
        self.atexit_registered = False


_STATE: Final = _State()


def fastapi_telemetry_off() -> dict[str, Any]:
    """Keyword arguments for ``FastAPI(...)`` that turn its built-in telemetry off.

    ``{"telemetry": {"tracing": False, "metrics": False, "logs": False}}`` on FastAPI
    versions whose constructor takes ``telemetry`` (>= 0.165), ``{}`` otherwise (or
    when FastAPI is not installed).
    """
    try:
        from fastapi import FastAPI

        if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
            return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    except Exception:  # FastAPI absent or unusual: nothing to switch off
        pass
    return {}


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


def _protocol() -> str:
    value = (
        os.environ.get(env_vars.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
        or os.environ.get(env_vars.OTEL_EXPORTER_OTLP_PROTOCOL)
        or "grpc"
    )
    return value.strip().lower()


def _address(endpoint: str, default_port: int) -> tuple[str, int] | None:
    """(host, port) of an OTLP endpoint given as ``host:port`` or a URL; None if unclear."""
    try:
        parts = urlsplit(endpoint if "://" in endpoint else "//" + endpoint)
        if not parts.hostname:
            return None
        return parts.hostname, parts.port or default_port
    except ValueError:
        return None


def _make_exporter(endpoint: str | None) -> tuple[SpanExporter, tuple[str, int] | None]:
    """OTLP exporter and the address it sends to.

    Endpoint: argument > OTEL_EXPORTER_OTLP_TRACES_ENDPOINT > ..._ENDPOINT > default.
    """
    if _protocol().startswith("http"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )

            url = endpoint or os.environ.get(env_vars.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
            if url is None and os.environ.get(env_vars.OTEL_EXPORTER_OTLP_ENDPOINT):
                url = os.environ[env_vars.OTEL_EXPORTER_OTLP_ENDPOINT].rstrip("/") + "/v1/traces"
            url = url or DEFAULT_HTTP_ENDPOINT
            return HttpExporter(endpoint=url), _address(url, 4318)
        except ImportError:
            _log.warning(
                "gym_telemetry: %s=%s but the OTLP/HTTP exporter is not installed; using gRPC",
                env_vars.OTEL_EXPORTER_OTLP_PROTOCOL,
                _protocol(),
            )
    from gym_telemetry._lean.grpc_exporter import make_grpc_exporter

    target = (
        endpoint
        or os.environ.get(env_vars.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
        or os.environ.get(env_vars.OTEL_EXPORTER_OTLP_ENDPOINT)
        or DEFAULT_GRPC_ENDPOINT
    )
    insecure: bool | None = None
    if "://" not in target and os.environ.get(env_vars.OTEL_EXPORTER_OTLP_INSECURE) is None:
        insecure = True  # the sidecar is local: plaintext unless told otherwise
    return make_grpc_exporter(target, insecure), _address(target, 4317)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        _log.warning("gym_telemetry: %s=%r is not an integer; ignored", name, raw)
        return None
    return value if value > 0 else None


def _make_batch_processor(exporter: SpanExporter) -> BatchSpanProcessor:
    """A batch processor with a bounded queue (``OTEL_BSP_MAX_QUEUE_SIZE``, default 2048).

    When only the queue size is set and it is below the SDK's default batch size (512),
    the batch size follows it instead of failing the SDK's argument check.
    """
    max_queue = _env_int(env_vars.OTEL_BSP_MAX_QUEUE_SIZE) or DEFAULT_MAX_QUEUE_SIZE
    kwargs: dict[str, Any] = {"max_queue_size": max_queue}
    batch = _env_int(env_vars.OTEL_BSP_MAX_EXPORT_BATCH_SIZE)
    kwargs["max_export_batch_size"] = min(batch or DEFAULT_MAX_EXPORT_BATCH_SIZE, max_queue)
    try:
        return BatchSpanProcessor(exporter, **kwargs)
    except ValueError as exc:  # inconsistent OTEL_BSP_* values: fall back to the defaults
        _log.warning("gym_telemetry: batch processor settings rejected (%s); using defaults", exc)
        return BatchSpanProcessor(
            exporter,
            max_queue_size=DEFAULT_MAX_QUEUE_SIZE,
            max_export_batch_size=DEFAULT_MAX_EXPORT_BATCH_SIZE,
        )


def _install_propagators() -> None:
    if os.environ.get(env_vars.OTEL_PROPAGATORS):
        return  # the API configured the ones the environment asked for
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    )


def _apply_span_groups(span_groups: str | None) -> None:
    if span_groups is None:
        _span_groups.configure_from_env()
    else:
        _span_groups.set_enabled(_span_groups.enabled_for_spec(span_groups))


def init_telemetry(
    service_name: str | None = None,
    *,
    server_name: str | None = None,
    server_type: str | None = None,
    endpoint: str | None = None,
    span_groups: str | None = None,
    resource_attributes: dict[str, Any] | None = None,
) -> bool:
    """Set up tracing for this process (see the module docstring). Never raises.

    Returns True when spans will be exported (now active, or already active), False
    when telemetry is disabled (``OTEL_SDK_DISABLED``) or could not be set up; the
    wrappers then stay cheap no-ops or record into whatever provider exists.
    Does no network I/O: the exporter connects lazily from its own thread.
    """
    try:
        with _STATE.lock:
            if _env_true(env_vars.OTEL_SDK_DISABLED):
                _log.info("gym_telemetry: %s=true, telemetry stays off", env_vars.OTEL_SDK_DISABLED)
                return False
            if _STATE.active:
                if span_groups is not None:
                    _apply_span_groups(span_groups)
                return True
            server_name = server_name or os.environ.get(env_vars.GYM_TELEMETRY_SERVER_NAME) or None
            server_type = server_type or os.environ.get(env_vars.GYM_TELEMETRY_SERVER_TYPE) or None

            provider = _STATE.provider
            if provider is None:
                current = trace.get_tracer_provider()
                if isinstance(current, TracerProvider):
                    provider = current
                    _STATE.owns_provider = False
                    _log.info("gym_telemetry: reusing the existing global TracerProvider")
                elif isinstance(current, trace.ProxyTracerProvider):
                    resource = build_resource(
                        service_name,
                        server_name=server_name,
                        server_type=server_type,
                        resource_attributes=resource_attributes,
                    )
                    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
                    trace.set_tracer_provider(provider)
                    if trace.get_tracer_provider() is not provider:
                        _log.warning("gym_telemetry: could not set the global TracerProvider")
                        return False
                    _STATE.owns_provider = True
                else:
                    _log.warning(
                        "gym_telemetry: a non-SDK TracerProvider (%s) is installed; "
                        "cannot add an exporter to it",
                        type(current).__name__,
                    )
                    return False
                _STATE.provider = provider
                _STATE.processor = GymSpanProcessor()
                provider.add_span_processor(_STATE.processor)

            processor = _STATE.processor
            assert processor is not None
            rate_limit_export_logs()
            inner, address = _make_exporter(endpoint)
            exporter = TrackingExporter(inner, address=address)
            processor.plug(_make_batch_processor(exporter), exporter)
            _STATE.exporter = exporter
            _install_propagators()
            _span_groups.reset_tracers()
            _apply_span_groups(span_groups)
            if not _STATE.atexit_registered:
                atexit.register(shutdown_telemetry, 2.0)
                _STATE.atexit_registered = True
            _STATE.active = True
            _start_polling(provider)
            _live.start(provider.resource, inner)
            return True
    except Exception as exc:  # boundary: telemetry setup must never break server start
        _log.warning("gym_telemetry: init_telemetry failed: %r", exc, exc_info=True)
        return False


def _start_polling(provider: TracerProvider) -> None:
    """Follow the sidecar's span-group config (``gym_telemetry.remote_config``)."""
    try:
        from gym_telemetry import remote_config

        service = str(provider.resource.attributes.get("service.name", "") or "")
        remote_config.start_polling(service)
    except Exception as exc:  # the poller is optional; local span groups stay in force
        _log.warning("gym_telemetry: span-group polling not started: %r", exc)


def _stop_polling(timeout_s: float) -> None:
    try:
        from gym_telemetry import remote_config

        remote_config.stop_polling(timeout_s)
    except Exception as exc:  # best effort at shutdown
        _log.debug("gym_telemetry: stopping the span-group poller failed: %r", exc)


def _in_background(fn: Any) -> None:
    """Run ``fn()`` on a daemon thread without waiting for it. Some exporter versions
    block in ``shutdown`` until an in-flight export ends (up to its timeout)."""

    def run() -> None:
        with contextlib.suppress(Exception):
            fn()

    threading.Thread(target=run, name="gym-telemetry-exporter-close", daemon=True).start()


def shutdown_telemetry(timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
    """Flush what is queued and close the exporter, within ``timeout_s``. Never raises.

    Returns True when everything was flushed and closed in time. The flush runs on a
    helper thread and is abandoned (left to finish in the background, daemon) at the
    deadline, so this never waits longer than ``timeout_s`` (plus a few ms), also when
    the sidecar is down or hangs. Safe to call twice and without ``init_telemetry``.
    Span groups stay as they are; with no exporter behind the processor, spans are
    dropped at ``on_end``.
    """
    try:
        deadline = time.monotonic() + max(0.0, timeout_s)
        # The live events' last word (gym.agent.stop) goes first, while the exporter's
        # channel is still open; a small part of the budget.
        _live.stop(min(LIVE_STOP_SHARE * timeout_s, LIVE_STOP_MAX_S))
        with _STATE.lock:
            if not _STATE.active or _STATE.processor is None:
                return True
            batch, exporter = _STATE.processor.plug(None)
            _STATE.active = False
        _stop_polling(min(timeout_s, 1.0))
        if batch is None:
            return True
        done = threading.Event()

        def run() -> None:
            try:
                # Leave the batch processor a little less than the deadline, so that
                # its own join/close finishes before the caller is answered.
                shutdown_batch(batch, max(0.0, 0.9 * (deadline - time.monotonic())))
            except Exception as exc:  # background thread: log and finish
                _log.warning("gym_telemetry: exporter shutdown failed: %r", exc)
            finally:
                done.set()

        thread = threading.Thread(target=run, name="gym-telemetry-shutdown", daemon=True)
        thread.start()
        aborted = False
        probed = False
        while True:
            remaining = deadline - time.monotonic()
            if done.wait(min(0.05, max(0.0, remaining))) or remaining <= 0:
                break
            if aborted or probed or exporter is None or not exporter.unreachable():
                continue
            # The last export failed or the final one is in its retry back-off. If nothing
            # even accepts connections there, waiting cannot deliver anything: abort the
            # retries so the flush fails fast instead of eating the whole deadline. If
            # something listens (a sidecar that came back, or one that hangs), wait.
            probed = True
            if not exporter.accepts_connections():
                aborted = True
                _log.info("gym_telemetry: sidecar unreachable at shutdown; not waiting")
                _in_background(exporter.shutdown)
        finished = done.is_set()
        if not finished:
            _in_background(batch.span_exporter.shutdown)  # abort retries, do not wait
            _log.warning("gym_telemetry: shutdown deadline (%.1fs) passed before flush", timeout_s)
        # The batch processor returns from shutdown at its own deadline even when an
        # export is still in flight or spans are still queued: check what actually left.
        queue, _bound = batch_queue(batch)
        queued = len(queue) if queue is not None else 0
        delivered = queued == 0 and (
            exporter is None or (not aborted and exporter.last_ok and not exporter.in_flight)
        )
        return finished and delivered
    except Exception as exc:  # boundary: shutdown must never raise into the caller
        _log.warning("gym_telemetry: shutdown_telemetry failed: %r", exc)
        return False


def dropped_spans() -> int:
    """Spans dropped because the export queue was full (since process start)."""
    processor = _STATE.processor
    return processor.dropped if processor is not None else 0


def export_stats() -> dict[str, int]:
    """Counters of the current exporter: spans ``exported``, ``failed`` to export, and
    ``dropped`` (queue full, whole process lifetime). Zeros before ``init_telemetry``."""
    processor = _STATE.processor
    exporter = _STATE.exporter
    return {
        "exported": exporter.exported if exporter is not None else 0,
        "failed": exporter.failed if exporter is not None else 0,
        "dropped": processor.dropped if processor is not None else 0,
    }


def is_active() -> bool:
    """Whether ``init_telemetry`` is in effect (and not shut down)."""
    return _STATE.active
