"""Gym's own failure markers on what a handler returned: a failure answered as HTTP 200.

NeMo Gym reports several failures *inside* a successful HTTP response instead of
raising, and its rollout collector files those rows as failures:

- ``judge_failsafe`` (around every resources server's ``/verify``) turns a failed judge
  call into a 200 row with ``mask_sample: true``, ``failure_kind`` (``judge_failed``) and
  ``_ng_failure_class`` -- the key the collector routes to its failures file;
- a verify response may set ``mask_sample: true`` itself ("the environment or its
  infrastructure failed rather than the evaluated system");
- an environment server's episode protocol (``BaseEpisodeResponse``, e.g.
  ``single_agent_turn``) answers 200 with ``failure`` set instead of ``result``;
- a relay (``legacy_agent``) returns a raw ``Response`` carrying its upstream's status.

:func:`failure_of` reads exactly those markers, and nothing else: the reward never decides
a failure (``gym_telemetry.answers`` reads it for its own attribute). The rules, in order:

1. A Starlette-style response object (``status_code`` int, ``body`` bytes: what
   ``judge_failsafe`` returns, and what the ``legacy_agent`` relay passes through): a
   status of 500 or more is a failure, ``error.type`` the status code. Otherwise its
   body (up to ``MAX_BODY_BYTES``; larger ones are not read) is searched for the byte
   markers ``"mask_sample":true`` and ``"_ng_failure_class":"`` (two substring tests, no
   parsing; compact JSON, as Starlette's ``JSONResponse``, FastAPI and orjson write it),
   and parsed only when one is there; its *top-level* JSON object then goes through
   rule 2.
2. A mapping or an object (pydantic model) is a failure when
   - ``failure`` is set (not None): an episode failure; ``error.type`` is its
     ``failure_kind``, else ``environment_server_failed`` (the class Gym's collector
     files such a row under); ``stage`` is kept as ``nemo.gym.failure.stage``;
   - or ``mask_sample`` is ``True``, or ``_ng_failure_class`` is a non-empty string:
     ``error.type`` is ``failure_kind``, else ``_ng_failure_class``, else ``_OTHER``;
   - or it is an episode response whose ``result`` is such a row (``single_agent_turn``
     returns the resources server's verify row as its result, judge failures included).
   A ``failure_kind`` with ``mask_sample`` false is *not* a failure: Gym documents that
   as a sample that degraded but was still measured validly.
3. Anything else (None, a list, a streaming response) is not a failure.

Cost: for the usual pydantic result, a few dict lookups in its ``__dict__`` (no
``getattr`` misses, which cost an exception each on a pydantic model). Never raises: a
malformed value is treated as "no failure" (callers also guard it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

#: ``error.type`` when a failure names no kind (OpenTelemetry's fallback value).
ERROR_TYPE_OTHER: Final = "_OTHER"
#: ``error.type`` of an episode failure without a ``failure_kind`` (Gym's collector class).
EPISODE_FAILURE_KIND: Final = "environment_server_failed"
#: Largest raw response body searched for the byte markers (and then parsed). Larger
#: bodies are not read. A relayed rollout's body is the agent's whole answer: a search
#: over 4 MiB is a few milliseconds, once per rollout.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
#: Longest failure reason kept in a span's status description.
MAX_REASON_CHARS: Final = 256
#: Longest ``error.type`` taken from a response (kinds are short names).
MAX_KIND_CHARS: Final = 128

# Byte markers that may indicate a failure row in a compact JSON body. Only the
# verify-row markers: episode failures come back as models or dicts (rule 2).
_BODY_MARKERS: Final = (b'"mask_sample":true', b'"_ng_failure_class":"')


class Failure(NamedTuple):
    """A failure read from a returned object."""

    kind: str
    """Low-cardinality name, used as ``error.type``."""
    reason: str | None
    """Occurrence detail (never a metric label), for the span's status description."""
    stage: str | None = None
    """An episode failure's stage (``seed``, ``agent``, ``verification``, ...)."""


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


_SCALARS: Final = (bool, str, int, float, list, tuple)


def _view(obj: Any) -> Mapping[str, Any] | None:
    """The fields of ``obj`` without attribute lookups: a dict itself, else the instance
    ``__dict__`` (where pydantic models and Starlette responses keep theirs), else a
    mapping itself.

    ``getattr`` on a pydantic model for a name it lacks goes through its Python
    ``__getattr__`` and an exception; a dict lookup does not.
    """
    if type(obj) is dict:
        return obj
    fields = getattr(obj, "__dict__", None)
    if type(fields) is dict:
        return fields
    return obj if isinstance(obj, Mapping) else None


def _extra(obj: Any, view: Mapping[str, Any], key: str) -> Any:
    """``key`` among the fields, else among a pydantic model's extra fields."""
    value = view.get(key)
    if value is None and view is not obj:
        extra = getattr(obj, "__pydantic_extra__", None)
        if type(extra) is dict:
            value = extra.get(key)
    return value


