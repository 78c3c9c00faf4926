"""The lean path (private): every line of the agent that depends on an SDK internal.

Recording a span cheaply over the OpenTelemetry SDK, and exporting it cheaply, means
reading and writing fields the SDK does not publish. All of that lives in this package,
so that bumping the SDK pin means re-reading this folder only:

- ``span``: ``LeanSpan``, a recording span that is its own ``ReadableSpan``, and
  ``clean_value`` (attribute values OpenTelemetry accepts);
- ``recorder``: ``LeanRecorder`` / ``SdkRecorder`` and ``recorder_for``, the choice
  between them, and the recorder's one-time self-check (``_layout_ok``);
- ``otlp_wire`` and ``span_encoding``: the lean encoder, spans (or span records) to
  OTLP wire bytes;
- ``probes``: probe spans of every shape the encoder's self-check compares with the
  stock encoder;
- ``grpc_exporter``: the SDK's OTLP/gRPC exporter with the lean encoder plugged in,
  and its self-check;
- ``log_transport``: sending serialized OTLP log requests (the live events) where the
  span exporter sends its spans;
- ``sdk_hooks``: the batch processor's queue, ``emit`` step (and its usual case as a
  plain append) and inner shutdown, and
  the API's current-span context key;
- ``context``: the API's runtime context and ``SpanContext`` reached directly (the
  current context's ``ContextVar``; a span context as the 6-tuple it is).

SDK internals used (``SDK_INTERNALS`` below; ``tests/agent/test_sdk_internals.py``
checks that no module outside this package touches one of them, and that this list
names every private field the package reads):

- ``ReadableSpan``'s fields ``_name``, ``_context``, ``_kind``, ``_parent``,
  ``_start_time``, ``_end_time``, ``_attributes``, ``_events``, ``_links``,
  ``_resource``, ``_status``, ``_instrumentation_scope``, ``_instrumentation_info``
  (``LeanSpan`` sets them, the encoder reads them);
- ``sdk.trace.Tracer._instrumentation_scope``, ``Tracer._is_enabled`` (1.3x+) and the
  ``_tracer_config`` it reads (read directly when ``_is_enabled`` is the SDK's own);
- ``SynchronousMultiSpanProcessor._span_processors`` and a processor's ``_on_ending``;
- ``ParentBased``'s ``_root`` and its four ``_*_parent_*`` delegates;
- ``ProxyTracer._real_tracer``;
- ``opentelemetry.trace.propagation._SPAN_KEY``;
- ``opentelemetry.context._RUNTIME_CONTEXT`` and its ``_current_context`` ContextVar
  (the contextvars runtime context), and ``SpanContext``'s tuple layout;
- ``BatchSpanProcessor._batch_processor`` and its ``_queue``, ``_max_queue_size``,
  ``emit`` and ``shutdown(timeout_millis=...)``, and the fields its ``emit`` reads
  (``_max_export_batch_size``, ``_worker_awaken``, ``_pid``, ``_shutdown``; the queue
  append of ``sdk_hooks.batch_append``);
- ``OTLPSpanExporter._translate_data`` (overridden by the lean exporter), and its
  ``_channel``, ``_client`` and ``_stub`` (the lean exporter's stub sends bytes);
- for the live events (``log_transport``): the gRPC span exporter's ``_channel``,
  ``_headers`` and ``_timeout``; the OTLP/HTTP span exporter's ``_endpoint``, and the
  OTLP/HTTP log exporter's ``_client`` (its ``export`` of serialized bytes) or, on earlier
  releases, its ``_export`` step.

SDK versions checked: the declared range ``opentelemetry-api``/``-sdk``/
``-exporter-otlp-proto-grpc`` ``>=1.27,<1.46`` (``agent/pyproject.toml``); both ends
are installed and exercised by ``tests/agent/test_sdk_range.py`` (1.27.0: lean
recorder, stock encoder; 1.45.x: both lean). Every lean step also checks itself once
against the installed SDK at run time and falls back to the SDK's own path.

This package imports nothing of ``gym_telemetry`` but ``environment_variables``.
"""

from __future__ import annotations

from typing import Final

#: The SDK's private names this package reads or writes (module docstring).
SDK_INTERNALS: Final[frozenset[str]] = frozenset(
    {
        "_name",
        "_context",
        "_kind",
        "_parent",
        "_start_time",
        "_end_time",
        "_attributes",
        "_events",
        "_links",
        "_resource",
        "_status",
        "_instrumentation_scope",
        "_instrumentation_info",
        "_is_enabled",
        "_tracer_config",
        "_span_processors",
        "_on_ending",
        "_root",
        "_remote_parent_sampled",
        "_remote_parent_not_sampled",
        "_local_parent_sampled",
        "_local_parent_not_sampled",
        "_real_tracer",
        "_SPAN_KEY",
        "_batch_processor",
        "_queue",
        "_max_queue_size",
        "_translate_data",
        "_max_export_batch_size",
        "_worker_awaken",
        "_pid",
        "_shutdown",
        "_RUNTIME_CONTEXT",
        "_current_context",
        "_channel",
        "_client",
        "_stub",
        "_headers",
        "_timeout",
        "_endpoint",
        "_export",
    }
)
