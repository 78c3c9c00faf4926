"""Export smoke test run inside a throwaway venv holding one end of the agent's
supported OpenTelemetry range (``test_sdk_range.py``). Imports only the installed agent.

    python sdk_range_child.py ENDPOINT

Records 3 ``gym.verify`` spans through the public wrapper with a rollout id set,
shuts telemetry down, and prints one JSON line: the installed SDK version, which lean
paths passed their self-checks, and whether everything queued was delivered.
"""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

from gym_telemetry import init_telemetry, rollout_correlation, shutdown_telemetry, span_groups
from gym_telemetry._lean import grpc_exporter
from gym_telemetry._lean.recorder import LeanRecorder, recorder_for
from gym_telemetry.endpoints import traced_verify_endpoint


async def verify(n: int) -> int:
    return n


async def main() -> None:
    wrapped = traced_verify_endpoint(verify, {"nemo.gym.server.name": "smoke"})
    with rollout_correlation.rollout_context("r-1"):
        for i in range(3):
            assert await wrapped(i) == i


if __name__ == "__main__":
    active = init_telemetry(
        "sdk-range", server_name="smoke", server_type="resources", endpoint=sys.argv[1]
    )
    span_groups.set_enabled({"verify"})
    asyncio.run(main())
    lean_recorder = isinstance(recorder_for(span_groups.tracer_for("verify")), LeanRecorder)
    delivered = shutdown_telemetry(timeout_s=10)
    print(
        json.dumps(
            {
                "active": active,
                "sdk": version("opentelemetry-sdk"),
                "api": version("opentelemetry-api"),
                "exporter": version("opentelemetry-exporter-otlp-proto-grpc"),
                "lean_recorder": lean_recorder,
                "lean_encoder": grpc_exporter.self_check(),
                "delivered": delivered,
            }
        )
    )
