"""The names NeMo Gym's *own* telemetry writes (``nemo_gym.telemetry``, on nemo-lens).

Gym 0.7.0 ships its own instrumentation, built on nemo-lens: once a Lens release with
``SpanRegistry`` is installed and ``NEMO_GYM_OTEL_ENABLED=1`` is set, every Gym server
exports spans and metrics itself, by default to ``localhost:4317`` (the sidecar's port).
Its span names are the ones this project's agent writes too
(``gym_telemetry_semconv.attributes``: ``gym.rollout``, ``gym.verify``,
``gym.agent.responses``, ``gym.model.*``), but its scopes, failure encoding and metrics
differ. The sidecar reads both dialects; this module names the second one. Read from the
0.7.0 wheel and Gym's main branch (facts only; no Gym code).

Not re-exported flat from ``gym_telemetry_semconv``: import the module
(``from gym_telemetry_semconv import gym_dialect``), so that these names never read as
the ones this project's agent writes.
"""

from __future__ import annotations

from typing import Final

# --- instrumentation scopes --------------------------------------------------------------
SCOPE_LENS_HELPERS: Final = "nemo.lens.helpers"
"""Every semantic span Gym opens with Lens's ``managed_span`` (``gym.rollout``,
``gym.verify``, ``gym.agent.responses``, ``gym.model.*``, ``gym.job``, ``gym.sandbox.*``):
one scope for all groups (Lens's ``trace.get_tracer(__name__)``). NeMo-RL and Megatron
spans use the same scope when Gym runs inside them."""
SCOPE_GYM_CLIENT: Final = "nemo.gym"
"""The CLIENT span of each hop between Gym servers (``HTTP POST``,
``nemo_gym.telemetry.spans.client_span``)."""
SCOPE_LENS: Final = "nemo.lens"
"""Lens's own tracer and meter: Gym's in-process metrics (``gym.*``) are under it."""

# --- span names Gym writes and this project's agent does not ----------------------------
SPAN_JOB: Final = "gym.job"
"""The whole rollout-collection run, driver side (group ``job``)."""
SPAN_SANDBOX_PREFIX: Final = "gym.sandbox."
"""``gym.sandbox.start`` / ``.exec`` / ``.stop`` (group ``sandbox``; the agent writes the
same names)."""

# --- the failure encoding ----------------------------------------------------------------
EXCEPTION_EVENT: Final = "exception"
"""OpenTelemetry's exception event: Lens's ``managed_span`` records one (and sets status
ERROR) when the wrapped handler raises; Gym writes no ``succeeded`` and no
``error.type``."""
EXCEPTION_TYPE: Final = "exception.type"
"""The exception event's attribute holding the exception's class name."""

# --- resource attributes -----------------------------------------------------------------
SERVICE_GROUP: Final = "nemo.gym.service_group"
"""``service.name`` without the per-server suffix (``nemo-gym``)."""
GYM_VERSION: Final = "nemo.gym.version"
RUN_ID: Final = "nemo.run.id"
DL_RANK: Final = "nv.dl.rank"
DL_WORLD_SIZE: Final = "nv.dl.world_size"

# --- in-process metrics ------------------------------------------------------------------
METRIC_SCOPE: Final = SCOPE_LENS
"""The scope of Gym's in-process metrics (``SCOPE_LENS``)."""
METRIC_ROLLOUT_DURATION: Final = "gym.rollout.duration_ms"
"""Gym's in-process copy: one point per ``/run`` handler, no attributes."""
METRIC_VERIFY_DURATION: Final = "gym.verify.duration_ms"
"""Gym's in-process copy: no ``succeeded`` attribute."""
METRIC_VERIFY_SUCCESS_RATE: Final = "gym.verify.success_rate"
"""Gym's gauge: the success fraction since the process started (not a window)."""
METRIC_ROLLOUT_COMPLETED: Final = "gym.rollout.completed_total"
"""Gym's main branch: rollouts the collection driver finished, by
``nemo.gym.rollout.outcome``."""
