"""The rollout id telemetry sees when Gym itself does not know it.

Gym sets its rollout ContextVar only when rollout capture is on
(``observability_enabled``); otherwise ``current_rollout_id()`` is None in all three
processes. Writing an id into Gym's ContextVar ourselves would change what Gym does
(some agents prefix model URLs or key sessions by it), so telemetry keeps the id in
gym_telemetry's own ContextVar (``rollout_correlation.ROLLOUT_ID_VAR``) instead:

- ``rollout_correlation.own_rollout_context(id)`` sets it (the SERVER layer, from the hop's baggage
  or a ``/ng-rollout/<id>/`` path; the rollout wrapper, from the ``/run`` body with
  Gym's own rule ``maybe_rollout_id_from_run_body``);
- ``bind()`` registers it as ``rollout_correlation``'s fallback, so
  ``current_rollout_id()`` -- what the endpoint wrappers, the hop spans and the baggage
  injection read -- returns Gym's id when Gym has one, else this one.

Gym's own ContextVar and behaviour are left exactly as they were.
"""

from __future__ import annotations

import logging

from gym_telemetry import rollout_correlation

_log = logging.getLogger(__name__)


def bind() -> None:
    """Make ``rollout_correlation.current_rollout_id`` fall back to telemetry's id when
    Gym's is unset. Idempotent; call once Gym is importable (at server start), so the
    primary source is resolved to Gym's. Never raises."""
    try:
        rollout_correlation.set_fallback(rollout_correlation.ROLLOUT_ID_VAR.get)
    except Exception:  # boundary: without it spans just lack the fallback id
        _log.warning("gym_telemetry: could not bind the rollout-id fallback", exc_info=True)
