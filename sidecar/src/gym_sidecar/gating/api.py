"""``/v1/span-groups``: the span-group API on the admin listener.

Transport-free handlers (:func:`get_span_groups`, :func:`put_span_groups`) take the
parts of a request they need and return an :class:`ApiResponse`; the admin server
adapts them to its HTTP framework. JSON shapes are documented in docs/span-groups.md.

- ``GET /v1/span-groups?service=NAME``: the effective modes for NAME, with an ``ETag``;
  ``If-None-Match`` with the current ETag answers 304 without a body.
- ``PUT /v1/span-groups`` (``Authorization: Bearer <token>``): body
  ``{"spec": ..., "modes": {...}, "services": {...}}`` replaces the policy;
  ``PUT /v1/span-groups?service=NAME`` with ``{"spec": ..., "modes": {...}}`` sets that
  service's override, and ``null`` removes it. 401 without or with a wrong token, 403
  when no token is configured, 400 for a bad body (naming the offending key and value).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

import gym_telemetry_semconv as semconv
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router

from gym_sidecar.configmodel import ValidationError
from gym_sidecar.gating.config import ServiceOverride, SpanGroupsPolicyConfig
from gym_sidecar.gating.policy import Policy
from gym_sidecar.gating.state import SpanGroupState

PATH: Final = semconv.SPAN_GROUPS_PATH
#: Largest PUT body accepted; larger bodies are refused with 413.
MAX_BODY_BYTES: Final = 256 * 1024
_JSON: Final = "application/json"


@dataclass(slots=True)
class ApiResponse:
    """What to answer: status, headers and an optional JSON body."""

    status: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body_bytes(self) -> bytes:
        return b"" if self.body is None else json.dumps(self.body, indent=None).encode()


def _error(status: int, message: str, **extra: Any) -> ApiResponse:
    headers = {"Content-Type": _JSON}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="gym-sidecar"'
    return ApiResponse(status, {"error": message, **extra}, headers)


def _document(policy: Policy, service: str | None, every_service: bool = False) -> ApiResponse:
    groups = policy.for_service(service)
    body = groups.to_json()
    body["generation"] = policy.generation
    if every_service:
        # A PUT answer warns about every service the new policy affects, not just one.
        warnings = list(groups.warnings)
        for name in sorted(policy.config.services):
            if name != service:
                warnings += [f"service {name!r}: {w}" for w in policy.for_service(name).warnings]
        body["warnings"] = warnings
    headers = {"Content-Type": _JSON, "ETag": groups.etag, "Cache-Control": "no-cache"}
    return ApiResponse(200, body, headers)


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    candidates = [c.strip().removeprefix("W/") for c in if_none_match.split(",")]
    return "*" in candidates or etag in candidates


def get_span_groups(
    state: SpanGroupState, service: str | None, if_none_match: str | None
) -> ApiResponse:
    """Answer ``GET /v1/span-groups?service=NAME``."""
    groups = state.policy.for_service(service or None)
    if _etag_matches(if_none_match, groups.etag):
        return ApiResponse(304, None, {"ETag": groups.etag, "Cache-Control": "no-cache"})
    return _document(state.policy, service or None)


def _validation_errors(exc: ValidationError, prefix: str) -> list[str]:
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "") or "<body>"
        out.append(f"{path}: {err['msg']}")
    return out


def put_span_groups(
    state: SpanGroupState, service: str | None, authorization: str | None, body: bytes
) -> ApiResponse:
    """Answer ``PUT /v1/span-groups[?service=NAME]`` (see module docstring)."""
    auth = state.check_token(authorization)
    if auth == "disabled":
        return _error(403, "PUT is disabled: no span_groups.token is configured")
    if auth != "ok":
        return _error(401, "missing or invalid bearer token")
    if len(body) > MAX_BODY_BYTES:
        state.record_invalid("api")
        return _error(413, f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        state.record_invalid("api")
        return _error(400, f"body is not valid JSON: {exc}")
    try:
        if service:
            override = None if data is None else ServiceOverride.model_validate(data)
            policy = state.set_service(service, override)
        else:
            policy = state.replace_policy(SpanGroupsPolicyConfig.model_validate(data))
    except ValidationError as exc:
        state.record_invalid("api")
        errors = _validation_errors(exc, f"services.{service}" if service else "")
        return _error(400, "; ".join(errors), errors=errors)
    return _document(policy, service or None, every_service=True)


def build_router(state: SpanGroupState) -> Router:
    """The admin listener's ``/v1/span-groups`` routes (a Starlette router), bound to ``state``."""

    def respond(answer: ApiResponse) -> Response:
        return Response(
            content=answer.body_bytes(),
            status_code=answer.status,
            headers=answer.headers,
            media_type=_JSON if answer.body is not None else None,
        )

    async def get_groups(request: Request) -> Response:
        return respond(
            get_span_groups(
                state, request.query_params.get("service"), request.headers.get("if-none-match")
            )
        )

    async def put_groups(request: Request) -> Response:
        # Read at most one byte past the limit: a huge body costs nothing beyond it.
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                break
        return respond(
            put_span_groups(
                state,
                request.query_params.get("service"),
                request.headers.get("authorization"),
                body,
            )
        )

    return Router(
        routes=[
            Route(PATH, get_groups, methods=["GET"]),
            Route(PATH, put_groups, methods=["PUT"]),
        ]
    )
