"""``TraceContextMiddleware``: join the caller's trace without recording a span.

An ASGI middleware that extracts the W3C ``traceparent`` / ``tracestate`` / ``baggage``
headers of an incoming HTTP request with the global propagator and makes that context
current for the request. It records nothing itself, so the endpoint wrappers' spans
(``gym.verify`` and friends) become children of the calling service's span even when the
``server`` span group (the per-request SERVER span) is off. Requests without a
``traceparent`` pass straight through after one header scan.

Never raises its own errors into the request: a malformed header is ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from opentelemetry import context as context_api
from opentelemetry import propagate

_log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_PROPAGATION_HEADERS: Final = frozenset({b"traceparent", b"tracestate", b"baggage"})


class TraceContextMiddleware:
    """Make the incoming W3C trace context current for each HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        carrier: dict[str, str] | None = None
        try:
            for name, value in scope.get("headers") or ():
                if name in _PROPAGATION_HEADERS:
                    if carrier is None:
                        carrier = {}
                    carrier[name.decode("latin-1")] = value.decode("latin-1")
            token = None
            if carrier is not None and "traceparent" in carrier:
                token = context_api.attach(propagate.extract(carrier))
        except Exception as exc:  # a bad header must not fail the request
            _log.debug("gym_telemetry: ignoring unusable trace headers: %r", exc)
            token = None
        if token is None:
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            context_api.detach(token)
