"""``example_single_tool_call`` with a verifier that can be made to raise on purpose.

``FailingWeatherResourcesServer`` is the shipped ``SimpleWeatherResourcesServer``
(same routes: ``/seed_session``, ``/get_weather``, ``/verify``, ...) whose ``verify``
raises ``VerifierCrash`` when the verify request carries ``"fail_verify": true``
(simple_agent forwards the ``/run`` body's extra fields to ``/verify``), or always
when the server's config sets ``always_fail: true``. ``"verify_sleep_s": <s>`` makes the
verification take that long first (a slow verifier, for the cancellation tests). It
exists to check that a verifier that raises shows up as a failed verification
(``succeeded=false``).
"""

from __future__ import annotations

import asyncio

from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse
from pydantic import ConfigDict
from resources_servers.example_single_tool_call.app import (
    SimpleWeatherResourcesServer,
    SimpleWeatherResourcesServerConfig,
)


class FailingWeatherConfig(SimpleWeatherResourcesServerConfig):
    """``always_fail``: raise on every verification, whatever the request says."""

    always_fail: bool = False


class FailableVerifyRequest(BaseVerifyRequest):
    """A verify request that may ask the verifier to crash."""

    model_config = ConfigDict(extra="allow")
    fail_verify: bool = False
    verify_sleep_s: float = 0.0


class VerifierCrash(RuntimeError):
    """Raised by the verifier on purpose."""


class FailingWeatherResourcesServer(SimpleWeatherResourcesServer):
    """The weather server whose verifier raises when asked to."""

    config: FailingWeatherConfig

    async def verify(self, body: FailableVerifyRequest) -> BaseVerifyResponse:  # type: ignore[override]
        if body.verify_sleep_s > 0:
            await asyncio.sleep(body.verify_sleep_s)
        if self.config.always_fail or body.fail_verify:
            raise VerifierCrash("verifier crashed on purpose (fail_verify)")
        return await super().verify(body)


if __name__ == "__main__":
    FailingWeatherResourcesServer.run_webserver()
