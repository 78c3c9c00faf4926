"""Jaeger's own UI over the store: ``gym-sidecar ui --jaeger-ui DIR`` serves a built
Jaeger UI (the ``build`` directory of jaeger-ui, either line) under ``/jaeger/``, with
the query API of both lines under ``/jaeger/api/``, as Jaeger's query service serves its
UI under a base path.

Like Jaeger's query service, it serves ``index.html`` for every page of the UI
(``/jaeger/search``, ``/jaeger/trace/ID``...) after search-and-replace of the markers
the UI leaves for its server: the base path (``<base href="/"``, the classic line's),
the backend capabilities (``JAEGER_BACKEND_CAPABILITIES``, the 2.x line's;
``JAEGER_STORAGE_CAPABILITIES``, the classic line's) and the version. The capabilities
announce metrics storage (so the 2.x UI shows its Monitor tab, answered by
:mod:`gym_sidecar.query.spm`) and search without a service; no archive storage and no
AI assistant. Other files of ``DIR`` are served as they are.

The UI runs inline scripts and styles, so its pages get their own Content-Security-Policy:
scripts only from this origin and the inline scripts of the served ``index.html`` (by
their SHA-256; WebAssembly may be compiled, JavaScript is never ``eval``-ed), styles
from this origin and inline, connections to this origin only, no frames, objects or
foreign anything. An unknown ``/jaeger/api/...`` route is the API's JSON 404.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.staticfiles import StaticFiles

BASE_PATH: Final = "/jaeger"
CAPABILITIES: Final = {
    "archiveStorage": False,
    "metricsStorage": True,
    "searchWithoutServiceName": True,
    "aiAssistant": False,
}
_MARKERS: Final = (
    (re.compile(rb"JAEGER_BACKEND_CAPABILITIES *= *DEFAULT_BACKEND_CAPABILITIES;"), "caps"),
    (re.compile(rb"JAEGER_STORAGE_CAPABILITIES *= *DEFAULT_STORAGE_CAPABILITIES;"), "storage"),
    (re.compile(rb"JAEGER_VERSION *= *DEFAULT_VERSION;"), "version"),
)
_INLINE_SCRIPT: Final = re.compile(rb"<script(?![^>]*\ssrc=)[^>]*>(.*?)</script>", re.S)


class JaegerUiError(ValueError):
    """``DIR`` is not a built Jaeger UI; the message says what is missing."""


def _version() -> str:
    try:
        return "gym-sidecar " + metadata.version("gym-telemetry-sidecar")
    except metadata.PackageNotFoundError:
        return "gym-sidecar"


def rewrite_index(raw: bytes) -> bytes:
    """``index.html`` as served (see the module docstring)."""
    values = {
        "caps": b"JAEGER_BACKEND_CAPABILITIES = " + json.dumps(CAPABILITIES).encode() + b";",
        "storage": b"JAEGER_STORAGE_CAPABILITIES = "
        + json.dumps({k: CAPABILITIES[k] for k in ("archiveStorage", "metricsStorage")}).encode()
        + b";",
        "version": b"JAEGER_VERSION = "
        + json.dumps({"gitCommit": "", "gitVersion": _version(), "buildDate": ""}).encode()
        + b";",
    }
    out = raw.replace(b'<base href="/"', b'<base href="' + BASE_PATH.encode() + b'/"', 1)
    for pattern, name in _MARKERS:
        # a function replacement: the JSON is inserted as it is, never read as a template
        out = pattern.sub(_literal(values[name]), out)
    return out


def _literal(value: bytes) -> Callable[[re.Match[bytes]], bytes]:
    return lambda _match: value


def content_security_policy(index: bytes) -> str:
    """The pages' CSP, allowing exactly the inline scripts of ``index``."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(index)
    )
    return (
        # 'wasm-unsafe-eval': System Architecture lays its graph out with a wasm module
        f"default-src 'self'; script-src 'self' 'wasm-unsafe-eval' {hashes}; "
        "style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; "
        "worker-src 'self' blob:; object-src 'none'; frame-src 'none'; base-uri 'self'; "
        "form-action 'self'; frame-ancestors 'none'"
    )


class JaegerUi:
    """A built Jaeger UI in ``root``, read once (its ``index.html`` must be there)."""

    def __init__(self, root: Path) -> None:
        index = root / "index.html"
        if not index.is_file():
            raise JaegerUiError(f"{root} is not a built Jaeger UI: no index.html in it")
        self.root = root
        self.index = rewrite_index(index.read_bytes())
        self.csp = content_security_policy(self.index)

    def routes(self, api: list[BaseRoute]) -> list[BaseRoute]:
        """The UI's routes, with the API routes ``api`` (already under ``/jaeger/api``)
        first."""
        files = StaticFiles(directory=self.root, check_dir=True)

        def page(request: Request) -> Response:
            return Response(
                self.index,
                media_type="text/html; charset=utf-8",
                headers={"Content-Security-Policy": self.csp, "Cache-Control": "no-cache"},
            )

        async def asset_or_page(request: Request) -> Response:
            path = request.path_params["path"]
            if path.startswith("api/"):
                raise HTTPException(404)  # an unknown API route: the API's own 404
            if path and path != "index.html":
                try:
                    response = await files.get_response(path, request.scope)
                except HTTPException:  # no such file: a page of the UI
                    return page(request)
                response.headers["Content-Security-Policy"] = self.csp
                return response
            return page(request)

        def to_base(request: Request) -> Response:
            return RedirectResponse(BASE_PATH + "/", status_code=302)

        return [
            *api,
            Route(BASE_PATH, to_base, methods=["GET"]),
            Route(BASE_PATH + "/{path:path}", asset_or_page, methods=["GET"]),
        ]
