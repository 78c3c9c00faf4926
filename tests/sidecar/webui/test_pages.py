"""The web view's pages over a store written the way the sidecar writes it, read over
real HTTP: filters, the waterfall's marks, stats, the service map, 404s, headers."""

from __future__ import annotations

import html
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from gym_sidecar.webui.app import ViewConfig
from gym_sidecar.webui.html import CSP

from tests.sidecar.webui.data import AGENT, MODEL, RESOURCES, gym_trace, request, write
from tests.sidecar.webui.serve import Clock, get, serve

NOW = time.time_ns()
OK, FAILED = 7, 3
S = 1_000_000_000


def _attr(text: str, name: str) -> list[str]:
    return [html.unescape(v) for v in re.findall(rf'{name}="([^"]*)"', text)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("webui") / "traces.db"
    payloads = []
    for i in range(OK + FAILED):
        failing = i >= OK
        # rollout i started i seconds after the first, i*10 ms longer than 100 ms
        tid, specs = gym_trace(f"{i}-0", NOW - 600 * S + i * S, fail_verify=failing)
        for s in specs[:2]:  # the agent's /run and rollout spans set the rollout duration
            s.end_ns += i * 10_000_000
        payloads.append(request(tid, specs))
    write(path, payloads, NOW - 500 * S)
    return path


@pytest.fixture(scope="module")
def base(store: Path) -> Iterator[str]:
    with serve(
        ViewConfig(store, jaeger_url="http://jaeger.example:16686", clock_ns=Clock(NOW))
    ) as url:
        yield url


def test_rollouts_newest_first_and_each_filter(base: str) -> None:
    page = get(base + "/rollouts")
    assert page.status == 200
    assert _attr(page.text, "data-rollout") == [f"{i}-0" for i in reversed(range(OK + FAILED))]
    failed = get(base + "/rollouts?failed=1").text
    assert _attr(failed, "data-rollout") == [f"{i}-0" for i in reversed(range(OK, OK + FAILED))]
    assert set(_attr(failed, "data-failed")) == {"true"}
    # rollout i lasts 99 + 10*i ms: slower than 150 ms are i >= 6
    slow = get(base + "/rollouts?slower_than=150ms").text
    assert _attr(slow, "data-rollout") == [f"{i}-0" for i in reversed(range(6, 10))]
    assert _attr(get(base + "/rollouts?rollout=4-0").text, "data-rollout") == ["4-0"]
    server = urllib.parse.quote(RESOURCES)
    assert len(_attr(get(f"{base}/rollouts?server={server}").text, "data-rollout")) == 10
    assert _attr(get(base + "/rollouts?server=nope").text, "data-rollout") == []
    # the rollouts started ~10 minutes ago: a 5 minute window holds none
    assert _attr(get(base + "/rollouts?since=5m").text, "data-rollout") == []
    assert len(_attr(get(base + "/rollouts?since=1h").text, "data-rollout")) == 10


def test_a_bad_filter_is_a_clear_400(base: str) -> None:
    page = get(base + "/rollouts?slower_than=fast")
    assert page.status == 400
    assert "slower than: not a duration: &#x27;fast&#x27;" in page.text


def test_paging(tmp_path: Path) -> None:
    path = tmp_path / "traces.db"
    write(path, [request(*gym_trace(f"p{i}", NOW - (200 - i) * S)) for i in range(120)])
    with serve(ViewConfig(path)) as url:
        first = get(url + "/rollouts")
        assert _attr(first.text, "data-rollout")[:2] == ["p119", "p118"]
        assert len(_attr(first.text, "data-rollout")) == 50
        assert 'data-refresh="5"' in first.text  # the first page refreshes
        third = get(url + "/rollouts?page=2").text
        assert _attr(third, "data-rollout") == [f"p{i}" for i in reversed(range(20))]
        assert 'rel="next"' not in third and 'data-refresh="0"' in third


def test_trace_waterfall_marks_services_edges_errors_and_the_failed_verification(
    base: str,
) -> None:
    page = get(base + "/trace/8-0")
    assert page.status == 200
    text = page.text
    assert _attr(text, "data-service").count(AGENT) >= 3
    assert {AGENT, MODEL, RESOURCES} <= set(_attr(text, "data-service"))
    assert text.count('data-testid="span"') == 7
    assert text.count('data-testid="cross-process"') == 2  # model and resources server spans
    [verify] = re.findall(r'<details[^>]*data-name="gym.verify"[^>]*>', text)
    assert 'data-verify-failed="true"' in verify and 'data-error="true"' in verify
    assert "VerifierCrash: on purpose" in text  # status message in the details
    assert 'data-state="complete"' in text
    [link] = [h for h in _attr(text, "href") if "jaeger" in h]
    assert re.fullmatch(r"http://jaeger\.example:16686/trace/[0-9a-f]{32}", link)
    ok = get(base + "/trace/2-0").text
    assert 'data-verify-failed="true"' not in ok and 'data-error="true"' not in ok


def test_trace_by_trace_id_prefix_and_unknown_ids(base: str) -> None:
    rows = get(base + "/rollouts?rollout=5-0").text
    [trace_id] = _attr(rows, "data-trace")
    assert 'data-testid="trace-summary"' in get(f"{base}/trace/{trace_id[:10]}").text
    for unknown in ("no-such-rollout", "0123456789abcdef", "%3Cscript%3E"):
        page = get(f"{base}/trace/{unknown}")
        assert page.status == 404
        assert 'data-testid="not-found"' in page.text and "No rollout or trace" in page.text
    assert get(base + "/nowhere").status == 404


def test_stats_numbers_and_a_bucket_links_to_its_rollouts(base: str) -> None:
    text = get(base + "/stats").text
    [success] = re.findall(r'<p data-testid="verify-success"[^>]*>', text)
    assert 'data-completed="7"' in success and 'data-total="10"' in success
    assert re.search(r'data-what="rollout \(spans\)" data-count="10"', text)
    counts = [
        int(c)
        for c in _attr(
            text.split('data-testid="rollout-histogram"')[1].split("</svg>")[0], "data-count"
        )
    ]
    assert sum(counts) == 10
    # the slowest non-empty bucket's link lists exactly the rollouts in it
    links = re.findall(r'<a href="([^"]+)" data-bucket="\d+" data-count="(\d+)"', text)
    href, count = links[-1]
    listed = get(base + html.unescape(href)).text
    assert len(_attr(listed, "data-rollout")) == int(count) > 0
    assert text.count('class="dot"') >= 1  # success fraction over time


def test_service_map_counts_calls_and_errors(base: str) -> None:
    text = get(base + "/map").text
    edges = {
        (html.unescape(s), html.unescape(t)): (int(c), int(e))
        for s, t, c, e in re.findall(
            r'data-testid="edge" data-source="([^"]*)" data-target="([^"]*)" '
            r'data-calls="(\d+)" data-errors="(\d+)"',
            text,
        )
    }
    assert edges == {(AGENT, MODEL): (10, 0), (AGENT, RESOURCES): (10, FAILED)}
    assert "<svg" in text and 'data-testid="service-map"' in text


def test_every_response_carries_the_security_headers_and_the_view_is_read_only(
    base: str,
) -> None:
    for path in (
        "/rollouts",
        "/trace/1-0",
        "/stats",
        "/map",
        "/static/ui.js",
        "/api/services",
        "/nope",
    ):
        answer = get(base + path)
        assert answer.headers["content-security-policy"] == CSP, path
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    for method in ("POST", "PUT", "DELETE"):
        assert get(base + "/rollouts", method).status == 405
        assert get(base + "/api/traces", method).status == 405


def test_a_missing_store_says_so(tmp_path: Path) -> None:
    with serve(ViewConfig(tmp_path / "none" / "traces.db")) as url:
        page = get(url + "/rollouts")
        assert page.status == 503 and "No local store at" in page.text
        assert get(url + "/api/services").json()["errors"][0]["code"] == 503


def test_gyms_own_telemetry_is_listed_and_shown_as_a_waterfall(tmp_path: Path) -> None:
    """Rollouts recorded by Gym's own telemetry (``nemo.lens.helpers``, failures as
    exception events): listed, each a waterfall marking its failed verification, every
    span's producer named."""
    from testkit.rollout_requests import Rollout, gym_dialect_request

    path = tmp_path / "traces.db"
    rollouts = [Rollout(f"{i}-0", NOW - 600 * S + i * S, 100.0, verify_ok=i < 3) for i in range(4)]
    write(path, [gym_dialect_request(rollouts).SerializeToString()], NOW - 500 * S)
    with serve(ViewConfig(path, clock_ns=Clock(NOW))) as url:
        listed = get(url + "/rollouts").text
        assert len(_attr(listed, "data-rollout")) == 4
        failed = get(url + "/rollouts?failed=1").text
        [trace_id] = [r.trace_id.hex() for r in rollouts[3:]]
        assert len(_attr(failed, "data-rollout")) == 1
        text = get(f"{url}/trace/{trace_id}").text
        [verify] = re.findall(r'<details[^>]*data-name="gym.verify"[^>]*>', text)
        assert 'data-verify-failed="true"' in verify and 'data-error="true"' in verify
        assert "__main__.VerifierCrash" in text  # the exception event, in the details
        assert "nemo_gym" in text and "nemo.lens.helpers" in text  # producer and scope
