"""Who produced a span, and what it is to the sidecar: the one place that says so.

Gym's spans reach the sidecar from two producers, in two dialects of the same names:

- :attr:`Producer.AGENT`, this project's agent (``gym_telemetry``): one instrumentation
  scope per span group, ``gym_telemetry.<group>`` (``semconv.scope_name``); the scope
  alone gives the group, the span name inside it the kind (``gym.rollout`` in
  ``gym_telemetry.rollout``). Failures: ERROR status plus ``error.type``; verifications
  carry ``succeeded``; a relayed rollout is marked ``nemo.gym.rollout.nested``.
- :attr:`Producer.GYM`, NeMo Gym's own telemetry (``nemo_gym.telemetry`` on nemo-lens,
  0.7.0 and Gym's main branch): every semantic span in one scope,
  ``nemo.lens.helpers``, so the **span name** gives the group and the kind
  (:data:`GYM_SPAN_GROUPS`); CLIENT hops in ``nemo.gym``. Failures: ERROR status plus an
  ``exception`` event (``exception.type``), no ``succeeded``, no ``error.type``, no
  nested marker.

Everything else is :attr:`Producer.OTHER` (third-party instrumentations; the gate maps
some of their scopes to groups, ``gating/scopes.py``).

Every area that recognises Gym spans asks this module and nothing else: the derive stage
(which spans are rollouts and verifications), the gate (which group a span belongs to,
per block or, in a scope that carries several groups, per span), the store (which spans
become ``gym_spans`` rows) and the web view (a span's producer). A new producer or a
renamed span is one table here.

Lookups are memoised per scope name (bounded) and cost one dict access on the hot path;
:class:`ScopeRole` answers per span name from a small frozen table. Thread-safe: the
tables never change after import; a racing cache fill computes the same answer twice.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import gym_dialect


class Producer(enum.Enum):
    """Which telemetry wrote a span (the module doc says how each is told apart)."""

    AGENT = "gym_telemetry"
    """This project's agent."""
    GYM = "nemo_gym"
    """NeMo Gym's own telemetry (``nemo_gym.telemetry`` on nemo-lens)."""
    OTHER = "other"


class Kind(enum.Enum):
    """What a span is to the sidecar: the kinds it derives metrics from, lists or groups."""

    ROLLOUT = "rollout"
    """A rollout (``gym.rollout``): listed, derived into ``gym.rollout.duration_ms``."""
    VERIFY = "verify"
    """A verification (``gym.verify``): derived into ``gym.verify.*``."""
    ENV_STEP = "env_step"
    """A gymnasium ``/step`` (``gym.env.step``): derived into ``gym.env.step.*``."""
    AGENT_RESPONSES = "agent_responses"
    MODEL_CALL = "model_call"
    SANDBOX = "sandbox"
    JOB = "job"
    SERVER = "server"
    HTTP_CLIENT = "http_client"
    OTHER = "other"


#: The kinds stored as rows of their own (``gym_spans``) and read span by span.
ROW_KINDS: Final = frozenset({Kind.ROLLOUT, Kind.VERIFY, Kind.ENV_STEP})


@dataclass(frozen=True, slots=True)
class SpanRole:
    """One span's producer, span group (None: in no group, never gated) and kind."""

    producer: Producer
    group: str | None
    kind: Kind


_NAME_KINDS: Final[Mapping[str, Kind]] = {
    semconv.SPAN_ROLLOUT: Kind.ROLLOUT,
    semconv.SPAN_VERIFY: Kind.VERIFY,
    semconv.SPAN_ENV_STEP: Kind.ENV_STEP,
    semconv.SPAN_AGENT_RESPONSES: Kind.AGENT_RESPONSES,
    semconv.SPAN_MODEL_RESPONSES: Kind.MODEL_CALL,
    semconv.SPAN_MODEL_CHAT: Kind.MODEL_CALL,
    semconv.SPAN_MODEL_MESSAGES: Kind.MODEL_CALL,
    gym_dialect.SPAN_JOB: Kind.JOB,
}
"""Span name -> kind, for both producers (they share the names)."""

