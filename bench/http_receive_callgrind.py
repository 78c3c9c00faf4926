"""OTLP/HTTP receive alone, in instructions per request under callgrind (a benchmark
harness; it asserts nothing).

    uv run --frozen python -m bench.http_receive_callgrind [--requests 2000] [--spans 16]
        [--connections 1] [--app otlp|minimal] [--sidecar-src OTHER_TREE/sidecar/src]
        [--top 25] [--json FILE]

What runs: a child process under ``valgrind --tool=callgrind --instr-atstart=no`` serving
the sidecar's OTLP/HTTP receiver (``receiver.http.OtlpHttpApp``, default limits) on the
sidecar's HTTP listener (``AsgiListener``: ``gym_sidecar.wire.http1`` in this tree,
``gym_sidecar.httpserver`` in a tree from before the wire package,
``gym_sidecar.asgi_listener`` -- uvicorn -- in one older still), in front of a
pipeline head that accepts every batch and does nothing else; so what is counted is
the HTTP/1.1 server, the receiver app, the body's decoding (the trace scanner) and the
response, and no pipeline stage or export. ``--app minimal`` serves a raw ASGI app
instead that reads the body and answers 200 with an empty body: the server alone. This
process sends ``--warmup`` requests
uninstrumented, switches instrumentation on (``callgrind_control``), sends
``--requests`` requests (an ``ExportTraceServiceRequest`` of ``--spans`` spans, as
``application/x-protobuf``, each answered before the next is sent, on ``--connections``
keep-alive connections taken in turn), and dumps the counters. ``--sidecar-src`` puts
another checkout's ``sidecar/src`` first on the child's path, for a before/after pair
from one environment.

Printed: instructions per request, the self cost per request of each shared library,
and the top functions by self cost. Instruction counts repeat to well under 1 % between
runs whatever else the machine does; the wall clock under valgrind means nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gym_telemetry_demo.stopsignals import run_main

from bench.callgrind_support import TOTALS
from bench.sidecar_callgrind import by_object, self_costs
from testkit.otlp_samples import trace_request

REPO = Path(__file__).resolve().parents[1]


# -- the child: the receiver on the listener ------------------------------------------------


async def minimal_app(scope: Any, receive: Any, send: Any) -> None:
    """Read the whole body, answer 200 with an empty protobuf body."""
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/x-protobuf"), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def serve(which: str) -> None:
    """Serve the receiver (or the minimal app) on a free loopback port; print the port;
    run until SIGTERM."""
    from gym_sidecar.config import LimitsConfig
    from gym_sidecar.core.stage import Batch, Stage
    from gym_sidecar.receiver.http import OtlpHttpApp
    from gym_sidecar.selfmetrics import SelfMetrics

    try:
        from gym_sidecar.wire.http1.connection_limits import ConnectionLimits
        from gym_sidecar.wire.http1.listener import AsgiListener
    except ImportError:
        try:  # a tree from before the wire package
            from gym_sidecar.httpserver.limits import (  # type: ignore[import-not-found,no-redef]
                ConnectionLimits,
            )
            from gym_sidecar.httpserver.listener import (  # type: ignore[import-not-found,no-redef]
                AsgiListener,
            )
        except ImportError:  # older still: uvicorn's protocol, subclassed
            from gym_sidecar.asgi_listener import (  # type: ignore[import-not-found,no-redef]
                AsgiListener,
                ConnectionLimits,
            )

    class Accept(Stage):
        name = "accept"

        async def consume(self, batch: Batch) -> None:
            return None

    async def main() -> None:
        metrics = SelfMetrics()
        limits = LimitsConfig()
        app: Any = OtlpHttpApp(Accept(None, metrics), limits, metrics)
        if which == "minimal":
            app = minimal_app
        conn_limits = ConnectionLimits.from_config(limits, metrics, "http_max_connections")
        listener = AsgiListener(app, "127.0.0.1:0", "OTLP/HTTP", conn_limits)
        await listener.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print(f"port {listener.bound_port} {type(listener).__module__}", flush=True)
        await stop.wait()
        await listener.stop(1.0)

    asyncio.run(main())


# -- the parent: drive it and read the dump -------------------------------------------------


def _send(conns: list[http.client.HTTPConnection], body: bytes, count: int) -> None:
    headers = {"Content-Type": "application/x-protobuf"}
    for i in range(count):
        conn = conns[i % len(conns)]
        conn.request("POST", "/v1/traces", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"request {i}: HTTP {resp.status}")


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], capture_output=True, check=True, timeout=600)


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    env["PYTHONHASHSEED"] = "0"
    if args.sidecar_src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(args.sidecar_src.resolve()), *filter(None, [env.get("PYTHONPATH")])]
        )
    dump = work / "cg.out"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={dump}",
        sys.executable,
        "-m",
        "bench.http_receive_callgrind",
        "--serve",
        "--app",
        args.app,
    ]
    child = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=REPO, text=True
    )
    assert child.stdout is not None
    try:
        line = child.stdout.readline().split()
        if not line or line[0] != "port":
            raise SystemExit(f"the server did not start: {line}")
        port, listener = int(line[1]), line[2]
        body = trace_request("http-receive", args.spans).SerializeToString()
        conns = [
            http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            for _ in range(args.connections)
        ]
        _send(conns, body, args.warmup)
        _control("-i", "on", str(child.pid))
        _control("-z", str(child.pid))
        _send(conns, body, args.requests)
        _control("-d", str(child.pid))
        _control("-i", "off", str(child.pid))
        for conn in conns:
            conn.close()
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(300)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    dumps = sorted(work.glob("cg.out*"), key=lambda p: p.stat().st_mtime)
    measured = [d for d in dumps if d.name != "cg.out"] or dumps
    return {"dump": measured[0], "listener": listener, "body_bytes": len(body)}


def report(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    dump: Path = run["dump"]
    m = TOTALS.search(dump.read_text(encoding="utf-8", errors="replace"))
    total = int(m.group(1)) if m else 0
    costs = self_costs(dump)
    objects = by_object(costs)
    n = args.requests
    result: dict[str, Any] = {
        "listener": run["listener"],
        "app": args.app,
        "sidecar_src": str(args.sidecar_src or REPO / "sidecar" / "src"),
        "requests": n,
        "spans": args.spans,
        "body_bytes": run["body_bytes"],
        "connections": args.connections,
        "instructions": total,
        "per_request": total / n,
        "objects_per_request": {k: v / n for k, v in objects.items()},
        "top_self_per_request": [
            (f"{fn} [{Path(ob).name}]", c / n)
            for (ob, fn), c in sorted(costs.items(), key=lambda kv: -kv[1])[: args.top]
        ],
    }
    print(
        f"{run['listener']}, app {args.app}: {n} requests of {args.spans} spans "
        f"({run['body_bytes']} bytes) on {args.connections} connection(s): "
        f"{total:,} instructions = {total / n:,.0f} per request"
    )
    print("  self instructions per request, by shared object:")
    for ob, c in list(objects.items())[:10]:
        print(f"    {c / n:>10,.0f}  {c / total:6.1%}  {ob}")
    print(f"  top {args.top} functions by self instructions (per request, share):")
    for (ob, fn), c in sorted(costs.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"    {c / n:>10,.0f}  {c / total:6.1%}  {fn[:80]} [{Path(ob).name}]")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--requests", type=int, default=2000, help="requests counted")
    p.add_argument("--warmup", type=int, default=200, help="requests before counting")
    p.add_argument("--spans", type=int, default=16, help="spans per request")
    p.add_argument("--connections", type=int, default=1, help="keep-alive connections")
    p.add_argument("--app", choices=["otlp", "minimal"], default="otlp", help="what is served")
    p.add_argument("--sidecar-src", type=Path, help="another tree's sidecar/src, first")
    p.add_argument("--top", type=int, default=25, help="functions to print")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    if args.serve:
        serve(args.app)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="http-receive-cg-"))
    try:
        result = report(args, measure(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["loadavg"] = os.getloadavg()[0]
    print(f"load average after: {result['loadavg']:.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
