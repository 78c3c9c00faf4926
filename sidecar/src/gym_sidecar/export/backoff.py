"""Jittered exponential backoff for export retries."""

from __future__ import annotations

import random
from collections.abc import Callable

from gym_sidecar.export.config import QueueConfig


class Backoff:
    """Delay before retry number ``attempt`` (1-based).

    ``initial * multiplier**(attempt-1)``, capped at the maximum interval, then scaled by
    a random factor in ``[1 - jitter, 1 + jitter]`` so that many sidecars that failed
    together do not retry together. Pure and cheap; ``rng`` is injectable for tests.
    """

    def __init__(self, config: QueueConfig, rng: Callable[[], float] = random.random) -> None:
        self.initial_s = config.retry_initial_interval_s
        self.max_s = config.retry_max_interval_s
        self.multiplier = config.retry_multiplier
        self.jitter = config.retry_jitter
        self._rng = rng

    def delay_s(self, attempt: int) -> float:
        base = min(self.max_s, self.initial_s * self.multiplier ** min(64, max(0, attempt - 1)))
        return base * (1.0 - self.jitter + 2.0 * self.jitter * self._rng())
