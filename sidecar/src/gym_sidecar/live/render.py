"""The live view as ``rich`` tables (``gym-sidecar live``): pure functions, no I/O.

Every string from the view (rollout ids, server, instance and step names: span data)
goes through :func:`gym_sidecar.inspect.render.untrusted` (never markup, controls escaped,
clipped), as in the other terminal views.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gym_sidecar.inspect.render import make_console, untrusted
from gym_sidecar.live.view import LiveView, RolloutView

__all__ = ["live_tables", "make_console"]


def _ago(seconds: float) -> str:
    if seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _id(r: RolloutView) -> Text:
    return untrusted(r.rollout_id if r.rollout_id else r.trace_id[:16], 40)


def _step(r: RolloutView) -> Text:
    if r.step is None:
        return Text("starting", style="dim")
    text = untrusted(r.step, 40)
    if r.step_target:
        text.append(" → ")
        text.append_text(untrusted(r.step_target, 30))
    return text


def live_tables(view: LiveView, source: str) -> Group:
    """In flight (stalled first, highlighted), lost recently, per server."""
    now = view.now_unix_nano
    if not view.enabled:
        return Group(Text(f"{source}: the sidecar tracks no rollouts (rollouts.enabled is off)"))
    title = (
        f"{view.in_flight_total} rollouts in flight, {view.stalled_total} stalled "
        f"(no new step for {view.stall_after_s:g}s) — {source}"
    )
    flight = Table(title=Text(title), title_justify="left")
    for name, justify in (
        ("rollout", "left"),
        ("agent server", "left"),
        ("state", "left"),
        ("age", "right"),
        ("step → target", "left"),
        ("idle", "right"),
        ("turns", "right"),
    ):
        flight.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in view.in_flight:
        age = _ago((now - r.started_unix_nano) / 1e9)
        flight.add_row(
            _id(r),
            untrusted(r.server, 40),
            Text("STALLED", style="bold yellow") if r.stalled else Text("running"),
            age if r.start_seen else "≥" + age,
            _step(r),
            _ago((now - r.last_activity_unix_nano) / 1e9),
            "-" if r.turns is None else str(r.turns),
            style="on dark_orange3" if r.stalled else None,
        )
    lost = Table(title=Text("Lost recently"), title_justify="left")
    for name in ("rollout", "agent server", "why", "lost", "last step"):
        lost.add_column(name)
    for r in view.lost:
        lost_ns = r.lost_unix_nano or now
        why = r.lost_reason or ""
        if r.ended_after_lost:
            why += " (span came later)"
        lost.add_row(
            _id(r), untrusted(r.server, 40), why, _ago((now - lost_ns) / 1e9) + " ago", _step(r)
        )
    servers = Table(title=Text("Servers"), title_justify="left")
    for name in ("server", "in flight", "stalled", "lost", "instances"):
        servers.add_column(name, justify="left" if name == "server" else "right")
    for s in view.servers:
        servers.add_row(
            untrusted(s.server, 40), str(s.in_flight), str(s.stalled), str(s.lost), str(s.instances)
        )
    return Group(flight, lost, servers)
