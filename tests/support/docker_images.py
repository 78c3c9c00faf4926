"""Local images for a Docker engine that cannot pull: a debootstrap base and stand-ins.

No registry image can be pulled on the project's machines, so every third-party image the
compose file and the Dockerfiles name is built here, under that exact tag, from:

- ``gym-telemetry-base/debian:trixie``: ``debootstrap --variant=minbase`` of Debian trixie
  (the machine's own Debian mirror, from its apt sources), imported once and cached as
  an image archive (``<cache>/docker/base-debian-trixie.tar``), so that a fresh daemon
  loads it in seconds instead of bootstrapping again;
- the Dockerfiles in ``tests/support/standins/`` on top of it: Python 3.13 (Debian's),
  Jaeger (the binary ``scripts/jaeger_build.py`` builds) and Prometheus (Debian's).

Each stand-in carries the label ``org.gym-telemetry.stand-in`` holding a digest of its
recipe: a tag that exists without that label is a real image (a machine with Docker Hub)
and is used as it is; a stand-in with an older digest is rebuilt. How each differs from
the real image: docs/testing.md.

API: :func:`ensure_standins(engine) <ensure_standins>` (returns the tags),
:data:`STANDINS` (tag -> recipe), and :func:`build_project_images` (the project's own
images, as ``tests/deploy/images.yaml`` builds them with Compose). Timings go to stderr.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.docker_daemon import REPO, Engine, EngineUnavailable, cache_dir, log

STANDIN_DIR = Path(__file__).resolve().parent / "standins"
PROJECT_IMAGES_FILE = REPO / "tests" / "deploy" / "images.yaml"
"""The project's images (gym-server, the sidecar, the webhook) as Compose builds them."""
BASE_IMAGE = "gym-telemetry-base/debian:trixie"
BASE_SUITE = "trixie"
STANDIN_LABEL = "org.gym-telemetry.stand-in"
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class StandIn:
    """One stand-in: the tags it is built under and its Dockerfile in ``standins/``."""

    tags: tuple[str, ...]
    dockerfile: str


def compose_pins() -> dict[str, str]:
    """The third-party images ``docker-compose.yml`` names, by name without tag."""
    text = (REPO / "docker-compose.yml").read_text()
    pins: dict[str, str] = {}
    for ref in re.findall(r"^\s*image:\s*(\S+)", text, flags=re.M):
        name = ref.rsplit(":", 1)[0]
        if name in {"jaegertracing/jaeger", "prom/prometheus"}:
            pins[name] = ref
    return pins


def _python_tags() -> tuple[str, ...]:
    """Every ``python:*`` the project's Dockerfiles name (FROM lines and ARG defaults)."""
    tags: set[str] = set()
    for dockerfile in (REPO / "deploy" / "docker").glob("*.Dockerfile"):
        tags.update(re.findall(r"\b(python:[\w.\-]+)", dockerfile.read_text()))
    return tuple(sorted(tags))


def standins() -> list[StandIn]:
    pins = compose_pins()
    return [
        StandIn(_python_tags(), "python.Dockerfile"),
        StandIn((pins["jaegertracing/jaeger"],), "jaeger.Dockerfile"),
        StandIn((pins["prom/prometheus"],), "prometheus.Dockerfile"),
    ]


