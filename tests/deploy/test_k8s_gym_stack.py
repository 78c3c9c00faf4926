"""The Kubernetes example's Gym servers, run for real without a cluster.

The overlay deploy/k8s/overlays/gym-namespace is rendered with kustomize; each server
Deployment's container command line -- exactly its rendered ``args`` behind the
gym-server image's ENTRYPOINT -- is run with the real launcher
(deploy/docker/gym_server_launch.py) in the cached real NeMo Gym environment, reading
the rendered ConfigMap ``gym-server-config`` where the pod mounts it. The in-image paths
are mapped back to the repository through the Dockerfile's own COPY lines. The hosts
of the config (Service names) are re-addressed to free loopback ports, the only change
made to what the cluster would run. Each server answers its readiness probe's route;
then the rollouts Job's command runs two rollouts through them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import REPO, render
from tests.gym.conftest import gym_python  # noqa: F401  (the session fixture)
from tests.support.ports import free_port, wait_listening

pytestmark = [pytest.mark.gym, pytest.mark.timeout(3600)]  # a first render builds kubectl

DOCKERFILE = REPO / "deploy" / "docker" / "gym-server.Dockerfile"
OVERLAY = "overlays/gym-namespace"


def image_layout() -> tuple[list[str], dict[str, Path], dict[str, str]]:
    """The gym-server image's ENTRYPOINT, its COPY destinations -> repository paths, and
    its ENV, read from the Dockerfile itself."""
    entrypoint: list[str] = []
    copies: dict[str, Path] = {}
    env: dict[str, str] = {}
    lines = DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
    for line in lines:
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "ENTRYPOINT":
            entrypoint = json.loads(line.split(None, 1)[1])
        elif words[0] == "COPY" and not any(w.startswith("--") for w in words):
            copies[words[2]] = REPO / words[1]
        elif words[0] == "ENV":
            for pair in words[1:]:
                key, _, value = pair.partition("=")
                env[key] = value
    return entrypoint, copies, env


def in_repo(word: str, copies: dict[str, Path]) -> str:
    """An in-image path as the repository file (or folder) the image copied there."""
    for dest, src in copies.items():
        if word == dest.rstrip("/"):
            return str(src)
        if dest.endswith("/") and word.startswith(dest):
            return str(src / word[len(dest) :])
    return word


def in_mounts(word: str, mounts: dict[str, Path]) -> str:
    """A path under a pod's mount path as the file written for that mount here."""
    for path, folder in mounts.items():
        if word.startswith(path):
            return str(folder / word[len(path) :])
    return word


def command_line(container: dict[str, Any], entrypoint: list[str]) -> list[str]:
    """What the container runtime executes: command (else ENTRYPOINT) followed by args."""
    return [*(container.get("command") or entrypoint), *(container.get("args") or [])]


@contextmanager
def running(
    objs: list[dict[str, Any]],
    python: Path,
    tmp_path: Path,
    names: set[str] | None = None,
    readdress_hosts: bool = True,
) -> Iterator[dict[str, int]]:
    """The overlay's Gym server Deployments (those in ``names``, default all) running on
    loopback; yields the loopback port per Deployment (= Service) name.

    Ports are always re-addressed; hosts (Service names) only with ``readdress_hosts``.
    """
    entrypoint, copies, image_env = image_layout()
    deployments = [
        o
        for o in objs
        if o["kind"] == "Deployment" and (names is None or o["metadata"]["name"] in names)
    ]
    ports = {o["metadata"]["name"]: free_port() for o in objs if o["kind"] == "Deployment"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for deployment in deployments:
            name = deployment["metadata"]["name"]
            pod = deployment["spec"]["template"]["spec"]
            [container] = pod["containers"]
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {}
            for mount in container["volumeMounts"]:
                source = volumes[mount["name"]]["configMap"]
                [cm] = [
                    o
                    for o in objs
                    if o["kind"] == "ConfigMap" and o["metadata"]["name"] == source["name"]
                ]
                folder = tmp_path / name / mount["name"]
                folder.mkdir(parents=True)
                for key, text in cm["data"].items():
                    config = yaml.safe_load(text)
                    # Service names -> this machine's loopback ports (the one change).
                    for server in config.values():
                        for impls in server.values() if "host" not in server else []:
                            for settings in impls.values():
                                settings["port"] = ports[settings["host"]]
                                if readdress_hosts:
                                    settings["host"] = "127.0.0.1"
                    (folder / key).write_text(yaml.safe_dump(config))
                mounts[mount["mountPath"].rstrip("/") + "/"] = folder
            argv = [
                in_repo(in_mounts(w, mounts), copies) for w in command_line(container, entrypoint)
            ]
            assert argv[0] == "python", argv
            env = {**os.environ, **{k: in_repo(v, copies) for k, v in image_env.items()}}
            env.update({e["name"]: e["value"] for e in container.get("env") or []})
            env["GYM_TELEMETRY"] = "0"  # no sidecar here; the servers are what is tested
            env["GYM_SERVER_BIND_HOST"] = "127.0.0.1"  # loopback only on this machine
            log = (tmp_path / f"{name}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [str(python), *argv[1:]],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        for deployment in deployments:
            name = deployment["metadata"]["name"]
            try:
                wait_listening(ports[name], timeout_s=120)
            except TimeoutError:
                pytest.fail(f"{name} did not start:\n{(tmp_path / f'{name}.log').read_text()}")
        yield ports
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def probe(objs: list[dict[str, Any]], name: str, port: int) -> None:
    """GET the route of Deployment ``name``'s readiness probe; assert 200."""
    [deployment] = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    url = f"http://127.0.0.1:{port}{container['readinessProbe']['httpGet']['path']}"
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200, url


def test_server_listens_on_the_bind_host_while_its_config_names_its_service(
    gym_python: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The config's host is the Service name ``stub-model`` (no address of this machine
    or of the pod); GYM_SERVER_BIND_HOST makes the server listen anyway."""
    objs = render(OVERLAY)
    with running(objs, gym_python, tmp_path, {"stub-model"}, readdress_hosts=False) as ports:
        probe(objs, "stub-model", ports["stub-model"])


def test_overlay_servers_start_from_their_manifest_and_serve_rollouts(
    gym_python: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    objs = render(OVERLAY)
    _entrypoint, copies, _env = image_layout()
    with running(objs, gym_python, tmp_path) as ports:
        # Each server answers the route its readiness probe checks.
        for name, port in ports.items():
            probe(objs, name, port)
        # The rollouts Job's own command line, against the agent's loopback port.
        [job] = [o for o in objs if o["kind"] == "Job"]
        [driver] = job["spec"]["template"]["spec"]["containers"]
        argv = [in_repo(w, copies) for w in command_line(driver, [])]
        assert argv[0] == "python"
        env = {**os.environ, **{e["name"]: e["value"] for e in driver["env"]}}
        assert env["AGENT_URL"] == "http://simple-agent:8000"
        env.update(AGENT_URL=f"http://127.0.0.1:{ports['simple-agent']}", ROLLOUTS="2")
        env["GYM_TELEMETRY"] = "0"
        result = subprocess.run(
            [sys.executable, *argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2/2 rollouts done" in result.stdout, result.stdout
    assert "rollout 0-1: reward=1.0" in result.stdout
