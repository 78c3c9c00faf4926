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
    max_verify_delay_s: float = 300.0


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

    async def verify(self, body: FailableVerifyRequest) -> BaseVerifyResponse:  # type: ignore[override]
        delay = min(max(body.verify_delay_s, 0.0), self.config.max_verify_delay_s)
        if delay > 0:
            await asyncio.sleep(delay)
        if self.config.always_fail or body.fail_verify:
            raise VerifierCrash("verifier crashed on purpose (fail_verify)")
        return await super().verify(body)


if __name__ == "__main__":
    FailingWeatherResourcesServer.run_webserver()
