"""The RL figures of what a verify, step or ``/run`` handler returned (issue 41).

Read from the object the handler returned, as Gym holds it (a pydantic model or a dict),
never from a response body: a raw response (``judge_failsafe``'s failure row, a relay's
passthrough) gives nothing.

- :func:`reward_of`: the answer's ``reward`` (Gym's ``BaseVerifyResponse.reward``, a
  gymnasium ``/step``'s ``EnvStepResponse.reward``, the ``/run`` answer, which is the
  verify response); for an environment server's episode answer
  (``BaseEpisodeResponse``) the ``reward`` of its ``result``. A number (int or float,
  not bool, finite), as a float; else None.
- :func:`usage_of`: the token usage Gym summed into a ``/run`` answer: its ``response``
  (the agent's final ``NeMoGymResponse``, whose ``usage`` ``simple_agent`` accumulates
  over the rollout's model calls) ``usage.input_tokens`` / ``usage.output_tokens``; for
  an episode answer, its ``result``'s. Non-negative ints (not bool); else None.

Cost: a few dict lookups in the instance ``__dict__`` (where pydantic keeps its fields),
no ``getattr`` misses (an exception each on a pydantic model). Never raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def fields(obj: Any) -> Mapping[str, Any] | None:
    """``obj``'s fields: a dict itself, else its instance ``__dict__`` (a pydantic model's
    fields), else None."""
    if type(obj) is dict:
        return obj
    try:
        view = obj.__dict__
    except AttributeError:
        return None
    return view if type(view) is dict else None


_isfinite = math.isfinite


def _number(value: Any) -> float | None:
    kind = type(value)
    if kind is float:
        return value if _isfinite(value) else None
    if kind is int:
        return float(value)
    return None


def reward_of(answer: Any) -> float | None:
    """The answer's numeric reward (module doc), or None. Never raises.

    On every verify span: the usual answer (a pydantic model with a float ``reward``) is
    read with one ``__dict__`` load and one dict lookup, no further call."""
    try:
        view = answer if type(answer) is dict else answer.__dict__
        reward = view.get("reward")
        if type(reward) is float:
            return reward if _isfinite(reward) else None
        if reward is not None:
            return _number(reward)
        nested = view.get("result")
        if nested is not None and not isinstance(nested, str | int | float | list | tuple):
            inner = fields(nested)
            if inner is not None:
                return _number(inner.get("reward"))
        return None
    except Exception:  # no fields (None, a str), a strange object: no reward read
        return None


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def usage_of(answer: Any) -> tuple[int, int] | None:
    """``(input_tokens, output_tokens)`` of a ``/run`` answer (module doc), or None."""
    try:
        view = fields(answer)
        if view is None:
            return None
        response = view.get("response")
        if response is None:
            nested = view.get("result")
            inner = fields(nested) if nested is not None else None
            response = inner.get("response") if inner is not None else None
        if response is None:
            return None
        response_view = fields(response)
        usage = response_view.get("usage") if response_view is not None else None
        usage_view = fields(usage) if usage is not None else None
        if usage_view is None:
            return None
        tokens_in = _count(usage_view.get("input_tokens"))
        tokens_out = _count(usage_view.get("output_tokens"))
        if tokens_in is None or tokens_out is None:
            return None
        return tokens_in, tokens_out
    except Exception:  # a strange object: no usage read, the handler is unaffected
        return None


__all__ = ["fields", "reward_of", "usage_of"]
