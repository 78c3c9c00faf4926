"""The deployment tests' Docker engine (``tests/support/docker_daemon.py``), shared by the
modules that run containers, and released (the daemon stopped if the tooling started it)
at the end of the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.docker_daemon import Engine, EngineUnavailable, ensure_engine, skip_or_fail
from tests.support.docker_images import ensure_standins


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Engine]:
    try:
        engine = ensure_engine()
    except EngineUnavailable as exc:
        skip_or_fail(exc)
        raise
    try:
        ensure_standins(engine)
        yield engine
    finally:
        engine.release()
