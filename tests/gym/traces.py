"""Reading the spans a sink received back as traces, for the real-Gym assertions."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import gym_telemetry_semconv as semconv
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from testkit.sink import RecordedSpan

SERVER = Span.SpanKind.SPAN_KIND_SERVER
CLIENT = Span.SpanKind.SPAN_KIND_CLIENT


@dataclass
class Trace:
    trace_id: bytes
    spans: list[RecordedSpan] = field(default_factory=list)

    @property
    def by_id(self) -> dict[bytes, RecordedSpan]:
        return {s.span.span_id: s for s in self.spans}

    def services(self) -> set[str]:
        return {str(s.resource.get(semconv.SERVICE_NAME)) for s in self.spans}

    def named(self, name: str) -> list[RecordedSpan]:
        return [s for s in self.spans if s.span.name == name]

    def roots(self) -> list[RecordedSpan]:
        return [s for s in self.spans if not s.span.parent_span_id]

    def orphans(self) -> list[RecordedSpan]:
        ids = self.by_id
        return [s for s in self.spans if s.span.parent_span_id and s.span.parent_span_id not in ids]

    def parent(self, span: RecordedSpan) -> RecordedSpan | None:
        return self.by_id.get(span.span.parent_span_id)

    def is_descendant(self, span: RecordedSpan, ancestor: RecordedSpan) -> bool:
        ids = self.by_id
        current = ids.get(span.span.parent_span_id)
        for _ in range(len(self.spans)):
            if current is None:
                return False
            if current.span.span_id == ancestor.span.span_id:
                return True
            current = ids.get(current.span.parent_span_id)
        return False

    def rollout_ids(self) -> set[object]:
        return {s.attributes.get(semconv.ROLLOUT_ID) for s in self.spans}


def traces(spans: list[RecordedSpan]) -> dict[bytes, Trace]:
    out: dict[bytes, Trace] = {}
    for s in spans:
        out.setdefault(s.span.trace_id, Trace(s.span.trace_id)).spans.append(s)
    return out


def by_rollout(spans: list[RecordedSpan]) -> dict[object, set[bytes]]:
    """Rollout id -> the trace ids its spans are in."""
    out: dict[object, set[bytes]] = defaultdict(set)
    for s in spans:
        out[s.attributes.get(semconv.ROLLOUT_ID)].add(s.span.trace_id)
    return dict(out)


def shape(spans: list[RecordedSpan]) -> dict[str, object]:
    """A summary of one trace's shape, for reports: spans per service, roots, orphans, and
    how many spans carry a rollout id."""
    per_service: dict[str, int] = defaultdict(int)
    for s in spans:
        per_service[str(s.resource.get(semconv.SERVICE_NAME))] += 1
    trace = Trace(spans[0].span.trace_id if spans else b"", list(spans))
    return {
        "spans": len(spans),
        "per_service": dict(sorted(per_service.items())),
        "roots": [r.span.name for r in trace.roots()],
        "orphans": len(trace.orphans()),
        "with_rollout_id": sum(1 for s in spans if s.attributes.get(semconv.ROLLOUT_ID)),
        "names": sorted(s.span.name for s in spans),
    }


def write_shapes(path_env: str, groups: dict[str, list[RecordedSpan]]) -> None:
    """Write ``{case: shape}`` as JSON to the file named by environment variable
    ``path_env``, when it is set (for before/after reports; tests do not need it)."""
    import json
    import os

    target = os.environ.get(path_env)
    if target:
        with open(target, "w", encoding="utf-8") as fh:
            json.dump({k: shape(v) for k, v in groups.items()}, fh, indent=1)
