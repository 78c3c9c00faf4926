"""Span data as hostile input, a trace of 10,000 spans, and a store written while read.

The hostile strings must reach the page only as text (escaped), never as markup, and
never inside an ``href``; the browser half of this (no script runs, no dialog opens)
is test_browser.py. A trace being written must never be shown as complete while parts
of it are missing.
"""

from __future__ import annotations

import html
import re
import threading
import time
from pathlib import Path

import gym_telemetry_semconv as semconv
from gym_sidecar.webui.app import ViewConfig
from gym_sidecar.webui.waterfall import PAGE_ROWS
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.sidecar.webui.data import AGENT, SpanSpec, gym_trace, new_id, request, write
from tests.sidecar.webui.serve import Clock, get, serve

NOW = time.time_ns()
HOSTILE = (
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(2)>',
    "javascript:alert(3)",
    "'><svg onload=alert(4)>",
)
LONG = "A" * 50_000


def hostile_trace(trace_id: bytes) -> list[SpanSpec]:
    root, child = new_id(), new_id()
    attrs = {h: h for h in HOSTILE} | {"url.full": "javascript:alert(5)", "long": LONG}
    return [
        SpanSpec(
            HOSTILE[0],
            HOSTILE[1],
            root,
            b"",
            NOW - 10**9,
            NOW - 5 * 10**8,
            Span.SpanKind.SPAN_KIND_SERVER,
            HOSTILE[2],
            attrs,
            error=HOSTILE[3],
            events=[(HOSTILE[0], {HOSTILE[1]: HOSTILE[2]})],
            resource={HOSTILE[3]: HOSTILE[0]},
        ),
        SpanSpec(
            HOSTILE[1],
            semconv.SPAN_ROLLOUT,
            child,
            root,
            NOW - 9 * 10**8,
            NOW - 6 * 10**8,
            scope=semconv.scope_name(semconv.GROUP_ROLLOUT),
            attrs={semconv.ROLLOUT_ID: HOSTILE[1], "long": LONG},
        ),
    ]


def test_hostile_strings_are_text_and_never_links(tmp_path: Path) -> None:
    path = tmp_path / "traces.db"
    tid = new_id(16)
    write(path, [request(tid, hostile_trace(tid))], NOW - 60 * 10**9)
    with serve(ViewConfig(path)) as url:
        pages = {
            "rollouts": get(url + "/rollouts").text,
            "trace": get(f"{url}/trace/{tid.hex()}").text,
            "map": get(url + "/map").text,
            "stats": get(url + "/stats").text,
            "filter": get(url + "/rollouts?server=%3Cscript%3E&rollout=%22%3E%3Cimg").text,
        }
        for name, text in pages.items():
            for h in HOSTILE[:2] + HOSTILE[3:]:
                assert h not in text, (name, h)
            assert "<img" not in text and "<svg onload" not in text, name
            # the only script is the project's own file; no data reaches an href
            assert re.findall(r"<script[^>]*>", text) == ['<script src="/static/ui.js" defer>']
            for href in re.findall(r'href="([^"]*)"', text):
                assert not html.unescape(href).lower().startswith("javascript:"), (name, href)
        trace = pages["trace"]
        assert html.escape(HOSTILE[0]) in trace and html.escape(HOSTILE[1]) in trace
        # an over-long value is cut, and says so
        assert LONG not in trace and "more characters)" in trace
        assert len(trace) < 200_000
        api = get(f"{url}/api/traces/{tid.hex()}")
        assert api.headers["content-type"].startswith("application/json")


