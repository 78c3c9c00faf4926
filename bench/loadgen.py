"""OTLP trace load generator shaped like NeMo Gym traffic (a benchmark tool, not a test).

    uv run --frozen python -m bench.loadgen --target 127.0.0.1:4317 --protocol grpc \
        --spans 512 --requests 400 --concurrency 8
    uv run --frozen python -m bench.loadgen --target http://127.0.0.1:4318 --protocol http \
        --spans 512 --rate 10000 --seconds 20

Requests are built and serialised once, before sending starts (``build_requests``), so the
generator spends its CPU on the transport only. Each request is what one Gym server
process's OpenTelemetry SDK exports: one resource (``service.name``
``nemo-gym/<server>``, the Gym server name and type, host, process and SDK attributes) and
the ScopeSpans of the span groups that server type records, each in its
``gym_telemetry.<group>`` scope (``semconv.scope_name``):

- agent server: ``server`` (SERVER spans of ``/run``), ``rollout`` (``gym.rollout`` with
  the rollout id), ``http_client`` (CLIENT spans of the calls to the model and
  resources servers);
- model server: ``server`` and ``model_call`` (``gym.model.chat_completions`` with token
  counts);
- resources server: ``server`` and ``verify`` (``gym.verify`` with ``succeeded``).

Spans carry what the agent records since issue 41: a rollout its reward, turns and tokens,
a verification its reward, a model call ``gen_ai.operation.name``, a hop its target
server (constants, so the random stream is unchanged).

The roles follow the span mix of a rollout (``ROLE_CYCLE``: 3 agent, 3 model and 1
resources request in every 7), and ``--distinct`` requests (different ids) cycle.

``--load`` chooses how much the requests vary, the way real traffic does:

- ``uniform`` (the first harness's load): every span of a rollout shares one trace id
  whose high bits are fixed per request, rollout ids are short counters, every span of
  a kind carries the same attribute set, and every request has exactly ``--spans``
  spans. Its bytes repeat a lot, so gzip has an easy job.
- ``random-ids`` (the independent harness's load): the same, but every span gets
  random trace, span and parent ids (32 incompressible bytes per span).
- ``varied`` (the default): random ids, random UUID rollout ids, an attribute mix that
  varies per span (routes, status codes, models, response ids, peer addresses, error
  types with an exception event, 0-3 extra attributes), and request sizes that vary:
  60% full (``--spans``), the rest uniform between ``--spans``/16 and ``--spans``, as an
  SDK's batch processor exports full batches under load and partial ones on its timer.

The ``start`` event reports the load's spread: spans, bytes and bytes per span per
request (min/median/max), and how well it compresses (zlib level 6, per request).

Sending: ``--concurrency`` calls in flight on one event loop (gRPC: ``grpc.aio`` unary
calls spread over ``--channels`` channels; HTTP: one aiohttp session with that many
keep-alive connections, ``application/x-protobuf``). A refused call
(``RESOURCE_EXHAUSTED``/``UNAVAILABLE``, HTTP 429/503) is retried after a short pause, as
an SDK exporter would, and counted. Two modes: ``--requests N`` sends N requests as fast
as the target accepts them; ``--rate SPANS_PER_S --seconds S`` paces requests at a fixed
span rate.

Output (stdout, one JSON object per line): ``{"event": "start"}`` right before the first
request, ``{"event": "progress", ...}`` every ``--progress-s``, and
``{"event": "done", "requests": .., "spans": .., "retries": .., "errors": .., "seconds": ..}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

import gym_telemetry_semconv as semconv
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

TRACE_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
RETRY_PAUSE_S = 0.05
ROLES = ("agent", "model", "resources")
# One rollout is ~17 spans: the agent's /run (SERVER, gym.rollout, ~5 CLIENT calls), ~4
# model calls (SERVER + gym.model.* each) and one verification (SERVER + gym.verify).
# Requests follow that mix: 3 agent, 3 model and 1 resources request in every 7.
ROLE_CYCLE = ("agent", "model", "agent", "resources", "model", "agent", "model")
_MODEL_NAME = "Qwen/Qwen3-30B-A3B-Instruct"


def _kv(key: str, value: str | int | float | bool) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


LOADS = ("uniform", "random-ids", "varied", "rollouts", "derive-heavy")
VARIED_LOADS = frozenset({"varied", "rollouts", "derive-heavy"})
"""Loads with varied attributes and request sizes (``varied`` and the two derive mixes)."""
_ROUTES = {
    "simple_agent": ("/run", "/run", "/run", "/v1/responses"),
    "policy_model": ("/v1/chat/completions", "/v1/chat/completions", "/v1/responses"),
    "math_verify": ("/verify", "/verify", "/verify", "/seed_session"),
}
_MODELS = (_MODEL_NAME, "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-70B-Instruct", "gpt-4.1-mini")
_ERRORS = ("TimeoutError", "ValueError", "httpx.ReadTimeout", "KeyError", "AssertionError")
_EXTRA = (
    ("gym.task.index", "int"),
    ("gym.env.seed", "int"),
    ("gym.dataset.name", "str"),
    ("http.request.body.size", "int"),
    ("http.response.body.size", "int"),
    ("user_agent.original", "str"),
)


def _resource(rs: ResourceSpans, role: str, index: int) -> None:
    server = {"agent": "simple_agent", "model": "policy_model", "resources": "math_verify"}[role]
    attrs: dict[str, str | int] = {
        semconv.SERVICE_NAME: f"nemo-gym/{server}",
        semconv.SERVER_NAME: server,
        semconv.SERVER_TYPE: role,
        "service.instance.id": f"{server}-{index:04d}-7f9c2e",
        "host.name": "gym-worker-3.cluster.local",
        "process.pid": 41000 + index,
        "process.runtime.name": "cpython",
        "process.runtime.version": "3.12.11",
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": "1.45.2",
    }
    rs.resource.attributes.extend(_kv(k, v) for k, v in attrs.items())


class _SpanFactory:
    """Fills spans with ids, times and the attributes a Gym server records."""

    def __init__(self, rng: random.Random, base_ns: int, load: str = "uniform") -> None:
        self.rng = rng
        self.base_ns = base_ns
        self.random_ids = load != "uniform"
        self.varied = load in VARIED_LOADS

    def span(self, ss: ScopeSpans, name: str, kind: int, rollout: int, ms: float) -> Span:
        r = self.rng
        sp = ss.spans.add()
        sp.trace_id = (r.getrandbits(128) if self.random_ids else rollout).to_bytes(16, "big")
        sp.span_id = r.getrandbits(64).to_bytes(8, "big")
        sp.parent_span_id = r.getrandbits(64).to_bytes(8, "big")
        sp.name = name
        sp.kind = kind  # type: ignore[assignment]
        start = self.base_ns + r.randrange(10**9)
        sp.start_time_unix_nano = start
        sp.end_time_unix_nano = start + int(ms * 1e6)
        sp.status.code = Status.STATUS_CODE_UNSET
        rid = f"{r.getrandbits(128):032x}" if self.varied else f"rollout-{rollout:012x}"
        sp.attributes.append(_kv(semconv.ROLLOUT_ID, rid))
        return sp

    def _extras(self, sp: Span) -> None:
        r = self.rng
        for key, kind in r.sample(_EXTRA, r.randrange(4)):
            if kind == "int":
                sp.attributes.append(_kv(key, r.randrange(10**6)))
            elif key == "user_agent.original":
                sp.attributes.append(
                    _kv(key, f"python-httpx/0.{r.randrange(20, 29)}.{r.randrange(9)}")
                )
            else:
                sp.attributes.append(_kv(key, r.choice(("gsm8k", "math500", "aime24", "mbpp"))))

    def _error(self, sp: Span) -> None:
        r = self.rng
        err = r.choice(_ERRORS)
        sp.status.code = Status.STATUS_CODE_ERROR
        sp.status.message = f"{err}: request {r.getrandbits(48):012x} failed"
        sp.attributes.append(_kv(semconv.ERROR_TYPE, err))
        ev = sp.events.add()
        ev.name = "exception"
        ev.time_unix_nano = sp.end_time_unix_nano
        ev.attributes.append(_kv("exception.type", err))
        ev.attributes.append(_kv("exception.message", sp.status.message))

    def fill(self, ss: ScopeSpans, group: str, server: str, rollout: int) -> None:
        r = self.rng
        if group == semconv.GROUP_SERVER:
            routes = _ROUTES.get(server, ("/verify",))
            route = r.choice(routes) if self.varied else routes[0]
            sp = self.span(ss, f"POST {route}", Span.SPAN_KIND_SERVER, rollout, r.uniform(5, 900))
            status = 200
            if self.varied and r.random() < 0.02:
                status = r.choice((422, 500, 503))
            peer = f"10.0.{r.randrange(8)}.{r.randrange(2, 250)}" if self.varied else "10.0.3.17"
            for k, v in (
                ("http.request.method", "POST"),
                ("http.route", route),
                ("http.response.status_code", status),
                ("url.scheme", "http"),
                ("network.peer.address", peer),
                (semconv.SERVER_NAME, server),
            ):
                sp.attributes.append(_kv(k, v))
            if self.varied:
                sp.attributes.append(_kv("network.peer.port", r.randrange(30000, 61000)))
                if status >= 500:
                    self._error(sp)
                self._extras(sp)
        elif group == semconv.GROUP_ROLLOUT:
            sp = self.span(
                ss, semconv.SPAN_ROLLOUT, Span.SPAN_KIND_INTERNAL, rollout, r.uniform(2e3, 6e4)
            )
            sp.attributes.append(_kv(semconv.SERVER_NAME, server))
            # the RL figures the agent records on a rollout (issue 41; constants: the
            # random stream, and so every other span, is as before they were added)
            for k, v in (
                (semconv.REWARD, 1.0),
                (semconv.ROLLOUT_TURNS, 2),
                (semconv.ROLLOUT_INPUT_TOKENS, 34),
                (semconv.ROLLOUT_OUTPUT_TOKENS, 13),
            ):
                sp.attributes.append(_kv(k, v))
        elif group == semconv.GROUP_HTTP_CLIENT:
            port = r.choice((8001, 8002))
            sp = self.span(ss, "POST", Span.SPAN_KIND_CLIENT, rollout, r.uniform(5, 900))
            for k, v in (
                ("http.request.method", "POST"),
                ("url.full", f"http://gym-worker-3:{port}/v1/chat/completions"),
                ("server.address", "gym-worker-3"),
                ("server.port", port),
                ("http.response.status_code", 200),
                (semconv.TARGET_SERVER_NAME, _TARGETS[port]),
            ):
                sp.attributes.append(_kv(k, v))
            if self.varied:
                self._extras(sp)
        elif group == semconv.GROUP_MODEL_CALL:
            sp = self.span(
                ss,
                "gym.model.chat_completions",
                Span.SPAN_KIND_INTERNAL,
                rollout,
                r.uniform(80, 900),
            )
            for k, v in (
                (semconv.GEN_AI_OPERATION_NAME, semconv.GEN_AI_OPERATION_CHAT),
                ("gen_ai.request.model", r.choice(_MODELS) if self.varied else _MODEL_NAME),
                ("gen_ai.usage.input_tokens", r.randrange(200, 6000)),
                ("gen_ai.usage.output_tokens", r.randrange(20, 2000)),
                (semconv.SERVER_NAME, server),
            ):
                sp.attributes.append(_kv(k, v))
            if self.varied:
                sp.attributes.append(
                    _kv("gen_ai.response.id", f"chatcmpl-{r.getrandbits(96):024x}")
                )
                reason = r.choice(("stop", "stop", "stop", "length", "tool_calls"))
                sp.attributes.append(_kv("gen_ai.response.finish_reasons", reason))
        elif group == semconv.GROUP_VERIFY:
            sp = self.span(
                ss, semconv.SPAN_VERIFY, Span.SPAN_KIND_INTERNAL, rollout, r.uniform(2, 400)
            )
            ok = r.random() > 0.03
            sp.attributes.append(_kv(semconv.VERIFY_SUCCEEDED, ok))
            sp.attributes.append(_kv(semconv.SERVER_NAME, server))
            if ok:  # the verify answer's reward (a verifier that raised has none)
                sp.attributes.append(_kv(semconv.REWARD, 1.0))
            if not ok and self.varied:
                self._error(sp)
            elif not ok:
                sp.status.code = Status.STATUS_CODE_ERROR
                sp.attributes.append(_kv(semconv.ERROR_TYPE, "TimeoutError"))


_TARGETS = {8001: "policy_model", 8002: "math_with_judge"}
"""A hop's target Gym server (``nemo.gym.target.server.name``), by the port it calls."""

