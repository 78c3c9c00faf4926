"""Gym's own ``nemo_gym.telemetry`` call sites resolve to gym_telemetry in a real Gym install.

In the cached nemo-gym 0.7.0 environment, with ``GYM_TELEMETRY=1``, a fresh interpreter
imports the Gym modules that hold call sites (the three base classes, ``server_utils``,
the sandbox API and providers, rollout collection). Every name such a module bound from
``nemo_gym.telemetry._fallbacks`` / ``.spans`` / ``.contrib`` / ``.endpoints`` must be
this project's replacement (the hooks run before any Gym module imports those names);
without the variable they stay Gym's inert fallbacks. This covers the sites the rollout
tests do not reach, such as ``managed_span`` in the sandbox API.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gym, pytest.mark.timeout(600)]

_CHECK = """
import importlib, json
from gym_telemetry.autoinstrument.gym_primitives import REPLACEMENTS
from gym_telemetry.autoinstrument.routes import ENDPOINT_REPLACEMENTS

replacements = {**REPLACEMENTS, "nemo_gym.telemetry.endpoints": ENDPOINT_REPLACEMENTS}
callers = [
    "nemo_gym.server_utils",
    "nemo_gym.base_resources_server",
    "nemo_gym.base_responses_api_agent",
    "nemo_gym.base_responses_api_model",
    "nemo_gym.sandbox.api",
    "nemo_gym.sandbox.providers.daytona.provider",
    "nemo_gym.sandbox.providers.opensandbox.provider",
    "nemo_gym.rollout_collection",
]
bound, missing = {}, []
for caller in callers:
    try:
        module = importlib.import_module(caller)
    except ImportError as exc:  # an optional provider dependency
        missing.append(f"{caller}: {exc}")
        continue
    for source, names in replacements.items():
        defining = importlib.import_module(source)
        for name, ours in names.items():
            if not callable(ours):
                continue
            if getattr(defining, name) is not ours:
                bound[f"{source}.{name}"] = "not replaced in its module"
            if name in vars(module):
                value = vars(module)[name]
                bound[f"{caller}.{name}"] = "ours" if value is ours else repr(value)
print(json.dumps({"bound": bound, "missing": missing}))
"""


def _check(gym_python: Path, activated: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_TELEMETRY")}
    if activated:
        env["GYM_TELEMETRY"] = "1"
    out = subprocess.run(
        [str(gym_python), "-c", _CHECK],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_gym_call_sites_run_through_gym_telemetry(gym_python: Path) -> None:
    result = _check(gym_python, activated=True)
    bound = result["bound"]
    assert isinstance(bound, dict)
    assert result["missing"] == [], result["missing"]
    # the call sites named in docs/nemo-gym.md, each bound by name in its Gym module
    for site in (
        "nemo_gym.server_utils.is_span_group_enabled",
        "nemo_gym.server_utils.safe_set_span_attributes",
        "nemo_gym.sandbox.api.managed_span",
        "nemo_gym.sandbox.api.is_span_group_enabled",
        "nemo_gym.base_responses_api_agent.traced_rollout_endpoint",
        "nemo_gym.base_resources_server.traced_verify_endpoint",
    ):
        assert site in bound, sorted(bound)
    assert {site: v for site, v in bound.items() if v != "ours"} == {}


def test_without_the_variable_gym_keeps_its_own(gym_python: Path) -> None:
    bound = _check(gym_python, activated=False)["bound"]
    assert isinstance(bound, dict)
    assert bound and all(v != "ours" for v in bound.values()), bound
