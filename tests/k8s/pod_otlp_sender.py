"""An app for the pod test: an OpenTelemetry SDK process that sends spans wherever its
environment says, the way ``opentelemetry-instrument`` configures an app.

It runs inside the pod (mounted from a ConfigMap, in the gym-server image, which has
the SDK and both OTLP exporters) and knows nothing of the sidecar: the exporter is the
one ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` names
(``grpc`` or ``http/protobuf``, as the SDK's own configurator picks it) and it reads its
endpoint, service name and everything else from the environment itself.

``python pod_otlp_sender.py serve --spans N --last M``: sends phase ``start`` (one trace
of N spans), then waits for SIGTERM (the pod's deletion) and sends phase ``last`` (M
spans) before exiting. ``python pod_otlp_sender.py once PHASE --spans N``: one phase,
then exit (run with ``kubectl exec``). Each phase prints one JSON line:
``{"phase", "trace_id", "spans", "acked", "protocol", "endpoint"}``; ``acked`` is whether
the exporter got a success answer for the whole batch. Exit status 1 when not acked.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def protocol() -> str:
    value = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "http/protobuf",  # the specification's default
    )
    return value.strip()


def exporter() -> SpanExporter:
    """The SDK's exporter for the protocol, built with no argument: it reads the
    endpoint from the environment as any app's would."""
    chosen = protocol()
    if chosen == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if chosen == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter()
    raise SystemExit(f"unsupported OTLP protocol {chosen!r}")


class Collect(SpanProcessor):
    """Keeps every ended span, so a phase is exported as one batch and its answer seen."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def send(phase: str, count: int) -> bool:
    collected = Collect()
    provider = TracerProvider()  # the resource from OTEL_SERVICE_NAME / _RESOURCE_ATTRIBUTES
    provider.add_span_processor(collected)
    tracer = provider.get_tracer("gym-telemetry.pod-test.sender")
    with tracer.start_as_current_span(f"{phase}-root", attributes={"phase": phase}) as root:
        for index in range(count - 1):
            with tracer.start_as_current_span(
                f"{phase}-{index}", attributes={"phase": phase, "index": index}
            ):
                pass
        trace_id = format(root.get_span_context().trace_id, "032x")
    out = exporter()
    result = out.export(collected.spans)
    out.shutdown()
    report: dict[str, Any] = {
        "phase": phase,
        "trace_id": trace_id,
        "spans": len(collected.spans),
        "acked": result is SpanExportResult.SUCCESS,
        "protocol": protocol(),
        "endpoint": os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
    }
    print(json.dumps(report), flush=True)
    return bool(report["acked"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["serve", "once"])
    parser.add_argument("phase", nargs="?", default="start")
    parser.add_argument("--spans", type=int, default=100)
    parser.add_argument("--last", type=int, default=20)
    args = parser.parse_args(argv)
    if args.mode == "once":
        return 0 if send(args.phase, args.spans) else 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ok = send("start", args.spans)
    stop.wait()
    ok = send("last", args.last) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
