"""The ``/live`` page over HTTP, reading a real ``gym-sidecar run`` fed with live events:
the in-flight rollouts' ids in the server-rendered HTML, stalled ones marked, lost ones
listed, hostile span data only as text, the link in every page's navigation, and a clear
answer when the sidecar cannot be read."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gym_sidecar.webui.app import ViewConfig
from gym_telemetry_demo.ports import free_port
from gym_telemetry_demo.sidecar import SidecarProcess

from testkit.live_events import heartbeat, logs_request, resource, start, step, stop
from testkit.otlp_samples import http_post
from testkit.wait import wait_for
from tests.sidecar.webui.serve import get, serve
from tests.sidecar.webui.test_hostile_and_bounded import HOSTILE

pytestmark = pytest.mark.timeout(300)
WAIT_S = 60.0


def _attr(text: str, name: str) -> list[str]:
    return [html.unescape(v) for v in re.findall(rf'{name}="([^"]*)"', text)]


def send(sc: SidecarProcess, events: list[object], **res: str) -> None:
    body = logs_request(resource(**res), events).SerializeToString()  # type: ignore[arg-type]
    assert http_post(sc.http_url, "logs", body).status_code == 200


@pytest.fixture
def sidecar() -> Iterator[SidecarProcess]:
    config = {
        "rollouts": {
            "stall_after_s": 2.0,
            "check_interval_s": 0.2,
            "stop_grace_s": 0,
            "lost_after_s": 600,  # only the stop loses anything, however slow the run
        }
    }
    with SidecarProcess(config=config) as sc:
        yield sc


def test_the_page_lists_in_flight_rollouts_stalled_and_lost(
    tmp_path: Path, sidecar: SidecarProcess
) -> None:
    t0 = time.time_ns()
    send(sidecar, [start(1, t0, rollout_id="12-0"), start(2, t0, rollout_id="13-0"), heartbeat(2)])
    with serve(ViewConfig(tmp_path / "traces.db", admin_url=sidecar.admin_url)) as base:
        page = get(base + "/live")
        assert page.status == 200
        assert _attr(page.text, "data-rollout") == ["12-0", "13-0"]  # oldest first
        assert ">12-0</a>" in page.text and ">13-0</a>" in page.text
        assert sidecar.admin_url in page.text
        # both stall; one steps again later, the other's instance stops
        assert wait_for(
            lambda: _attr(get(base + "/live").text, "data-state") == ["stalled"] * 2, WAIT_S
        )
        page = get(base + "/live").text
        assert page.count('<tr class="stalled"') == 2 and "badge stalled" in page
        send(sidecar, [step(2, time.time_ns(), "POST /v1/responses", "policy_model", 1)])
        page = get(base + "/live").text
        assert "POST /v1/responses → policy_model" in html.unescape(page)
        send(sidecar, [stop()])
        assert wait_for(
            lambda: _attr(get(base + "/live").text, "data-reason") == ["stopped", "stopped"], WAIT_S
        )
        page = get(base + "/live").text
        assert 'data-testid="no-live"' in page
        assert _attr(page, "data-lost") == ["2"]  # the server's row


def test_hostile_span_data_is_text(tmp_path: Path, sidecar: SidecarProcess) -> None:
    t0 = time.time_ns()
    events = [start(i + 1, t0, rollout_id=h) for i, h in enumerate(HOSTILE)]
    events.append(step(1, t0, HOSTILE[0], HOSTILE[1], 1))
    send(sidecar, events, server=HOSTILE[3], instance=HOSTILE[2])
    with serve(ViewConfig(tmp_path / "traces.db", admin_url=sidecar.admin_url)) as base:
        page = get(base + "/live").text
        assert sorted(_attr(page, "data-rollout")) == sorted(HOSTILE)
        for h in HOSTILE:
            escaped = html.escape(h, quote=True)
            assert escaped in page  # there, as text
            if escaped != h:
                assert h not in page  # never as markup
        hrefs = _attr(page, "href")
        assert not [h for h in hrefs if "javascript" in h.lower() or "<" in h]
        assert all(h.startswith("/") for h in hrefs)


def test_every_page_links_the_live_page(tmp_path: Path) -> None:
    with serve(
        ViewConfig(tmp_path / "traces.db", admin_url=f"http://127.0.0.1:{free_port()}")
    ) as base:
        for path in ("/rollouts", "/stats", "/map", "/live", "/trace/nothing", "/nowhere"):
            text = get(base + path).text
            assert '<a href="/live"' in text, path


def test_a_sidecar_that_does_not_answer_is_a_clear_503(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with serve(ViewConfig(tmp_path / "traces.db", admin_url=url)) as base:
        page = get(base + "/live")
        assert page.status == 503
        [message] = re.findall(r'data-testid="live-error">([^<]*)<', page.text)
        assert "not reachable" in message and url in html.unescape(message)
        assert 'id="live-region"' in page.text  # the region the script swaps, with the reason


def test_a_sidecar_that_tracks_nothing_says_so(tmp_path: Path) -> None:
    with (
        SidecarProcess(config={"rollouts": {"enabled": False}}) as sc,
        serve(ViewConfig(tmp_path / "traces.db", admin_url=sc.admin_url)) as base,
    ):
        page = get(base + "/live")
        assert page.status == 200
        assert "tracks no rollouts" in page.text
