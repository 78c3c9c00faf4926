"""Serve the web view's app in-process on a free loopback port (real sockets, real HTTP)
with a clock the test sets, for the page and API tests."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from gym_sidecar.webui.app import ViewConfig, build_app

from tests.support.ports import free_port


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Clock:
    """A settable ``time_ns``: real time plus ``offset_ns``; with ``anchor_ns``, time that
    starts at ``anchor_ns`` when the clock is made and runs on from there.

    Anchor a clock to the module's ``NOW`` when the data is placed relative to it: the
    module is imported when the suite is collected, so on a long run (a cold ``make
    test`` spends most of an hour on builds first) real time is far past ``NOW`` by the
    time the test runs, and "ten minutes ago" would have become "an hour ago"."""

    def __init__(self, anchor_ns: int | None = None) -> None:
        self.offset_ns = 0 if anchor_ns is None else anchor_ns - time.time_ns()

    def __call__(self) -> int:
        return time.time_ns() + self.offset_ns


@contextmanager
def serve(cfg: ViewConfig) -> Iterator[str]:
    """The base URL of the app for ``cfg`` while the context lasts."""
    port = free_port()
    config = uvicorn.Config(
        build_app(cfg), host="127.0.0.1", port=port, log_config=None, lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the web view did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def get(url: str, method: str = "GET") -> Answer:
    """One request; an HTTP error status is an answer too (not raised)."""
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return Answer(
                resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read().decode()
            )
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode())
