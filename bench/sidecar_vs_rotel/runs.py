"""One measured run: start a collector, drive the load generator through it into the sink.

``throughput_run`` sends a fixed number of spans as fast as the path takes them and times
until the sink has counted all of them (spans/s *delivered*); ``fixed_rate_run`` paces
the generator at a span rate and reports the collector's CPU share and memory. Both read
the collector's CPU (user + system, all threads) from /proc before and after, and its
peak RSS (``VmHWM``, since the process started; every run starts a fresh collector).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import pyspy
from bench.sidecar_vs_rotel.procs import Collector, cpu_seconds, pin, status_mib
from bench.sidecar_vs_rotel.relay import ByteCountingRelay
from testkit.http_sink import HttpSink
from testkit.sink import RecordingSink

Progress = Callable[[int, int], None]
"""Called with (spans delivered so far, spans expected) while a run is going."""

POLL_S = 0.01
DELIVERY_TIMEOUT_S = 120.0


@dataclass
class LoadSpec:
    """What the generator sends (see ``bench.loadgen``)."""

    protocol: str = "grpc"
    spans: int = 512
    requests: int = 400
    concurrency: int = 8
    rate: float = 0.0
    seconds: float = 0.0
    load: str = "varied"
    seed: int = 1
    groups: str = "all"
    """The collectors' span-group spec (sidecar, otelcol); not the generator's."""

    @property
    def label(self) -> str:
        """The load as reported: ``<load>`` with span groups ``all``, else ``<load>:<groups>``."""
        return self.load if self.groups == "all" else f"{self.load}:{self.groups}"

    def args(self, target: str) -> list[str]:
        out = [
            sys.executable,
            "-m",
            "bench.loadgen",
            "--target",
            target,
            "--protocol",
            self.protocol,
            "--spans",
            str(self.spans),
            "--concurrency",
            str(self.concurrency),
            "--progress-s",
            "0.2",
            "--load",
            self.load,
            "--seed",
            str(self.seed),
        ]
        if self.rate:
            return [*out, "--rate", str(self.rate), "--seconds", str(self.seconds)]
        return [*out, "--requests", str(self.requests)]


@dataclass
class RunResult:
    path: str
    protocol: str
    repeat: int
    load: str
    pinned: bool
    spans_sent: int
    spans_delivered: int
    seconds: float
    spans_per_s: float
    cpu_s: float | None
    spans_per_cpu_s: float | None
    cpu_pct: float | None
    peak_rss_mib: float | None
    rss_end_mib: float | None
    retries: int
    errors: int
    out_bytes_per_span: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class _Generator:
    """The load generator subprocess; a thread collects its JSON events."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.started_at: float | None = None
        self.start_event: dict[str, Any] = {}
        self.done: dict[str, Any] | None = None
        self.done_at: float | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            if event["event"] == "start":
                self.start_event = event
                self.started_at = time.monotonic()
            elif event["event"] == "done":
                self.done_at = time.monotonic()
                self.done = event

    def finished(self) -> bool:
        return self.done is not None or self.proc.poll() is not None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._thread.join(timeout=5)


def _loadavg() -> float:
    with open("/proc/loadavg", encoding="ascii") as f:
        return float(f.read().split()[0])


def run(
    collector: Collector,
    sink: RecordingSink | HttpSink,
    load: LoadSpec,
    repeat: int,
    progress: Progress,
    pin_cores: tuple[set[int], set[int]] | None = None,
    profile: Path | None = None,
    relay: ByteCountingRelay | None = None,
    settle_s: float | None = None,
) -> RunResult:
    """One run on a freshly started collector (stopped afterwards); see module doc.

    ``settle_s``: the collector forwards only part of what it gets (its default span
    gating), so the run ends once the generator is done and the sink's count has not
    moved for this long, instead of waiting for every span.
    """
    collector.start()
    try:
        if pin_cores is not None and collector.pid is not None:
            pin(collector.pid, pin_cores[0])
        target = collector.grpc_target if load.protocol == "grpc" else collector.http_target
        if target is None:
            raise ValueError(f"path {collector.name} has no {load.protocol} receiver")
        base = sink.span_count
        bytes0 = relay.sent if relay is not None else 0
        pid = collector.pid
        loadavg = _loadavg()
        gen = _Generator(load.args(target))
        try:
            while gen.started_at is None and not gen.finished():
                time.sleep(POLL_S)
            expected = int(gen.start_event.get("expected_spans", 0))
            cpu0 = cpu_seconds(pid) if pid else None
            t0 = gen.started_at or time.monotonic()
            spy = None
            if profile is not None and pid is not None:
                spy = pyspy.start(pid, max(2.0, load.seconds), profile)
            delivered_at = None
            last_count, last_change = -1, time.monotonic()
            while True:
                got = sink.span_count - base
                progress(got, expected)
                if got != last_count:
                    last_count, last_change = got, time.monotonic()
                elif (
                    settle_s is not None
                    and gen.finished()
                    and delivered_at is None
                    and time.monotonic() - last_change >= settle_s
                ):
                    delivered_at = last_change
                if got >= expected and delivered_at is None and settle_s is None:
                    delivered_at = time.monotonic()
                if gen.finished() and (delivered_at or time.monotonic() - t0 > DELIVERY_TIMEOUT_S):
                    break
                if time.monotonic() - t0 > DELIVERY_TIMEOUT_S + (load.seconds or 0):
                    break
                time.sleep(POLL_S)
            end = delivered_at or time.monotonic()
            # Paced runs: CPU share over the sending window (plus the tail of delivery).
            cpu1 = cpu_seconds(pid) if pid else None
            rss_end = status_mib(pid, "VmRSS") if pid else None
            peak = status_mib(pid, "VmHWM") if pid else None
            gen.proc.wait(timeout=30)
            if spy is not None:
                spy.wait(timeout=60)
        finally:
            gen.close()
        done = gen.done or {}
        got = sink.span_count - base
        out_bytes = (relay.sent - bytes0) if relay is not None else 0
        seconds = end - t0
        cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        return RunResult(
            path=collector.name,
            protocol=load.protocol,
            repeat=repeat,
            load=load.label,
            pinned=pin_cores is not None,
            spans_sent=int(done.get("spans", 0)),
            spans_delivered=got,
            seconds=seconds,
            spans_per_s=got / seconds if seconds > 0 else 0.0,
            cpu_s=cpu,
            # Spans handled per CPU-second: delivered, or received when the collector
            # drops some by design (span groups other than ``all``).
            spans_per_cpu_s=((got if load.groups == "all" else int(done.get("spans", 0))) / cpu)
            if cpu
            else None,
            cpu_pct=(100.0 * cpu / seconds) if cpu is not None and seconds > 0 else None,
            peak_rss_mib=peak,
            rss_end_mib=rss_end,
            retries=int(done.get("retries", 0)),
            errors=int(done.get("errors", 0)),
            out_bytes_per_span=out_bytes / got if relay is not None and got else None,
            extra={
                "generator_seconds": done.get("seconds"),
                "rate": load.rate,
                "loadavg_at_start": loadavg,
                "spread": gen.start_event.get("spread"),
                "scanner": getattr(collector, "scanner", None),
            },
        )
    finally:
        collector.stop()
