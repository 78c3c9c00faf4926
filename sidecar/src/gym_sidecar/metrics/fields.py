"""What the derive stage asks the receivers' scanner to read, and where each value lands.

The scanner (``gym_sidecar.wire.protobuf.scan``) reports, for the spans of the scopes in
:data:`SCAN_SPEC`, a tuple of values, one per attribute key in :data:`ATTR_KEYS` order,
then the exception event's type. The indexes below name those positions; the derive
loops (``metrics.spans``, ``metrics.rl``) read nothing else.

Scopes read (``core.producers``): the agent's rollout, verify and ``model_call`` scopes,
Gym's one ``nemo.lens.helpers`` scope, and, *sparsely*, the agent's ``http_client`` scope:
of its blocks (every hop between Gym servers) only the spans carrying
``http.request.resend_count`` or ``error.type`` are reported (a retried or failed hop),
and a block with neither costs the Python scanner one byte search per key
(``ScanSpec.sparse_scopes``).
"""

from __future__ import annotations

from typing import Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import gym_dialect

from gym_sidecar.core import producers
from gym_sidecar.core.traces import ScanSpec

ATTR_KEYS: Final[tuple[str, ...]] = (
    semconv.ROLLOUT_NESTED,
    semconv.VERIFY_SUCCEEDED,
    semconv.ERROR_TYPE,
    semconv.REWARD,
    semconv.ROLLOUT_TURNS,
    semconv.ROLLOUT_INPUT_TOKENS,
    semconv.ROLLOUT_OUTPUT_TOKENS,
    semconv.GEN_AI_USAGE_INPUT_TOKENS,
    semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
    semconv.GEN_AI_REQUEST_MODEL,
    semconv.GEN_AI_OPERATION_NAME,
    semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    semconv.HTTP_REQUEST_RESEND_COUNT,
    semconv.TARGET_SERVER_NAME,
)
NESTED: Final = 0
SUCCEEDED: Final = 1
ERROR_TYPE: Final = 2
REWARD: Final = 3
TURNS: Final = 4
ROLLOUT_INPUT_TOKENS: Final = 5
ROLLOUT_OUTPUT_TOKENS: Final = 6
USAGE_INPUT_TOKENS: Final = 7
USAGE_OUTPUT_TOKENS: Final = 8
REQUEST_MODEL: Final = 9
OPERATION_NAME: Final = 10
TIME_TO_FIRST_CHUNK: Final = 11
RESEND_COUNT: Final = 12
TARGET_SERVER: Final = 13
EXCEPTION_TYPE: Final = len(ATTR_KEYS)
"""The exception event's ``exception.type`` (ERROR spans only), after the attributes."""

SCAN_SPEC: Final = ScanSpec(
    derive_scopes=producers.DERIVE_SCOPES,
    attr_keys=ATTR_KEYS,
    event_keys=((gym_dialect.EXCEPTION_EVENT, gym_dialect.EXCEPTION_TYPE),),
    sparse_scopes=producers.HOP_SCOPES,
    sparse_keys=(semconv.HTTP_REQUEST_RESEND_COUNT, semconv.ERROR_TYPE),
)
"""What the derive stage reads of a trace request beyond its index (module doc)."""
