"""OTLP/HTTP exporter: POST ``application/x-protobuf`` to ``<base>/v1/<signal>``.

Outcomes follow the OTLP/HTTP specification: 2xx is success (the body's
``partial_success`` is read); 429, 502, 503 and 504 are retryable and honour a
``Retry-After`` header given in seconds or as an HTTP date; 400 and every other status
are permanent. Connection errors and timeouts are retryable.

With ``compression: gzip`` the exporter compresses the body itself (standard gzip,
``Content-Encoding: gzip``) at ``compression_level``, with ISA-L (levels 1-3) or zlib-ng
(4-9), the libraries :mod:`gym_sidecar.wire.deflate` chooses. Compression and the POST
run in a worker thread (both deflate libraries release the GIL), so the event loop
keeps receiving meanwhile. The body goes out from the batch's pieces (:mod:`.body`):
deflated piece by piece with gzip, else written in coalesced chunks; the batch is never
joined into one more copy.
The transport is the standard library's ``http.client`` (:mod:`.http_post`).
"""

from __future__ import annotations

import asyncio
import email.utils
import http.client
import logging
import time
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from gym_sidecar.core.exporter import Exporter, ExportResult
from gym_sidecar.core.signals import PROTOBUF, SPECS, rejected_items
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.body import Piece, gzip_parts
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.http_post import HttpPoster, PostResponse
from gym_sidecar.wire import deflate

logger = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
_MAX_ERROR_BODY_CHARS = 300


def signal_urls(url: str) -> dict[Signal, str]:
    """The POST URL per signal: base URL + its OTLP path (see BackendConfig.url)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for spec in SPECS.values():
        if path.endswith(spec.http_path):
            path = path[: -len(spec.http_path)]
            break
    return {
        signal: urlunsplit((parts.scheme, parts.netloc, path + spec.http_path, "", ""))
        for signal, spec in SPECS.items()
    }


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds or as an HTTP date -> seconds from now (None if absent/bad)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_status(status: int, retry_after: str | None, body: str) -> ExportResult:
    """Map a non-2xx response to an export outcome."""
    message = f"HTTP {status}: {body[:_MAX_ERROR_BODY_CHARS]}"
    if status in RETRYABLE_STATUSES:
        return ExportResult.retryable(message, parse_retry_after(retry_after))
    return ExportResult.permanent(message)


class OtlpHttpExporter(Exporter):
    """Exports with standard-library HTTP/1.1 connections (kept alive) in worker threads.

    One export is one worker-thread call that gzips the body (when configured) and
    POSTs it, so neither blocks the event loop. The attempt's deadline is
    ``timeout_s``: the loop stops waiting then (retryable), and every socket operation
    of the thread times out after the same time, so an abandoned attempt ends too.
    """

    name = "otlp_http"

    def __init__(self, config: BackendConfig) -> None:
        if config.url is None:
            raise ValueError("OtlpHttpExporter needs backend.url")
        self.urls = signal_urls(config.url)
        self._paths = {signal: _path_of(url) for signal, url in self.urls.items()}
        self._gzip = config.compression == "gzip"
        self._level = config.compression_level
        self._timeout_s = config.timeout_s
        self._headers = {**config.headers, "Content-Type": PROTOBUF}
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
            logger.info(
                "OTLP/HTTP export: gzip with %s at level %d",
                deflate.deflate_library(self._level),
                self._level,
            )
        self._poster = HttpPoster(config.url, timeout_s=config.timeout_s)

    def _send(self, signal: Signal, parts: Sequence[Piece]) -> PostResponse:
        """Worker thread: compress (if configured) and POST."""
        if self._gzip:
            return self._poster.post(
                self._paths[signal], gzip_parts(parts, self._level), self._headers
            )
        return self._poster.post(self._paths[signal], parts, self._headers)

    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        return await self.export_parts(signal, (payload,), items)

    async def export_parts(
        self, signal: Signal, parts: Sequence[Piece], items: int
    ) -> ExportResult:
        try:
            resp = await asyncio.wait_for(
                asyncio.to_thread(self._send, signal, parts), self._timeout_s
            )
        except TimeoutError:
            return ExportResult.retryable(f"timed out after {self._timeout_s}s")
        except (OSError, http.client.HTTPException) as err:
            return ExportResult.retryable(f"{type(err).__name__}: {err}")
        if 200 <= resp.status < 300:
            if not resp.body or resp.content_type != PROTOBUF:
                return ExportResult.success()
            rejected, message = rejected_items(signal, resp.body)
            return ExportResult.success(min(rejected, items), message)
        text = resp.body.decode("utf-8", errors="replace")
        return classify_status(resp.status, resp.retry_after, text)

    async def close(self) -> None:
        self._poster.close()


def _path_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.path or "/"
