"""The real Jaeger UI over the local store, in Debian's Chromium: a check run by hand.

Jaeger's UI is not on any registry reachable here; it is built from its repository
beside the project (docs/testing.md, "The real Jaeger UI"). Point these variables at
what was built and this module drives each line through ``gym-sidecar ui --jaeger-ui``:

- ``GYM_TELEMETRY_JAEGER_UI_CLASSIC``: the classic line's ``packages/jaeger-ui/build``
  (tag v1.76.0: the classic ``/api`` endpoints);
- ``GYM_TELEMETRY_JAEGER_UI_V2``: the 2.x line's (main: API v3 for services and search);
- ``GYM_TELEMETRY_JAEGER_UI_STORE`` (optional): a store directory, e.g. what ``bash
  scripts/demo.sh --store-dir DIR`` left; without it the test writes rollouts of its own
  at two ages;
- ``GYM_TELEMETRY_JAEGER_UI_SHOTS`` (optional): a directory for a screenshot per step.

Without the first two, every test here is skipped. What each step expects is read from
the store directly (its services, a failed rollout, which traces have an ERROR span of
a service, durations, start times, calls, server span names), not through the API; and
every ``/api`` answer the UI got must be 2xx, with no page error and no CSP refusal.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gym_sidecar.store import db, queries
from gym_sidecar.store.queries import STATUS_ERROR, SpanRecord
from gym_telemetry_demo.webview import WebViewChild
from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.sidecar.webui.data import gym_trace, request, write
from tests.support.browser import launch

LINES = {
    "classic": os.environ.get("GYM_TELEMETRY_JAEGER_UI_CLASSIC", ""),
    "v2": os.environ.get("GYM_TELEMETRY_JAEGER_UI_V2", ""),
}
STORE = os.environ.get("GYM_TELEMETRY_JAEGER_UI_STORE", "")
SHOTS = os.environ.get("GYM_TELEMETRY_JAEGER_UI_SHOTS", "")
WAIT_MS = 60_000
S = 1_000_000_000
_TRACE_HREF = re.compile(r"/jaeger/trace/([0-9a-f]{32})$")
_HAS_RESULT = (
    "() => [...document.querySelectorAll('a[href*=\"/trace/\"]')]"
    ".some(a => /\\/trace\\/[0-9a-f]{32}$/.test(a.getAttribute('href')))"
)
"""A search result is shown (the top bar's Compare link is ``/trace/...``)."""

pytestmark = pytest.mark.skipif(
    not any(LINES.values()),
    reason="needs a built Jaeger UI: GYM_TELEMETRY_JAEGER_UI_CLASSIC / _V2 (docs/testing.md)",
)


@dataclass
class Facts:
    """What the store holds, read directly (see the module docstring)."""

    services: list[str]
    spans: dict[str, list[SpanRecord]]
    service: str = ""
    rollout_id: str = ""
    trace_id: str = ""
    other_trace_id: str = ""
    calls: dict[tuple[str, str], int] = field(default_factory=dict)

    def traces(self, since_ns: int, *, error: bool = False, min_ns: int = 0) -> set[str]:
        """Traces with a span of :attr:`service` started since ``since_ns`` (ERROR, at
        least ``min_ns`` long)."""
        return {
            tid
            for tid, spans in self.spans.items()
            if any(
                s.service == self.service
                and s.start_ns >= since_ns
                and (not error or s.status_code == STATUS_ERROR)
                and s.end_ns - s.start_ns >= min_ns
                for s in spans
            )
        }

    def server_ops(self, service: str, since_ns: int) -> set[str]:
        return {
            s.name
            for spans in self.spans.values()
            for s in spans
            if s.service == service and s.kind == 2 and s.end_ns > since_ns
        }


def _facts(store: Path) -> Facts:
    with closing(db.connect(store, readonly=True)) as conn:
        ids = queries.recent_traces(conn, limit=100_000)
        facts = Facts(queries.service_names(conn), {t: queries.trace_spans(conn, t) for t in ids})
        failed = queries.rollouts(conn, failed_only=True, limit=1)[0]
        ok = queries.rollouts(conn, limit=50)
    root = next(s for s in facts.spans[failed.trace_id] if not s.parent_span_id)
    facts.service, facts.rollout_id, facts.trace_id = (
        root.service,
        failed.rollout_id,
        failed.trace_id,
    )
    facts.other_trace_id = next(r.trace_id for r in ok if r.trace_id != failed.trace_id)
    for spans in facts.spans.values():
        by_id = {s.span_id: s for s in spans}
        for s in spans:
            parent = by_id.get(s.parent_span_id or "")
            if parent is not None and parent.service != s.service:
                key = (parent.service, s.service)
                facts.calls[key] = facts.calls.get(key, 0) + 1
    return facts


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if STORE:
        return Path(STORE) / "traces.db"
    path = tmp_path_factory.mktemp("jaeger-ui") / "traces.db"
    now = time.time_ns()
    for age_s, first, count in ((40 * 60, 0, 4), (120, 4, 8)):  # 40 min and 2 min ago
        payloads = []
        for i in range(first, first + count):
            tid, specs = gym_trace(f"{i}-0", now - age_s * S + i * S, fail_verify=i % 4 == 3)
            payloads.append(request(tid, specs))
        write(path, payloads, now - age_s * S + (first + count) * S)
    return path


@pytest.fixture(params=[k for k, v in LINES.items() if v])
def ui(request: pytest.FixtureRequest, store: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(line, the UI's base URL) of a ``gym-sidecar ui --jaeger-ui`` child over ``store``."""
    line = request.param
    child = WebViewChild(store.parent, tmp_path, jaeger_ui=Path(LINES[line]))
    with child.start(timeout_s=60) as view:
        yield line, view.url + "/jaeger"


class Browser:
    """One page; every ``/api`` answer, page error and CSP refusal is recorded."""

    def __init__(self, page: Page, line: str) -> None:
        self.page, self.line = page, line
        self.api: list[tuple[int, str]] = []
        self.errors: list[str] = []
        page.set_default_timeout(WAIT_MS)
        page.on(
            "response", lambda r: self.api.append((r.status, r.url)) if "/api/" in r.url else None
        )
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on(
            "console",
            lambda m: self.errors.append(m.text) if "Content Security Policy" in m.text else None,
        )

    def open(self, url: str) -> None:
        self.page.goto(url)
        self.page.wait_for_load_state("networkidle")

    def shot(self, step: str) -> None:
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SHOTS) / f"jaeger-ui-{self.line}-{step}.png"))

    def text(self) -> str:
        """The page's text as shown (block elements on their own lines)."""
        return self.page.inner_text("body")

    def all_text(self) -> str:
        """Every text node, also SVG labels."""
        return str(self.page.evaluate("() => document.body.textContent"))

    def trace_links(self) -> set[str]:
        hrefs = self.page.eval_on_selector_all(
            "a[href*='/trace/']", "els => els.map(e => e.getAttribute('href'))"
        )
        return {m.group(1) for h in hrefs if (m := _TRACE_HREF.search(h or ""))}

    def search(self, base: str, **params: str | list[str]) -> set[str]:
        """The traces a search URL (the form's own) shows."""
        query = urllib.parse.urlencode({"limit": "1500", **params}, doseq=True)
        self.open(f"{base}/search?{query}")
        self.page.wait_for_function(
            f"() => ({_HAS_RESULT})() || "
            "/No trace results|No traces found|\\b0 traces/i.test(document.body.textContent)"
        )
        self.page.wait_for_load_state("networkidle")
        return self.trace_links()

    def check_clean(self) -> None:
        bad = [(status, url) for status, url in self.api if not 200 <= status < 300]
        assert not bad, bad
        assert not self.errors, self.errors


