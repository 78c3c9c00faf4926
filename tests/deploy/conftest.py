"""The deployment tests' Docker engine (``tests/support/docker_daemon.py``), shared by the
modules that run containers, and released (the daemon stopped if the tooling started it)
at the end of the session. Before any image is built, the native scanner's wheel that
``make test`` built is put where the sidecar image installs it from
(:mod:`testkit.native_wheel`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import native_wheel
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
        native_wheel.stage()
        yield engine
    finally:
        engine.release()


@pytest.fixture(scope="session")
def staged_native_wheel(docker_engine: Engine) -> Path:
    """The native scanner's wheel the sidecar image was built with; skips where this
    environment has no native scanner (fails with ``GYM_TEST_NATIVE=required``)."""
    wheel = native_wheel.stage()
    if wheel is None:
        reason = (
            "gym_sidecar_native is not installed here, so the sidecar image is built "
            "without it (`uv sync --frozen --group native` builds it, as make test does)"
        )
        if os.environ.get("GYM_TEST_NATIVE") == "required":
            pytest.fail(f"GYM_TEST_NATIVE=required: {reason}")
        pytest.skip(reason)
    return wheel