_KIND_GROUPS: Final[Mapping[Kind, str]] = {
    Kind.ROLLOUT: semconv.GROUP_ROLLOUT,
    Kind.VERIFY: semconv.GROUP_VERIFY,
    Kind.ENV_STEP: semconv.GROUP_VERIFY,
    Kind.AGENT_RESPONSES: semconv.GROUP_AGENT,
    Kind.MODEL_CALL: semconv.GROUP_MODEL_CALL,
    Kind.SANDBOX: semconv.GROUP_SANDBOX,
    Kind.JOB: semconv.GROUP_JOB,
    Kind.SERVER: semconv.GROUP_SERVER,
    Kind.HTTP_CLIENT: semconv.GROUP_HTTP_CLIENT,
}

_GROUP_KINDS: Final[Mapping[str, Kind]] = {
    semconv.GROUP_SANDBOX: Kind.SANDBOX,
    semconv.GROUP_JOB: Kind.JOB,
    semconv.GROUP_SERVER: Kind.SERVER,
    semconv.GROUP_HTTP_CLIENT: Kind.HTTP_CLIENT,
    semconv.GROUP_AGENT: Kind.AGENT_RESPONSES,
    semconv.GROUP_MODEL_CALL: Kind.MODEL_CALL,
}
"""An agent span's kind when its name is not one of :data:`_NAME_KINDS`: its group's."""


def gym_span_kind(name: str) -> Kind:
    """The kind of a span Gym's own telemetry named ``name`` (``Kind.OTHER``: not Gym's:
    NeMo-RL's or Megatron's spans share Lens's scope)."""
    kind = _NAME_KINDS.get(name)
    if kind is not None:
        return kind
    if name.startswith(gym_dialect.SPAN_SANDBOX_PREFIX):
        return Kind.SANDBOX
    return Kind.OTHER


GYM_SPAN_GROUPS: Final[Mapping[str, str]] = {
    name: _KIND_GROUPS[kind] for name, kind in _NAME_KINDS.items()
}
"""Span name -> group in Gym's own dialect (plus ``gym.sandbox.*`` -> ``sandbox``);
Gym 0.7.0's ``GymSpanGroup`` and its call sites, unchanged on Gym's main branch."""


class ScopeRole:
    """What one instrumentation scope holds: its producer, and either one group for all
    its spans or a group per span name (``by_name``). Immutable."""

    __slots__ = ("_kind", "_roles", "by_name", "group", "name", "producer")

    def __init__(
        self, name: str, producer: Producer, group: str | None, *, by_name: bool = False
    ) -> None:
        self.name = name
        self.producer = producer
        self.group = group
        """Every span's group when the scope decides it (None: per span, or no group)."""
        self.by_name = by_name
        """True: the scope carries several groups; the span name decides (the gate then
        works span by span in its blocks)."""
        self._kind = _GROUP_KINDS.get(group, Kind.OTHER) if group is not None else Kind.OTHER
        self._roles: dict[str, SpanRole] = {}

    def span(self, name: str) -> SpanRole:
        """The role of a span called ``name`` in this scope (memoised, bounded)."""
        role = self._roles.get(name)
        if role is not None:
            return role
        if self.by_name:
            kind = gym_span_kind(name)
            role = SpanRole(self.producer, _KIND_GROUPS.get(kind), kind)
        elif self.producer is Producer.AGENT:
            kind = _NAME_KINDS.get(name, self._kind)
            # A name of another group's kind in this scope (not written by the agent):
            # the scope's group still holds it, the kind is the scope's.
            if kind in _KIND_GROUPS and _KIND_GROUPS[kind] != self.group:
                kind = self._kind
            role = SpanRole(self.producer, self.group, kind)
        else:
            role = SpanRole(self.producer, self.group, self._kind)
        if len(self._roles) < _MAX_NAMES:
            self._roles[name] = role
        return role

    def __repr__(self) -> str:
        return f"ScopeRole({self.name!r}, {self.producer}, {self.group!r}, by_name={self.by_name})"