def test_the_real_jaeger_ui(ui: tuple[str, str], store: Path) -> None:
    line, base = ui
    facts = _facts(store)
    now = time.time_ns()
    with sync_playwright() as p:
        browser = launch(p)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            b = Browser(context.new_page(), line)
            _services_and_search_form(b, base, facts)
            _searches(b, base, facts, now)
            _trace_lookup_and_compare(b, base, facts)
            _system_architecture(b, base, facts)
            _monitor(b, base, facts, now)
            b.check_clean()
            assert b.api, "the UI made no API call"
        finally:
            browser.close()


def _services_and_search_form(b: Browser, base: str, facts: Facts) -> None:
    b.open(f"{base}/search")
    label = b.page.get_by_text("Service (").first
    assert label.inner_text().strip() == f"Service ({len(facts.services)})"
    b.page.locator(".ant-select").first.click()
    options = b.page.locator(".ant-select-item-option")
    options.first.wait_for()
    shown = [o.strip() for o in options.all_inner_texts()]
    assert set(facts.services) <= set(shown), shown
    b.page.locator(
        ".ant-select-item-option", has_text=re.compile(f"^{re.escape(facts.service)}$")
    ).click()
    b.page.get_by_role("button", name="Find Traces").click()
    b.page.wait_for_url(re.compile(r"/search\?.*service="))
    b.page.wait_for_function(_HAS_RESULT)
    b.page.wait_for_load_state("networkidle")
    found = b.trace_links()
    expected = facts.traces(time.time_ns() - 3600 * S)  # the form's default: the last hour
    assert found <= expected and len(found) == min(20, len(expected)), (found, expected)
    b.shot("search-service")


