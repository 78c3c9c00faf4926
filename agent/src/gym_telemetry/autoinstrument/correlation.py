"""The rollout id telemetry sees when Gym itself does not know it.

Gym sets its rollout ContextVar only when rollout capture is on
(``observability_enabled``); otherwise ``current_rollout_id()`` is None in all three
processes. Writing an id into Gym's ContextVar ourselves would change what Gym does
(some agents prefix model URLs or key sessions by it), so telemetry keeps its own
ContextVar instead:

- ``telemetry_rollout_context(id)`` sets it (the SERVER layer, from the hop's baggage
  or a ``/ng-rollout/<id>/`` path; the rollout wrapper, from the ``/run`` body with
  Gym's own rule ``maybe_rollout_id_from_run_body``);
- ``bind()`` makes ``gym_telemetry.rollout_correlation.current_rollout_id()`` -- what the
  endpoint wrappers, the hop spans and the baggage injection read -- return Gym's id
  when Gym has one, else this one.

Gym's own ContextVar and behaviour are left exactly as they were.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

from gym_telemetry import rollout_correlation

_log = logging.getLogger(__name__)

#: Telemetry's own rollout id; never read by Gym.
TELEMETRY_ROLLOUT_ID: Final[ContextVar[str | None]] = ContextVar(
    "gym_telemetry_autoinstrument_rollout_id", default=None
)


class _Bound:
    __slots__ = ("done", "lock")

    def __init__(self) -> None:
        self.done = False
        self.lock = threading.Lock()


_BOUND: Final = _Bound()


@contextmanager
def telemetry_rollout_context(rollout_id: str) -> Iterator[None]:
    """Set telemetry's rollout id for the enclosed code, then restore it."""
    token = TELEMETRY_ROLLOUT_ID.set(rollout_id)
    try:
        yield
    finally:
        TELEMETRY_ROLLOUT_ID.reset(token)


def _combined(gym_get: Callable[[], str | None]) -> Callable[[], str | None]:
    own_get = TELEMETRY_ROLLOUT_ID.get

    def current() -> str | None:
        return gym_get() or own_get()

    return current


def bind() -> None:
    """Route ``rollout_correlation.current_rollout_id`` through Gym's id, then ours.

    Idempotent; call once Gym is importable (at server start). Never raises.
    """
    with _BOUND.lock:
        if _BOUND.done:
            return
        try:
            rollout_correlation.resolve()
            gym_get = rollout_correlation.getter()
            # The agent's correlation module keeps its resolved getter in ``_STATE.get``;
            # the combined getter takes its place so every reader sees the fallback.
            rollout_correlation._STATE.get = _combined(gym_get)
            _BOUND.done = True
        except Exception:  # boundary: without it spans just lack the fallback id
            _log.warning("gym_telemetry: could not bind the rollout-id fallback", exc_info=True)
