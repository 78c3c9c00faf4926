"""``make demo --hang``: one rollout whose model call hangs, seen stalled, then lost.

After the demo's rollouts, one more ``/run`` goes to the agent with ``WAIT_FILE:<path>`` in
its user message: the stub model server (``examples/gym_stack``) does not answer the
rollout's first model call until that file exists (at most 10 minutes), so the rollout
hangs at ``POST /v1/responses``; the demo creates the file once it is done, so the model
server stops promptly.
The sidecar runs with a short :data:`STALL_AFTER_S` and :data:`LOST_AFTER_S` and the
agent sends its live events every :data:`LIVE_INTERVAL_S`, so within seconds the rollout
is listed stalled on the web view's ``/live`` page and counted in
``gym_rollout_stalled``; then the agent server is killed (SIGKILL: no stop event, no
last spans) and, once it has been silent for ``lost_after_s``, the rollout is lost.

Everything here reads the sidecar the way an operator would: its admin endpoints
(``/v1/rollouts/live``, ``/metrics``). The real-Gym test ``tests/gym/test_live_rollouts.py``
drives the same functions.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from gym_sidecar.live.client import LiveUnavailable, fetch_live
from gym_sidecar.live.view import LiveView, RolloutView
from rich.console import Console

from gym_telemetry_demo.gym_servers import AGENT, GymServers, post_json, run_body

STALL_AFTER_S: Final = 5.0
LOST_AFTER_S: Final = 10.0
LIVE_INTERVAL_S: Final = 1.0
HANG_S: Final = 86_400
"""How long the stub model sleeps: a day, longer than any demo."""
HANG_MARKER: Final = f"SLEEP:{HANG_S}"
WAIT_S: Final = 120.0
"""Generous bound on each wait (a loaded machine is slow; the sidecar's own thresholds
are what decide)."""

ROLLOUTS_CONFIG: Final[dict[str, Any]] = {
    "stall_after_s": STALL_AFTER_S,
    "lost_after_s": LOST_AFTER_S,
    "check_interval_s": 0.5,
}
"""The sidecar's ``rollouts`` section for the demo with ``--hang``."""
AGENT_ENV: Final[dict[str, str]] = {"GYM_TELEMETRY_LIVE_INTERVAL_S": str(LIVE_INTERVAL_S)}
"""Added to the Gym servers' environment: live events every second."""


def hang_body(task_index: int, marker: str = HANG_MARKER) -> dict[str, Any]:
    """An agent ``/run`` body whose first model call hangs: ``marker`` (default
    :data:`HANG_MARKER`; the stub model also knows ``WAIT_FILE:<path>``, a hang that ends
    when the file exists) in its user message."""
    body = run_body(task_index, 0)
    messages = body["responses_create_params"]["input"]
    messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']} {marker}"}
    return body


def start_hung_rollout(
    agent_url: str, task_index: int, marker: str = HANG_MARKER
) -> threading.Thread:
    """POST the hanging ``/run`` from a daemon thread (it returns when the agent dies, or
    the hang ends)."""

    def run() -> None:
        # OSError: the agent was killed under it, which is what the demo does next
        with contextlib.suppress(OSError):
            post_json(agent_url + "/run", hang_body(task_index, marker), timeout_s=HANG_S)

    thread = threading.Thread(target=run, name="hung-rollout", daemon=True)
    thread.start()
    return thread


def wait_view(
    admin_url: str, predicate: Callable[[LiveView], RolloutView | None], timeout_s: float = WAIT_S
) -> RolloutView | None:
    """Poll the sidecar's live view until ``predicate`` finds a rollout in it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = predicate(fetch_live(admin_url, 100))
        except LiveUnavailable:
            found = None
        if found is not None:
            return found
        time.sleep(0.5)
    return None


def stalled_on(server: str) -> Callable[[LiveView], RolloutView | None]:
    """A stalled rollout of agent server ``server``."""

    def find(view: LiveView) -> RolloutView | None:
        return next((r for r in view.in_flight if r.server == server and r.stalled), None)

    return find


def lost_rollout(trace_id: str) -> Callable[[LiveView], RolloutView | None]:
    """The rollout of trace ``trace_id`` among the lost ones."""

    def find(view: LiveView) -> RolloutView | None:
        return next((r for r in view.lost if r.trace_id == trace_id), None)

    return find


def metric(admin_url: str, name: str, server: str) -> float | None:
    """``name``'s value for agent server ``server`` on the sidecar's ``/metrics`` (None:
    no such series)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("nemo_gym_server_name") == server:
                return float(sample.value)
    return None


def run_hang(
    console: Console, servers: GymServers, admin_url: str, webview_url: str, release: Path
) -> bool:
    """The ``--hang`` step (module docstring; the model call waits for ``release``, which
    this creates before it returns); False when the sidecar did not show the rollout
    stalled, then lost, within :data:`WAIT_S` each."""
    try:
        return _run_hang(console, servers, admin_url, webview_url, f"WAIT_FILE:{release}")
    finally:
        release.parent.mkdir(parents=True, exist_ok=True)
        release.touch()


def _run_hang(
    console: Console, servers: GymServers, admin_url: str, webview_url: str, marker: str
) -> bool:
    console.rule("[bold]--hang: one rollout whose model call hangs")
    started = time.monotonic()
    start_hung_rollout(servers.url(AGENT), int(time.time()) % 100_000 * 1000 + 999, marker)
    stalled = wait_view(admin_url, stalled_on(AGENT))
    if stalled is None:
        console.print(f"[red]no stalled rollout on {AGENT} within {WAIT_S:.0f} s[/red]")
        return False
    name = stalled.rollout_id or stalled.trace_id
    console.print(
        f"rollout {name} stalled after {time.monotonic() - started:.1f} s (stall_after_s="
        f"{STALL_AFTER_S:g}), waiting at {stalled.step} → {stalled.step_target}",
        markup=False,
        highlight=False,
    )
    console.print(f"  {webview_url}/live", soft_wrap=True, highlight=False)
    value = metric(admin_url, "gym_rollout_stalled", AGENT)
    console.print(
        f"  gym_rollout_stalled{{nemo_gym_server_name={AGENT!r}}} = {value}", markup=False
    )
    process = servers.processes[AGENT].proc
    assert process is not None
    process.kill()  # SIGKILL: no stop event, no last spans; only silence tells
    process.wait()
    console.print(f"killed {AGENT} (SIGKILL); lost after {LOST_AFTER_S:g} s of silence...")
    lost = wait_view(admin_url, lost_rollout(stalled.trace_id))
    if lost is None:
        console.print(f"[red]rollout {name} not declared lost within {WAIT_S:.0f} s[/red]")
        return False
    value = metric(admin_url, "gym_rollout_lost_total", AGENT)
    console.print(
        f"rollout {name} lost ({lost.lost_reason}); gym_rollout_lost_total"
        f"{{nemo_gym_server_name={AGENT!r}}} = {value}",
        markup=False,
        highlight=False,
    )
    return True
