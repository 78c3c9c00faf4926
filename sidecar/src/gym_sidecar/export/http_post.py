"""Blocking HTTP/1.1 POSTs over kept-alive standard-library connections, for worker threads.

The OTLP/HTTP exporter sends one request per export, a few at a time. ``http.client`` is
already loaded by the sidecar, so POSTing with it in a worker thread costs no resident
memory beyond the sockets; an async client library (aiohttp) costs ~6 MiB.

:class:`HttpPoster` keeps idle connections to one origin (at most ``max_idle``; more are
closed after use) and is safe to call from several threads at once. A request on a
reused connection that the server had already closed (keep-alive race) is retried once
on a fresh connection. Every socket operation is bounded by ``timeout_s``. Responses
are read up to ``max_response_bytes``; the rest of a longer body is discarded and the
connection closed.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gym_sidecar.export.body import body_size, coalesced

_STALE_ERRORS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
"""Errors of a reused keep-alive connection the server closed meanwhile."""


@dataclass(frozen=True, slots=True)
class PostResponse:
    """What came back: status, the two headers the exporter reads, and the body."""

    status: int
    content_type: str
    """Media type without parameters, lower-cased (``""`` when absent)."""
    retry_after: str | None
    body: bytes


class HttpPoster:
    """POSTs to one ``http://`` or ``https://`` origin (thread-safe)."""

    def __init__(
        self,
        origin_url: str,
        timeout_s: float,
        max_idle: int = 8,
        max_response_bytes: int = 1024 * 1024,
    ) -> None:
        parts = urlsplit(origin_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {origin_url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._timeout_s = timeout_s
        self._max_idle = max_idle
        self._max_response_bytes = max_response_bytes
        self._context = ssl.create_default_context() if self._https else None
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout_s, context=self._context
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def post(
        self,
        path: str,
        body: bytes | Sequence[bytes | memoryview],
        headers: dict[str, str],
    ) -> PostResponse:
        """POST ``body`` to ``path``; raises OSError or http.client.HTTPException.

        ``body`` is bytes, or the pieces whose concatenation it is: then they are
        written in coalesced chunks (:func:`.body.coalesced`, never joined whole) with
        their total length as ``Content-Length``."""
        if not isinstance(body, bytes):
            headers = {**headers, "Content-Length": str(body_size(body))}
        conn, reused = self._take()
        try:
            resp = self._exchange(conn, path, body, headers)
        except _STALE_ERRORS:
            conn.close()
            if not reused:
                raise
            conn = self._connect()
            try:
                resp = self._exchange(conn, path, body, headers)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()
            raise
        status, content_type, retry_after, content, reusable = resp
        if reusable:
            self._give_back(conn)
        else:
            conn.close()
        return PostResponse(status, content_type, retry_after, content)

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        path: str,
        body: bytes | Sequence[bytes | memoryview],
        headers: dict[str, str],
    ) -> tuple[int, str, str | None, bytes, bool]:
        sent = body if isinstance(body, bytes) else coalesced(body)
        conn.request("POST", path, body=sent, headers=headers)
        resp = conn.getresponse()
        content = resp.read(self._max_response_bytes + 1)
        whole = len(content) <= self._max_response_bytes and resp.isclosed()
        content_type = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
        reusable = whole and not resp.will_close
        if not whole:
            content = content[: self._max_response_bytes]
        return resp.status, content_type, resp.getheader("Retry-After"), content, reusable

    def close(self) -> None:
        """Close the idle connections; connections in use close when their request ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
