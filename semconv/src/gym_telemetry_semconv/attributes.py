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
KEEP_TRACE: Final = "nemo.gym.trace.keep"
"""Boolean, on any span of a trace: ``true`` asks the gateway tier's tail sampling to keep
the whole trace whatever the other policies say (``deploy/gateway/tier2.yaml``, policy
``keep-mark``). Set it from a handler with
``opentelemetry.trace.get_current_span().set_attribute(KEEP_TRACE, True)``."""
ROLLOUT_OUTER_BAGGAGE: Final = "nemo.gym.rollout.outer"
"""W3C baggage key (not a span attribute): ``1`` on a hop made inside a recorded
``gym.rollout`` span, so the ``/run`` it reaches marks itself nested."""
FAILURE_STAGE: Final = "nemo.gym.failure.stage"
"""The stage of an episode failure Gym reported in-band (``seed``, ``agent``, ...)."""

# --- the RL view (issue 41) ---------------------------------------------------------------
REWARD: Final = "nemo.gym.reward"
"""Double, on ``gym.verify`` (the returned verify response's ``reward``), ``gym.env.step``
(the step's reward) and ``gym.rollout`` (the ``/run`` answer's reward): absent when the
handler raised or returned no numeric reward. Independent of ``succeeded``."""
ROLLOUT_TURNS: Final = "nemo.gym.rollout.turns"
"""Int, on ``gym.rollout`` (and on the live ``gym.rollout.step`` event): the model calls the
rollout made, counted by the agent process on its outbound hops to a model-server route
(:data:`MODEL_ROUTES`)."""
ROLLOUT_INPUT_TOKENS: Final = "nemo.gym.rollout.input_tokens"
"""Int, on ``gym.rollout``: input tokens of the whole rollout (the usage Gym summed into the
``/run`` answer). Not ``gen_ai.usage.*``: a generic GenAI consumer would count those twice."""
ROLLOUT_OUTPUT_TOKENS: Final = "nemo.gym.rollout.output_tokens"
"""Int, on ``gym.rollout``: output tokens of the whole rollout (as ``ROLLOUT_INPUT_TOKENS``)."""
TARGET_SERVER_NAME: Final = "nemo.gym.target.server.name"
"""On a CLIENT hop span: the Gym server the hop is addressed to (the configured server name
Gym's ``ServerClient`` resolved; absent for a hop to no configured server)."""

MODEL_ROUTES: Final[tuple[str, ...]] = ("/v1/responses", "/v1/chat/completions", "/v1/messages")
"""A model server's routes, one per dialect (Responses, Chat Completions, Messages); a hop
to one of them is a model call (a turn)."""

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

# OpenTelemetry GenAI conventions (development status), on ``model_call`` spans.
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_OPERATION_CHAT: Final = "chat"
"""``gen_ai.operation.name`` of all three model dialects: OpenTelemetry's value for chat
completions, and the applicable predefined value for the Responses API (its OpenAI
conventions name no other; ``openai.api.type`` tells the two apart) and for Anthropic's
Messages API."""
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
"""String array: one reason per generation received (``stop``, ``length``, ``tool_calls``...)."""
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
"""Double, seconds, on a streamed model call: from the call's start to its first chunk."""
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
"""Metric attribute of ``gen_ai.client.token.usage``: ``input`` or ``output``."""
GEN_AI_TOKEN_TYPE_INPUT: Final = "input"
GEN_AI_TOKEN_TYPE_OUTPUT: Final = "output"
OPENAI_API_TYPE: Final = "openai.api.type"
"""On OpenAI-dialect model spans: ``responses`` or ``chat_completions``."""
OPENAI_API_TYPE_RESPONSES: Final = "responses"
OPENAI_API_TYPE_CHAT_COMPLETIONS: Final = "chat_completions"

# OpenTelemetry HTTP conventions, on CLIENT hop spans.
HTTP_REQUEST_RESEND_COUNT: Final = "http.request.resend_count"
"""Int: how many times the hop's request was sent again (Gym's retries), when it was."""
ERROR_TYPE_TIMEOUT: Final = "timeout"
"""``error.type`` of a hop (or call) that ended because a timeout expired (OpenTelemetry's
component-specific low-cardinality identifier for it)."""