def _searches(b: Browser, base: str, facts: Facts, now: int) -> None:
    svc = facts.service
    tags = json.dumps({"nemo.gym.rollout.id": facts.rollout_id})
    assert b.search(base, service=svc, tags=tags, lookback="2d") == {facts.trace_id}
    b.shot("search-rollout-id")
    errors = b.search(base, service=svc, tags=json.dumps({"error": "true"}), lookback="2d")
    assert errors == facts.traces(now - 2 * 86400 * S, error=True) and facts.trace_id in errors
    b.shot("search-error")
    root = next(s for s in facts.spans[facts.trace_id] if not s.parent_span_id)
    min_us = (root.end_ns - root.start_ns) // 1000  # the failed rollout's own duration
    slow = b.search(base, service=svc, minDuration=f"{min_us}us", lookback="2d")
    assert slow == facts.traces(now - 2 * 86400 * S, min_ns=min_us * 1000)
    assert facts.trace_id in slow
    b.shot("search-duration")
    # the lookback through the form: the UI turns it into start and end (a search URL's
    # bare ``lookback`` is only a label, for Jaeger's query service too)
    for label, seconds in (("Last 15 minutes", 15 * 60), ("Last 2 hours", 2 * 3600)):
        b.open(f"{base}/search")
        _choose(b, "Service", re.compile(f"^{re.escape(svc)}$"))
        _choose(b, "Lookback", re.compile(f"^{label}$", re.I))
        b.shot(f"lookback-form-{seconds}")
        b.page.get_by_role("button", name="Find Traces").click()
        b.page.wait_for_url(re.compile(r"/search\?.*start="))
        b.page.wait_for_function(
            f"() => ({_HAS_RESULT})() || "
            "/No trace results|No traces found|\\b0 traces/i.test(document.body.textContent)"
        )
        b.page.wait_for_load_state("networkidle")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(b.page.url).query)
        start_ns = int(query["start"][0]) * 1000
        assert int(query["end"][0]) * 1000 - start_ns == seconds * S, query
        expected = facts.traces(start_ns)
        assert b.trace_links() == set(list(expected)[:20]) or (
            len(expected) > 20 and len(b.trace_links()) == 20
        ), (label, b.trace_links(), expected)
    b.shot("search-lookback")


