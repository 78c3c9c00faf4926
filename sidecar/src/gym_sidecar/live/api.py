"""``GET /v1/rollouts/live`` on the admin listener: the live view as JSON (:mod:`.view`).

Query: ``limit`` (1 to 10000, default 500): most in-flight rollouts, lost rollouts and
instances listed (the totals count all). A bad ``limit`` is a 400 with a JSON error. A
sidecar whose tracker is off answers ``{"enabled": false, ...}``. Runs on the event loop
(the tracker is loop-confined); building the view is a walk over the tracked rollouts.
"""

from __future__ import annotations

import time
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from gym_sidecar.live.tracker import LiveTracker
from gym_sidecar.live.view import DEFAULT_LIMIT, MAX_LIMIT, build_view, disabled_view

LIVE_PATH: Final = "/v1/rollouts/live"


def live_router(tracker: LiveTracker | None) -> Router:
    """The admin route serving ``tracker``'s view (or the disabled answer)."""

    async def rollouts_live(request: Request) -> Response:
        raw = request.query_params.get("limit", "")
        limit = DEFAULT_LIMIT
        if raw:
            try:
                limit = int(raw)
            except ValueError:
                limit = 0
            if not 1 <= limit <= MAX_LIMIT:
                return JSONResponse(
                    {"error": f"limit must be an integer from 1 to {MAX_LIMIT}"}, status_code=400
                )
        view = disabled_view(time.time_ns()) if tracker is None else build_view(tracker, limit)
        return JSONResponse(view.to_json())

    return Router(routes=[Route(LIVE_PATH, rollouts_live, methods=["GET"])])
