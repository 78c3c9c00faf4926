"""Reloading span groups from the real config file: on change on disk and on demand."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gym_sidecar.config import load_config
from gym_sidecar.gating.config import Mode
from gym_sidecar.gating.reload import ConfigReloader
from gym_sidecar.gating.state import SpanGroupState
from gym_sidecar.selfmetrics import SelfMetrics


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    # Make the change visible to a stat-based check even within one mtime tick.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_file_change_applies_and_invalid_file_keeps_policy(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    write(path, "span_groups:\n  spec: default\n")
    metrics = SelfMetrics()
    state = SpanGroupState(load_config(path, environ={}).span_groups, metrics)
    reloader = ConfigReloader(state, path, lambda: load_config(path, environ={}).span_groups)
    reloader.baseline()

    async def scenario() -> None:
        assert not await reloader.check_once()  # unchanged file: nothing
        write(path, "span_groups:\n  spec: default,verify\n  modes: {verify: metrics}\n")
        assert await reloader.check_once()
        assert state.policy.generation == 2
        assert state.policy.for_service("x").modes["verify"] is Mode.METRICS
        write(path, "span_groups:\n  spec: default,verfy\n")
        assert await reloader.check_once()
        assert state.policy.generation == 2  # refused, old policy stays
        write(path, "span_groups:\n  spec: default,verify\n  modes: {verify: metrics}\n")
        await reloader.check_once()
        assert state.policy.generation == 2  # same content as in force: unchanged

    asyncio.run(scenario())
    changes = "gym_sidecar_span_group_changes_total"
    assert metrics.registry.get_sample_value(changes, {"source": "file", "outcome": "invalid"}) == 1
    assert metrics.registry.get_sample_value(changes, {"source": "file", "outcome": "applied"}) == 1


def test_reload_discards_put_changes(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    write(path, "span_groups:\n  spec: all\n")
    state = SpanGroupState(load_config(path, environ={}).span_groups, SelfMetrics())
    reloader = ConfigReloader(state, path, lambda: load_config(path, environ={}).span_groups)
    state.replace_policy(state.settings.policy().model_copy(update={"spec": "none"}))
    assert state.policy.for_service(None).enabled == frozenset()
    assert reloader.reload("sighup")
    assert len(state.policy.for_service(None).enabled) == 8
