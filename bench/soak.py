"""Soak: the sidecar in its default configuration at a fixed rate for a long time, with
the backend going away and coming back (a benchmark harness, not a test; it asserts
nothing).

    uv run --frozen python -m bench.soak [--minutes 30] [--rate 10000] [--load rollouts]
        [--outage-every-s 300] [--outage-s 30] [--first-outage-s 120] [--name soak]

- The sidecar: ``gym-sidecar run --backend <sink>`` and nothing else (gRPC export, no
  compression, default span groups, the default 64 MiB memory queue).
- The backend: a counting gRPC sink (``testkit.sink.RecordingSink``) on a fixed
  port; every ``--outage-every-s`` (first at ``--first-outage-s``) it is stopped for
  ``--outage-s`` and started again on the same port. While it is away the sidecar
  retries, its queue fills, and once the queue is full clients are refused
  (RESOURCE_EXHAUSTED) and retry, as an SDK does.
- The load: ``bench.loadgen`` paced at ``--rate`` spans/s over gRPC (``rollouts`` load by
  default: whole rollouts, 2 of 18 spans derived from). It counts, per distinct request,
  how many were answered OK.
- Every 5 s: the sidecar's RSS and CPU, its queue bytes, refused and dropped counters
  (``/metrics``), the sink's count and the generator's progress.

At the end (generator done, the sink's count still for 15 s) it checks, and prints, that
every span answered OK and forwarded by the default gating (its group ``on``) reached
the sink: *expected* = Σ over requests answered OK of their spans in ``on`` groups;
*delivered* = what the sink counted (a retried export may deliver a batch twice, so
delivered ≥ expected is the check, and the excess is printed). RSS at minute 5 and at
the end (the outages are scheduled so that both are as long after an outage). Writes
``docs/benchmarks/<name>.json`` and a plot ``docs/benchmarks/<name>.png`` (RSS, queue
bytes, refused and dropped counters, the rates in and out).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
from gym_telemetry_demo.ports import free_port
from gym_telemetry_demo.sidecar import SidecarProcess
from gym_telemetry_demo.stopsignals import run_main
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.loadgen import build_requests
from bench.sidecar_vs_rotel.procs import cpu_seconds, status_mib
from testkit.sink import RecordingSink

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
SAMPLE_S = 5.0


def forwarded_spans(bodies: list[tuple[bytes, int]], spec: str = semconv.DEFAULT_SPEC) -> list[int]:
    """Per request, the spans whose group the spec forwards (mode ``on``)."""
    modes = semconv.resolve_modes(spec)
    on = {semconv.scope_name(g) for g, m in modes.items() if m == semconv.Mode.ON}
    out = []
    for body, _ in bodies:
        req = ExportTraceServiceRequest.FromString(body)
        out.append(
            sum(
                len(ss.spans)
                for rs in req.resource_spans
                for ss in rs.scope_spans
                if ss.scope.name in on
            )
        )
    return out


class Backend:
    """The counting sink, restartable on the same port; counts survive restarts."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self._done = 0
        self.sink: RecordingSink | None = None
        self.up = False

    def start(self) -> None:
        for _ in range(100):
            try:
                self.sink = RecordingSink(port=self.port, record=False).start()
                self.up = True
                return
            except RuntimeError:  # port not yet free
                time.sleep(0.1)
        raise RuntimeError(f"cannot listen on {self.endpoint} again")

    def stop(self) -> None:
        if self.sink is not None:
            self.sink.stop()
            self._done += self.sink.span_count
            self.sink = None
        self.up = False

    @property
    def span_count(self) -> int:
        return self._done + (self.sink.span_count if self.sink is not None else 0)


