"""One AdmissionReview in, one answer out: decide, mutate, diff into a JSON patch.

Transport-free (bytes in, :class:`Outcome` out) so it is tested without a server. Every
failure -- a body that is not JSON, a review of the wrong shape, a pod the mutation
cannot handle -- still answers ``allowed: true`` without a patch, with the reason logged
and returned as an admission warning: telemetry must never keep a Gym pod from starting.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

import jsonpatch
from gym_telemetry_semconv.ratelimit import rate_limit
from pydantic import ValidationError

from gym_sidecar.webhook.admission import AdmissionReview, response_review
from gym_sidecar.webhook.config import InjectorConfig
from gym_sidecar.webhook.mutate import already_injected, decide, mutate

logger = logging.getLogger(__name__)

OutcomeKind = Literal["injected", "unchanged", "skipped", "failed_open"]
WARNING_PREFIX = "gym-telemetry injector: "


@dataclass(frozen=True)
class Outcome:
    """The answer to send, plus what happened (for logs and counters)."""

    review: AdmissionReview
    kind: OutcomeKind
    reason: str


FAIL_OPEN_LOG_INTERVAL_S = 10.0
"""At most one WARNING per this many seconds (all are counted, in
``gym_injector_reviews_total{outcome="failed_open"}``)."""
#: Fail-open lines repeat per pod while the injector is misconfigured or fed bad reviews:
#: their own logger, so the rate limit spares this module's per-pod lines.
_fail_open_log = rate_limit(logging.getLogger(__name__ + ".fail_open"), FAIL_OPEN_LOG_INTERVAL_S)


def fail_open(uid: str, reason: str) -> Outcome:
    """An allowing answer without a patch, carrying ``reason`` as an admission warning."""
    # Every pod at DEBUG (like "not injecting"), the rate-limited WARNING for operators.
    logger.debug("admitting pod without the sidecar (uid=%s): %s", uid or "?", reason)
    _fail_open_log.warning("admitting pod without the sidecar (uid=%s): %s", uid or "?", reason)
    review = response_review(uid, warnings=[WARNING_PREFIX + "sidecar not injected: " + reason])
    return Outcome(review, "failed_open", reason)


def _uid_of(body: bytes) -> str:
    """Best-effort uid of a review that failed validation, so the answer still matches."""
    try:
        data = json.loads(body)
        uid = data["request"]["uid"]
    except (ValueError, TypeError, KeyError):
        return ""
    return uid if isinstance(uid, str) else ""


def handle_review(body: bytes, config: InjectorConfig, namespace_opted_in: bool) -> Outcome:
    """Answer one AdmissionReview v1 body. Never raises.

    ``namespace_opted_in`` tells which webhook entry called (see :func:`mutate.decide`).
    """
    try:
        review = AdmissionReview.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<body>"
        return fail_open(_uid_of(body), f"malformed AdmissionReview: {where}: {first['msg']}")
    request = review.request
    if request is None:
        return fail_open("", "malformed AdmissionReview: no request")
    uid = request.uid
    pod = request.object
    if request.kind.kind != "Pod" or request.operation != "CREATE" or pod is None:
        return fail_open(
            uid, f"expected a Pod CREATE, got {request.kind.kind or '?'} {request.operation}"
        )
    try:
        decision = decide(pod, namespace_opted_in)
        if not decision.inject:
            logger.debug("not injecting (uid=%s): %s", uid, decision.reason)
            return Outcome(response_review(uid), "skipped", decision.reason)
        was_injected = already_injected(pod, config)
        patch: list[dict[str, Any]] = jsonpatch.make_patch(pod, mutate(pod, config)).patch
    except Exception as exc:  # boundary: any bug or odd pod must still admit the pod
        return fail_open(uid, f"{type(exc).__name__}: {exc}")
    if not patch:
        return Outcome(response_review(uid), "unchanged", "already injected")
    if was_injected:
        return Outcome(response_review(uid, patch), "injected", "completed a prior injection")
    where = f"{request.namespace or '?'}/{request.name or pod_name(pod)}"
    logger.info("injecting the sidecar into pod %s (%s)", where, decision.reason)
    return Outcome(response_review(uid, patch), "injected", decision.reason)


def pod_name(pod: dict[str, Any]) -> str:
    """A pod's name, or its ``generateName`` prefix while it has none yet."""
    metadata = pod.get("metadata") or {}
    return str(metadata.get("name") or (str(metadata.get("generateName", "")) + "*"))
