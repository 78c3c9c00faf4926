"""OTLP/HTTP exporter: POST ``application/x-protobuf`` to ``<base>/v1/<signal>``.

Outcomes follow the OTLP/HTTP specification: 2xx is success (the body's
``partial_success`` is read); 429, 502, 503 and 504 are retryable and honour a
``Retry-After`` header given in seconds or as an HTTP date; 400 and every other status
are permanent. Connection errors and timeouts are retryable.
"""

from __future__ import annotations

import asyncio
import email.utils
import gzip
import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from gym_sidecar.export.base import Exporter, ExportResult
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.otlp_grpc import rejected_items
from gym_sidecar.pipeline.stage import Signal

if TYPE_CHECKING:
    import aiohttp

# aiohttp (~8 MiB resident) is imported when an HTTP exporter is built, so a sidecar
# exporting over gRPC never loads it.

logger = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
_GZIP_IN_THREAD_BYTES = 64 * 1024
"""Bodies past this size are compressed off the event loop."""
_MAX_ERROR_BODY_CHARS = 300


def signal_urls(url: str) -> dict[Signal, str]:
    """The POST URL per signal: base URL + ``/v1/<signal>`` (see BackendConfig.url)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for signal in Signal:
        suffix = f"/v1/{signal.value}"
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return {
        signal: urlunsplit((parts.scheme, parts.netloc, f"{path}/v1/{signal.value}", "", ""))
        for signal in Signal
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
    """Exports through one ``aiohttp.ClientSession`` (created lazily on the running loop)."""

    name = "otlp_http"

    def __init__(self, config: BackendConfig) -> None:
        if config.url is None:
            raise ValueError("OtlpHttpExporter needs backend.url")
        import aiohttp

        self._aiohttp = aiohttp
        self.urls = signal_urls(config.url)
        self._gzip = config.compression == "gzip"
        self._timeout = aiohttp.ClientTimeout(total=config.timeout_s)
        self._headers = {**config.headers, "Content-Type": "application/x-protobuf"}
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = self._aiohttp.ClientSession(
                timeout=self._timeout, headers=self._headers
            )
        return self._session

    async def _body(self, payload: bytes) -> bytes:
        if not self._gzip:
            return payload
        if len(payload) > _GZIP_IN_THREAD_BYTES:
            return await asyncio.to_thread(gzip.compress, payload, 6)
        return gzip.compress(payload, 6)

    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        body = await self._body(payload)
        session = self._get_session()
        try:
            async with session.post(self.urls[signal], data=body) as resp:
                content = await resp.read()
                if 200 <= resp.status < 300:
                    if not content or resp.content_type != "application/x-protobuf":
                        return ExportResult.success()
                    rejected, message = rejected_items(signal, content)
                    return ExportResult.success(min(rejected, items), message)
                text = content.decode("utf-8", errors="replace")
                return classify_status(resp.status, resp.headers.get("Retry-After"), text)
        except TimeoutError:
            return ExportResult.retryable(f"timed out after {self._timeout.total}s")
        except self._aiohttp.ClientError as err:
            return ExportResult.retryable(f"{type(err).__name__}: {err}")

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
