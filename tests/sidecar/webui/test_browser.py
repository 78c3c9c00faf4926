"""The web view in a real browser (Debian's Chromium driven by Playwright) over stores
written here: hostile span data runs no script and opens no dialog, the CSP refuses an
injected inline script, a span's details open on click, a 10,000-span trace pages, the
rollouts list refreshes in place as rollouts arrive, the environments page drills down to
an environment's rollouts and the stats page draws its time series. Assertions are on the
DOM.

The same view after a real Gym run: tests/demo/test_web_view.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gym_telemetry_demo.webview import WebViewChild
from playwright.sync_api import Browser, Page, sync_playwright

from tests.sidecar.webui.data import (
    AGENT,
    SpanSpec,
    derived_metrics,
    gym_trace,
    new_id,
    request,
    write,
    write_points,
)
from tests.sidecar.webui.test_hostile_and_bounded import HOSTILE, LONG, hostile_trace
from tests.support.browser import launch

NOW = time.time_ns()
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

    def on_dialog(dialog: object) -> None:
        dialogs.append(dialog.message)  # type: ignore[attr-defined]
        dialog.dismiss()  # type: ignore[attr-defined]

    pg.on("dialog", on_dialog)
    try:
        yield pg, dialogs
    finally:
        context.close()


def _no_foreign_markup(pg: Page) -> None:
    scripts = pg.eval_on_selector_all("script", "els => els.map(e => e.getAttribute('src'))")
    assert scripts == ["/static/ui.js"]
    assert pg.locator("img, iframe, object, embed").count() == 0
    handlers = pg.evaluate(
        "() => [...document.querySelectorAll('*')].flatMap(e => [...e.attributes]"
        ".filter(a => a.name.startsWith('on')).map(a => a.name))"
    )
    assert handlers == []
    links = pg.eval_on_selector_all(
        "a[href]", "els => els.map(e => new URL(e.getAttribute('href'), location.href).href)"
    )
    assert not [h for h in links if h.lower().startswith("javascript:")]


def test_hostile_span_data_is_only_text(tmp_path: Path, page: tuple[Page, list[str]]) -> None:
    pg, dialogs = page
    tid = new_id(16)
    write(tmp_path / "traces.db", [request(tid, hostile_trace(tid))], NOW - 60 * 10**9)
    with WebViewChild(tmp_path, tmp_path).start(timeout_s=60) as view:
        for path in (
            "/rollouts",
            f"/trace/{tid.hex()}",
            "/stats",
            "/map",
            "/rollouts?server=%3Cscript%3Ealert(9)%3C/script%3E",
        ):
            pg.goto(view.url + path)
            pg.wait_for_load_state("load")
            _no_foreign_markup(pg)
        pg.goto(f"{view.url}/trace/{tid.hex()}")
        root = pg.locator("details[data-testid=span]").first
        assert root.get_attribute("data-service") == HOSTILE[0]
        root.locator("summary").click()
        detail = root.locator("[data-testid=span-detail]")
        detail.wait_for(state="visible")
        text = detail.inner_text()
        for h in HOSTILE:
            assert h in text  # shown as the text it is
        assert LONG not in text and "more characters" in text
        # the CSP refuses an inline script even when something manages to insert one
        pg.evaluate(
            "() => { const s = document.createElement('script');"
            " s.textContent = 'window.__inline = 1; alert(7)'; document.body.appendChild(s); }"
        )
        pg.wait_for_timeout(200)
        assert pg.evaluate("() => window.__inline") is None
        assert pg.evaluate("() => window.__xss") is None
    assert dialogs == []


def test_a_10000_span_trace_pages_in_the_browser(
    tmp_path: Path, page: tuple[Page, list[str]]
) -> None:
    pg, _ = page
    tid, root = new_id(16), new_id()
    specs = [SpanSpec(AGENT, "POST /run", root, b"", NOW - 10**10, NOW)]
    specs += [
        SpanSpec(AGENT, f"step {i}", new_id(), root, NOW - 10**10 + i * 10**6, NOW - 10**6)
        for i in range(9_999)
    ]
    write(tmp_path / "traces.db", [request(tid, specs)], NOW - 60 * 10**9)
    with WebViewChild(tmp_path, tmp_path).start(timeout_s=60) as view:
        pg.goto(f"{view.url}/trace/{tid.hex()}")
        assert pg.locator("details[data-testid=span]").count() == 500
        assert pg.locator("[data-testid=trace-summary]").get_attribute("data-spans") == "10000"
        pg.locator("[data-testid=trace-pager] a[rel=next]").first.click()
        pg.wait_for_url("**page=1*")
        assert pg.locator("details[data-testid=span]").count() == 500
        assert pg.locator("details[data-name='step 499']").count() == 1


def test_the_rollouts_list_refreshes_in_place(tmp_path: Path, page: tuple[Page, list[str]]) -> None:
    pg, _ = page
    path = tmp_path / "traces.db"
    write(path, [request(*gym_trace("first-0", NOW - 10 * 10**9))])
    with WebViewChild(tmp_path, tmp_path).start(timeout_s=60) as view:
        pg.goto(view.url + "/rollouts")
        assert pg.locator("[data-testid=rollout-row]").count() == 1
        pg.evaluate("() => { window.__same_document = true; }")
        write(path, [request(*gym_trace("second-0", NOW - 5 * 10**9))])
        pg.locator("[data-rollout='second-0']").wait_for(timeout=WAIT_MS)
        # refreshed by the script, not by a reload (which would lose the marker)
        assert pg.evaluate("() => window.__same_document") is True
        rows = pg.eval_on_selector_all(
            "[data-testid=rollout-row]", "els => els.map(e => e.dataset.rollout)"
        )
        assert rows == ["second-0", "first-0"]


def test_the_environments_page_drills_down_and_the_stats_page_charts(
    tmp_path: Path, page: tuple[Page, list[str]]
) -> None:
    """issue 41's pages in the browser: every page's navigation reaches the environments
    page; an environment's link lists its rollouts with their reward, turns and tokens;
    the trace page shows them; the stats page draws the three time series; a hostile
    environment name stays text (no script, no dialog)."""
    pg, dialogs = page
    path = tmp_path / "traces.db"
    payloads = [
        request(
            *gym_trace(
                f"w{i}",
                NOW - (60 - i) * 10**9,
                agent="nemo-gym/weather_agent",
                reward=float(i % 2),
                turns=2,
                tokens=(34, 13),
                model_call=("policy-7b", 13, 5),
            )
        )
        for i in range(6)
    ]
    payloads.append(
        request(*gym_trace("h0", NOW - 30 * 10**9, agent=HOSTILE[0], reward=0.5, turns=1))
    )
    write(path, payloads, NOW - 20 * 10**9)
    write_points(path, derived_metrics(payloads), NOW - 20 * 10**9)
    with WebViewChild(tmp_path, tmp_path).start(timeout_s=60) as view:
        pg.goto(view.url + "/rollouts")
        pg.locator("header nav a[href='/envs']").click()
        pg.wait_for_url("**/envs")
        _no_foreign_markup(pg)
        row = pg.locator("[data-testid=env-row][data-env='nemo-gym/weather_agent']")
        assert row.get_attribute("data-rollouts") == "6"
        assert row.get_attribute("data-reward-mean") == "0.5"
        assert pg.locator("[data-testid=model-row]").get_attribute("data-calls") == "6"
        assert pg.locator("[data-testid=env-row]").count() == 2
        row.locator("[data-testid=env-link]").click()
        pg.wait_for_url("**/rollouts?env=*")
        rows = pg.eval_on_selector_all(
            "[data-testid=rollout-row]",
            "els => els.map(e => [e.dataset.rollout, e.dataset.reward, e.dataset.turns,"
            " e.dataset.tokens])",
        )
        assert rows == [[f"w{i}", str(i % 2), "2", "47"] for i in reversed(range(6))]
        pg.locator("[data-rollout='w3'] a").first.click()
        pg.wait_for_url("**/trace/*")
        assert pg.locator("[data-testid=trace-reward]").inner_text() == "1"
        assert pg.locator("[data-testid=trace-tokens]").inner_text() == "34 / 13"
        pg.goto(view.url + "/stats")
        for chart in ("rate-chart", "reward-chart", "tokens-chart"):
            assert pg.locator(f"svg[data-testid={chart}]").count() == 1, chart
        bins = pg.eval_on_selector_all(
            "svg[data-testid=rate-chart] [data-n]", "els => els.map(e => Number(e.dataset.n))"
        )
        assert sum(bins) == 7
        _no_foreign_markup(pg)
    assert dialogs == []
