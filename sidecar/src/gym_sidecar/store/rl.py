"""The RL operator's figures over a window: per environment, per model, per verifier.

**An environment** is the agent server that ran a rollout: the service of its outermost
``gym.rollout`` span. In NeMo Gym one agent server config binds one resources server and
one model server (``simple_agent``'s ``resources_server`` / ``model_server``), and Gym's
own rollout collection groups results by that agent; so "per environment" is per agent
server, and the resources servers its rollouts reached are listed beside it (from their
stored ``gym.verify`` spans, when the ``verify`` group is forwarded).

Three sources, each what it can answer:

- the stored rollout spans (:func:`environments`, exact): rollouts, failed, success,
  reward mean/p10/p50/p90, turns and tokens per rollout, latency p50/p90/p99. Rewards,
  turns and tokens are the rollout span's attributes (``store.figures``), so this works
  with the default span groups (the ``rollout`` group is forwarded).
- the derived GenAI points (:func:`models`): calls, failures, tokens and duration per
  model server and requested model, time to first token; from
  ``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage`` and
  ``gen_ai.server.time_to_first_token``, which count every call even though the
  ``model_call`` spans are dropped in ``metrics`` mode.
- the derived ``gym.verify.reward`` points (:func:`verifier_rewards`): per resources
  server, the rewards of every verification (not only the stored ones).

Percentiles of stored values are nearest-rank; of points, estimated within a bucket
(``stats.bucket_quantile``, narrowed by the points' ``min`` and ``max``). At most
:data:`MAX_ROLLOUTS` rollouts (the most recent) are read for one answer;
:attr:`Environments.truncated` says when the bound was reached.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import gym_telemetry_semconv as semconv

from gym_sidecar.store import queries
from gym_sidecar.store.queries import RolloutSummary
from gym_sidecar.store.stats import Histogram, nearest_rank, window_points

MAX_ROLLOUTS: Final = 20_000
"""Most rollouts one :func:`environments` answer reads (the most recent)."""
REWARD_QUANTILES: Final = (0.1, 0.5, 0.9)
TURN_QUANTILES: Final = (0.5, 0.9)
LATENCY_QUANTILES: Final = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class Summary:
    """Count, mean and quantiles of one figure (None: no value)."""

    count: int
    mean: float | None
    quantiles: tuple[float | None, ...]

    @classmethod
    def of(cls, values: Sequence[float], qs: Sequence[float]) -> Summary:
        ordered = sorted(values)
        mean = math.fsum(ordered) / len(ordered) if ordered else None
        return cls(len(ordered), mean, tuple(nearest_rank(ordered, q) for q in qs))


@dataclass(frozen=True)
class EnvSummary:
    """One environment's rollouts in the window."""

    env: str
    """The agent server's service name."""
    rollouts: int
    failed: int
    reward: Summary
    """Over the rollouts with a numeric reward (p10, p50, p90)."""
    turns: Summary
    """Model calls per rollout (p50, p90)."""
    input_tokens: Summary
    output_tokens: Summary
    duration_ms: Summary
    """Latency (p50, p90, p99)."""
    resources: tuple[str, ...]
    """The services of the verifications its rollouts' traces hold (when stored)."""

    @property
    def success(self) -> float | None:
        """The share of its rollouts that did not fail."""
        return (self.rollouts - self.failed) / self.rollouts if self.rollouts else None


@dataclass(frozen=True)
class Environments:
    envs: list[EnvSummary]
    read: int
    """Rollouts read."""
    truncated: bool
    """True when :data:`MAX_ROLLOUTS` cut the window short (older rollouts not read)."""


def summarize(env: str, rows: Sequence[RolloutSummary], resources: Sequence[str]) -> EnvSummary:
    def values(get: Any) -> list[float]:
        return [float(v) for v in (get(r) for r in rows) if v is not None]

    return EnvSummary(
        env=env,
        rollouts=len(rows),
        failed=sum(1 for r in rows if r.failed),
        reward=Summary.of(values(lambda r: r.reward), REWARD_QUANTILES),
        turns=Summary.of(values(lambda r: r.turns), TURN_QUANTILES),
        input_tokens=Summary.of(values(lambda r: r.input_tokens), ()),
        output_tokens=Summary.of(values(lambda r: r.output_tokens), ()),
        duration_ms=Summary.of([r.duration_ms for r in rows], LATENCY_QUANTILES),
        resources=tuple(sorted(resources)),
    )