def test_a_trace_of_10000_spans_renders_in_bounded_pages(tmp_path: Path) -> None:
    path = tmp_path / "traces.db"
    tid = new_id(16)
    root = new_id()
    specs = [
        SpanSpec(AGENT, "POST /run", root, b"", NOW - 10**10, NOW, Span.SpanKind.SPAN_KIND_SERVER)
    ]
    parent = root
    for i in range(9_999):
        sid = new_id()
        # half a chain (deep), half flat under the root (wide)
        specs.append(
            SpanSpec(
                AGENT,
                f"step {i}",
                sid,
                parent if i < 5000 else root,
                NOW - 10**10 + i * 10**6,
                NOW - 10**6,
            )
        )
        if i < 5000:
            parent = sid
    write(path, [request(tid, specs[:5000]), request(tid, specs[5000:])], NOW - 60 * 10**9)
    with serve(ViewConfig(path)) as url:
        first = get(f"{url}/trace/{tid.hex()}")
        assert first.status == 200
        assert first.text.count('data-testid="span"') == PAGE_ROWS
        assert 'data-spans="10000"' in first.text
        assert f'data-pages="{10_000 // PAGE_ROWS}"' in first.text
        last = get(f"{url}/trace/{tid.hex()}?page={10_000 // PAGE_ROWS - 1}")
        assert last.text.count('data-testid="span"') == PAGE_ROWS
        assert len(first.text) < 2_000_000
        # the Jaeger API returns the whole trace (the UI asked for it)
        assert len(get(f"{url}/api/traces/{tid.hex()}").json()["data"][0]["spans"]) == 10_000


def _state(url: str, trace_id: str) -> tuple[str, int]:
    text = get(f"{url}/trace/{trace_id}").text
    [state] = re.findall(r'data-state="(\w+)"', text)
    [spans] = re.findall(r'data-spans="(\d+)"', text)
    return state, int(spans)


def test_completeness_as_spans_arrive(tmp_path: Path) -> None:
    """Spans arrive the way exporters send them: each process exports a span when it
    ends, so children come before their parents, and the model server's spans may
    come after the agent's root."""
    path = tmp_path / "traces.db"
    clock = Clock()
    tid, specs = gym_trace("c-0", NOW - 10**9)
    run, rollout, mcall, mserver, vcall, vserver, verify = specs
    with serve(ViewConfig(path, settle_s=30, clock_ns=clock)) as url:
        write(path, [request(tid, [verify, vserver])], clock())  # the resources server's
        assert _state(url, tid.hex()) == ("arriving", 2)
        clock.offset_ns = 60 * 10**9  # a minute later nothing more came: incomplete
        assert _state(url, tid.hex()) == ("incomplete", 2)
        clock.offset_ns = 0
        write(path, [request(tid, [mcall, vcall, rollout, run])], clock())  # the agent's
        # a root, no span misses its parent, but the model call has no server span yet
        assert _state(url, tid.hex()) == ("arriving", 6)
        write(path, [request(tid, [mserver])], clock())
        assert _state(url, tid.hex()) == ("complete", 7)


def test_a_store_written_while_read_never_shows_a_half_trace_as_complete(
    tmp_path: Path,
) -> None:
    path = tmp_path / "traces.db"
    write(path, [])  # create the file
    total = 40
    ids: list[str] = []
    done = threading.Event()

    def writer() -> None:
        for i in range(total):
            tid, specs = gym_trace(f"w{i}", NOW + i)
            # exporters send children first; the agent's root comes last
            write(path, [request(tid, specs[5:])])
            ids.append(tid.hex())
            write(path, [request(tid, specs[3:5])])
            write(path, [request(tid, specs[:3])])
        done.set()

    # settle_s=0: only the trace's structure decides, never the clock
    with serve(ViewConfig(path, settle_s=0)) as url:
        thread = threading.Thread(target=writer)
        thread.start()
        seen: dict[str, set[tuple[str, int]]] = {}
        while not done.is_set() or len(seen) < total:
            for tid in list(ids):
                state = _state(url, tid)
                seen.setdefault(tid, set()).add(state)
                assert state[0] != "complete" or state[1] == 7, (tid, state)
            if done.is_set() and len(seen) >= total:
                break
        thread.join(timeout=60)
        assert all(_state(url, tid) == ("complete", 7) for tid in ids)