def _from_view(obj: Any, view: Mapping[str, Any], nested: bool = True) -> Failure | None:
    episode = view.get("failure")
    if episode is not None:
        failure = _view(episode)
        if failure is not None:
            kind = _text(failure.get("failure_kind"), MAX_KIND_CHARS) or EPISODE_FAILURE_KIND
            return Failure(
                kind,
                _text(failure.get("failure_reason"), MAX_REASON_CHARS),
                _text(failure.get("stage"), MAX_KIND_CHARS),
            )
    failure_class = _text(_extra(obj, view, "_ng_failure_class"), MAX_KIND_CHARS)
    if view.get("mask_sample") is True or failure_class:
        named = _text(view.get("failure_kind"), MAX_KIND_CHARS) or failure_class
        return Failure(
            named or ERROR_TYPE_OTHER, _text(view.get("failure_reason"), MAX_REASON_CHARS)
        )
    if nested:
        result = view.get("result")
        if result is not None and not isinstance(result, _SCALARS):
            result_view = _view(result)
            if result_view is not None:
                return _from_view(result, result_view, nested=False)
    return None


def _from_response(body: Any) -> Failure | None:
    if type(body) is not bytes or len(body) > MAX_BODY_BYTES:
        return None
    if not any(marker in body for marker in _BODY_MARKERS):
        return None
    try:
        parsed = json.loads(body)
    except ValueError:  # not JSON after all: no markers to read
        return None
    return _from_view(parsed, parsed) if type(parsed) is dict else None


# How failure_of reads a result, per type (remembered, ``MAX_TYPES``): not at all (None and
# the scalar types), as a dict, as a model whose only possible markers are some of its
# declared fields (a pydantic model that keeps no extra fields: its ``__dict__`` is
# exactly its fields, so one lookup per such field tells "no marker"), or through
# ``_view``.
_SKIP, _DICT, _FIELDS, _OTHER = range(4)
_MARKER_FIELDS: Final = ("failure", "mask_sample", "_ng_failure_class", "result", "status_code")
_plans: dict[type, tuple[int, tuple[str, ...]]] = {}
#: Bound of the per-type memo (entries; cleared when full).
MAX_TYPES: Final = 256


def _plan_of(cls: type) -> tuple[int, tuple[str, ...]]:
    plan: tuple[int, tuple[str, ...]] = (_OTHER, ())
    if cls is type(None) or issubclass(cls, _SCALARS):
        plan = (_SKIP, ())
    elif cls is dict:
        plan = (_DICT, ())
    else:
        fields = getattr(cls, "model_fields", None)
        config = getattr(cls, "model_config", None)
        if (
            isinstance(fields, Mapping)
            and isinstance(config, Mapping)
            and config.get("extra") != "allow"
            and cls.__getattribute__ is object.__getattribute__
        ):
            plan = (_FIELDS, tuple(name for name in _MARKER_FIELDS if name in fields))
    if len(_plans) >= MAX_TYPES:
        _plans.clear()
    _plans[cls] = plan
    return plan


def failure_of(result: Any) -> Failure | None:
    """The Gym failure ``result`` reports in-band, or None (module doc). Never raises."""
    try:
        plan = _plans.get(type(result)) or _plan_of(type(result))
        kind = plan[0]
        if kind == _SKIP:
            return None
        if kind == _FIELDS:
            fields = result.__dict__
            if type(fields) is dict:
                for name in plan[1]:  # usually just mask_sample
                    value = fields.get(name)
                    if value is True if name == "mask_sample" else value is not None:
                        break
                else:
                    return None  # none of the fields that could carry a marker does
        view = _view(result)
        if view is None:
            return None
        if view is not result:  # an object: a Starlette-style response has status_code
            status = view.get("status_code")
            if type(status) is int:
                if status >= 500:
                    return Failure(str(status), None)
                return _from_response(view.get("body"))
        # The usual answer carries no marker: found with dict lookups, no calls.
        get = view.get
        if get("failure") is None and get("mask_sample") is not True:
            failure_class = get("_ng_failure_class")
            if failure_class is None and view is not result:
                extra = getattr(result, "__pydantic_extra__", None)
                if type(extra) is dict:
                    failure_class = extra.get("_ng_failure_class")
            nested = get("result")
            if failure_class is None and (nested is None or isinstance(nested, _SCALARS)):
                return None
        return _from_view(result, view)
    except Exception:  # a strange object: no failure read, the handler is unaffected
        return None


__all__ = [
    "EPISODE_FAILURE_KIND",
    "ERROR_TYPE_OTHER",
    "MAX_BODY_BYTES",
    "Failure",
    "failure_of",
]
