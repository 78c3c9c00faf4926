"""The ``/live`` page in a real browser (Debian's Chromium driven by Playwright), reading a
real ``gym-sidecar run`` through a ``gym-sidecar ui`` process: it lists what is in flight,
marks a rollout that stalls and refreshes in place (no reload) as rollouts start, stall,
end and are lost; hostile span data runs no script; when the sidecar goes away the page
says so in place. Assertions are on the DOM."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry_demo.sidecar import SidecarProcess
from gym_telemetry_demo.webview import WebViewChild
from playwright.sync_api import Browser, Page, sync_playwright

from testkit.live_events import heartbeat, ids, logs_request, resource, start, step
from testkit.otlp_samples import http_post
from tests.sidecar.metrics.traces import ROLLOUT_SCOPE, SpanSpec, request
from tests.sidecar.webui.test_hostile_and_bounded import HOSTILE
from tests.support.browser import launch

pytestmark = pytest.mark.timeout(600)
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[tuple[Page, list[str]]]:
    context = browser.new_context()
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    dialogs: list[str] = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        yield pg, dialogs
    finally:
        context.close()


def send(sc: SidecarProcess, events: list[object], **res: str) -> None:
    body = logs_request(resource(**res), events).SerializeToString()  # type: ignore[arg-type]
    assert http_post(sc.http_url, "logs", body).status_code == 200


def end(sc: SidecarProcess, n: int) -> None:
    trace_id, span_id = ids(n)
    span = SpanSpec(semconv.SPAN_ROLLOUT, 10.0, start_ns=time.time_ns())
    span.trace_id, span.span_id = trace_id, span_id
    res = {"service.name": "nemo-gym/agent_a", semconv.SERVER_NAME: "agent_a"}
    body = request({ROLLOUT_SCOPE: [span]}, res).SerializeToString()
    assert http_post(sc.http_url, "traces", body).status_code == 200


def rows(pg: Page) -> list[tuple[str, str]]:
    found = pg.eval_on_selector_all(
        "[data-testid=live-row]", "els => els.map(e => [e.dataset.rollout, e.dataset.state])"
    )
    return [(rollout, state) for rollout, state in found]


def test_the_live_page_follows_rollouts_in_place(
    tmp_path: Path, page: tuple[Page, list[str]]
) -> None:
    pg, dialogs = page
    config = {"rollouts": {"stall_after_s": 3.0, "check_interval_s": 0.2, "lost_after_s": 600}}
    with (
        SidecarProcess(config=config, log_dir=tmp_path) as sc,
        WebViewChild(tmp_path, tmp_path, admin_url=sc.admin_url).start(timeout_s=60) as view,
    ):
        send(sc, [start(1, time.time_ns(), rollout_id="hang-0"), heartbeat(1)])
        pg.goto(view.url + "/rollouts")
        pg.locator("header nav a[href='/live']").click()
        pg.wait_for_url("**/live")
        assert pg.locator("header nav a.active").inner_text() == "Live"
        assert [rollout for rollout, _ in rows(pg)] == ["hang-0"]  # in the served HTML
        pg.evaluate("() => { window.__same_document = true; }")
        # a second rollout starts, and keeps stepping; the first has nothing new: it stalls
        send(sc, [start(2, time.time_ns(), rollout_id="busy-1")])
        stalled = pg.locator("tr.stalled[data-rollout='hang-0']")
        stalled.wait_for()
        assert stalled.locator(".badge.stalled").inner_text() == "stalled"
        colour = stalled.locator("td").first.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(255, 244, 224)"  # highlighted (ui.css tr.stalled)
        # busy-1 ends: it leaves the list; the first stays, stalled first
        send(sc, [step(2, time.time_ns(), "POST /verify", "weather", 2)])
        end(sc, 2)
        pg.locator("[data-rollout='busy-1']").wait_for(state="detached")
        assert rows(pg) == [("hang-0", "stalled")]
        assert pg.evaluate("() => window.__same_document") is True  # refreshed, not reloaded
        # hostile data: text only
        send(sc, [start(10 + i, time.time_ns(), rollout_id=h) for i, h in enumerate(HOSTILE)])
        pg.locator(f"[data-testid=live-row] >> text={HOSTILE[0]}").wait_for()
        scripts = pg.eval_on_selector_all("script", "els => els.map(e => e.getAttribute('src'))")
        assert scripts == ["/static/ui.js"]
        assert pg.locator("img, iframe, object, embed").count() == 0
        # the sidecar goes away: the page says so in place and keeps trying (backing off)
        sc.stop()
        pg.locator("[data-testid=live-error]").wait_for()
        assert "not reachable" in pg.locator("[data-testid=live-error]").inner_text()
        assert pg.evaluate("() => window.__same_document") is True
    assert dialogs == []
