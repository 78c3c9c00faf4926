#!/usr/bin/env python3
"""Build, cache and reuse a Python 3.11 environment holding the real NeMo Gym release.

Usage::

    python3 scripts/gym_env.py ensure          # build if absent/incomplete; print its python
    python3 scripts/gym_env.py install-agent   # ensure, then (re)install the agent and
                                               # semconv wheels built from the current
                                               # tree; print python
    python3 scripts/gym_env.py path            # print where the env lives (no build)
    python3 scripts/gym_env.py --recipe lens ensure   # the same for another recipe

Recipes (``--recipe``):

- ``agent`` (default): Python 3.11, Gym and this project's agent, plus
  ``EXTRA_PACKAGES``.
- ``lens``: Python 3.13, Gym, the agent and ``nemo-lens`` 0.1.0 from PyPI with the
  OpenTelemetry SDK, exporters and the FastAPI / aiohttp-client instrumentations
  (``LENS_PACKAGES``): the environment in which Gym's *own* telemetry
  (``nemo_gym.telemetry``) can run, for the tests of the sidecar against upstream's code
  (docs/nemo-gym.md, "Gym's own telemetry"). Why 3.13: nemo-lens 0.1.0 declares
  ``Requires-Python >=3.13`` and its ``nemo/lens/strategies.py`` uses the ``type``
  statement (PEP 695, Python 3.12+), so on 3.11 importing ``nemo_gym.telemetry`` with
  lens installed raises SyntaxError, which Gym's ``except ImportError`` fallback does
  not catch. The interpreter is ``$GYM_TELEMETRY_LENS_PYTHON``, else a ``python3.13``
  that runs, else pyenv's newest 3.13. What PyPI's lens lacks for Gym 0.7.0
  (``SpanRegistry``, two resource-attribute names) is not installed here: the tests
  put a stand-in on ``PYTHONPATH`` (``testkit/lens_standin``).

Why a separate environment: nemo-gym 0.7.0 declares ``Requires-Python >=3.13.14`` and pulls
~1.5 GB of dependencies (ray, pyarrow, scipy, ...). Its code runs on 3.11, so the env is
built in three steps: download the wheel alone ignoring ``Requires-Python``, install its
non-extra ``Requires-Dist`` (plus the agent's own dependencies) with ``--prefer-binary``,
then install the wheel itself with ``--no-deps --ignore-requires-python``.

Contract:
- The env lives outside the repository, in
  ``$GYM_TELEMETRY_CACHE`` (default ``~/.cache/gym-telemetry``)
  ``/gym-env/nemo-gym-<version>-py<maj.min>[-<recipe>]-<hash>/`` (no recipe part for
  ``agent``); the hash covers everything installed (Gym version, Python version, the
  agent's dependency list, the recipe's packages and version).
- A ``.complete`` marker is written only after every step succeeded; an env without it
  is deleted and rebuilt. A lock file serialises concurrent callers (they wait).
- Only the standard library and pip are needed; packages come from the configured
  package index (PyPI).
- ``install-agent`` builds real (non-editable) wheels of ``semconv/`` and ``agent/`` and
  force-reinstalls them without dependencies, so what runs is the installed activation
  path (``.pth``). ``gym-telemetry-semconv`` is a workspace member, not on PyPI: it is
  left out of the env's dependency list (and its hash) and installed from its wheel.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

GYM_PACKAGE = "nemo-gym"
GYM_VERSION = os.environ.get("GYM_TELEMETRY_NEMO_GYM_VERSION", "0.7.0")
# Bump when the build steps change, so old caches are not reused.
RECIPE_VERSION = "2"
#: Third-party packages the real-Gym tests need beyond Gym and the agent, installed in the
#: same resolver run: the SWE harness ``mini_swe_agent_2`` imports (``minisweagent``,
#: ``swebench``) and the OpenTelemetry instrumentations the agent turns on for a harness's
#: own HTTP clients (``gym_telemetry.autoinstrument.harness_http``). Part of the hash.
EXTRA_PACKAGES = (
    "mini-swe-agent==2.1.0",
    "swebench==4.1.0",
    "opentelemetry-instrumentation-httpx>=0.48b0",
    "opentelemetry-instrumentation-aiohttp-client>=0.48b0",
)
#: The ``lens`` recipe's packages beyond Gym and the agent: PyPI's nemo-lens with the SDK
#: and exporters (``sdk``) and the instrumentations Gym's own telemetry turns on
#: (``fastapi``: the SERVER span per request; ``aiohttp``). Part of that recipe's hash.
LENS_PACKAGES = ("nemo-lens[sdk,fastapi,aiohttp]==0.1.0",)
#: Bump when the ``lens`` recipe's build steps change.
LENS_RECIPE_VERSION = "1"
REPO_ROOT = Path(__file__).resolve().parent.parent
AGENT_DIR = REPO_ROOT / "agent"
SEMCONV_DIR = REPO_ROOT / "semconv"
#: Distributions of this workspace: installed from wheels built here, never from PyPI.
WORKSPACE_DISTRIBUTIONS = frozenset({"gym-telemetry-semconv"})
MARKER = ".complete"
_EXTRA_MARKER = re.compile(r"\bextra\s*==")


@dataclass(frozen=True)
class Recipe:
    """What one cached environment holds (module doc, "Recipes")."""

    name: str
    python: tuple[int, int]
    python_env: str
    """Environment variable naming the interpreter to build from."""
    version: str
    packages: tuple[str, ...]
    checks: tuple[str, ...]
    """Imports that must work once the env is built (each a ``python -c`` line)."""


RECIPES = {
    "agent": Recipe(
        "agent",
        (3, 11),
        "GYM_TELEMETRY_GYM_PYTHON",
        RECIPE_VERSION,
        EXTRA_PACKAGES,
        (
            "import nemo_gym.server_utils, fastapi, aiohttp, opentelemetry.sdk",
            "import minisweagent, swebench, opentelemetry.instrumentation.httpx",
        ),
    ),
    "lens": Recipe(
        "lens",
        (3, 13),
        "GYM_TELEMETRY_LENS_PYTHON",
        LENS_RECIPE_VERSION,
        LENS_PACKAGES,
        (
            "import nemo_gym.server_utils, fastapi, aiohttp, opentelemetry.sdk",
            "import nemo.lens.helpers, nemo_gym.telemetry.setup",
            "import opentelemetry.instrumentation.fastapi, opentelemetry.exporter.otlp",
        ),
    ),
}
RECIPE = RECIPES["agent"]
"""The recipe this run builds (``--recipe``)."""


def _log(msg: str) -> None:
    print(f"gym_env: {msg}", file=sys.stderr, flush=True)


def _runs(python: str, version: tuple[int, int]) -> bool:
    """Whether ``python`` starts and is Python ``version``."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == "{}.{}".format(*version)


