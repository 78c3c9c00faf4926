"""One process, one telemetry: with the agent active, Gym's own ``setup_telemetry``
(which builds nemo-lens's providers and exporters once Lens can run) is skipped; it
runs only when the agent's SDK did not start. The real Gym and Lens side of this is
``tests/gym/test_gym_own_telemetry.py``."""

from __future__ import annotations

import types

import pytest
from gym_telemetry.autoinstrument import identity, install


class SimpleServer:
    """Stands for Gym's ``nemo_gym.server_utils.SimpleServer`` in a module object."""

    calls: list[str]

    def setup_telemetry(self) -> None:
        self.calls.append("gym")


@pytest.mark.parametrize(("ours_started", "expected"), [(True, ["ours"]), (False, ["ours", "gym"])])
def test_gym_setup_runs_only_when_the_agent_does_not_export(
    monkeypatch: pytest.MonkeyPatch, ours_started: bool, expected: list[str]
) -> None:
    module = types.ModuleType("nemo_gym.server_utils")
    cls = type("SimpleServer", (SimpleServer,), {})
    module.SimpleServer = cls  # type: ignore[attr-defined]
    server = cls()
    server.calls = []

    def start(srv: SimpleServer) -> bool:
        srv.calls.append("ours")
        return ours_started

    monkeypatch.setattr(identity, "start_server_telemetry", start)
    install.patch_server_utils(module)
    install.patch_server_utils(module)  # idempotent: wrapped once
    server.setup_telemetry()
    assert server.calls == expected
