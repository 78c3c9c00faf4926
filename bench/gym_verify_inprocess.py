"""The real Gym ``/verify`` app driven in process: server CPU per request without uvicorn,
sockets or a client, with the cyclic GC on and off, and what the agent adds to Gym's
per-request garbage.

The ``example_single_tool_call`` resources server is built from the cached Gym env
(``scripts/gym_env.py``) the way Gym's own tests build it, its FastAPI app from
``setup_webserver()``, and requests go through ASGI with the same body, ``traceparent``
and rollout baggage as ``bench/gym_verify_throughput.py``. Activated variants call
``install()`` and ``start_server_telemetry`` as Gym's activation does; spans are queued
(the batch processor's delay and batch size are made very large, the endpoint is
unreachable), so export is not measured.

Variants (each round runs each in a fresh process, interleaved):

- ``bare``: no agent;
- ``none``: the agent activated, every span group off;
- ``<spec>``: the agent activated with ``GYM_TELEMETRY_SPAN_GROUPS=<spec>`` (default
  ``default``: the SERVER span and ``gym.verify``); with ``--before SRC`` also the same
  spec with another agent source tree first on ``PYTHONPATH``.

Per variant it prints process CPU µs per request (median and range over the rounds),
with the GC enabled and disabled, and, from a separate GC-disabled pass, the GC-tracked
objects allocated per request that only the cyclic GC frees (Gym's garbage: cancelled
tasks, tracebacks, frames) and those still alive afterwards.

    uv run --frozen python bench/gym_verify_inprocess.py [--rounds 3] [--requests 1500]
        [--spec default] [--before /tmp/before/agent/src]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gym_telemetry_demo.stopsignals import run_main  # noqa: E402

from bench.gym_verify_throughput import BAGGAGE, TRACEPARENT, gym_python, verify_body  # noqa: E402

_CHILD = r"""
import asyncio, collections, gc, json, os, sys, time
from unittest.mock import MagicMock
variant, spec, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
body, traceparent, baggage = json.loads(sys.argv[4])
os.environ.update(
    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_INSECURE="true",
    GYM_TELEMETRY_SPAN_GROUPS=spec, GYM_TELEMETRY_POLL_INTERVAL_S="0",
    OTEL_BSP_SCHEDULE_DELAY="100000000", OTEL_BSP_MAX_QUEUE_SIZE="1000000",
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE="1000000",
)
from nemo_gym.server_utils import ServerClient
from resources_servers.example_single_tool_call.app import (
    SimpleWeatherResourcesServer, SimpleWeatherResourcesServerConfig,
)
config = SimpleWeatherResourcesServerConfig(
    host="127.0.0.1", port=8080, entrypoint="", name="weather"
)
server = SimpleWeatherResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
if variant != "bare":
    from gym_telemetry.autoinstrument.identity import start_server_telemetry
    from gym_telemetry.autoinstrument.install import install
    install()
    assert start_server_telemetry(server)
app = server.setup_webserver()
BODY = body.encode()
HEADERS = [
    (b"host", b"bench"), (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
    (b"traceparent", traceparent.encode()), (b"baggage", baggage.encode()),
]
statuses = collections.Counter()
async def receive():
    return {"type": "http.request", "body": BODY, "more_body": False}
async def send(message):
    if message["type"] == "http.response.start":
        statuses[message["status"]] += 1
async def run(count):
    for _ in range(count):
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "path": "/verify", "raw_path": b"/verify", "query_string": b"",
            "root_path": "", "headers": list(HEADERS), "scheme": "http",
            "server": ("bench", 80), "client": ("bench", 1),
        }
        await app(scope, receive, send)
loop = asyncio.new_event_loop()
loop.run_until_complete(run(200))
out = {}
for mode in ("gc", "nogc"):
    gc.collect()
    if mode == "nogc":
        gc.disable()
    start = time.process_time()
    loop.run_until_complete(run(n))
    out[mode] = 1e6 * (time.process_time() - start) / n
    gc.enable()
gc.collect()
gc.disable()
m = 300
before = {id(o) for o in gc.get_objects()}
loop.run_until_complete(run(m))
allocated = sum(1 for o in gc.get_objects() if id(o) not in before)
out["garbage"] = gc.collect() / m
out["alive"] = sum(1 for o in gc.get_objects() if id(o) not in before) / m
out["tracked"] = allocated / m
assert set(statuses) == {200}, statuses
print(json.dumps(out), flush=True)
os._exit(0)  # skip the exporter's shutdown (nothing listens on the endpoint)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--spec", default="default", help="span-group spec of the agent variants")
    parser.add_argument("--before", type=Path, help="another agent source tree (src)")
    args = parser.parse_args()
    python = str(gym_python())
    payload = json.dumps([json.dumps(verify_body()), TRACEPARENT, BAGGAGE])
    variants: dict[str, tuple[str, str | None]] = {
        "bare": ("none", None),
        "none": ("none", None),
        f"{args.spec}_after": (args.spec, None),
    }
    if args.before:
        variants[f"{args.spec}_before"] = (args.spec, str(args.before.resolve()))
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    load_start = os.getloadavg()
    for _ in range(args.rounds):
        for name, (spec, src) in variants.items():
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)
            if src:
                env["PYTHONPATH"] = src
            kind = "bare" if name == "bare" else "agent"
            out = subprocess.run(
                [python, "-c", _CHILD, kind, spec, str(args.requests), payload],
                env=env,
                cwd="/",
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if out.returncode:
                raise SystemExit(f"{name}: {out.stderr.strip()[-800:]}")
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    load_end = os.getloadavg()
    print(
        f"in-process Gym /verify, {args.rounds} rounds x {args.requests} requests per variant; "
        f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end"
    )
    bare = {k: statistics.median(r[k] for r in results["bare"]) for k in ("gc", "nogc")}
    for name, runs in results.items():
        cells = []
        for mode in ("gc", "nogc"):
            values = sorted(r[mode] for r in runs)
            med = statistics.median(values)
            cells.append(
                f"{mode:>4} {med:7.1f} us/req ({values[0]:.1f}-{values[-1]:.1f}, "
                f"+{med - bare[mode]:6.1f})"
            )
        garbage = statistics.median(r["garbage"] for r in runs)
        alive = statistics.median(r["alive"] for r in runs)
        print(
            f"  {name:>16}: {'  '.join(cells)}  GC-freed garbage {garbage:5.1f}/req, "
            f"alive {alive:4.2f}/req"
        )


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