# Span groups per role with their share of the role's spans.
_MIX: dict[str, tuple[tuple[str, int], ...]] = {
    "agent": (
        (semconv.GROUP_SERVER, 1),
        (semconv.GROUP_ROLLOUT, 1),
        (semconv.GROUP_HTTP_CLIENT, 5),
    ),
    "model": ((semconv.GROUP_SERVER, 1), (semconv.GROUP_MODEL_CALL, 1)),
    "resources": ((semconv.GROUP_SERVER, 1), (semconv.GROUP_VERIFY, 1)),
}
# ``rollouts``: whole rollouts as the real stack records them, 18 spans of which 2
# (``gym.rollout``, ``gym.verify``) are derived from: the resources server also serves
# ``/seed_session`` (two SERVER spans per ``gym.verify``). Over ROLE_CYCLE that is 10.9%
# of the spans in the derived groups (2/18 = 11.1%).
# ``derive-heavy``: half of every request is ``gym.rollout``/``gym.verify``; agent and
# resources requests alternate (DERIVE_HEAVY_CYCLE).
_MIXES: dict[str, dict[str, tuple[tuple[str, int], ...]]] = {
    "rollouts": {
        **_MIX,
        "resources": ((semconv.GROUP_SERVER, 2), (semconv.GROUP_VERIFY, 1)),
    },
    "derive-heavy": {
        **_MIX,
        "agent": (
            (semconv.GROUP_SERVER, 1),
            (semconv.GROUP_ROLLOUT, 2),
            (semconv.GROUP_HTTP_CLIENT, 1),
        ),
    },
}
DERIVE_HEAVY_CYCLE = ("agent", "resources")


