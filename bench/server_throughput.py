"""Requests/s of a FastAPI server: bare, with gym_telemetry, with the stock instrumentor, both.

    uv run --frozen python -m bench.server_throughput               # 4 variants x 3 x 8 s
    uv run --frozen python -m bench.server_throughput --quick       # 1 repeat x 3 s

A harness, not a test. Per run it starts a fresh server process (uvicorn, one worker,
access log off) serving a Gym-like resources server route, ``POST /verify`` with a
pydantic body, and a separate load process (aiohttp, ``--connections`` keep-alive
connections, each sending back to back, with a ``traceparent`` and the rollout-id
baggage as a Gym agent's call has). The load process warms up for ``--warmup`` s,
then counts answered requests for ``--seconds`` s. Spans go over OTLP/gRPC to a counting
sink in this process (``testkit.sink``), so export cost is in the server's CPU.

Variants (every app is built with FastAPI's built-in telemetry off, so no variant pays
for it; see ``gym_telemetry.fastapi_telemetry_off``):

- ``bare``: no OpenTelemetry set up at all.
- ``gym_telemetry``: the agent as a Gym server gets it (``autoinstrument.install`` hooks,
  ``start_server_telemetry`` for a resources server): the SERVER span middleware and the
  route wrappers, span groups ``--span-groups`` (default: ``default,-verify``, i.e. one
  SERVER span per request; ``default`` adds the ``gym.verify`` span, in ``metrics`` mode
  by default since issue 15.1).
- ``stock``: ``opentelemetry-instrumentation-fastapi``'s ``FastAPIInstrumentor`` with an
  SDK ``TracerProvider``, ``BatchSpanProcessor`` and the OTLP/gRPC exporter.
- ``both``: gym_telemetry, plus ``FastAPIInstrumentor`` on the same app and provider.

Figures per variant (median and range over repeats, variants interleaved in shuffled
order): requests/s, the ratio to bare, and server CPU per request (from /proc), whose
ratio to bare is steadier on a shared machine than requests/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_telemetry_demo.stopsignals import run_main
from pydantic import BaseModel

if TYPE_CHECKING:
    from testkit.sink import RecordingSink

VARIANTS = ("bare", "gym_telemetry", "stock", "both")
BODY = json.dumps(
    {
        "responses_create_params": {"input": [{"role": "user", "content": "What is 17 * 23?"}]},
        "response": {"output": [{"type": "message", "content": "391"}], "model": "policy"},
        "expected_answer": "391",
    }
).encode()


class VerifyRequest(BaseModel):
    """The shape of a Gym resources server's verify request (trimmed)."""

    responses_create_params: dict[str, Any]
    response: dict[str, Any]
    expected_answer: str


class VerifyResponse(BaseModel):
    reward: float
    extracted_answer: str


# --- the server process -------------------------------------------------------------
def serve(variant: str, port: int, sink: str, span_groups: str, handler_us: float = 0.0) -> None:
    """Build the app for ``variant`` and serve it on 127.0.0.1:``port`` until killed."""
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{sink}"
    os.environ["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    os.environ["GYM_TELEMETRY_SPAN_GROUPS"] = span_groups
    os.environ["GYM_TELEMETRY_POLL_INTERVAL_S"] = "0"  # no sidecar to poll here
    gym = variant in ("gym_telemetry", "both")
    if gym:
        from types import SimpleNamespace

        from gym_telemetry.autoinstrument.identity import start_server_telemetry
        from gym_telemetry.autoinstrument.install import install

        install()

        class SimpleResourcesServer:  # the name is what identifies a Gym resources server
            config = SimpleNamespace(name="bench_resources")

        if not start_server_telemetry(SimpleResourcesServer()):
            raise SystemExit("gym_telemetry did not start")
    import uvicorn
    from fastapi import FastAPI
    from gym_telemetry import fastapi_telemetry_off

    if variant == "stock":
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        # uvicorn re-raises SIGTERM after its graceful shutdown, so atexit hooks never run:
        # flush here, or the last batch of spans would be lost and uncounted.
        from opentelemetry import trace as trace_api

        flush = getattr(trace_api.get_tracer_provider(), "force_flush", None)
        if flush is not None:
            flush(5000)

    app = FastAPI(lifespan=lifespan, **fastapi_telemetry_off())

    @app.post("/verify")
    async def verify(body: VerifyRequest) -> VerifyResponse:
        if handler_us:  # stands for the verifier's own work (pure CPU)
            until = time.perf_counter() + handler_us / 1e6
            while time.perf_counter() < until:
                pass
        return VerifyResponse(reward=1.0, extracted_answer=body.expected_answer)

    if variant in ("stock", "both"):
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- the load process ---------------------------------------------------------------
async def _load(url: str, connections: int, warmup: float, seconds: float) -> None:
    import aiohttp

    count = [0, 0, 0]  # answered 200 while measuring, other while measuring, 200 in all
    measuring = [False]
    stop = [False]
    # What a Gym agent's call carries: W3C trace context and the rollout-id baggage.
    headers = {
        "Content-Type": "application/json",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "baggage": "nemo.gym.rollout.id=bench-rollout-17",
    }

    async def client(session: aiohttp.ClientSession) -> None:
        while not stop[0]:
            async with session.post(url, data=BODY, headers=headers) as resp:
                await resp.read()
                count[2] += resp.status == 200
                if measuring[0]:
                    count[0 if resp.status == 200 else 1] += 1

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(connections)]
        await asyncio.sleep(warmup)
        measuring[0] = True
        print(json.dumps({"event": "start"}), flush=True)
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        measuring[0] = False
        elapsed = time.monotonic() - t0
        ok, bad, _ = count
        print(
            json.dumps({"event": "done", "requests": ok, "errors": bad, "seconds": elapsed}),
            flush=True,
        )
        stop[0] = True
        await asyncio.gather(*tasks, return_exceptions=True)
        print(json.dumps({"event": "closed", "answered": count[2]}), flush=True)


