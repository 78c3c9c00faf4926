"""The agent's hot paths one at a time, in instructions per call (callgrind; a benchmark
harness, it asserts nothing): where a Gym request's extra instructions go, path by path,
and what a change to one of them saves, measured in seconds of machine time instead of
the minutes a whole Gym request under callgrind takes.

    uv run --frozen python -m bench.agent_paths_callgrind [--paths hop,model,...]
        [--iterations 2000] [--before AGENT_SRC] [--agent AGENT_SRC] [--json FILE]

Paths (each on the lean recorder, exporting into the batch processor's queue as the
agent does, with an exporter that keeps nothing):

- ``hop``: a CLIENT span as a Gym hop makes it: started with the hop's five attributes,
  made current and detached, ended with its status code, encoded and queued;
- ``model``: a model-call span: started, the GenAI attributes of a Responses answer added
  (``genai.response_attributes``, token counts varying per call as in a fleet), ended,
  encoded and queued;
- ``server``: one request through ``ServerSpanMiddleware`` around an app that only
  answers, with the ``traceparent`` and rollout baggage a Gym hop sends (each request its
  own ids), minus the same app called bare;
- ``traceparent``, ``baggage``: the two headers read (``propagation.parse_traceparent``,
  ``read_rollout_baggage``).

How: every path runs in a fresh ``python`` under ``valgrind --tool=callgrind`` (this
tree's ``agent/src``, or ``--agent``/``--before`` trees, first on ``PYTHONPATH``;
``PYTHONHASHSEED=0``), 500 warm-up calls, then the counters are zeroed
(``--zero-before=getpgrp``), ``--iterations`` calls run and the calling thread is dumped
(``--dump-before=getsid``): instructions per call, the loop's own included (~1 k, the
same for every tree). ``--before SRC`` adds each path run on the tree ``SRC`` (e.g.
``git archive <commit> agent/src | tar -x -C /tmp/before``) and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.callgrind_support import REPO, TOTALS

PATHS = ("hop", "model", "server", "traceparent", "baggage")


def _child(path: str, iterations: int) -> None:
    """The measured loop of ``path`` (runs under callgrind, in the child)."""
    from gym_telemetry._export.processor import GymSpanProcessor, TrackingExporter
    from gym_telemetry._lean.context import detach
    from gym_telemetry._lean.recorder import recorder_for
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.trace import SpanKind

    class Nowhere(SpanExporter):
        accepts_span_records = True

        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

    provider = TracerProvider(shutdown_on_exit=False)
    batch = BatchSpanProcessor(
        Nowhere(),
        schedule_delay_millis=600_000,
        max_queue_size=10_000_000,
        max_export_batch_size=10_000_000,
    )
    switch = GymSpanProcessor()
    switch.plug(batch, TrackingExporter(Nowhere()))
    provider.add_span_processor(switch)
    trace.set_tracer_provider(provider)
    total = iterations + 500
    step: Any
    if path == "hop":
        hop = recorder_for(provider.get_tracer("gym_telemetry.http_client"))
        shapes = [
            {
                "http.request.method": "POST",
                "url.full": "http://127.0.0.1:8000/verify",
                "url.template": "/verify",
                "gym.rollout.id": f"{i}-0",
                "nemo.gym.target.server.name": "weather",
            }
            for i in range(7)
        ]
        status = {"http.response.status_code": 200}

        def step(i: int) -> None:
            span, token = hop.start("POST /verify", shapes[i % 7].copy(), SpanKind.CLIENT)
            detach(token)
            span.end_with(status, None, False)  # type: ignore[attr-defined]

    elif path == "model":
        from gym_telemetry.genai import response_attributes

        model = recorder_for(provider.get_tracer("gym_telemetry.model_call"))
        answers = [
            {
                "object": "response",
                "model": "policy",
                "status": "completed",
                "usage": {"input_tokens": 1000 + i, "output_tokens": 20 + i % 300},
            }
            for i in range(total)
        ]

        def step(i: int) -> None:
            span, token = model.start(
                "model.responses",
                {"gen_ai.operation.name": "chat", "gym.rollout.id": f"{i % 7}-0"},
            )
            attributes = response_attributes(answers[i])
            add = getattr(span, "add_clean", None) or span.set_attributes
            add(attributes)
            detach(token)
            span.end_with(None, None, False)  # type: ignore[attr-defined]

    elif path in ("server", "server-bare"):
        import gym_telemetry_semconv as semconv
        from gym_telemetry import span_groups
        from gym_telemetry.autoinstrument.identity import RUNTIME
        from gym_telemetry.autoinstrument.server_span import ServerSpanMiddleware

        RUNTIME.active = True
        span_groups.set_enabled({semconv.GROUP_SERVER})

        class Route:
            path = "/verify"

        start = {"type": "http.response.start", "status": 200, "headers": []}
        body = {"type": "http.response.body", "body": b"{}"}

        async def app(scope: Any, receive: Any, send: Any) -> None:
            scope["route"] = Route
            await send(start)
            await send(body)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            return None

        served = app if path == "server-bare" else ServerSpanMiddleware(app)
        headers = [
            [
                (b"host", b"127.0.0.1:8000"),
                (b"content-type", b"application/json"),
                (b"traceparent", b"00-%032x-%016x-01" % ((7 << 64) + i + 1, i + 1)),
                (b"baggage", b"nemo.gym.rollout.id=%d-0" % i),
            ]
            for i in range(total)
        ]

        def step(i: int) -> None:
            scope = {"type": "http", "method": "POST", "path": "/verify", "headers": headers[i]}
            coroutine = served(scope, receive, send)
            with contextlib.suppress(StopIteration):
                coroutine.send(None)  # nothing suspends: it finishes here

    else:
        from gym_telemetry.autoinstrument import propagation

        traceparent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        baggage = b"nemo.gym.rollout.id=verify-bench-0000123-0"
        if path == "traceparent":

            def step(i: int) -> None:
                propagation.parse_traceparent(traceparent, None)

        else:

            def step(i: int) -> None:
                propagation.read_rollout_baggage(baggage)

    for i in range(500):
        step(i)
    os.getpgrp()  # counters zeroed here (--zero-before)
    for i in range(500, total):
        step(i)
    os.getsid(0)  # the calling thread dumped here (--dump-before)


def measure(path: str, iterations: int, agent_src: str) -> float:
    """Instructions per call of ``path`` on the agent source tree ``agent_src``."""
    with tempfile.TemporaryDirectory(prefix="agent-paths-") as tmp:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([agent_src, str(REPO / "semconv" / "src")])
        env["PYTHONHASHSEED"] = "0"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--zero-before=getpgrp",
            "--dump-before=getsid",
            f"--callgrind-out-file={tmp}/cg.%p",
            sys.executable,
            "-m",
            "bench.agent_paths_callgrind",
            "--child",
            path,
            "--iterations",
            str(iterations),
        ]
        subprocess.run(command, env=env, cwd=REPO, check=True, capture_output=True)
        (dump,) = Path(tmp).glob("cg.*.1")
        match = TOTALS.search(dump.read_text(errors="replace"))
        if match is None:
            raise RuntimeError(f"no total in {dump}")
        return int(match.group(1)) / iterations


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--before", type=Path, help="another agent source tree (module doc)")
    p.add_argument("--agent", type=Path, help="the agent source tree (default: this tree's)")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.child, args.iterations)
        return 0
    trees = {"": str((args.agent or REPO / "agent" / "src").resolve())}
    if args.before:
        trees["@before"] = str(args.before.resolve())
    results: dict[str, dict[str, float]] = {}
    print(f"instructions per call, {args.iterations} calls after 500 (callgrind):")
    for path in args.paths.split(","):
        row: dict[str, float] = {}
        for suffix, src in trees.items():
            value = measure(path, args.iterations, src)
            if path == "server":  # the request through the layer, minus the bare app
                value -= measure("server-bare", args.iterations, src)
            row[f"{path}{suffix}"] = value
        results[path] = row
        text = "   ".join(f"{name}: {value:,.0f}" for name, value in row.items())
        if args.before:
            text += f"   (x{row[path] / row[path + '@before']:.3f} of before)"
        print(f"  {text}")
    if args.json:
        args.json.write_text(json.dumps({"iterations": args.iterations, "paths": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
