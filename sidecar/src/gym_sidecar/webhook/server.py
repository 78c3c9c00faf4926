"""The injector's HTTPS server: aiohttp, TLS from files, certificates reloaded on rotation.

Needs the ``webhook`` extra (``gym-telemetry-sidecar[webhook]``).

Routes (the MutatingWebhookConfiguration points its two entries at the first two):

- ``POST /mutate/pod-opt-in``: pods of namespaces not opted in; inject only when the pod
  is annotated ``telemetry.nemo-gym.io/inject: "true"``;
- ``POST /mutate/namespace-opt-in``: pods of namespaces labelled
  ``telemetry.nemo-gym.io/inject=true``; inject unless the pod is annotated ``"false"``;
- ``GET /healthz``: liveness/readiness of the injector itself;
- ``GET /metrics``: Prometheus counters of reviews by outcome.

Lifecycle: :meth:`InjectorServer.start` binds and serves (non-blocking, inside a running
loop), :meth:`InjectorServer.stop` closes listeners and waits for in-flight reviews; safe
to call twice or without ``start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import ssl
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gym_sidecar.hostport import join_host_port, split_host_port
from gym_sidecar.webhook.admission import encode_review
from gym_sidecar.webhook.config import InjectorConfig
from gym_sidecar.webhook.review import Outcome, fail_open, handle_review

logger = logging.getLogger(__name__)

POD_OPT_IN_PATH = "/mutate/pod-opt-in"
NAMESPACE_OPT_IN_PATH = "/mutate/namespace-opt-in"


class CertificateError(ValueError):
    """A certificate or key file could not be loaded; the message names the file."""


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CertificateError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None


class CertificateReloader:
    """Owns the server's SSLContext and reloads the key pair when the files' content changes.

    Rotation is detected by content (SHA-256 of the certificate and key bytes), not by
    mtime: a mounted Kubernetes Secret is updated by swapping its ``..data`` symlink, so
    ``tls.crt`` keeps the mtime of a symlink that never changes while what it points at
    does. Reloading into the same context means new handshakes use the new certificate
    while open connections are untouched. A failed reload (half-written files, or a check
    that read the old certificate and the new key) keeps the old pair and is retried at
    the next check.
    """

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        cert, key = _read(cert_file, "cert_file"), _read(key_file, "key_file")
        if b"-----BEGIN CERTIFICATE-----" not in cert:
            raise CertificateError(f"cert_file {cert_file}: no PEM certificate in it")
        if b"PRIVATE KEY-----" not in key:
            raise CertificateError(f"key_file {key_file}: no PEM private key in it")
        try:
            self.context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise CertificateError(
                f"cannot load the TLS key pair cert_file {cert_file} and key_file {key_file}: {exc}"
            ) from None
        self._digest: bytes | None = self._fingerprint(cert, key)

    @staticmethod
    def _fingerprint(cert: bytes, key: bytes) -> bytes:
        # Length-prefixed so that no split of the same bytes between the files collides.
        return hashlib.sha256(len(cert).to_bytes(8, "big") + cert + key).digest()

    def _current(self) -> bytes:
        return self._fingerprint(
            _read(self.cert_file, "cert_file"), _read(self.key_file, "key_file")
        )

    def reload_if_changed(self) -> bool:
        """Reload when the files' content changed; True when a new pair was loaded."""
        try:
            before = self._current()
            if before == self._digest:
                return False
            self.context.load_cert_chain(self.cert_file, self.key_file)
            # The files may have changed again between the hash and the load: only a
            # pair read twice the same is taken as loaded; otherwise check again next time.
            self._digest = before if self._current() == before else None
        except (OSError, ssl.SSLError, CertificateError) as exc:
            logger.warning("keeping the current TLS certificate, reload failed: %s", exc)
            return False
        logger.info("reloaded TLS certificate from %s", self.cert_file)
        return True


class InjectorMetrics:
    """Counters of reviews by route and outcome, in a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.reviews = Counter(
            "gym_injector_reviews",
            "AdmissionReviews answered, by route and outcome "
            "(injected, unchanged, skipped, failed_open).",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.cert_reloads = Counter(
            "gym_injector_certificate_reloads",
            "Times a rotated TLS certificate was loaded.",
            registry=self.registry,
        )


class InjectorServer:
    """Serves AdmissionReview v1 over HTTPS (plain HTTP only when no certificate is set)."""

    def __init__(self, config: InjectorConfig) -> None:
        self.config = config
        self.metrics = InjectorMetrics()
        self._runner: web.AppRunner | None = None
        self._reloader: CertificateReloader | None = None
        self._reload_task: asyncio.Task[None] | None = None
        self.port: int | None = None

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app.router.add_post(POD_OPT_IN_PATH, self._pod_opt_in)
        app.router.add_post(NAMESPACE_OPT_IN_PATH, self._namespace_opt_in)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _answer(self, request: web.Request, route: str, namespace: bool) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            outcome: Outcome = fail_open(
                "", f"AdmissionReview over max_request_bytes={self.config.max_request_bytes}"
            )
        else:
            outcome = handle_review(body, self.config, namespace)
        self.metrics.reviews.labels(route, outcome.kind).inc()
        return web.Response(body=encode_review(outcome.review), content_type="application/json")

    async def _pod_opt_in(self, request: web.Request) -> web.Response:
        return await self._answer(request, "pod-opt-in", namespace=False)

    async def _namespace_opt_in(self, request: web.Request) -> web.Response:
        return await self._answer(request, "namespace-opt-in", namespace=True)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def start(self) -> None:
        """Bind ``config.listen`` and serve; sets :attr:`port` (useful with port 0)."""
        host, port = split_host_port(self.config.listen)
        ssl_context: ssl.SSLContext | None = None
        if self.config.cert_file and self.config.key_file:
            self._reloader = CertificateReloader(self.config.cert_file, self.config.key_file)
            ssl_context = self._reloader.context
        else:
            logger.warning("no --cert/--key: serving plain HTTP (the API server requires TLS)")
        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            await self._runner.cleanup()
            self._runner = None
            raise
        self.port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock, ssl_context=ssl_context).start()
        if self._reloader is not None:
            self._reload_task = asyncio.create_task(self._watch_certificates(self._reloader))
        logger.info(
            "injector listening on %s (%s)",
            join_host_port(host, self.port),
            "https" if ssl_context else "http",
        )

    async def _watch_certificates(self, reloader: CertificateReloader) -> None:
        while True:
            await asyncio.sleep(self.config.cert_reload_interval_s)
            if reloader.reload_if_changed():
                self.metrics.cert_reloads.inc()

    async def stop(self) -> None:
        """Stop accepting, finish in-flight reviews, release the port. Idempotent."""
        if self._reload_task is not None:
            self._reload_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reload_task
            self._reload_task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve_forever(config: InjectorConfig, stop: asyncio.Event) -> None:
    """Run the injector until ``stop`` is set (the CLI sets it on SIGTERM, SIGINT, SIGHUP)."""
    server = InjectorServer(config)
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()