def _metrics(sc: SidecarProcess) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = sc.admin_get("/metrics")
    if status != 200:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if (
                s.name.startswith(
                    (
                        "gym_sidecar_queue_bytes",
                        "gym_sidecar_refused_items_total",
                        "gym_sidecar_dropped_items_total",
                        "gym_sidecar_exported_items_total",
                        "gym_sidecar_received_items_total",
                        "gym_sidecar_export_errors_total",
                    )
                )
                and s.labels.get("signal", "traces") == "traces"
            ):
                reason = s.labels.get("reason") or s.labels.get("kind")
                key = s.name.removeprefix("gym_sidecar_") + (f":{reason}" if reason else "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=10_000.0)
    p.add_argument("--load", default="rollouts")
    p.add_argument("--outage-every-s", type=float, default=300.0)
    p.add_argument("--outage-s", type=float, default=30.0)
    p.add_argument("--first-outage-s", type=float, default=120.0)
    p.add_argument("--name", default="soak")
    args = p.parse_args(argv)
    seconds = args.minutes * 60
    distinct, seed = 56, 1
    bodies = build_requests(512, distinct, seed, args.load)
    fwd = forwarded_spans(bodies)
    backend = Backend()
    backend.start()
    workdir = Path("/tmp") / f"bench-soak-{int(time.time())}"
    workdir.mkdir(parents=True, exist_ok=True)
    sc = SidecarProcess(
        backend=backend.endpoint, extra_args=["--log-level", "warning"], log_dir=workdir
    )
    sc.start()
    assert sc.proc is not None
    pid = sc.proc.pid
    load_start = _loadavg()
    print(
        f"soak: {args.minutes} min at {args.rate:.0f} spans/s, load {args.load}, "
        f"sidecar pid {pid}, load average {load_start}",
        flush=True,
    )
    gen = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.loadgen",
            "--target",
            sc.grpc_endpoint,
            "--protocol",
            "grpc",
            "--spans",
            "512",
            "--distinct",
            str(distinct),
            "--seed",
            str(seed),
            "--load",
            args.load,
            "--rate",
            str(args.rate),
            "--seconds",
            str(seconds),
            "--progress-s",
            "5",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    events: dict[str, Any] = {"progress": {}, "done": None}

    def read() -> None:
        assert gen.stdout is not None
        for line in gen.stdout:
            ev = json.loads(line)
            if ev["event"] == "progress":
                events["progress"] = ev
            elif ev["event"] == "done":
                events["done"] = ev

    threading.Thread(target=read, daemon=True).start()
    t0 = time.monotonic()
    cpu0 = cpu_seconds(pid)
    samples: list[dict[str, Any]] = []
    outages: list[tuple[float, float]] = []
    next_outage = args.first_outage_s
    down_until: float | None = None
    next_sample = 0.0
    while gen.poll() is None or events["done"] is None:
        now = time.monotonic() - t0
        if down_until is None and now >= next_outage and now < seconds:
            backend.stop()
            down_until = now + args.outage_s
            print(f"  {now:7.1f}s backend stopped", flush=True)
        elif down_until is not None and now >= down_until:
            backend.start()
            outages.append((next_outage, now))
            print(f"  {now:7.1f}s backend back", flush=True)
            down_until = None
            next_outage += args.outage_every_s
        if now >= next_sample:
            m = _metrics(sc)
            prog = events["progress"]
            sample = {
                "t": round(now, 2),
                "rss_mib": status_mib(pid, "VmRSS"),
                "hwm_mib": status_mib(pid, "VmHWM"),
                "cpu_s": cpu_seconds(pid) - cpu0,
                "sink_spans": backend.span_count,
                "backend_up": backend.up,
                "gen_spans_ok": prog.get("spans", 0),
                "gen_retries": prog.get("retries", 0),
                "gen_errors": prog.get("errors", 0),
                "loadavg": _loadavg()[0],
                **m,
            }
            samples.append(sample)
            if len(samples) % 12 == 1:
                print(
                    f"  {now:7.1f}s rss {sample['rss_mib']:.1f} MiB queue "
                    f"{m.get('queue_bytes', 0) / 2**20:.1f} MiB sink {sample['sink_spans']} "
                    f"ok {sample['gen_spans_ok']} retries {sample['gen_retries']} "
                    f"load {sample['loadavg']}",
                    flush=True,
                )
            next_sample += SAMPLE_S
        time.sleep(0.1)
    if not backend.up:
        backend.start()
    done = events["done"] or {}
    ok = done.get("ok_per_body", [0] * distinct)
    expected = sum(k * f for k, f in zip(ok, fwd, strict=True))
    last, still = -1, time.monotonic()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        c = backend.span_count
        if c != last:
            last, still = c, time.monotonic()
        elif (c >= expected and time.monotonic() - still > 15) or time.monotonic() - still > 60:
            break
        time.sleep(0.5)
    final_metrics = _metrics(sc)
    end_rss = status_mib(pid, "VmRSS")
    cpu_total = cpu_seconds(pid) - cpu0
    code = sc.stop()
    backend.stop()
    delivered = backend.span_count
    load_end = _loadavg()

    def rss_at(minute: float) -> float:
        best = min(samples, key=lambda s: abs(s["t"] - minute * 60))
        return float(best["rss_mib"])

    minute_end = min(args.minutes, samples[-1]["t"] / 60)
    rss5, rss_end = rss_at(min(5.0, args.minutes)), rss_at(minute_end)
    result = {
        "args": vars(args),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "sidecar_exit": code,
        "generator": {k: v for k, v in done.items() if k != "ok_per_body"},
        "spans_answered_ok": int(done.get("spans", 0)),
        "expected_forwarded": expected,
        "delivered": delivered,
        "missing": max(0, expected - delivered),
        "duplicates_or_extra": max(0, delivered - expected),
        "rss_minute_5_mib": rss5,
        "rss_end_mib": rss_end,
        "rss_end_minute": round(minute_end, 2),
        "rss_growth": rss_end / rss5 - 1,
        "rss_after_drain_mib": end_rss,
        "peak_rss_mib": max(s["hwm_mib"] for s in samples),
        "cpu_pct_of_core": 100 * cpu_total / max(1e-9, samples[-1]["t"]),
        "outages": outages,
        "final_metrics": final_metrics,
        "samples": samples,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    _plot(result, OUT / f"{args.name}.png")
    print(
        f"soak done: answered OK {result['spans_answered_ok']} spans, forwarded by the default "
        f"gating {expected}, delivered {delivered} (missing {result['missing']}, extra "
        f"{result['duplicates_or_extra']}); retries {done.get('retries')}, errors "
        f"{done.get('errors')}; RSS minute 5 {rss5:.1f} MiB, minute {minute_end:.1f} "
        f"{rss_end:.1f} MiB ({100 * result['rss_growth']:+.1f}%), peak "
        f"{result['peak_rss_mib']:.1f}; CPU {result['cpu_pct_of_core']:.1f}% of a core; "
        f"sidecar exit {code}; load average {load_start} -> {load_end}",
        flush=True,
    )
    return 0


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    t = [x["t"] / 60 for x in s]
    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    ax = axes[0]
    ax.plot(t, [x["rss_mib"] for x in s], label="RSS")
    ax.set_ylabel("MiB")
    ax.set_title(
        f"sidecar soak, default config, {result['args']['rate']:.0f} spans/s "
        f"({result['args']['load']} load); load average {result['load_average_start'][0]}"
        f" -> {result['load_average_end'][0]}"
    )
    ax.legend()
    ax = axes[1]
    ax.plot(t, [x.get("queue_bytes", 0) / 2**20 for x in s], label="queue bytes")
    ax.set_ylabel("queue MiB")
    ax.legend()
    ax = axes[2]
    keys = sorted({k for x in s for k in x if k.startswith(("refused", "dropped"))})
    for k in keys:
        ax.plot(t, [x.get(k, 0) for x in s], label=k.replace("_items_total", ""))
    ax.plot(
        t,
        [x["gen_retries"] for x in s],
        label="client retries",
        linestyle=":",
    )
    ax.set_ylabel("count (cumulative)")
    ax.set_yscale("symlog")
    ax.legend(fontsize=8)
    ax = axes[3]

    def rate(key: str) -> list[float]:
        out = [0.0]
        for a, b in itertools.pairwise(s):
            out.append((b[key] - a[key]) / max(1e-9, b["t"] - a["t"]))
        return out

    ax.plot(t, rate("gen_spans_ok"), label="spans answered OK /s")
    ax.plot(t, rate("sink_spans"), label="spans delivered /s")
    for a, b in result["outages"]:
        for axis in axes:
            axis.axvspan(a / 60, b / 60, color="red", alpha=0.12)
    ax.set_ylabel("spans/s")
    ax.set_xlabel("minutes (red: backend stopped)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
