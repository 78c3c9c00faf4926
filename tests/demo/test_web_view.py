"""``bash scripts/demo.sh --keep`` and its web view in a real browser.

Runs the demo as a user would (real Gym servers, a sidecar with the local store, the web
view), waits for the URLs it prints at the end, then drives Debian's Chromium through the
pages: the rollouts list, the failed filter, a failed rollout's waterfall across all
three services with its failing verification marked, a span's details, the stats and
the service map, whose numbers are checked against the web view's own Jaeger-compatible
API (what a tool reading Jaeger's API sees). Then Ctrl-C (SIGINT to the demo's process
group), a clean stop, and the demo dies by SIGINT as an interrupted program does
(SIGTERM and SIGHUP: ``test_demo_signals.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from tests.support.browser import launch
from tests.support.demo import REPO, demo_env

pytestmark = [pytest.mark.gym, pytest.mark.timeout(2400)]

ROLLOUTS = 10
FAILING = 2
WAIT_MS = 60_000
AGENT = "nemo-gym/example_single_tool_call_simple_agent"
FAILING_AGENT = "nemo-gym/failing_weather_simple_agent"
MODEL = "nemo-gym/policy_model"
FAILING_RESOURCES = "nemo-gym/failing_weather"


class Demo:
    def __init__(self, tmp: Path) -> None:
        cmd = [
            "bash",
            str(REPO / "scripts" / "demo.sh"),
            "--keep",
            "--rollouts",
            str(ROLLOUTS),
            "--failing",
            str(FAILING),
            "--concurrency",
            "4",
            "--store-dir",
            str(tmp / "store"),
            "--workdir",
            str(tmp / "work"),
        ]
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=demo_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def out(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.out:
            assert self.proc.poll() is None, f"the demo exited:\n{self.out[-6000:]}"
            assert time.monotonic() < deadline, f"no {text!r} from the demo:\n{self.out[-6000:]}"
            time.sleep(0.5)

    def interrupt(self, timeout_s: float = 120) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return code


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    d = Demo(tmp_path_factory.mktemp("webview-demo"))
    try:
        d.wait_for("--keep:", 2200)
        yield d
    finally:
        if d.proc.poll() is None:
            d.interrupt()


def _api(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


def test_the_demo_prints_the_web_view_and_a_failed_rollouts_page(demo: Demo) -> None:
    out = " ".join(demo.out.split())
    assert f"failing 500: {FAILING}" in out
    assert re.search(
        r"Web view \(rollouts, waterfalls, stats, service map\): http://127\.0\.0\.1:\d+/", out
    )
    assert re.search(r"a failed rollout, \S+: http://127\.0\.0\.1:\d+/trace/[0-9a-f]{32}", out)


def _base(demo: Demo) -> str:
    [url] = re.findall(r"^  (http://127\.0\.0\.1:\d+)/$", demo.out, re.M)
    return url


def test_rollouts_filter_a_failed_waterfall_and_span_details(demo: Demo) -> None:
    base = _base(demo)
    with sync_playwright() as p:
        browser = launch(p)
        pg: Page = browser.new_page()
        pg.set_default_timeout(WAIT_MS)
        dialogs: list[str] = []
        pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        pg.goto(base + "/")
        rows = pg.locator("[data-testid=rollout-row]")
        assert rows.count() == ROLLOUTS
        # filter failed ones with the form, as a user does
        pg.locator("input[name=failed]").check()
        pg.locator("form[data-testid=filters] button[type=submit]").click()
        pg.wait_for_url("**failed=1*")
        assert rows.count() == FAILING
        assert set(rows.evaluate_all("els => els.map(e => e.dataset.failed)")) == {"true"}
        rows.first.locator("a").click()
        pg.wait_for_url("**/trace/*")
        services = set(
            pg.locator("details[data-testid=span]").evaluate_all(
                "els => els.map(e => e.dataset.service)"
            )
        )
        assert {FAILING_AGENT, MODEL, FAILING_RESOURCES} <= services
        assert pg.locator("[data-testid=cross-process]").count() >= 3
        verify = pg.locator("details[data-name='gym.verify']")
        assert verify.count() == 1 and verify.get_attribute("data-verify-failed") == "true"
        assert verify.locator("[data-testid=verify-failed]").is_visible()
        # a span's details, on click
        verify.locator("summary").click()
        detail = verify.locator("[data-testid=span-detail]")
        detail.wait_for(state="visible")
        assert "succeeded" in detail.inner_text() and "false" in detail.inner_text()
        assert pg.locator("[data-testid=trace-summary]").get_attribute("data-complete") == "true"
        browser.close()
    assert dialogs == []


def test_stats_and_service_map_numbers_match_the_api(demo: Demo) -> None:
    base = _base(demo)
    # what the Jaeger-compatible API says, computed here from its JSON
    calls: Counter[tuple[str, str]] = Counter()
    errors: Counter[tuple[str, str]] = Counter()
    services = _api(base + "/api/services")["data"]
    traces: dict[str, Any] = {}
    for service in services:
        for t in _api(
            f"{base}/api/traces?service={urllib.request.quote(service, safe='')}&limit=1000"
        )["data"]:
            traces[t["traceID"]] = t
    for t in traces.values():
        svc = {pid: p["serviceName"] for pid, p in t["processes"].items()}
        by_id = {s["spanID"]: s for s in t["spans"]}
        for s in t["spans"]:
            parents = [r["spanID"] for r in s["references"] if r["refType"] == "CHILD_OF"]
            parent = by_id.get(parents[0]) if parents else None
            if parent is not None and svc[parent["processID"]] != svc[s["processID"]]:
                edge = (svc[parent["processID"]], svc[s["processID"]])
                calls[edge] += 1
                errors[edge] += any(tag["key"] == "error" and tag["value"] for tag in s["tags"])
    assert len(traces) == ROLLOUTS
    with sync_playwright() as p:
        browser = launch(p)
        pg = browser.new_page()
        pg.set_default_timeout(WAIT_MS)
        pg.goto(base + "/stats")
        success = pg.locator("[data-testid=verify-success]")
        assert success.get_attribute("data-completed") == str(ROLLOUTS - FAILING)
        assert success.get_attribute("data-total") == str(ROLLOUTS)
        counts = pg.locator("[data-testid=rollout-histogram] [data-count]").evaluate_all(
            "els => els.map(e => Number(e.dataset.count))"
        )
        assert sum(counts) == ROLLOUTS
        assert pg.locator("[data-testid=success-chart] circle").count() >= 1
        # the slowest bucket leads to its rollouts
        bars = pg.locator("[data-testid=rollout-histogram] a[data-count]")
        slowest = bars.nth(bars.count() - 1)
        n = int(slowest.get_attribute("data-count") or 0)
        slowest.click()
        pg.wait_for_url("**/rollouts?*")
        assert pg.locator("[data-testid=rollout-row]").count() == n > 0
        pg.goto(base + "/map")
        edges = pg.locator("[data-testid=edge]").evaluate_all(
            "els => els.map(e => [e.dataset.source, e.dataset.target, Number(e.dataset.calls),"
            " Number(e.dataset.errors)])"
        )
        assert {(a, b): (c, e) for a, b, c, e in edges} == {k: (calls[k], errors[k]) for k in calls}
        assert errors[(FAILING_AGENT, FAILING_RESOURCES)] >= FAILING
        assert calls[(AGENT, MODEL)] >= ROLLOUTS - FAILING and errors[(AGENT, MODEL)] == 0
        assert pg.locator("svg[data-testid=service-map] .node").count() == len(services)
        browser.close()


def test_ctrl_c_stops_everything_cleanly(demo: Demo) -> None:
    base = _base(demo)
    assert demo.interrupt() == -signal.SIGINT, demo.out[-6000:]
    assert "stopped cleanly." in demo.out
    assert "stopped by SIGINT." in demo.out
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "/rollouts", timeout=10)
