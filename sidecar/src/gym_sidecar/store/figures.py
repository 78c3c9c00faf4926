"""A rollout's RL figures, as the store reads them from its span's attributes JSON.

The agent writes them on the ``gym.rollout`` span (RL-DESIGN.md, ``semconv.attributes``):
``nemo.gym.reward`` (the ``/run`` answer's reward), ``nemo.gym.rollout.turns`` (its model
calls) and ``nemo.gym.rollout.input_tokens`` / ``output_tokens`` (the usage Gym summed
into the answer). A value of the wrong type reads as absent (span data is hostile).
Gym's own telemetry writes none of them: its rollouts show ``-``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gym_telemetry_semconv as semconv


def _number(value: Any) -> float | None:
    """A finite int or float attribute (not a bool) as a float, else None."""
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    return None


def _count(value: Any) -> int | None:
    """A non-negative int attribute (not a bool), else None."""
    return value if type(value) is int and value >= 0 else None


@dataclass(frozen=True)
class RlFigures:
    """The RL figures of one rollout, from its span's attributes (``nemo.gym.reward``,
    ``nemo.gym.rollout.turns|input_tokens|output_tokens``)."""

    reward: float | None = None
    turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    @classmethod
    def of(cls, attrs: dict[str, Any]) -> RlFigures:
        return cls(
            _number(attrs.get(semconv.REWARD)),
            _count(attrs.get(semconv.ROLLOUT_TURNS)),
            _count(attrs.get(semconv.ROLLOUT_INPUT_TOKENS)),
            _count(attrs.get(semconv.ROLLOUT_OUTPUT_TOKENS)),
        )

    def or_counts_of(self, other: RlFigures | None) -> RlFigures:
        """These figures, with turns and tokens from ``other`` when these have none (a
        relaying rollout's span leaves them to the nested span it reached)."""
        if other is None or self.turns is not None or self.input_tokens is not None:
            return self
        return RlFigures(self.reward, other.turns, other.input_tokens, other.output_tokens)