_MAX_NAMES: Final = 256
"""Span names remembered per scope (past it, answers are computed each time)."""
_MAX_SCOPES: Final = 1024
"""Scope names remembered (a client inventing scopes cannot grow the cache)."""

GYM_SCOPES: Final[Mapping[str, str | None]] = {
    gym_dialect.SCOPE_LENS_HELPERS: None,
    gym_dialect.SCOPE_GYM_CLIENT: semconv.GROUP_HTTP_CLIENT,
}
"""Gym's own scopes -> the group of all their spans (None: by span name)."""

SPLIT_SCOPES: Final = frozenset(name for name, group in GYM_SCOPES.items() if group is None)
"""Scopes that carry several groups: gated span by span (the scanner reports each span's
byte range in their blocks, ``core.traces.ScanSpec.split_scopes``)."""

AGENT_ROLLOUT_SCOPE: Final = semconv.scope_name(semconv.GROUP_ROLLOUT)
AGENT_VERIFY_SCOPE: Final = semconv.scope_name(semconv.GROUP_VERIFY)

ROW_SCOPES: Final = frozenset({AGENT_ROLLOUT_SCOPE, AGENT_VERIFY_SCOPE, *SPLIT_SCOPES})
"""Every scope that can hold a span of :data:`ROW_KINDS`: read span by span by the derive
stage and the store; every other block costs them one scope-name lookup."""

AGENT_MODEL_CALL_SCOPE: Final = semconv.scope_name(semconv.GROUP_MODEL_CALL)
AGENT_HTTP_CLIENT_SCOPE: Final = semconv.scope_name(semconv.GROUP_HTTP_CLIENT)

MODEL_CALL_SCOPES: Final = frozenset({AGENT_MODEL_CALL_SCOPE, *SPLIT_SCOPES})
"""Every scope that can hold a model call (``Kind.MODEL_CALL``: ``gym.model.*``): the
agent's ``model_call`` scope and Gym's one scope. Read by the derive stage for the GenAI
metrics (issue 41)."""

HOP_SCOPES: Final = frozenset({AGENT_HTTP_CLIENT_SCOPE})
"""The scopes whose CLIENT hops the derive stage reads for ``gym.http.client.*``: the
agent's ``http_client`` scope only. Gym's own hop scope (``nemo.gym``) records neither the
retries nor the target server: Gym counts them in its in-process
``gym.http.{retry,timeout}_total`` instead (docs/nemo-gym.md)."""

DERIVE_SCOPES: Final = ROW_SCOPES | MODEL_CALL_SCOPES | HOP_SCOPES
"""Every scope the derive stage reads span by span (``metrics.spans.SCAN_SPEC``)."""


def _compute(name: str) -> ScopeRole:
    group = semconv.group_of_scope(name)
    if group is not None and group in semconv.ALL_GROUPS:
        return ScopeRole(name, Producer.AGENT, group)
    if name in GYM_SCOPES:
        gym_group = GYM_SCOPES[name]
        return ScopeRole(name, Producer.GYM, gym_group, by_name=gym_group is None)
    return ScopeRole(name, Producer.OTHER, None)


_ROLES: Final[dict[str, ScopeRole]] = {}


def scope_role(name: str) -> ScopeRole:
    """The role of the instrumentation scope ``name`` (memoised; bounded)."""
    role = _ROLES.get(name)
    if role is None:
        role = _compute(name)
        if len(_ROLES) < _MAX_SCOPES:
            _ROLES[name] = role
    return role


def span_role(scope: str, name: str) -> SpanRole:
    """The role of a span called ``name`` in the scope ``scope``."""
    return scope_role(scope).span(name)
