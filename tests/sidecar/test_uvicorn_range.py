"""Both ends of the uvicorn range the sidecar declares, tested for real.

``gym_sidecar.asgi_listener`` subclasses uvicorn's private ``HttpToolsProtocol`` (its
parser callbacks, ``transport``, ``cycle``, ``timeout_keep_alive``), so the sidecar
declares a bounded range (``sidecar/pyproject.toml``), like the agent's SDK range
(``tests/agent/test_sdk_range.py``). For each end this installs the sidecar with that
end's uvicorn into a throw-away venv (``uv venv`` + ``uv pip install``; packages from
the registry or uv's cache) and runs ``uvicorn_range_child.py`` there: one request
served through the subclassed protocol, one refused for oversized headers (431) and
counted. Lowest end: the declared floor, pinned; highest: what the resolver picks
inside the bounds.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.support.range_venv import floor, install_venv

REPO = Path(__file__).resolve().parents[2]
SIDECAR = REPO / "sidecar"
SEMCONV = REPO / "semconv"
CHILD = Path(__file__).with_name("uvicorn_range_child.py")


def _declared() -> SpecifierSet:
    import tomllib

    deps = tomllib.loads((SIDECAR / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d.removeprefix("uvicorn") for d in deps if d.startswith("uvicorn")]
    return SpecifierSet(spec)


def test_the_uvicorn_range_is_bounded_on_both_sides() -> None:
    operators = {s.operator for s in _declared()}
    assert ">=" in operators and "<" in operators, str(_declared())


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_the_guarded_protocol_works_at_each_end_of_the_uvicorn_range(
    tmp_path: Path, end: str
) -> None:
    declared = _declared()
    pins = [f"uvicorn=={floor(declared)}"] if end == "lowest" else []
    python, env = install_venv(
        tmp_path / "venv",
        [str(SEMCONV), str(SIDECAR), *pins],
        venv_timeout=300,
        install_timeout=900,
    )
    # A copy outside tests/sidecar/, whose inspect/ folder would shadow the standard
    # library's inspect as the script's own directory comes first on sys.path.
    script = tmp_path / CHILD.name
    script.write_text(CHILD.read_text())
    child = subprocess.run(
        [python, str(script)],
        timeout=300,
        cwd=tmp_path,  # not the repository: only the installed sidecar is importable
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    print(end, report)  # shown with -s / -rA: which uvicorn each end resolved to
    got = Version(report["uvicorn"])
    assert got in declared, report
    if end == "lowest":
        assert got == Version(floor(declared))
    assert report["served"] == "HTTP/1.1 200 OK ok", report
    assert report["refused"] == "HTTP/1.1 431 Request Header Fields Too Large", report
    assert report["header_limit_hits"] == 1, report
