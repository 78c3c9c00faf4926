"""``GET /v1/rollouts/live`` on the admin listener: the tracker's state as the live view
(:mod:`.view`), in JSON.

Query: ``limit`` (1 to 10000, default 500): most in-flight rollouts, lost rollouts and
instances listed (the totals count all). A bad ``limit`` is a 400 with a JSON error. A
sidecar whose tracker is off answers ``{"enabled": false, ...}``. Runs on the event loop
(the tracker is loop-confined); building the view is a walk over the tracked rollouts.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from gym_sidecar.live.instance import Rollout
from gym_sidecar.live.tracker import LiveTracker, LostRollout
from gym_sidecar.live.view import (
    DEFAULT_LIMIT,
    LIVE_PATH,
    MAX_LIMIT,
    InstanceView,
    LiveView,
    RolloutView,
    ServerView,
    disabled_view,
)


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


def _rollout_view(r: Rollout) -> RolloutView:
    return RolloutView(
        rollout_id=r.rollout_id,
        trace_id=r.key[0].hex(),
        span_id=r.key[1].hex(),
        server=r.server,
        instance=r.instance_key[1],
        started_unix_nano=r.started_ns,
        start_seen=r.start_seen,
        last_activity_unix_nano=r.last_activity_ns,
        step=r.step,
        step_target=r.target,
        turns=r.turns,
        stalled=r.stalled,
    )


def _lost_view(lost: LostRollout) -> RolloutView:
    base = _rollout_view(lost.rollout)
    return RolloutView(
        **{
            **asdict(base),
            "stalled": False,
            "lost_unix_nano": lost.lost_ns,
            "lost_reason": lost.reason,
            "ended_after_lost": lost.ended_after,
        }
    )


def build_view(tracker: LiveTracker, limit: int = DEFAULT_LIMIT) -> LiveView:
    """The tracker's state now (``limit`` rollouts and instances at most)."""
    now_ns, now_mono = tracker.clock.wall_ns(), tracker.clock.mono_ns()
    rollouts = [_rollout_view(r) for r in tracker.rollouts.values()]
    rollouts.sort(key=lambda v: (not v.stalled, v.started_unix_nano))
    servers: dict[str, list[int]] = {}
    instances = []
    for inst in tracker.instances.values():
        name = inst.sender.server
        row = servers.setdefault(name, [0, 0, 0])
        row[0] += len(inst.rollouts)
        row[1] += sum(r.stalled for r in inst.rollouts.values())
        row[2] += 1
        state = "alive"
        if inst.stopped_mono is not None:
            state = "stopping"
        elif inst.superseded_mono is not None:
            state = "superseded"
        instances.append(
            InstanceView(
                server=name,
                instance=inst.key[1],
                last_seen_s_ago=max(0.0, (now_mono - inst.last_seen_mono) / 1e9),
                interval_s=inst.interval_s,
                reported_in_flight=inst.reported_in_flight,
                tracked=len(inst.rollouts),
                state=state,
            )
        )
    for name in tracker.lost_by_server:
        servers.setdefault(name, [0, 0, 0])
    cfg = tracker.cfg
    return LiveView(
        enabled=True,
        now_unix_nano=now_ns,
        stall_after_s=cfg.stall_after_s,
        lost_after_s=cfg.lost_after_s,
        in_flight_total=len(rollouts),
        stalled_total=sum(v.stalled for v in rollouts),
        in_flight=rollouts[:limit],
        lost=[_lost_view(lost) for lost in reversed(tracker.lost)][:limit],
        servers=[
            ServerView(name, n, s, tracker.lost_by_server.get(name, 0), i)
            for name, (n, s, i) in sorted(servers.items())
        ],
        instances=sorted(instances, key=lambda i: (i.server, i.instance))[:limit],
    )