def _window_rollouts(
    conn: sqlite3.Connection, window_s: float | None, now_ns: int | None
) -> tuple[list[RolloutSummary], bool, dict[str, set[str]]]:
    """The window's rollouts (at most :data:`MAX_ROLLOUTS`, the most recent), whether the
    bound cut it, and each trace's verifier services."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    rows = queries.rollouts(conn, since_s=window_s, limit=MAX_ROLLOUTS + 1, now_ns=now_ns)
    truncated = len(rows) > MAX_ROLLOUTS
    rows = rows[:MAX_ROLLOUTS]
    return rows, truncated, _verifier_services(conn, {r.trace_id for r in rows})


def environments(
    conn: sqlite3.Connection, window_s: float | None, now_ns: int | None = None
) -> Environments:
    """Every environment with a rollout started in the last ``window_s`` seconds (all
    when None), by name (module doc)."""
    rows, truncated, verifiers = _window_rollouts(conn, window_s, now_ns)
    by_env: dict[str, list[RolloutSummary]] = defaultdict(list)
    for r in rows:
        by_env[r.service].append(r)
    envs = [
        summarize(env, found, sorted({s for r in found for s in verifiers.get(r.trace_id, ())}))
        for env, found in sorted(by_env.items())
    ]
    return Environments(envs, len(rows), truncated)


def whole_fleet(
    conn: sqlite3.Connection, window_s: float | None, now_ns: int | None = None
) -> Environments:
    """:func:`environments` with every rollout of the window as one environment, ``all``."""
    rows, truncated, verifiers = _window_rollouts(conn, window_s, now_ns)
    if not rows:
        return Environments([], 0, truncated)
    resources = sorted({s for found in verifiers.values() for s in found})
    return Environments([summarize("all", rows, resources)], len(rows), truncated)


def _verifier_services(conn: sqlite3.Connection, trace_ids: set[str]) -> dict[str, set[str]]:
    """Trace id (hex) -> the services of its stored ``gym.verify`` / ``gym.env.step``."""
    out: dict[str, set[str]] = defaultdict(set)
    ids = sorted(bytes.fromhex(t) for t in trace_ids)
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        for r in conn.execute(
            f"SELECT trace_id, service FROM gym_spans WHERE name IN (?, ?) "
            f"AND trace_id IN ({marks})",
            [semconv.SPAN_VERIFY, semconv.SPAN_ENV_STEP, *chunk],
        ):
            out[bytes(r["trace_id"]).hex()].add(str(r["service"]))
    return out


# -- from the derived points ---------------------------------------------------------------


@dataclass
class ModelSummary:
    """Model calls to one requested model at one model server, in the window."""

    service: str
    model: str
    """``gen_ai.request.model`` (``-`` when the calls named none)."""
    duration_s: Histogram = field(default_factory=Histogram)
    """Every call's duration."""
    failed: int = 0
    """Calls with an ``error.type``."""
    input_tokens: Histogram = field(default_factory=Histogram)
    output_tokens: Histogram = field(default_factory=Histogram)
    ttft_s: Histogram = field(default_factory=Histogram)
    """Streamed calls' time to first chunk."""

    @property
    def calls(self) -> int:
        return self.duration_s.count


def models(
    conn: sqlite3.Connection, window_s: float | None, now_ns: int | None = None
) -> list[ModelSummary]:
    """Per (model server, requested model), the model calls of the window (module doc)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    since = None if window_s is None else now_ns - int(window_s * 1e9)
    found: dict[tuple[str, str], ModelSummary] = {}

    def entry(service: str, attrs: dict[str, Any]) -> ModelSummary:
        model = str(attrs.get(semconv.GEN_AI_REQUEST_MODEL, "-"))
        key = (service, model)
        if key not in found:
            found[key] = ModelSummary(service, model)
        return found[key]

    for service, attrs_json, value in window_points(
        conn, semconv.METRIC_GEN_AI_OPERATION_DURATION, since
    ):
        attrs = json.loads(attrs_json)
        summary = entry(service, attrs)
        summary.duration_s.add(value)
        if attrs.get(semconv.ERROR_TYPE) is not None:
            summary.failed += int(value.get("count", 0))
    for service, attrs_json, value in window_points(conn, semconv.METRIC_GEN_AI_TOKEN_USAGE, since):
        attrs = json.loads(attrs_json)
        summary = entry(service, attrs)
        if attrs.get(semconv.GEN_AI_TOKEN_TYPE) == semconv.GEN_AI_TOKEN_TYPE_INPUT:
            summary.input_tokens.add(value)
        elif attrs.get(semconv.GEN_AI_TOKEN_TYPE) == semconv.GEN_AI_TOKEN_TYPE_OUTPUT:
            summary.output_tokens.add(value)
    for service, attrs_json, value in window_points(
        conn, semconv.METRIC_GEN_AI_TIME_TO_FIRST_TOKEN, since
    ):
        entry(service, json.loads(attrs_json)).ttft_s.add(value)
    return [found[k] for k in sorted(found)]


@dataclass
class VerifierRewards:
    """``gym.verify.reward`` of one resources server in the window."""

    service: str
    completed: Histogram = field(default_factory=Histogram)
    """``succeeded=true``."""
    failed: Histogram = field(default_factory=Histogram)
    """``succeeded=false`` with a reward (a failure row Gym returned with one)."""


def verifier_rewards(
    conn: sqlite3.Connection, window_s: float | None, now_ns: int | None = None
) -> list[VerifierRewards]:
    """Per resources server, the rewards of its verifications in the window."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    since = None if window_s is None else now_ns - int(window_s * 1e9)
    found: dict[str, VerifierRewards] = {}
    for service, attrs_json, value in window_points(conn, semconv.METRIC_VERIFY_REWARD, since):
        entry = found.setdefault(service, VerifierRewards(service))
        succeeded = json.loads(attrs_json).get(semconv.VERIFY_SUCCEEDED)
        (entry.completed if succeeded is not False else entry.failed).add(value)
    return [found[k] for k in sorted(found)]
