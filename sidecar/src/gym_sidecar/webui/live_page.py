"""The ``/live`` page: the rollouts in flight now, stalled ones first and highlighted, the
lost ones recently, per server and per instance.

The data is the sidecar's live view (``GET /v1/rollouts/live`` on its admin listener,
read by :mod:`.app` with :func:`gym_sidecar.live.client.fetch_live`): the live state is
the running sidecar's memory, not the store's history, so the web view asks the sidecar
for it (docs/local-store.md, "The live page"). Every string in it (rollout ids, server,
instance and step names) came from span data and is escaped (:func:`~.html.e`,
:func:`~.html.clip`). The page's region refreshes in place every :data:`REFRESH_S`
seconds (``static/ui.js``, backing off while the view or the sidecar does not answer);
without JavaScript it reloads itself at that interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gym_sidecar.live.view import InstanceView, LiveView, RolloutView, ServerView
from gym_sidecar.webui.html import clip, e, page, seg, table

REFRESH_S: Final = 3
ACTIVE: Final = "/live"


def ago(seconds: float) -> str:
    """``42 s``, ``3 m 05 s``, ``2 h 07 m`` (``-`` for a negative duration)."""
    if seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


def _id_cell(r: RolloutView) -> str:
    label = r.rollout_id if r.rollout_id else r.trace_id[:16]
    return f'<a href="/trace/{e(seg(r.trace_id))}">{clip(label, 80)}</a>'


def _step(r: RolloutView) -> str:
    if r.step is None:
        return '<span class="hint">starting</span>'
    target = f" → {clip(r.step_target, 60)}" if r.step_target else ""
    return f"{clip(r.step, 80)}{target}"


def _in_flight_row(r: RolloutView, now_ns: int) -> str:
    state = "stalled" if r.stalled else "running"
    badge = '<span class="badge stalled">stalled</span>' if r.stalled else "running"
    age = ago((now_ns - r.started_unix_nano) / 1e9)
    if not r.start_seen:
        age = "≥ " + age
    turns = "-" if r.turns is None else str(r.turns)
    return (
        f'<tr class="{state}" data-testid="live-row" data-rollout="{e(r.rollout_id or "")}" '
        f'data-trace="{e(r.trace_id)}" data-state="{state}">'
        f"<td>{_id_cell(r)}</td><td>{clip(r.server)}</td><td>{badge}</td>"
        f'<td class="num">{e(age)}</td><td>{_step(r)}</td>'
        f'<td class="num">{e(ago((now_ns - r.last_activity_unix_nano) / 1e9))} ago</td>'
        f'<td class="num">{e(turns)}</td></tr>'
    )


def _lost_row(r: RolloutView, now_ns: int) -> str:
    lost_ns = r.lost_unix_nano or now_ns
    note = ' <span class="hint">(its span arrived later)</span>' if r.ended_after_lost else ""
    return (
        f'<tr class="lost" data-testid="lost-row" data-rollout="{e(r.rollout_id or "")}" '
        f'data-reason="{e(r.lost_reason or "")}">'
        f"<td>{_id_cell(r)}</td><td>{clip(r.server)}</td><td>{clip(r.instance, 40)}</td>"
        f"<td>{e(r.lost_reason or '')}{note}</td>"
        f'<td class="num">{e(ago((now_ns - lost_ns) / 1e9))} ago</td>'
        f'<td class="num">{e(ago((lost_ns - r.started_unix_nano) / 1e9))}</td>'
        f"<td>{_step(r)}</td></tr>"
    )


def _server_row(s: ServerView) -> str:
    return (
        f'<tr data-testid="live-server" data-server="{e(s.server)}" data-in-flight="{s.in_flight}" '
        f'data-stalled="{s.stalled}" data-lost="{s.lost}"><td>{clip(s.server)}</td>'
        f'<td class="num">{s.in_flight}</td><td class="num">{s.stalled}</td>'
        f'<td class="num">{s.lost}</td><td class="num">{s.instances}</td></tr>'
    )


def _instance_row(i: InstanceView) -> str:
    reported = "-" if i.reported_in_flight is None else str(i.reported_in_flight)
    return (
        f'<tr data-testid="live-instance"><td>{clip(i.server)}</td><td>{clip(i.instance, 40)}</td>'
        f'<td>{e(i.state)}</td><td class="num">{e(ago(i.last_seen_s_ago))} ago</td>'
        f'<td class="num">{i.interval_s:g} s</td><td class="num">{e(reported)}</td>'
        f'<td class="num">{i.tracked}</td></tr>'
    )


def _region(view: LiveView) -> list[str]:
    now = view.now_unix_nano
    shown = len(view.in_flight)
    more = (
        f" (the {shown} listed first; stalled first, then the oldest)"
        if shown < view.in_flight_total
        else ""
    )
    out = [
        f'<p data-testid="live-summary" data-in-flight="{view.in_flight_total}" '
        f'data-stalled="{view.stalled_total}">{view.in_flight_total} rollouts in flight, '
        f"{view.stalled_total} stalled (no new step for {view.stall_after_s:g} s or more){more}. "
        f"A server silent for {view.lost_after_s:g} s, stopped or restarted loses its rollouts."
        "</p>",
        "<h2>In flight</h2>",
    ]
    if view.in_flight:
        out.append(
            table(
                [
                    "rollout",
                    "agent server",
                    "state",
                    "age",
                    "step → target",
                    "last activity",
                    "turns",
                ],
                (_in_flight_row(r, now) for r in view.in_flight),
                "live",
            )
        )
    else:
        out.append('<p class="empty" data-testid="no-live">No rollout in flight.</p>')
    out.append("<h2>Lost recently</h2>")
    if view.lost:
        out.append(
            table(
                ["rollout", "agent server", "instance", "why", "lost", "age then", "last step"],
                (_lost_row(r, now) for r in view.lost),
                "lost",
            )
        )
    else:
        out.append('<p class="empty" data-testid="no-lost">None.</p>')
    out.append("<h2>Servers</h2>")
    out.append(
        table(
            ["server", "in flight", "stalled", "lost", "instances"],
            (_server_row(s) for s in view.servers),
            "servers",
        )
    )
    out.append(
        "<details><summary>Instances (processes sending live events)</summary>"
        + table(
            [
                "server",
                "instance",
                "state",
                "last heard",
                "interval",
                "reported in flight",
                "tracked",
            ],
            (_instance_row(i) for i in view.instances),
            "instances",
        )
        + "</details>"
    )
    return out


def live_page(view: LiveView | None, error: str, admin_url: str) -> str:
    """The whole page: ``view`` as read from the sidecar at ``admin_url``, or ``error``
    (why it could not be read, or that its tracker is off)."""
    body = [
        '<p class="hint">Live state of the sidecar at '
        f'<span data-testid="live-source">{e(admin_url)}</span> (refreshed every '
        f"{REFRESH_S} s); finished rollouts are under Rollouts.</p>"
    ]
    region: Sequence[str]
    if error:
        region = [f'<p class="message error" data-testid="live-error">{e(error)}</p>']
    elif view is None or not view.enabled:
        region = [
            '<p class="message" data-testid="live-error">The sidecar tracks no rollouts '
            "(rollouts.enabled or metrics.enabled is off).</p>"
        ]
    else:
        region = _region(view)
    body.append(
        f'<div id="live-region" data-testid="live" data-refresh="{REFRESH_S}">'
        + "".join(region)
        + "</div>"
    )
    return page("Rollouts live", "".join(body), active=ACTIVE, refresh_s=REFRESH_S)