def _mirror() -> str:
    """The Debian mirror of the machine's apt sources (deb822 or one-line format)."""
    sources = [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for url in re.findall(r"(?:URIs:\s*|^deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, flags=re.M):
            if url.rstrip("/").endswith("/debian"):
                return url
    return DEFAULT_MIRROR


def ensure_base_image(engine: Engine) -> None:
    """``BASE_IMAGE`` in the engine: present, else loaded from the archive, else built."""
    if engine.image_exists(BASE_IMAGE):
        return
    archive = cache_dir() / f"base-debian-{BASE_SUITE}.tar"
    started = time.monotonic()
    if archive.exists():
        engine.docker("load", "--input", str(archive), timeout_s=600)
        log(f"{BASE_IMAGE} loaded from {archive} in {time.monotonic() - started:.1f} s")
        return
    if shutil.which("debootstrap") is None:
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=900"]
        install = [*apt, "install", "-y", "debootstrap"]
        # A fresh machine may not have run `apt-get update` yet: one retry after it.
        if subprocess.run(install, stdout=2, timeout=1800, check=False).returncode:
            subprocess.run([*apt, "update"], stdout=2, timeout=1800, check=False)
            subprocess.run(install, stdout=2, timeout=1800, check=True)
    with tempfile.TemporaryDirectory(prefix="gym-telemetry-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            "--include=ca-certificates",
            BASE_SUITE,
            str(rootfs),
            _mirror(),
        ]
        log("$ " + " ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode:
            raise EngineUnavailable(f"debootstrap failed: {(done.stdout + done.stderr)[-2000:]}")
        booted = time.monotonic()
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        client = shutil.which("docker") or "docker"
        subprocess.run(
            [client, "import", "-", BASE_IMAGE],
            stdin=tar.stdout,
            env=engine.env,
            stdout=2,
            timeout=600,
            check=True,
        )
        tar.wait(timeout=60)
    engine.docker("save", "--output", str(archive), BASE_IMAGE, timeout_s=600)
    log(
        f"{BASE_IMAGE}: debootstrap {booted - started:.0f} s, import and save "
        f"{time.monotonic() - booted:.0f} s; archive {archive.stat().st_size / 1e6:.0f} MB"
    )


def _recipe_digest(standin: StandIn, context: Path) -> str:
    digest = hashlib.sha256((STANDIN_DIR / standin.dockerfile).read_bytes())
    for path in sorted(context.rglob("*")):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _context(standin: StandIn, into: Path) -> None:
    """What the stand-in's Dockerfile COPYs, gathered into ``into``."""
    if standin.dockerfile == "python.Dockerfile":
        certs = into / "ca-certificates"
        certs.mkdir()
        for cert in EXTRA_CA_DIR.glob("**/*.crt") if EXTRA_CA_DIR.is_dir() else []:
            shutil.copy(cert, certs / cert.name)
    elif standin.dockerfile == "jaeger.Dockerfile":
        sys.path.insert(0, str(REPO / "scripts"))
        import jaeger_build

        shutil.copy(jaeger_build.ensure(), into / "jaeger")


def _label(engine: Engine, tag: str) -> str | None:
    """The stand-in label of ``tag`` ('' for a real image), None when absent."""
    if not engine.image_exists(tag):
        return None
    out = engine.docker(
        "image", "inspect", "--format", f'{{{{index .Config.Labels "{STANDIN_LABEL}"}}}}', tag
    )
    return out.stdout.strip().replace("<no value>", "")


def ensure_standins(engine: Engine) -> list[str]:
    """Every third-party tag present in the engine (a real image, or a current stand-in)."""
    ensure_base_image(engine)
    tags: list[str] = []
    for standin in standins():
        tags.extend(standin.tags)
        labels = {tag: _label(engine, tag) for tag in standin.tags}
        if all(label == "" for label in labels.values()):
            continue  # real images (pulled on a machine with a registry): used as they are
        with tempfile.TemporaryDirectory(prefix="gym-telemetry-standin-") as tmp:
            context = Path(tmp)
            _context(standin, context)
            digest = _recipe_digest(standin, context)
            if all(label == digest for label in labels.values()):
                continue
            shutil.copy(STANDIN_DIR / standin.dockerfile, context / "Dockerfile")
            args = ["build", "--label", f"{STANDIN_LABEL}={digest}"]
            for tag in standin.tags:
                args += ["--tag", tag]
            started = time.monotonic()
            done = engine.docker(
                *args, str(context), timeout_s=1800, check=False, env={"DOCKER_BUILDKIT": "0"}
            )
            if done.returncode:
                raise RuntimeError(
                    f"stand-in {standin.dockerfile} failed to build: {done.stderr[-3000:]}"
                )
            log(f"stand-in {', '.join(standin.tags)} built in {time.monotonic() - started:.0f} s")
    return tags


def build_project_images(engine: Engine, *services: str) -> None:
    """Build the project's images (``services`` of :data:`PROJECT_IMAGES_FILE``, default
    all) with Compose v2 and BuildKit, after the stand-ins and the native scanner's wheel
    are in place (:mod:`testkit.native_wheel`). The layer cache makes a repeat seconds."""
    from testkit import native_wheel

    ensure_standins(engine)
    native_wheel.stage()
    started = time.monotonic()
    done = engine.compose(
        ["-f", str(PROJECT_IMAGES_FILE), "build", *services],
        cwd=REPO,
        timeout_s=3000,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(
            f"building the project's images failed:\n{(done.stdout + done.stderr)[-8000:]}"
        )
    log(
        f"project images {', '.join(services) or 'all'} built in {time.monotonic() - started:.0f} s"
    )
