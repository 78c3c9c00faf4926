"""What the gateway tier loses when tier 2's membership changes (a benchmark-style
report, not a test: how much is lost depends on timing, which a shared machine does not
hold still).

    uv run --frozen python -m bench.gateway_faults --traces 600 --rate 20

Tier 1 (static resolver) in front of tier-2 replicas ``a`` and ``b``, exporting to a
recording OTLP sink; every trace is kept (``GATEWAY_KEEP_PERCENT=100``) so that anything
missing at the sink is a loss, not a sampling decision. A generator sends rollout-shaped
traces into tier 1: each trace is three requests (what the model server's, the resources
server's and the agent's sidecars send), ``--spread-s`` apart, the agent's last with the
root span, ``SPANS_PER_TRACE`` spans in all. While it runs:

1. ``kill``: replica ``b`` is killed (SIGKILL, as a crash or an OOM kill) at one third of
   the run and restarted on the same port ``--down-s`` later;
2. ``add``: a replica ``c`` is started at two thirds of the run and tier 1 is restarted
   (SIGTERM: it drains) with ``[a, b, c]``, what an operator does with the static
   resolver (the DNS resolver on Kubernetes changes the ring without a restart).

Each replica exports to its own recording sink. Then every trace is classified: whole
(all its spans, decided on one replica), partial (some spans: a replica died holding
part of it), missing, and ``split_whole`` / ``split_partial`` when its spans reached more
than one replica's sink (the ring moved mid-trace: each replica decided on part of it;
with every trace kept that still looks whole in a backend, under sampling the two
decisions can differ); by the phase in which the trace started. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
from gym_telemetry_demo.stopsignals import run_main
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from testkit.otelcol import TIER1, TIER2, Collector, gateway_binary
from testkit.sink import RecordingSink

SPANS_PER_TRACE = 12
PARTS = (("nemo-gym/policy_model", 4), ("nemo-gym/failing_weather", 4), ("nemo-gym/agent", 4))


def _request(trace_id: bytes, root_id: bytes, service: str, n: int, root: bool) -> bytes:
    req = ExportTraceServiceRequest()
    rs: ResourceSpans = req.resource_spans.add()
    rs.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value=service))
    )
    ss = rs.scope_spans.add()
    now = time.time_ns()
    for i in range(n):
        span: Span = ss.spans.add()
        span.trace_id = trace_id
        is_root = root and i == n - 1
        span.span_id = root_id if is_root else secrets.token_bytes(8)
        if not is_root:
            span.parent_span_id = root_id
        span.name = "gym.rollout" if is_root else f"{service} op {i}"
        span.start_time_unix_nano = now - 1_000_000
        span.end_time_unix_nano = now
        span.status.code = Status.STATUS_CODE_OK
    return req.SerializeToString()


class Generator:
    def __init__(self, target: str, traces: int, rate: float, spread_s: float) -> None:
        self.target = target
        self.traces = traces
        self.rate = rate
        self.spread_s = spread_s
        self.started: dict[bytes, float] = {}
        self.failed_sends = 0
        self.lock = threading.Lock()

    def _send(self, body: bytes) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                with grpc.insecure_channel(self.target) as channel:
                    stub = TraceServiceStub(channel)
                    stub.Export(ExportTraceServiceRequest.FromString(body), timeout=10)
                return
            except grpc.RpcError:
                with self.lock:
                    self.failed_sends += 1
                if time.monotonic() > deadline:
                    return
                time.sleep(0.5)  # tier 1 restarting: retry, as a sidecar does

    def _trace(self) -> None:
        trace_id, root_id = secrets.token_bytes(16), secrets.token_bytes(8)
        with self.lock:
            self.started[trace_id] = time.monotonic()
        for k, (service, n) in enumerate(PARTS):
            if k:
                time.sleep(self.spread_s)
            self._send(_request(trace_id, root_id, service, n, root=k == len(PARTS) - 1))

    def run(self) -> None:
        threads = []
        for _ in range(self.traces):
            t = threading.Thread(target=self._trace)
            t.start()
            threads.append(t)
            time.sleep(1 / self.rate)
        for t in threads:
            t.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--traces", type=int, default=600)
    parser.add_argument("--rate", type=float, default=20.0, help="new traces per second")
    parser.add_argument("--spread-s", type=float, default=1.0)
    parser.add_argument("--down-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    binary = gateway_binary(lambda line: print(line, file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="gateway-faults-"))
    # One sink per replica: a trace whose spans reach two sinks was decided on two
    # replicas (split by a ring change), which a single backend cannot show when every
    # trace is kept.
    sinks = {n: RecordingSink().start() for n in "abc"}
    env2 = {
        "GATEWAY_KEEP_PERCENT": "100",
        "GATEWAY_DECISION_WAIT": "30s",
        "GATEWAY_DECISION_WAIT_AFTER_ROOT": "5s",
    }
    replicas = {
        n: Collector(
            binary,
            TIER2,
            work,
            f"tier2-{n}",
            {**env2, "GATEWAY_BACKEND_OTLP_GRPC": sinks[n].endpoint},
        )
        for n in "abc"
    }
    for n in "ab":
        replicas[n].start()

    def tier1_for(names: str, port: int | None = None) -> Collector:
        hosts = ", ".join(replicas[n].grpc_endpoint for n in names)
        c = Collector(binary, TIER1, work, "tier1", {"GATEWAY_TIER2_ENDPOINTS": f"[{hosts}]"})
        if port is not None:
            c.grpc_port = port
        return c.start()

    tier1 = tier1_for("ab")
    gen = Generator(tier1.grpc_endpoint, args.traces, args.rate, args.spread_s)
    run_s = args.traces / args.rate
    events: dict[str, float] = {}
    thread = threading.Thread(target=gen.run)
    t0 = time.monotonic()
    thread.start()
    try:
        time.sleep(run_s / 3)
        events["kill_b"] = time.monotonic() - t0
        replicas["b"].kill()
        time.sleep(args.down_s)
        replicas["b"].start()
        events["restart_b"] = time.monotonic() - t0
        time.sleep(max(0.0, run_s * 2 / 3 - (time.monotonic() - t0)))
        replicas["c"].start()
        events["add_c"] = time.monotonic() - t0
        port = tier1.grpc_port
        tier1.stop()
        tier1 = tier1_for("abc", port)
        events["tier1_restarted"] = time.monotonic() - t0
        thread.join()
        sent = sum(n for _, n in PARTS) * args.traces
        time.sleep(60)  # decisions: 30 s at most, plus export
        got: Counter[bytes] = Counter()
        deciders: dict[bytes, set[str]] = {}
        for name, sink in sinks.items():
            for s in sink.spans():
                got[s.span.trace_id] += 1
                deciders.setdefault(s.span.trace_id, set()).add(name)
        phases: dict[str, Counter[str]] = {}
        for trace_id, started in gen.started.items():
            at = started - t0
            phase = (
                "before_kill"
                if at < events["kill_b"]
                else "kill_to_add"
                if at < events["add_c"]
                else "after_add"
            )
            n = got.get(trace_id, 0)
            kind = "missing" if n == 0 else "whole" if n == SPANS_PER_TRACE else "partial"
            if n and len(deciders[trace_id]) > 1:
                kind = f"split_{kind}"  # decided on more than one replica
            phases.setdefault(phase, Counter())[kind] += 1
        report = {
            "traces": args.traces,
            "spans_sent": sent,
            "spans_at_sink": sum(got.values()),
            "failed_sends_retried": gen.failed_sends,
            "events_s": {k: round(v, 1) for k, v in events.items()},
            "by_phase": {k: dict(v) for k, v in phases.items()},
            "load_avg": os.getloadavg()[0],
        }
        print(json.dumps(report, indent=1))
    finally:
        tier1.stop()
        for c in replicas.values():
            c.stop()
        for sink in sinks.values():
            sink.stop()
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
