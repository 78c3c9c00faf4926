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
    semconv.VERIFY_SUCCEEDED,
    semconv.REWARD,
    semconv.GEN_AI_OPERATION_NAME,
    semconv.ROLLOUT_TURNS,
    semconv.GEN_AI_USAGE_INPUT_TOKENS,
    semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
    semconv.GEN_AI_REQUEST_MODEL,
    semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    semconv.ROLLOUT_INPUT_TOKENS,
    semconv.ROLLOUT_OUTPUT_TOKENS,
    semconv.ERROR_TYPE,
    semconv.ROLLOUT_NESTED,
    semconv.HTTP_REQUEST_RESEND_COUNT,
    semconv.TARGET_SERVER_NAME,
)
"""In the order the pure-Python scanner searches a block's bytes for them (it reads a
block's attributes once one occurs): the keys every verification, rollout and model call
of the agent carries come first, so a block of them is decided by the first search."""
SUCCEEDED: Final = 0
REWARD: Final = 1
OPERATION_NAME: Final = 2
TURNS: Final = 3
USAGE_INPUT_TOKENS: Final = 4
USAGE_OUTPUT_TOKENS: Final = 5
REQUEST_MODEL: Final = 6
TIME_TO_FIRST_CHUNK: Final = 7
ROLLOUT_INPUT_TOKENS: Final = 8
ROLLOUT_OUTPUT_TOKENS: Final = 9
ERROR_TYPE: Final = 10
NESTED: Final = 11
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