# --- the harness --------------------------------------------------------------------
def one_run(
    variant: str, args: argparse.Namespace, sink: RecordingSink, repeat: int
) -> dict[str, Any]:
    from gym_telemetry_demo.ports import free_port, wait_listening

    from bench import pyspy
    from bench.sidecar_vs_rotel.procs import cpu_seconds, pin, status_mib

    port = free_port()
    base = sink.span_count
    me = [sys.executable, "-m", "bench.server_throughput"]
    server = subprocess.Popen(
        [
            *me,
            "--serve",
            variant,
            "--port",
            str(port),
            "--sink",
            sink.endpoint,
            "--handler-us",
            str(args.handler_us),
            "--span-groups",
            args.span_groups,
        ]
    )
    try:
        wait_listening(port, timeout_s=30)
        if args.pin:
            pin(server.pid, {1})
        load = subprocess.Popen(
            [
                *me,
                "--load",
                f"http://127.0.0.1:{port}/verify",
                "--connections",
                str(args.connections),
                "--warmup",
                str(args.warmup),
                "--seconds",
                str(args.seconds),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        if args.pin:
            pin(load.pid, {0})
        assert load.stdout is not None
        cpu0 = cpu1 = 0.0
        answered = 0
        done: dict[str, Any] = {}
        spy = None
        for line in load.stdout:
            event = json.loads(line)
            if event["event"] == "start":
                cpu0 = cpu_seconds(server.pid)
                if args.profile is not None:
                    out = args.profile / f"server-{variant}-{repeat}.txt"
                    spy = pyspy.start(server.pid, args.seconds - 1, out)
            elif event["event"] == "done":
                cpu1 = cpu_seconds(server.pid)
                done = event
            elif event["event"] == "closed":
                answered = int(event["answered"])
        load.wait(timeout=30)
        if spy is not None:
            spy.wait(timeout=60)
        rss = status_mib(server.pid, "VmHWM")
    finally:
        server.terminate()  # uvicorn shuts down; the SDKs flush their queues at exit
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    last, deadline = -1, time.monotonic() + 5
    while sink.span_count != last and time.monotonic() < deadline:  # until it settles
        last = sink.span_count
        time.sleep(0.3)
    spans = sink.span_count - base
    requests = int(done.get("requests", 0))
    if not requests or done.get("errors"):
        raise RuntimeError(f"{variant}: the load process got {done or 'nothing'}")
    seconds = float(done.get("seconds", 0.0)) or 1.0
    return {
        "variant": variant,
        "requests": requests,
        "errors": int(done.get("errors", 0)),
        "requests_per_s": requests / seconds,
        "server_cpu_us_per_request": 1e6 * (cpu1 - cpu0) / requests if requests else None,
        "server_cpu_pct": 100.0 * (cpu1 - cpu0) / seconds,
        "server_peak_rss_mib": rss,
        "spans_per_request": spans / answered if answered else None,
    }


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: list[dict[str, Any]], variants: list[str]) -> list[dict[str, Any]]:
    """Per variant: medians/ranges, and ratios to bare's medians."""
    out = []
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        row: dict[str, Any] = {"variant": v, "runs": len(mine)}
        keys = ("requests_per_s", "server_cpu_us_per_request", "server_peak_rss_mib")
        for key in (*keys, "spans_per_request"):
            vals = [r[key] for r in mine if r[key] is not None]
            row[key] = _stats(vals) if vals else None
        row["errors"] = sum(r["errors"] for r in mine)
        out.append(row)
    bare = next((r for r in out if r["variant"] == "bare"), None)
    for row in out:
        if bare and bare["requests_per_s"] and row["requests_per_s"]:
            row["throughput_vs_bare"] = (
                row["requests_per_s"]["median"] / bare["requests_per_s"]["median"]
            )
        if bare and bare["server_cpu_us_per_request"] and row["server_cpu_us_per_request"]:
            row["cpu_per_request_vs_bare"] = (
                row["server_cpu_us_per_request"]["median"]
                / bare["server_cpu_us_per_request"]["median"]
            )
    return out


def print_profiles(console: Any, directory: Path, variants: list[str]) -> None:
    """Where the instrumented servers spend their samples (first repeat of each)."""
    from bench import pyspy

    for v in variants:
        path = directory / f"server-{v}-0.txt"
        if v == "bare" or not path.exists():
            continue
        # py-spy shortens paths: the SDK shows as trace/..., sdk/..., exporter/...
        match = ("gym_telemetry", "trace/", "sdk/", "exporter", "encoder", "instrumentation")
        total, frames = pyspy.top_frames(path, top=24, match=match)
        console.print(f"[bold]{v}[/]: telemetry frames, % of {total} samples (inclusive)")
        for pct, frame in frames:
            console.print(f"  {pct:5.1f}%  {frame}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=1.5)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--span-groups", default="default,-verify", help="GYM_TELEMETRY_SPAN_GROUPS")
    p.add_argument(
        "--handler-us", type=float, default=0.0, help="CPU the handler burns per request (µs)"
    )
    p.add_argument("--tag", default="", help="suffix of the result file name")
    p.add_argument("--pin", action="store_true", help="server on core 1, load on core 0")
    p.add_argument("--quick", action="store_true", help="1 repeat x 3 s")
    p.add_argument("--profile", type=Path, help="py-spy each server into this directory")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    p.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--sink", help=argparse.SUPPRESS)
    p.add_argument("--load", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.sink, args.span_groups, args.handler_us)
        return 0
    if args.load:
        asyncio.run(_load(args.load, args.connections, args.warmup, args.seconds))
        return 0
    return harness(args)


def harness(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from bench.sidecar_vs_rotel.report import machine
    from testkit.sink import RecordingSink

    if args.quick:
        args.repeats, args.seconds, args.warmup = 1, 3.0, 1.0
    variants = [v for v in args.variants.split(",") if v]
    if set(variants) - set(VARIANTS):
        raise SystemExit(f"unknown variant(s); variants: {', '.join(VARIANTS)}")
    console = Console(width=150)
    start = machine()
    console.print(f"machine at start: {start}")
    runs: list[dict[str, Any]] = []
    rng = random.Random(5)
    with RecordingSink(record=False) as sink, Progress(console=console) as progress:
        task = progress.add_task("server throughput", total=args.repeats * len(variants))
        for repeat in range(args.repeats):
            order = variants[:]
            rng.shuffle(order)
            for v in order:
                progress.update(task, description=f"{v} #{repeat + 1}")
                res = one_run(v, args, sink, repeat)
                res["repeat"] = repeat
                runs.append(res)
                progress.advance(task)
        spans = sink.span_count
    summary = summarise(runs, variants)
    t = Table(title="FastAPI server throughput  —  median (min-max)")
    cols = ("variant", "runs", "req/s", "vs bare", "server CPU µs/req", "vs bare", "spans/req")
    for col in (*cols, "peak RSS"):
        t.add_column(col, justify="right")
    for row in summary:
        rps, cpu, rss = (
            row["requests_per_s"],
            row["server_cpu_us_per_request"],
            row["server_peak_rss_mib"],
        )
        t.add_row(
            row["variant"],
            str(row["runs"]),
            f"{rps['median']:,.0f} ({rps['min']:,.0f}-{rps['max']:,.0f})" if rps else "-",
            f"{row.get('throughput_vs_bare', 0):.2f}x",
            f"{cpu['median']:,.0f} ({cpu['min']:,.0f}-{cpu['max']:,.0f})" if cpu else "-",
            f"{row.get('cpu_per_request_vs_bare', 0):.2f}x",
            f"{row['spans_per_request']['median']:.2f}" if row["spans_per_request"] else "-",
            f"{rss['median']:.0f} MiB" if rss else "-",
        )
    console.print(t)
    if args.profile is not None:
        print_profiles(console, args.profile, variants)
    end = machine()
    console.print(f"spans received by the sink: {spans:,}; machine at end: {end}")
    doc = {
        "config": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("serve", "port", "sink", "load")
        },
        "machine_start": start,
        "machine_end": end,
        "spans_received": spans,
        "summary": summary,
        "runs": runs,
    }
    name = (
        "server_throughput"
        + (f"_{args.tag}" if args.tag else "")
        + ("_quick" if args.quick else "")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {args.out / name}.json")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
