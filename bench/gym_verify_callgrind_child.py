"""The child of ``bench.gym_verify_callgrind``, run by the Gym env's python (it imports only
Gym, the agent and the standard library; not the repository).

    python gym_verify_callgrind_child.py '{"variant": "default", "requests": 200, ...}'

Builds the real ``example_single_tool_call`` resources server the way Gym's own tests do,
activates the agent for the agent variants (``install()`` + ``start_server_telemetry``,
as Gym's activation does), warms up, then serves ``requests`` ``POST /verify`` requests
in process through ASGI (body, ``traceparent`` and rollout baggage as a Gym agent sends
them). The measured loop is bracketed by ``os.getpgrp()`` and ``os.getsid(0)``: under
callgrind ``--zero-before=getpgrp --dump-before=getsid`` they zero and dump the counters,
so the dump holds exactly the loop (every thread). Natively the child reports process
CPU (all threads), main-thread CPU and wall time of the loop, and the cyclic GC's
collections during it. Prints one JSON line.

Options in the JSON: ``variant`` (``bare``; ``fastapi-builtin``: no agent, a global SDK
provider with no processor, so FastAPI's own telemetry records its spans; or a
span-group spec such as ``default``, ``all``, ``none``), ``requests``, ``warmup``,
``gc`` (``on``: ``gc.collect()`` before the loop, so none is pending; ``pending``: no
such collect, so a collection the warm-up left pending may fall inside the loop;
``off``: disabled for the loop; ``freeze``: ``gc.freeze()`` after warm-up), ``body``,
``traceparent``,
``baggage`` (``vary_ids``, default true: each request gets its own random trace and
parent ids and rollout id instead, as each ``/verify`` of a real server belongs to
another rollout), ``export`` (``queue``: spans are queued, never exported, as
``bench/gym_verify_inprocess.py`` does; ``sink:HOST:PORT``: exported to a real OTLP
sink by the agent's batch processor as in production, and flushed *inside* the measured
window: the warm-up's spans are flushed before the counters are zeroed, the loop's
spans after the loop and before the dump, so the window holds their encoding and
export on the batch thread too), ``profile`` (true: count the bytecodes and calls of
the loop's main thread per Python function, ``callgrind_support.OpcodeProfile``;
reported per request), ``garbage`` (true: natively, instead of the measured loop, what
the requests leave to the cyclic GC, ``_garbage_census``; reported per request).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
import random
import sys
import time
from typing import Any
from unittest.mock import MagicMock

from callgrind_support import (  # a sibling file (bench/)
    OpcodeProfile,
    instrument_on,
    kernel_counters,
    live_requests_sent,
    rusage,
)


def _flush() -> None:
    """Export every span recorded so far, and wait for it (the SDK provider's flush)."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None and not flush(60_000):
        raise RuntimeError("the flush did not finish")


def main() -> None:
    opts: dict[str, Any] = json.loads(sys.argv[1])
    variant = opts["variant"]
    n, warmup = int(opts["requests"]), int(opts.get("warmup", 200))
    export = opts.get("export", "queue")
    env = {
        "GYM_TELEMETRY_SPAN_GROUPS": "none" if variant == "bare" else variant,
        "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }
    if export == "queue":
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
            "OTEL_BSP_SCHEDULE_DELAY": "100000000",
            "OTEL_BSP_MAX_QUEUE_SIZE": "1000000",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1000000",
        }
    else:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://" + export.removeprefix("sink:")
        # Batches leave when full (512 spans) or at the flushes, as on a busy server; not
        # on the schedule's clock, which under callgrind would tick ~50x more per request.
        env["OTEL_BSP_SCHEDULE_DELAY"] = "100000000"
    os.environ.update(env)
    from nemo_gym.server_utils import ServerClient
    from resources_servers.example_single_tool_call.app import (
        SimpleWeatherResourcesServer,
        SimpleWeatherResourcesServerConfig,
    )

    config = SimpleWeatherResourcesServerConfig(
        host="127.0.0.1", port=8080, entrypoint="", name="weather"
    )
    server = SimpleWeatherResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
    if variant == "fastapi-builtin":
        # No agent, but a global SDK provider set by something else: FastAPI's built-in
        # telemetry (fastapi >= 0.165) then records its own spans for every request.
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
    elif variant != "bare":
        from gym_telemetry.autoinstrument.identity import start_server_telemetry
        from gym_telemetry.autoinstrument.install import install

        install()
        assert start_server_telemetry(server)
    app = server.setup_webserver()
    body = opts["body"].encode()
    # Every request is its own rollout, as on a real resources server: its own trace id,
    # parent span id and rollout id (fixed ones would let any per-value cache hit every
    # time). Built before the loop, so the loop does the same work in every variant.
    rng = random.Random(opts.get("seed", 7))

    def request_headers(index: int) -> list[tuple[bytes, bytes]]:
        traceparent, baggage = opts["traceparent"], opts["baggage"]
        if opts.get("vary_ids", True):
            traceparent = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01"
            baggage = f"nemo.gym.rollout.id={index // 4}-{index % 4}"
        return [
            (b"host", b"bench"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"traceparent", traceparent.encode()),
            (b"baggage", baggage.encode()),
        ]

    statuses: collections.Counter[int] = collections.Counter()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] += 1

    async def run(all_headers: list[list[tuple[bytes, bytes]]]) -> None:
        for headers in all_headers:
            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "path": "/verify",
                "raw_path": b"/verify",
                "query_string": b"",
                "root_path": "",
                "headers": headers,
                "scheme": "http",
                "server": ("bench", 80),
                "client": ("bench", 1),
            }
            await app(scope, receive, send)

    loop = asyncio.new_event_loop()
    warmup_headers = [request_headers(i) for i in range(warmup)]
    loop_headers = [request_headers(warmup + i) for i in range(n)]
    loop.run_until_complete(run(warmup_headers))
    flush = variant != "bare" and export != "queue"
    if flush:
        _flush()  # the warm-up's spans leave before the window opens
    if opts.get("garbage"):
        print(json.dumps(_garbage_census(loop, run(loop_headers), n)), flush=True)
        os._exit(0)
    mode = opts.get("gc", "on")
    if mode != "pending":
        gc.collect()  # the window starts with no collection pending ("pending": it may)
    if mode == "freeze":
        gc.freeze()
    if mode == "off":
        gc.disable()
    stats0 = [s["collections"] for s in gc.get_stats()]
    live0 = live_requests_sent()
    ru0 = rusage()
    cpu0, thr0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    profile = OpcodeProfile() if opts.get("profile") else None
    instrument_on()
    os.getpgrp()  # callgrind: --zero-before=getpgrp
    if profile is not None:
        profile.start()
    loop.run_until_complete(run(loop_headers))
    if flush:
        _flush()  # the loop's spans: encoded and exported inside the window
    if profile is not None:
        profile.stop()
    os.getsid(0)  # callgrind: --dump-before=getsid
    cpu1, thr1, wall1 = time.process_time(), time.thread_time(), time.perf_counter()
    kernel = kernel_counters(ru0, rusage())
    stats1 = [s["collections"] for s in gc.get_stats()]
    gc.enable()
    assert set(statuses) == {200}, statuses
    out = {
        "process_cpu_us": 1e6 * (cpu1 - cpu0) / n,
        "main_thread_cpu_us": 1e6 * (thr1 - thr0) / n,
        "wall_us": 1e6 * (wall1 - wall0) / n,
        # what an instruction count cannot see: kernel time, page faults, switches
        "user_us": 1e6 * kernel.pop("user_s") / n,
        "system_us": 1e6 * kernel.pop("system_s") / n,
        **kernel,  # minor faults and context switches per run
        "gc_collections": [b - a for a, b in zip(stats0, stats1, strict=True)],
        # the live events' heartbeats sent in the window: one per interval of wall clock
        "live_requests": live_requests_sent() - live0,
        "threads": len(sys._current_frames()),
        "agent": _agent_file(),
        "lean": _lean_paths(),
    }
    if profile is not None:
        out["profile"] = profile.result(n)
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip the exporter's shutdown (nothing may listen on the endpoint)