def _pyenv_pythons(version: tuple[int, int]) -> list[str]:
    """pyenv's interpreters of ``version``, newest first (none without pyenv)."""
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    found = sorted(
        Path(root, "versions").glob("{}.{}.*".format(*version)),
        key=lambda p: [int(x) if x.isdigit() else -1 for x in p.name.split(".")],
        reverse=True,
    )
    return [str(p / "bin" / "python{}.{}".format(*version)) for p in found]


def _base_python() -> str:
    """The interpreter the recipe's env is created from (module doc)."""
    explicit = os.environ.get(RECIPE.python_env)
    if explicit:
        return explicit
    if sys.version_info[:2] == RECIPE.python:
        return sys.executable
    candidates = [
        shutil.which("python{}.{}".format(*RECIPE.python)),
        *_pyenv_pythons(RECIPE.python),
    ]
    for candidate in candidates:
        if candidate is not None and _runs(candidate, RECIPE.python):
            return candidate
    raise SystemExit(
        "gym_env: Python {}.{} is needed (set {})".format(*RECIPE.python, RECIPE.python_env)
    )


def _agent_dependencies() -> list[str]:
    with (AGENT_DIR / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    deps: list[str] = [
        d
        for d in project.get("dependencies", [])
        if _requirement_name(d) not in WORKSPACE_DISTRIBUTIONS
    ]
    return sorted(deps)


def _requirement_name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement string."""
    name = re.split(r"[\s\[<>=!~;(@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _python_tag(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def env_dir() -> Path:
    """Where the env for the current recipe lives (it may not exist yet)."""
    cache = Path(os.environ.get("GYM_TELEMETRY_CACHE", Path.home() / ".cache" / "gym-telemetry"))
    pyver = _python_tag(_base_python())
    key = "\n".join(
        [GYM_PACKAGE, GYM_VERSION, pyver, RECIPE.version, *_agent_dependencies(), *RECIPE.packages]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    tag = "" if RECIPE.name == "agent" else f"-{RECIPE.name}"
    return cache / "gym-env" / f"nemo-gym-{GYM_VERSION}-py{pyver}{tag}-{digest}"


def env_python(root: Path) -> Path:
    return root / "bin" / "python"


def _run(cmd: list[str]) -> None:
    """Run a build step; its output goes to stderr (stdout carries only the result)."""
    _log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def _gym_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines that are not behind an ``extra ==`` marker."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta_name).decode()
    reqs: list[str] = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        _, _, marker = req.partition(";")
        if _EXTRA_MARKER.search(marker):
            continue
        reqs.append(req)
    return reqs


def _build(root: Path) -> None:
    if root.exists():
        _log(f"removing incomplete env {root}")
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    _run([_base_python(), "-m", "venv", str(root)])
    py = str(env_python(root))
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "--quiet", "--upgrade", "pip", "wheel"])
    wheels = root / "gym-wheel"
    _run(
        [
            *pip,
            "download",
            "--no-deps",
            "--ignore-requires-python",
            "--dest",
            str(wheels),
            f"{GYM_PACKAGE}=={GYM_VERSION}",
        ]
    )
    wheel = next(wheels.glob("*.whl"))
    reqs = [*_gym_requirements(wheel), *_agent_dependencies(), *RECIPE.packages]
    req_file = root / "gym-requirements.txt"
    req_file.write_text("\n".join(reqs) + "\n")
    _run([*pip, "install", "--prefer-binary", "-r", str(req_file)])
    _run([*pip, "install", "--no-deps", "--ignore-requires-python", str(wheel)])
    for check in RECIPE.checks:
        _run([py, "-c", check])
    (root / MARKER).write_text(f"{GYM_PACKAGE}=={GYM_VERSION}\n")


def ensure() -> Path:
    """Return the env's python, building the env first when absent or incomplete.

    Blocks while another caller builds it (file lock next to the env directory).
    """
    root = env_dir()
    if (root / MARKER).exists():
        return env_python(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.with_name(root.name + ".lock")
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (root / MARKER).exists():
                _log(f"building {root} (takes a few minutes the first time)")
                started = time.monotonic()
                _build(root)
                _log(f"built {root} in {time.monotonic() - started:.0f} s")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return env_python(root)


def _build_wheel(project: Path, out_dir: Path) -> Path:
    """Build ``project``'s wheel into ``out_dir`` (uv if present, else pip) and return it."""
    before = set(out_dir.glob("*.whl"))
    uv = shutil.which("uv")
    if uv is not None:
        _run([uv, "build", "--wheel", "--quiet", "--out-dir", str(out_dir), str(project)])
    else:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--quiet",
                "--wheel-dir",
                str(out_dir),
                str(project),
            ]
        )
    (wheel,) = set(out_dir.glob("*.whl")) - before
    return wheel


def install_agent() -> Path:
    """Ensure the env, then install semconv and the agent from the current tree as wheels."""
    python = ensure()
    root = python.parent.parent
    lock_path = root.with_name(root.name + ".lock")
    with tempfile.TemporaryDirectory() as tmp, lock_path.open("w") as lock:
        wheels = [_build_wheel(SEMCONV_DIR, Path(tmp)), _build_wheel(AGENT_DIR, Path(tmp))]
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--force-reinstall",
                    *map(str, wheels),
                ]
            )
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return python


def main(argv: list[str] | None = None) -> int:
    global RECIPE  # noqa: PLW0603 -- one recipe per run of this script
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="agent")
    parser.add_argument("command", choices=["ensure", "install-agent", "path"])
    args = parser.parse_args(argv)
    RECIPE = RECIPES[args.recipe]
    if args.command == "path":
        print(env_dir())
    elif args.command == "ensure":
        print(ensure())
    else:
        print(install_agent())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
