"""Both ends of the OpenTelemetry range the agent declares, tested for real.

The agent reads private SDK fields on its lean paths, so it declares a bounded range
(``agent/pyproject.toml``). For each end this installs the agent with that end's
``opentelemetry-api``/``-sdk``/``-exporter-otlp-proto-grpc`` into a throwaway venv
(``uv venv`` + ``uv pip install``; packages come from PyPI or uv's cache), runs an
export smoke test there (``sdk_range_child.py``) against a recording OTLP/gRPC sink in
this process, and checks what arrived, and which lean paths passed their self-checks on
that SDK (so the newest end silently falling back to the slow path is caught too).

Lowest end: the declared lower bounds, pinned. Highest end: what the resolver picks
inside the declared bounds (the newest release below the upper bound).
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from testkit.sink import RecordingSink
from tests.support.range_venv import floor, install_venv

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "agent"
CHILD = Path(__file__).with_name("sdk_range_child.py")
OTEL = ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc")


def _declared() -> dict[str, SpecifierSet]:
    deps = tomllib.loads((AGENT / "pyproject.toml").read_text())["project"]["dependencies"]
    out: dict[str, SpecifierSet] = {}
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep)
        assert m is not None, dep
        out[m.group(1)] = SpecifierSet(m.group(2))
    return out


def test_the_declared_range_is_bounded_on_both_sides() -> None:
    declared = _declared()
    for name in OTEL:
        operators = {s.operator for s in declared[name]}
        assert ">=" in operators and "<" in operators, (name, str(declared[name]))


@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_export_works_at_each_end_of_the_declared_range(tmp_path: Path, end: str) -> None:
    declared = _declared()
    pins = [f"{name}=={floor(declared[name])}" for name in OTEL] if end == "lowest" else []
    python, env = install_venv(
        tmp_path / "venv", [str(AGENT), *pins], venv_timeout=120, install_timeout=600
    )
    with RecordingSink() as sink:
        child = subprocess.run(
            [python, str(CHILD), sink.endpoint],
            timeout=120,
            cwd=tmp_path,  # not the repository: only the installed agent is importable
            env={**env, "GYM_TELEMETRY_POLL_INTERVAL_S": "0", "OTEL_BSP_SCHEDULE_DELAY": "50"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert child.returncode == 0, child.stderr[-3000:]
        report = json.loads(child.stdout.strip().splitlines()[-1])
        assert sink.wait_spans(3)
        spans = sink.spans()
    print(end, report)  # shown with -s / -rA: which versions each end resolved to
    for name, key in zip(OTEL, ("api", "sdk", "exporter"), strict=True):
        got = Version(report[key])
        assert got in declared[name], (name, report[key])
        if end == "lowest":
            assert got == Version(floor(declared[name]))
    assert report["active"] and report["delivered"]
    assert report["lean_recorder"], f"the lean recorder refused SDK {report['sdk']}"
    if end == "highest":
        # On 1.27 the stock encoder skips None inside arrays and maps (logging an error)
        # where later ones encode an empty value; the lean encoder matches the later
        # ones, so its self-check refuses 1.27 and the stock encoder exports there.
        assert report["lean_encoder"], f"the lean encoder refused SDK {report['sdk']}"
    assert len(spans) == 3
    for span in spans:
        assert span.span.name == "gym.verify"
        assert span.scope == "gym_telemetry.verify"
        assert span.attributes["nemo.gym.rollout.id"] == "r-1"
        assert span.attributes["succeeded"] is True
        assert span.resource["service.name"] == "sdk-range"
