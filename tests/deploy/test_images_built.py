"""The project's images, built for real from ``deploy/docker/*.Dockerfile`` by Compose v2
(BuildKit, each Dockerfile's own ``.dockerignore``) on the tests' Docker engine.

``tests/deploy/images.yaml`` names the three images as compose builds them
(``gym-server``, which is also the rollout driver's, ``gym-telemetry-sidecar``,
``gym-telemetry-webhook``). Each: runs as a non-root user, prints ``--version``, and
answers its health check; the sidecar image holds neither the agent nor the
OpenTelemetry SDK or OTLP exporter (looked up inside the image); sizes are printed.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.otlp_samples import http_post, trace_request
from testkit.wait import wait_for
from tests.deploy.support import REPO
from tests.support.docker_daemon import Engine
from tests.support.docker_images import PROJECT_IMAGES_FILE, build_project_images
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(5400),
]  # a cold first run builds Compose and images

IMAGES_FILE = PROJECT_IMAGES_FILE
GYM_SERVER = "gym-server:0.1.0"
SIDECAR = "gym-telemetry-sidecar:0.1.0"
WEBHOOK = "gym-telemetry-webhook:0.1.0"


def _run(engine: Engine, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return engine.docker("run", "--rm", *args, timeout_s=timeout_s, check=False)


@pytest.fixture(scope="module")
def images(docker_engine: Engine) -> Iterator[dict[str, dict[str, Any]]]:
    """Build the three images (the layer cache makes this seconds after the first time)."""
    build_project_images(docker_engine)
    docs = {ref: docker_engine.inspect(ref) for ref in (GYM_SERVER, SIDECAR, WEBHOOK)}
    sizes = {ref: f"{int(doc['Size']) / 1e6:.0f} MB" for ref, doc in docs.items()}  # type: ignore[call-overload]
    print(f"image sizes: {json.dumps(sizes)}")
    yield docs


def test_images_yaml_builds_what_docker_compose_yml_builds() -> None:
    ours = yaml.safe_load(IMAGES_FILE.read_text())["services"]
    theirs = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]

    def build(service: dict[str, Any], base: Path) -> tuple[Path, str]:
        return (base / service["build"]["context"]).resolve(), service["build"]["dockerfile"]

    built = {s["image"]: build(s, REPO) for s in theirs.values() if "build" in s}
    assert set(built) == {GYM_SERVER, SIDECAR}
    for service in ours.values():
        if service["image"] in built:
            assert build(service, IMAGES_FILE.parent) == built[service["image"]], service


@pytest.mark.parametrize("ref", [GYM_SERVER, SIDECAR, WEBHOOK])
def test_image_runs_as_non_root(images: dict[str, dict[str, Any]], ref: str) -> None:
    user = images[ref]["Config"]["User"]
    assert user and not user.startswith(("0", "root")), (ref, user)


def test_versions(docker_engine: Engine, images: dict[str, dict[str, Any]]) -> None:
    sidecar = _run(docker_engine, SIDECAR, "--version")
    assert sidecar.returncode == 0 and sidecar.stdout.strip() == "gym-sidecar 0.1.0", sidecar
    webhook = _run(docker_engine, "--entrypoint", "gym-sidecar", WEBHOOK, "--version")
    assert webhook.returncode == 0 and webhook.stdout.strip() == "gym-sidecar 0.1.0", webhook
    server = _run(docker_engine, GYM_SERVER, "--version")
    assert server.returncode == 0, server
    assert "gym-telemetry-agent 0.1.0" in server.stdout and "nemo-gym 0.7.0" in server.stdout
    # the rollout driver (the same image, its own entrypoint) reports a bad agent URL
    driver = _run(
        docker_engine, "-e", "AGENT_URL=http://127.0.0.1:9", "-e", "WAIT_S=1",
        "--entrypoint", "python", GYM_SERVER, "/usr/local/bin/gym-rollout-driver",
    )  # fmt: skip
    assert driver.returncode != 0 and "not healthy" in driver.stderr, driver


PROBE = """
import importlib.util, json
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
print(json.dumps({m: found(m) for m in ['gym_sidecar', 'gym_telemetry_semconv',
    'gym_telemetry', 'opentelemetry.sdk', 'opentelemetry.exporter.otlp', 'aiohttp',
    'jsonpatch']}))