def _garbage_census(loop: asyncio.AbstractEventLoop, requests: Any, n: int) -> dict[str, Any]:
    """Run ``requests`` (a coroutine serving ``n`` requests) with the cyclic GC off and
    ``gc.DEBUG_SAVEALL``, then collect once: what the requests left only a reference
    cycle would free. Per request: the generation-0 allocation count's growth (what
    paces the collections), the unreachable objects by type, and the names of the tasks
    among them (anyio names a task after its function; a task's context copy is what
    holds a context variable's value in such a cycle)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    count0 = gc.get_count()[0]
    loop.run_until_complete(requests)
    grown = gc.get_count()[0] - count0
    gc.collect()
    garbage = list(gc.garbage)
    gc.garbage.clear()
    gc.set_debug(0)
    by_type = collections.Counter(
        f"{getattr(type(o), '__module__', '?')}.{type(o).__qualname__}" for o in garbage
    )
    tasks = collections.Counter(o.get_name() for o in garbage if isinstance(o, asyncio.Task))
    del garbage
    return {
        "gen0_growth_per_request": grown / n,
        "unreachable_per_request": sum(by_type.values()) / n,
        "by_type": {k: v / n for k, v in by_type.most_common()},
        "tasks": {k: v / n for k, v in tasks.most_common()},
    }


def _lean_paths() -> dict[str, Any] | None:
    """Whether the agent's lean encoder passed its self-check and how many spans went
    out as records (None without the agent): a failed check falls back to the stock
    path silently, which a benchmark must not."""
    if "gym_telemetry.provider" not in sys.modules:
        return None
    from gym_telemetry import provider
    from gym_telemetry._lean import grpc_exporter

    processor = getattr(provider._STATE, "processor", None)
    return {
        "encoder_self_check": grpc_exporter.self_check(),
        "stock_fallbacks": grpc_exporter.STATS.fallbacks,
        "records": getattr(processor, "records", None),
        "record_failures": getattr(processor, "record_failures", None),
    }


def _agent_file() -> str | None:
    """Where the agent was imported from (the harness puts a source tree first on the
    path), or None when it was not imported."""
    module = sys.modules.get("gym_telemetry")
    return getattr(module, "__file__", None)


if __name__ == "__main__":
    main()
