"""The live view: what ``GET /v1/rollouts/live`` answers, as typed values and as JSON.

The sidecar builds it from its tracker (:func:`gym_sidecar.live.api.build_view`); the web view and
``gym-sidecar live`` read it back from JSON (:meth:`LiveView.from_json`), which checks
every field's type, since the text came over a socket: a document that does not hold
together raises ValueError. Strings in it come from span data (rollout ids, server and
step names): whoever shows them escapes them.

JSON shape (times in unix nanoseconds on the sidecar's clock, durations in seconds)::

    {"enabled": true, "now_unix_nano": ..., "stall_after_s": 300.0, "lost_after_s": 30.0,
     "in_flight_total": 3, "stalled_total": 1,
     "in_flight": [ROLLOUT...], "lost": [ROLLOUT...], "servers": [SERVER...],
     "instances": [INSTANCE...]}
    ROLLOUT: {"rollout_id": "12-0" | null, "trace_id": hex, "span_id": hex, "server": ...,
              "instance": ..., "started_unix_nano": ..., "start_seen": true,
              "last_activity_unix_nano": ..., "step": "POST /v1/responses" | null,
              "step_target": "policy_model" | null, "turns": 1 | null, "stalled": false,
              "lost_unix_nano": null | ..., "lost_reason": null | "stopped" | ...,
              "ended_after_lost": false}
    SERVER: {"server": ..., "in_flight": 2, "stalled": 1, "lost": 0, "instances": 1}
    INSTANCE: {"server": ..., "instance": ..., "last_seen_s_ago": 0.4, "interval_s": 2.0,
               "reported_in_flight": 2 | null, "tracked": 2, "state": "alive" |
               "stopping" | "superseded"}

``in_flight`` lists stalled rollouts first, then the oldest first, at most ``limit``;
``lost`` the newest first.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Final, TypeVar

LIVE_PATH: Final = "/v1/rollouts/live"
"""The admin listener's path of the live view."""
DEFAULT_LIMIT = 500
MAX_LIMIT = 10_000

T = TypeVar("T")


@dataclass(frozen=True)
class RolloutView:
    rollout_id: str | None
    trace_id: str
    span_id: str
    server: str
    instance: str
    started_unix_nano: int
    start_seen: bool
    last_activity_unix_nano: int
    step: str | None
    step_target: str | None
    turns: int | None
    stalled: bool
    lost_unix_nano: int | None = None
    lost_reason: str | None = None
    ended_after_lost: bool = False


@dataclass(frozen=True)
class ServerView:
    server: str
    in_flight: int
    stalled: int
    lost: int
    instances: int


@dataclass(frozen=True)
class InstanceView:
    server: str
    instance: str
    last_seen_s_ago: float
    interval_s: float
    reported_in_flight: int | None
    tracked: int
    state: str


@dataclass(frozen=True)
class LiveView:
    enabled: bool
    now_unix_nano: int
    stall_after_s: float
    lost_after_s: float
    in_flight_total: int
    stalled_total: int
    in_flight: list[RolloutView]
    lost: list[RolloutView]
    servers: list[ServerView]
    instances: list[InstanceView]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: object) -> LiveView:
        """The view a JSON document holds; ValueError when it does not hold one."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        values = _fields(cls, doc, skip={"in_flight", "lost", "servers", "instances"})
        return cls(
            **values,
            in_flight=_list(RolloutView, doc.get("in_flight")),
            lost=_list(RolloutView, doc.get("lost")),
            servers=_list(ServerView, doc.get("servers")),
            instances=_list(InstanceView, doc.get("instances")),
        )


def disabled_view(now_ns: int) -> LiveView:
    """The answer of a sidecar whose tracker is off."""
    return LiveView(False, now_ns, 0.0, 0.0, 0, 0, [], [], [], [])


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "str | None": (str, type(None)),
    "int": (int,),
    "int | None": (int, type(None)),
    "float": (int, float),
    "bool": (bool,),
}


def _fields(cls: type, doc: dict[str, Any], skip: Collection[str] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in skip:
            continue
        if f.name not in doc:
            if f.default is not MISSING:  # has a default: optional in the JSON
                continue
            raise ValueError(f"{cls.__name__}: missing {f.name!r}")
        value = doc[f.name]
        allowed = _TYPES[str(f.type)]
        is_bool = isinstance(value, bool)
        if not isinstance(value, allowed) or (is_bool and bool not in allowed):
            raise ValueError(f"{cls.__name__}.{f.name}: unexpected {type(value).__name__}")
        out[f.name] = float(value) if str(f.type) == "float" else value  # type: ignore[arg-type]
    return out


def _list(cls: type[T], value: object) -> list[T]:
    if not isinstance(value, list):
        raise ValueError(f"{cls.__name__} list: not a JSON array")
    out = []
    for item in value:
        if not isinstance(item, dict):
            raise ValueError(f"{cls.__name__}: not a JSON object")
        out.append(cls(**_fields(cls, item)))
    return out