"""


def test_sidecar_image_holds_no_agent_and_no_sdk(
    docker_engine: Engine, images: dict[str, dict[str, Any]]
) -> None:
    found = _run(docker_engine, "--entrypoint", "python", SIDECAR, "-c", PROBE)
    assert found.returncode == 0, found
    assert json.loads(found.stdout) == {
        "gym_sidecar": True,
        "gym_telemetry_semconv": True,
        "gym_telemetry": False,
        "opentelemetry.sdk": False,
        "opentelemetry.exporter.otlp": False,
        "aiohttp": False,
        "jsonpatch": False,
    }
    pth = _run(
        docker_engine, "--entrypoint", "sh", SIDECAR, "-c",
        "ls /opt/gym-sidecar/lib/python3*/site-packages | grep -c autoinstrument || true",
    )  # fmt: skip
    assert pth.stdout.strip() == "0", pth
    webhook = _run(docker_engine, "--entrypoint", "python", WEBHOOK, "-c", PROBE)
    assert json.loads(webhook.stdout)["aiohttp"] is True, webhook


# Run in the sidecar image as its user: the optimisation level, and every module that
# `gym-sidecar run` imports whose bytecode at that level was not compiled at build.
OPTIMIZED_PROBE = """
import json, os, sys
import gym_sidecar.cli, gym_sidecar.server
missing = sorted(
    name for name, m in list(sys.modules.items())
    if getattr(m, "__cached__", None) and not os.path.exists(m.__cached__)
)
print(json.dumps({"optimize": sys.flags.optimize, "docstring": gym_sidecar.server.__doc__,
                  "modules": len(sys.modules), "missing": missing}))
"""


def test_sidecar_image_runs_optimized_on_precompiled_bytecode(
    docker_engine: Engine, images: dict[str, dict[str, Any]]
) -> None:
    found = _run(docker_engine, "--entrypoint", "python", SIDECAR, "-c", OPTIMIZED_PROBE)
    assert found.returncode == 0, found
    probe = json.loads(found.stdout)
    assert (probe["optimize"], probe["docstring"]) == (2, None), probe
    assert probe["modules"] > 100, probe  # the probe did import the sidecar
    assert probe["missing"] == [], probe  # none compiled again at each start


def test_sidecar_image_healthcheck_turns_healthy(
    docker_engine: Engine, images: dict[str, dict[str, Any]]
) -> None:
    assert images[SIDECAR]["Config"]["Healthcheck"]["Test"][0] == "CMD"
    started = docker_engine.docker(
        "run", "--detach", "--rm", "--health-interval", "2s", SIDECAR, timeout_s=120
    )
    container = started.stdout.strip()
    try:

        def status() -> str:
            doc = docker_engine.inspect(container)
            return str(doc["State"]["Health"]["Status"])  # type: ignore[index]

        assert wait_for(lambda: status() == "healthy", 300, 1.0), status()
    finally:
        docker_engine.docker("rm", "--force", container, check=False, timeout_s=120)


def test_sidecar_container_runs_the_native_scanner(
    docker_engine: Engine, images: dict[str, dict[str, Any]], staged_native_wheel: Path
) -> None:
    """The image carries the wheel make test built, and the running sidecar uses it: its
    /metrics says so before any trace, its log says so once, and a trace through the
    container is scanned (received and exported) by it."""
    port, otlp_port = free_port(), free_port()
    started = docker_engine.docker(
        "run", "--detach", "--rm",
        "--publish", f"127.0.0.1:{port}:13133", "--publish", f"127.0.0.1:{otlp_port}:4318",
        "--env", "GYM_SIDECAR_ADMIN_LISTEN=0.0.0.0:13133",
        "--env", "GYM_SIDECAR_HTTP_LISTEN=0.0.0.0:4318", SIDECAR, timeout_s=120,
    )  # fmt: skip
    container = started.stdout.strip()
    try:

        def metrics() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return str(r.read().decode())
            except OSError:
                return ""

        assert wait_for(lambda: "gym_sidecar_trace_scanner_info" in metrics(), 300, 1.0)
        assert 'gym_sidecar_trace_scanner_info{scanner="native"} 1.0' in metrics()
        assert 'scanner="python"' not in metrics()
        logs = docker_engine.docker("logs", container).stderr
        assert logs.count("trace scanner: native (gym_sidecar_native)") == 1, logs[-3000:]
        found = _run(
            docker_engine, "--entrypoint", "python", SIDECAR, "-c",
            "import gym_sidecar_native as m, importlib.metadata as md; "
            "print(md.version('gym-telemetry-sidecar-native'), m.__file__)",
        )  # fmt: skip
        assert found.returncode == 0, found
        assert found.stdout.startswith("0.1.0 /opt/gym-sidecar/"), found.stdout
        sent = http_post(
            f"http://127.0.0.1:{otlp_port}",
            "traces",
            trace_request("native", 7).SerializeToString(),
        )
        assert sent.status_code == 200, sent.text
        assert 'gym_sidecar_received_items_total{signal="traces",transport="http"} 7.0' in (
            metrics()
        )
        print(f"sidecar image: {staged_native_wheel.name}; {found.stdout.strip()}")
    finally:
        docker_engine.docker("rm", "--force", container, check=False, timeout_s=120)


def test_webhook_image_answers_healthz(
    docker_engine: Engine, images: dict[str, dict[str, Any]]
) -> None:
    port = free_port()
    started = docker_engine.docker(
        "run", "--detach", "--rm", "--publish", f"127.0.0.1:{port}:8443", WEBHOOK,
        timeout_s=120,
    )  # fmt: skip
    container = started.stdout.strip()
    try:

        def healthz() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        assert wait_for(healthz, 300, 1.0), docker_engine.docker("logs", container).stderr
    finally:
        docker_engine.docker("rm", "--force", container, check=False, timeout_s=120)
