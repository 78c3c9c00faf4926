"""A Docker Engine API contract server on a unix socket, for testing the Docker source.

No Docker engine runs on these machines. This is a real HTTP/1.1 server on a unix
socket that answers the few Engine API endpoints the ``docker`` SDK calls for container
lookups, with the JSON shapes of the Engine API reference (API v1.45, the SDK's default;
``ContainerInspectResponse`` for ``GET /containers/{id}/json``, ``ContainerSummary``
items for ``GET /containers/json``, ``SystemVersion`` for ``GET /version``, plain
``OK`` for ``GET /_ping``, and ``{"message": ...}`` error bodies). Paths are accepted
with or without the ``/v{version}`` prefix, as the engine does.

Containers are found by full id, unique id prefix or name, as the engine finds them.
Every request path is recorded (``requests``) so tests can count lookups; ``delay_s``
slows answers down to show that lookups never block the pipeline.
"""

from __future__ import annotations

import json
import re
import socketserver
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

API_VERSION = "1.45"
_VERSIONED = re.compile(r"^/v(\d+\.\d+)(/.*)$")


@dataclass
class FakeContainer:
    """One container the contract server knows."""

    id: str
    name: str
    image: str
    """The image reference as created (``Config.Image``), e.g. ``gym/model:1.2``."""
    labels: dict[str, str] = field(default_factory=dict)
    networks: dict[str, str] = field(default_factory=dict)
    """Network name -> IPv4 address."""
    image_id: str = "sha256:" + "ab" * 32


def _endpoint(name: str, ip: str) -> dict[str, Any]:
    return {
        "IPAMConfig": None,
        "Links": None,
        "Aliases": None,
        "MacAddress": "02:42:ac:11:00:02",
        "DriverOpts": None,
        "NetworkID": f"{abs(hash(name)):064x}"[:64],
        "EndpointID": f"{abs(hash(ip)):064x}"[:64],
        "Gateway": ip.rsplit(".", 1)[0] + ".1",
        "IPAddress": ip,
        "IPPrefixLen": 16,
        "IPv6Gateway": "",
        "GlobalIPv6Address": "",
        "GlobalIPv6PrefixLen": 0,
        "DNSNames": None,
    }


def inspect_document(c: FakeContainer) -> dict[str, Any]:
    """The ``ContainerInspectResponse`` for ``c`` (fields per the API reference)."""
    return {
        "Id": c.id,
        "Created": "2026-11-29T08:00:00.000000000Z",
        "Path": "python",
        "Args": ["-m", "app"],
        "State": {
            "Status": "running",
            "Running": True,
            "Paused": False,
            "Restarting": False,
            "OOMKilled": False,
            "Dead": False,
            "Pid": 4242,
            "ExitCode": 0,
            "Error": "",
            "StartedAt": "2026-11-29T08:00:01.000000000Z",
            "FinishedAt": "0001-01-01T00:00:00Z",
        },
        "Image": c.image_id,
        "ResolvConfPath": f"/var/lib/docker/containers/{c.id}/resolv.conf",
        "HostnamePath": f"/var/lib/docker/containers/{c.id}/hostname",
        "HostsPath": f"/var/lib/docker/containers/{c.id}/hosts",
        "LogPath": f"/var/lib/docker/containers/{c.id}/{c.id}-json.log",
        "Name": "/" + c.name,
        "RestartCount": 0,
        "Driver": "overlay2",
        "Platform": "linux",
        "MountLabel": "",
        "ProcessLabel": "",
        "AppArmorProfile": "",
        "ExecIDs": None,
        "HostConfig": {"NetworkMode": next(iter(c.networks), "bridge")},
        "GraphDriver": {"Name": "overlay2", "Data": {}},
        "Mounts": [],
        "Config": {
            "Hostname": c.id[:12],
            "Domainname": "",
            "User": "",
            "AttachStdin": False,
            "AttachStdout": False,
            "AttachStderr": False,
            "Tty": False,
            "OpenStdin": False,
            "StdinOnce": False,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["python", "-m", "app"],
            "Image": c.image,
            "Volumes": None,
            "WorkingDir": "/app",
            "Entrypoint": None,
            "OnBuild": None,
            "Labels": dict(c.labels),
        },
        "NetworkSettings": {
            "SandboxID": "9d12daf2c33f5959c8bf90aa513e4f65b561738661003029ec84830cd503a0c3",
            "SandboxKey": "/var/run/docker/netns/8ab54b426c38",
            "Ports": {},
            "Networks": {name: _endpoint(name, ip) for name, ip in c.networks.items()},
        },
    }