def role_cycle(load: str) -> tuple[str, ...]:
    """The order of the server roles whose requests a load cycles through."""
    return DERIVE_HEAVY_CYCLE if load == "derive-heavy" else ROLE_CYCLE


def build_request(
    role: str, spans: int, index: int, seed: int = 1, load: str = "uniform"
) -> ExportTraceServiceRequest:
    """One request of exactly ``spans`` spans from a Gym server of ``role`` (module doc)."""
    if role not in _MIX:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    if load not in LOADS:
        raise ValueError(f"unknown load {load!r}; loads: {', '.join(LOADS)}")
    if spans < 1:
        raise ValueError("spans must be at least 1")
    rng = random.Random(seed * 1_000_003 + index)
    factory = _SpanFactory(rng, base_ns=time.time_ns() - 120 * 10**9, load=load)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    _resource(rs, role, index)
    server = rs.resource.attributes[1].value.string_value
    mix = _MIXES.get(load, _MIX)[role]
    weight = sum(w for _, w in mix)
    counts = [spans * w // weight for _, w in mix]
    counts[-1] += spans - sum(counts)
    rollouts_per_request = max(1, spans // 16)
    high = rng.getrandbits(32) << 64
    for (group, _), n in zip(mix, counts, strict=True):
        if n == 0:
            continue
        ss = rs.scope_spans.add()
        ss.scope.name = semconv.scope_name(group)
        ss.scope.version = "0.1.0"
        for i in range(n):
            rollout = high | (index * 4096 + i % rollouts_per_request)
            factory.fill(ss, group, server, rollout)
    return req


def request_sizes(spans: int, distinct: int, seed: int, load: str) -> list[int]:
    """Spans per request: all ``spans``, or for ``varied`` 60% full and the rest partial."""
    if load not in VARIED_LOADS:
        return [spans] * distinct
    rng = random.Random(seed * 7919 + 17)
    low = max(1, spans // 16)
    return [spans if rng.random() < 0.6 else rng.randint(low, spans) for _ in range(distinct)]


def build_requests(
    spans: int, distinct: int = 14, seed: int = 1, load: str = "uniform"
) -> list[tuple[bytes, int]]:
    """``distinct`` serialised requests (bytes, span count), roles in ``role_cycle`` order."""
    sizes = request_sizes(spans, distinct, seed, load)
    cycle = role_cycle(load)
    return [
        (
            build_request(cycle[i % len(cycle)], n, i, seed, load).SerializeToString(),
            n,
        )
        for i, n in enumerate(sizes)
    ]


DERIVED_SPAN_NAMES = frozenset({semconv.SPAN_ROLLOUT, semconv.SPAN_VERIFY})
"""The spans the sidecar's derive stage and the same-job Collector's ``span_metrics``
derive from."""


def derived_share(bodies: list[tuple[bytes, int]]) -> float:
    """The share of the spans in ``bodies`` that are derived from (``gym.rollout`` and
    ``gym.verify`` in their scopes), read back from the encoded requests."""
    derived = total = 0
    for body, _ in bodies:
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                total += len(ss.spans)
                derived += sum(span.name in DERIVED_SPAN_NAMES for span in ss.spans)
    return derived / total if total else 0.0


def spread(bodies: list[tuple[bytes, int]]) -> dict[str, object]:
    """The load's spread (module doc): min/median/max per request, and its compressibility."""
    import statistics
    import zlib

    def stats(values: list[float]) -> list[float]:
        return [min(values), statistics.median(values), max(values)]

    sizes = [float(len(b)) for b, _ in bodies]
    spans = [float(n) for _, n in bodies]
    gz = [len(zlib.compress(b, 6)) / len(b) for b, _ in bodies]
    return {
        "requests": len(bodies),
        "spans_per_request": stats(spans),
        "bytes_per_request": stats(sizes),
        "bytes_per_span": stats([b / n for b, n in zip(sizes, spans, strict=True)]),
        "zlib6_ratio": stats(gz),
        "mean_bytes_per_span": sum(sizes) / sum(spans),
        "derived_share": derived_share(bodies),
        "mean_zlib6_bytes_per_span": sum(g * b for g, b in zip(gz, sizes, strict=True))
        / sum(spans),
    }


@dataclass
class Tally:
    requests: int = 0
    spans: int = 0
    retries: int = 0
    errors: int = 0
    ok_per_body: list[int] = field(default_factory=list)
    """Requests answered OK, per distinct request (index into ``build_requests``)."""


Send = Callable[[bytes], Awaitable[str]]
"""Sends one request; returns ``ok``, ``retry`` (refused, try again) or ``error``."""


async def _grpc_sender(target: str, channels: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import grpc
    from grpc import aio

    opts = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.use_local_subchannel_pool", 1),  # one connection per channel
    ]
    chans = [aio.insecure_channel(target, options=opts) for _ in range(channels)]
    calls = [c.unary_unary(TRACE_METHOD) for c in chans]
    retryable = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}
    turn = [0]

    async def send(body: bytes) -> str:
        turn[0] += 1
        try:
            await calls[turn[0] % len(calls)](body, timeout=30)
        except aio.AioRpcError as exc:
            return "retry" if exc.code() in retryable else "error"
        return "ok"

    async def close() -> None:
        for c in chans:
            await c.close()

    return send, close


async def _http_sender(target: str, concurrency: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import aiohttp

    url = target.rstrip("/") + "/v1/traces"
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency),
        headers={"Content-Type": "application/x-protobuf"},
        timeout=aiohttp.ClientTimeout(total=30),
    )

    async def send(body: bytes) -> str:
        try:
            async with session.post(url, data=body) as resp:
                await resp.read()
                if resp.status == 200:
                    return "ok"
                return "retry" if resp.status in (429, 503) else "error"
        except aiohttp.ClientError:
            return "error"

    return send, session.close


def _emit(event: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> Tally:
    """Send as the arguments say (module doc); returns the tally."""
    bodies = build_requests(args.spans, args.distinct, args.seed, args.load)
    if args.protocol == "grpc":
        send, close = await _grpc_sender(args.target, args.channels)
    else:
        send, close = await _http_sender(args.target, args.concurrency)
    tally = Tally(ok_per_body=[0] * len(bodies))
    mean_spans = sum(n for _, n in bodies) / len(bodies)
    total = args.requests if not args.rate else int(args.seconds * args.rate / mean_spans)
    expected = sum(bodies[i % len(bodies)][1] for i in range(total))
    # Paced mode: request i leaves when the spans before it are due at ``--rate``.
    due: list[float] = []
    if args.rate:
        sent = 0
        for i in range(total):
            due.append(sent / args.rate)
            sent += bodies[i % len(bodies)][1]
    next_index = [0]
    t0 = time.monotonic()

    async def worker() -> None:
        while next_index[0] < total:
            i = next_index[0]
            next_index[0] += 1
            body, n = bodies[i % len(bodies)]
            if due:
                delay = t0 + due[i] - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            while True:
                outcome = await send(body)
                if outcome != "retry":
                    break
                tally.retries += 1
                await asyncio.sleep(RETRY_PAUSE_S)
            if outcome == "ok":
                tally.ok_per_body[i % len(bodies)] += 1
                tally.requests += 1
                tally.spans += n
            else:
                tally.errors += 1

    async def reporter() -> None:
        while True:
            await asyncio.sleep(args.progress_s)
            fields = asdict(tally)
            del fields["ok_per_body"]
            _emit("progress", **fields, total_requests=total)

    _emit("start", expected_spans=expected, load=args.load, spread=spread(bodies))
    report = asyncio.create_task(reporter())
    try:
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    finally:
        report.cancel()
        await close()
    _emit("done", **asdict(tally), seconds=time.monotonic() - t0, pid=os.getpid())
    return tally


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="gRPC HOST:PORT, or HTTP base URL")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument("--spans", type=int, default=512, help="spans per request")
    p.add_argument("--distinct", type=int, default=56, help="distinct pre-encoded requests")
    p.add_argument("--load", choices=LOADS, default="varied", help="how requests vary")
    p.add_argument("--seed", type=int, default=1, help="seeds ids, attributes and sizes")
    p.add_argument("--requests", type=int, default=200, help="requests to send (no --rate)")
    p.add_argument("--rate", type=float, default=0.0, help="spans per second (paced mode)")
    p.add_argument("--seconds", type=float, default=10.0, help="duration of the paced mode")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--channels", type=int, default=2, help="gRPC channels (connections)")
    p.add_argument("--progress-s", type=float, default=0.25)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    tally = asyncio.run(run(args))
    return 1 if tally.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
