"""GC-tracked objects the agent leaves alive per request (a harness, not a test).

A FastAPI ``/verify`` app, set up the way a Gym resources server is (``install()`` +
``start_server_telemetry``), is driven in process through ASGI with a ``traceparent`` and
the rollout baggage. With the cyclic GC disabled, 500 requests are measured after 200
warm-up ones; the batch processor's delay and batch size are made very large, so every
recorded span stays queued, as spans do between exports on a busy server.

Printed per span-group setting (``none`` is the app without the agent):

- ``spans/req``: spans queued for export per request;
- ``gen0/req``: the net growth of ``gc.get_count()[0]`` per request (what brings the
  next young collection closer; untracked dicts count too);
- ``survivors/req``: GC-tracked objects alive after the request (``gc.get_objects()``
  delta), and their types;
- ``promoted/req``: those still tracked after one young collection (which frees young
  cyclic garbage and untracks tuples of untracked values): what the young collections
  promote and the full collections of a large heap then traverse.

Each setting runs in a fresh process; ``--before SRC`` also runs another agent source
tree (e.g. a ``git archive`` of an older commit's ``agent/src``) first on ``PYTHONPATH``.

    uv run python bench/agent_allocations.py [--before /tmp/before/agent/src]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from gym_telemetry_demo.stopsignals import run_main

_CHILD = r"""
import asyncio, collections, gc, os, sys
from types import SimpleNamespace
groups = sys.argv[1]
os.environ.update(
    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_INSECURE="true",
    GYM_TELEMETRY_SPAN_GROUPS=groups, GYM_TELEMETRY_POLL_INTERVAL_S="0",
    OTEL_BSP_SCHEDULE_DELAY="100000000",
    OTEL_BSP_MAX_QUEUE_SIZE="100000", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="100000",
)
if groups != "none":
    from gym_telemetry.autoinstrument.identity import start_server_telemetry
    from gym_telemetry.autoinstrument.install import install
    install()
    class SimpleResourcesServer:  # the class name identifies a Gym resources server
        config = SimpleNamespace(name="bench_resources")
    assert start_server_telemetry(SimpleResourcesServer())
from fastapi import FastAPI
from pydantic import BaseModel
from gym_telemetry import fastapi_telemetry_off
class Req(BaseModel):
    expected_answer: str
class Resp(BaseModel):
    reward: float
app = FastAPI(**fastapi_telemetry_off())
@app.post("/verify")
async def verify(body: Req) -> Resp:
    return Resp(reward=1.0)
HEADERS = [
    (b"host", b"bench"), (b"content-type", b"application/json"),
    (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    (b"baggage", b"nemo.gym.rollout.id=12-3"),
]
async def receive():
    return {"type": "http.request", "body": b'{"expected_answer":"a"}', "more_body": False}
async def send(message):
    return None
async def run(n):
    for _ in range(n):
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "path": "/verify", "raw_path": b"/verify",
            "query_string": b"", "root_path": "", "headers": list(HEADERS),
            "scheme": "http", "server": ("bench", 80), "client": ("bench", 1),
        }
        await app(scope, receive, send)
loop = asyncio.new_event_loop()
loop.run_until_complete(run(200))
N = 500
gc.collect()
gc.disable()
def queued():
    if groups == "none":
        return 0
    from gym_telemetry.provider import _STATE
    return len(_STATE.processor._queue)
before = {id(o) for o in gc.get_objects()}
count = gc.get_count()[0]
queued_before = queued()
loop.run_until_complete(run(N))
spans = (queued() - queued_before) / N
grown = gc.get_count()[0] - count
new = [o for o in gc.get_objects() if id(o) not in before]
len_new = len(new)
kinds = collections.Counter(type(o).__name__ for o in new).most_common(4)
top = ", ".join(f"{name} {n / N:.2f}" for name, n in kinds)
del new
# One young collection, as the running GC would do next: it frees young cyclic garbage
# and untracks the tuples that hold only untracked values. What is still tracked is what
# gets promoted, and eventually traversed by every full collection of the heap.
gc.collect(0)
kept = collections.Counter(type(o).__name__ for o in gc.get_objects() if id(o) not in before)
promoted = sum(kept.values())
top_kept = ", ".join(f"{name} {n / N:.2f}" for name, n in kept.most_common(3))
print(
    f"{spans:4.2f} spans/req {grown / N:6.2f} gen0/req {len_new / N:6.2f} survivors/req ({top}); "
    f"{promoted / N:5.2f} promoted/req ({top_kept})",
    flush=True,
)
os._exit(0)  # skip the exporter's shutdown (nothing listens on the endpoint)
"""


def _run(groups: str, src: str | None) -> str:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, groups],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else f"failed: {result.stderr.strip()[-300:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="another agent source tree (src), run first")
    parser.add_argument(
        "--groups",
        default="default;default,verify;all",
        help="span-group specs to run, separated by ';' (default: %(default)s)",
    )
    args = parser.parse_args()
    versions: list[tuple[str, str | None]] = [("this tree", None)]
    if args.before:
        versions.insert(0, ("before", args.before))
    print(f"python {sys.version.split()[0]}")
    print(f"{'none':>14} {'':>10}: {_run('none', None)}")
    for label, src in versions:
        for groups in args.groups.split(";"):
            print(f"{groups:>14} {label:>10}: {_run(groups, src)}")


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
