"""The pod sandbox ("pause") image of the tests' kubelet, built here: no registry answers.

``pause.go`` (beside this file, the Go standard library only) is compiled once per
machine by :mod:`go_peers` (``CGO_ENABLED=0``: a static binary; the shared Go caches, a
lock, a marker holding the source's digest, so an edited source is rebuilt), then
imported into Docker as a one-file image (``docker import``, entrypoint ``/pause``) under
a tag that carries the same digest: :data:`IMAGE`. containerd's CRI plugin is told to use
it as its ``sandbox_image``, and it reaches containerd like the project's images
(``docker save | ctr import``).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from tests.support.docker_daemon import REPO, Engine

SOURCE = Path(__file__).resolve().parent / "pause.go"
DIGEST = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
IMAGE = f"gym-telemetry-test/pause:{DIGEST}"
"""The sandbox image's tag (containerd normalises it to ``docker.io/...``)."""


def _go_peers() -> Any:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import go_peers
    finally:
        sys.path.pop(0)
    return go_peers


def _generate(workdir: Path, env: dict[str, str]) -> None:
    (workdir / "go.mod").write_text("module gym-telemetry.invalid/pause\n\ngo 1.22\n")
    shutil.copy(SOURCE, workdir / "main.go")


def binary() -> Path:
    """The static pause binary, built on first use (seconds)."""
    go_peers = _go_peers()
    tool = go_peers.GoTool(
        name="pause",
        module="gym-telemetry.invalid/pause",
        version=DIGEST,
        programs={"pause": "."},
        check=("-v",),
        env={"CGO_ENABLED": "0"},
        recipe=DIGEST,
        generate=_generate,
    )
    built: Path = go_peers.ensure(tool, prefer_path=False)
    return built


def ensure_image(engine: Engine) -> str:
    """:data:`IMAGE` in the Docker engine (imported when absent); returns the tag."""
    if engine.image_exists(IMAGE):
        return IMAGE
    data = binary().read_bytes()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("pause")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    client = shutil.which("docker") or "docker"
    subprocess.run(
        [client, "import", "--change", 'ENTRYPOINT ["/pause"]', "-", IMAGE],
        input=archive.getvalue(),
        env=engine.env,
        capture_output=True,
        timeout=300,
        check=True,
    )
    return IMAGE