def _choose(b: Browser, field: str, option: re.Pattern[str]) -> None:
    """Pick ``option`` in the search form's select ``field`` (the 2.x line marks its
    selects with a ``data-testid``, the classic line puts them in labelled form items)."""
    select = b.page.locator(f".ant-select[data-testid='{field.lower()}']")
    if not select.count():
        select = b.page.locator(".ant-form-item", has_text=field).locator(".ant-select")
    select.first.click()
    b.page.locator(".ant-select-dropdown:visible .ant-select-item-option", has_text=option).click()
    open_list = b.page.locator(".ant-select-dropdown:visible")
    for _ in range(3):  # a list may stay open over the button: close it
        try:
            open_list.first.wait_for(state="hidden", timeout=5000)
            break
        except PlaywrightTimeout:
            b.page.keyboard.press("Escape")
    assert open_list.count() == 0
    assert option.search(select.first.inner_text().strip()), select.first.inner_text()


def _trace_lookup_and_compare(b: Browser, base: str, facts: Facts) -> None:
    a, other = facts.trace_id, facts.other_trace_id
    b.open(f"{base}/trace/{a}")
    b.page.get_by_text("Total Spans").first.wait_for()
    assert re.search(rf"Total Spans\s*{len(facts.spans[a])}\s", b.text())
    b.shot("trace")
    if b.line == "classic":
        # the search by trace ids: the UI calls /api/traces?traceID=a&traceID=b
        assert b.search(base, traceID=[a, other]) == {a, other}
    else:
        box = b.page.get_by_placeholder(re.compile("Lookup by Trace ID|lookup trace", re.I))
        box.fill(other)
        box.press("Enter")
        b.page.wait_for_url(re.compile(f"/trace/{other}"))
        b.page.get_by_text("Total Spans").first.wait_for()
    b.open(f"{base}/trace/{a}...{other}?cohort={a}&cohort={other}")
    b.page.get_by_text("VS").first.wait_for()
    # the diff graph is drawn: a span below the root is named in it
    child = next(s.name for s in facts.spans[a] if s.parent_span_id)
    b.page.wait_for_function("n => document.body.textContent.includes(n)", arg=child)
    b.page.wait_for_load_state("networkidle")
    text = b.text()
    assert a[:7] in text and other[:7] in text
    b.shot("compare")


def _system_architecture(b: Browser, base: str, facts: Facts) -> None:
    b.open(f"{base}/dependencies")
    # the graph is laid out: every service and call count is drawn
    words = sorted({str(n) for n in facts.calls.values()} | {s for k in facts.calls for s in k})
    b.page.wait_for_function(
        "words => words.every(w => document.body.textContent.includes(w))", arg=words
    )
    text = b.all_text()
    for (parent, child), count in facts.calls.items():
        assert parent in text and child in text and str(count) in text, (parent, child, count)
    b.shot("dependencies")


def _monitor(b: Browser, base: str, facts: Facts, now: int) -> None:
    b.open(f"{base}/monitor")
    b.page.get_by_text("Latency (ms)").first.wait_for()
    b.page.wait_for_function("() => /Operations metrics under/.test(document.body.textContent)")
    b.page.wait_for_load_state("networkidle")
    text = b.text()
    shown = re.search(r'Aggregation of all "([^"]+)" metrics', text)
    assert shown is not None, text[:500]
    expected = facts.server_ops(shown.group(1), now - 70 * 60 * S)
    assert expected, f"no server spans of {shown.group(1)} in the last hour"
    rows = b.page.locator(".ant-table-tbody tr.ant-table-row")
    rows.first.wait_for()
    names = {r.split("\t")[0].split("\n")[0].strip() for r in rows.all_inner_texts()}
    assert names == expected, (names, expected)
    b.shot("monitor")
