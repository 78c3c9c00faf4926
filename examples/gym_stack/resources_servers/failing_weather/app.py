"""``example_single_tool_call`` with a verifier that can be made to raise on purpose.

``FailingWeatherResourcesServer`` is the shipped ``SimpleWeatherResourcesServer``
(same routes: ``/seed_session``, ``/get_weather``, ``/verify``, ...) whose ``verify``
raises ``VerifierCrash`` when the verify request carries ``"fail_verify": true``
(simple_agent forwards the ``/run`` body's extra fields to ``/verify``), or always
when the server's config sets ``always_fail: true``. It exists to check that a verifier
that raises shows up as a failed verification (``succeeded=false``).

``"verify_delay_s": X`` in the request makes the verifier wait X seconds first (at most
the config's ``max_verify_delay_s``, 300 by default): a slow rollout on purpose, whose
slowness comes from this configured delay and not from the machine (the gateway test's
slow-rollout policy, the cancellation tests).

``POST /deadline_call`` (``{"server": NAME, "path": ROUTE, "body": {...}, "timeout_s": X}``,
X at most ``max_deadline_s``, 30 by default) makes one outbound call to the configured
Gym server ``NAME`` the way Gym's sandbox HTTP transport makes its calls: through Gym's
``server_utils.request`` with an aiohttp ``ClientTimeout(total=X)`` and
``_max_connection_retries=1`` (no retry), naming the target. It answers
``{"outcome": "timeout"}`` when the deadline passed, else ``{"outcome": "answered",
"status": <status>}``: a hop that times out on purpose (the real-Gym tests of the
CLIENT span's ``error.type=timeout``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from fastapi import FastAPI
from nemo_gym import server_utils
from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse
from pydantic import BaseModel, ConfigDict
from resources_servers.example_single_tool_call.app import (
    SimpleWeatherResourcesServer,
    SimpleWeatherResourcesServerConfig,
)


class FailingWeatherConfig(SimpleWeatherResourcesServerConfig):
    """``always_fail``: raise on every verification, whatever the request says."""

    always_fail: bool = False
    max_verify_delay_s: float = 300.0
    max_deadline_s: float = 30.0


class DeadlineCallRequest(BaseModel):
    """One outbound call with a deadline (``/deadline_call``)."""

    server: str
    path: str
    body: dict[str, Any] = {}
    timeout_s: float


class FailableVerifyRequest(BaseVerifyRequest):
    """A verify request that may ask the verifier to crash."""

    model_config = ConfigDict(extra="allow")
    fail_verify: bool = False
    verify_delay_s: float = 0.0


class VerifierCrash(RuntimeError):
    """Raised by the verifier on purpose."""


class FailingWeatherResourcesServer(SimpleWeatherResourcesServer):
    """The weather server whose verifier raises when asked to."""

    config: FailingWeatherConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/deadline_call")(self.deadline_call)
        return app

    async def deadline_call(self, body: DeadlineCallRequest) -> dict[str, Any]:
        timeout_s = min(max(body.timeout_s, 0.001), self.config.max_deadline_s)
        try:
            response = await server_utils.request(
                method="POST",
                url=server_utils.get_server_url(body.server) + body.path,
                json=body.body,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                _max_connection_retries=1,
                _server_name=body.server,
            )
        except TimeoutError:
            return {"outcome": "timeout"}
        response.release()
        return {"outcome": "answered", "status": response.status}

    async def verify(self, body: FailableVerifyRequest) -> BaseVerifyResponse:  # type: ignore[override]
        delay = min(max(body.verify_delay_s, 0.0), self.config.max_verify_delay_s)
        if delay > 0:
            await asyncio.sleep(delay)
        if self.config.always_fail or body.fail_verify:
            raise VerifierCrash("verifier crashed on purpose (fail_verify)")
        return await super().verify(body)


if __name__ == "__main__":
    FailingWeatherResourcesServer.run_webserver()
