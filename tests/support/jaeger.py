"""A real Jaeger v2 (built from the Go module proxy) on free loopback ports, for tests.

The code lives with the demo (:mod:`gym_telemetry_demo.jaeger`, which ``make demo --jaeger``
uses); this module keeps the names the tests (and benchmarks) import, and binds
:func:`jaeger_binary` to this checkout's ``scripts/jaeger_build.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from gym_telemetry_demo import jaeger as _jaeger
from gym_telemetry_demo.jaeger import (
    JaegerAPI,
    JaegerQueryClient,
    JaegerServer,
    JaegerSpan,
    JaegerTrace,
    jaeger_config,
    same_trace_id,
)

REPO = Path(__file__).resolve().parents[2]


def jaeger_binary(report: Callable[[str], object] | None = None) -> Path:
    """Build (first call on a machine: minutes) or reuse the cached Jaeger binary; its
    path. See :func:`gym_telemetry_demo.jaeger.jaeger_binary`."""
    return _jaeger.jaeger_binary(REPO, report)


__all__ = [
    "JaegerAPI",
    "JaegerQueryClient",
    "JaegerServer",
    "JaegerSpan",
    "JaegerTrace",
    "jaeger_binary",
    "jaeger_config",
    "same_trace_id",
]

if __name__ == "__main__":
    print(jaeger_binary(), file=sys.stdout)