def summary_document(c: FakeContainer) -> dict[str, Any]:
    """The ``ContainerSummary`` item of ``GET /containers/json`` for ``c``."""
    return {
        "Id": c.id,
        "Names": ["/" + c.name],
        "Image": c.image,
        "ImageID": c.image_id,
        "Command": "python -m app",
        "Created": 1795939200,
        "Ports": [],
        "Labels": dict(c.labels),
        "State": "running",
        "Status": "Up 5 minutes",
        "HostConfig": {"NetworkMode": next(iter(c.networks), "bridge")},
        "NetworkSettings": {
            "Networks": {name: _endpoint(name, ip) for name, ip in c.networks.items()}
        },
        "Mounts": [],
    }


VERSION_DOCUMENT: dict[str, Any] = {
    "Platform": {"Name": "Docker Engine - Community"},
    "Components": [],
    "Version": "26.1.0",
    "ApiVersion": API_VERSION,
    "MinAPIVersion": "1.24",
    "GitCommit": "0000000",
    "GoVersion": "go1.21.9",
    "Os": "linux",
    "Arch": "amd64",
    "KernelVersion": "6.1.0",
    "BuildTime": "2026-01-01T00:00:00.000000000+00:00",
}


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    engine: EngineContractServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def address_string(self) -> str:  # unix sockets have no client address
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Api-Version", API_VERSION)
        self.send_header("Server", "Docker/26.1.0 (linux)")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        engine = self.server.engine
        path = self.path.split("?", 1)[0]
        engine._record(path)
        if engine.delay_s:
            time.sleep(engine.delay_s)
        match = _VERSIONED.match(path)
        if match is not None:
            path = match.group(2)
        if path == "/_ping":
            self._send(200, b"OK", "text/plain; charset=utf-8")
        elif path == "/version":
            self._json(200, VERSION_DOCUMENT)
        elif path == "/containers/json":
            self._json(200, [summary_document(c) for c in engine.containers()])
        elif path.startswith("/containers/") and path.endswith("/json"):
            ref = path[len("/containers/") : -len("/json")]
            found = engine.find(ref)
            if found is None:
                self._json(404, {"message": f"No such container: {ref}"})
            else:
                self._json(200, inspect_document(found))
        else:
            self._json(404, {"message": "page not found"})


class EngineContractServer:
    """Serve the Engine API contract on ``socket_path`` from a background thread."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.base_url = f"unix://{socket_path}"
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self._containers: dict[str, FakeContainer] = {}
        self.requests: list[str] = []
        self._server = _Server(str(socket_path), _Handler)
        self._server.engine = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def add(self, container: FakeContainer) -> None:
        with self._lock:
            self._containers[container.id] = container

    def containers(self) -> list[FakeContainer]:
        with self._lock:
            return list(self._containers.values())

    def find(self, ref: str) -> FakeContainer | None:
        """By full id, unique id prefix, or name (as the engine resolves references)."""
        with self._lock:
            if ref in self._containers:
                return self._containers[ref]
            by_name = [c for c in self._containers.values() if c.name == ref.lstrip("/")]
            if by_name:
                return by_name[0]
            prefixed = [c for c in self._containers.values() if c.id.startswith(ref)]
            return prefixed[0] if len(prefixed) == 1 else None

    def _record(self, path: str) -> None:
        with self._lock:
            self.requests.append(path)

    def count(self, suffix: str) -> int:
        """How many recorded request paths end with ``suffix``."""
        with self._lock:
            return sum(1 for p in self.requests if p.endswith(suffix))

    def start(self) -> EngineContractServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> EngineContractServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
