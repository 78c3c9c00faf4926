"""Attribute keys and span names that the agent writes and the sidecar reads.

Each string is written here once; the agent's wrappers and server-span middleware set
them, the sidecar's derive stage, local store and ``inspect`` views read them.
"""

from __future__ import annotations

from typing import Final

# --- span names ------------------------------------------------------------------------
SPAN_ROLLOUT: Final = "gym.rollout"
SPAN_VERIFY: Final = "gym.verify"
SPAN_ENV_STEP: Final = "gym.env.step"
"""One gymnasium ``/step`` (the reward-producing call of a gymnasium resources server)."""
SPAN_AGENT_RESPONSES: Final = "gym.agent.responses"
"""An agent server's ``/v1/responses`` (group ``agent``)."""
SPAN_MODEL_RESPONSES: Final = "gym.model.responses"
"""A model server's ``/v1/responses`` (group ``model_call``)."""
SPAN_MODEL_CHAT: Final = "gym.model.chat_completions"
"""A model server's ``/v1/chat/completions`` (group ``model_call``)."""
SPAN_MODEL_MESSAGES: Final = "gym.model.messages"
"""A model server's ``/v1/messages`` (group ``model_call``)."""

# --- NeMo Gym attributes ---------------------------------------------------------------
ROLLOUT_ID: Final = "nemo.gym.rollout.id"
SERVER_NAME: Final = "nemo.gym.server.name"
SERVER_TYPE: Final = "nemo.gym.server.type"
VERIFY_SUCCEEDED: Final = "succeeded"
"""Boolean on a ``gym.verify`` span: whether the verification passed."""
ROLLOUT_NESTED: Final = "nemo.gym.rollout.nested"
"""``true`` on a ``gym.rollout`` span started inside another rollout (a relayed ``/run``);
derived rollout metrics count only the outermost span."""
ROLLOUT_OUTER_BAGGAGE: Final = "nemo.gym.rollout.outer"
"""W3C baggage key (not a span attribute): ``1`` on a hop made inside a recorded
``gym.rollout`` span, so the ``/run`` it reaches marks itself nested."""
FAILURE_STAGE: Final = "nemo.gym.failure.stage"
"""The stage of an episode failure Gym reported in-band (``seed``, ``agent``, ...)."""

SERVER_TYPES: Final[tuple[str, ...]] = ("resources", "agent", "model", "environment")
"""The values ``SERVER_TYPE`` takes (NeMo Gym's server kinds)."""

# --- OpenTelemetry semantic-convention keys used here -----------------------------------
SERVICE_NAME: Final = "service.name"
ERROR_TYPE: Final = "error.type"
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_ROUTE: Final = "http.route"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
URL_PATH: Final = "url.path"
URL_FULL: Final = "url.full"
URL_TEMPLATE: Final = "url.template"
"""On a CLIENT span: the low-cardinality route template its name ends with."""
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
