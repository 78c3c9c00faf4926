"""The value type enrichment sources produce, and its conversion to OTLP KeyValues."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

AttributeValue = str | tuple[str, ...]
"""A string, or a string array (e.g. ``container.image.tags``)."""

Attributes = Mapping[str, AttributeValue]


def to_any_value(value: AttributeValue) -> AnyValue:
    """An OTLP AnyValue holding ``value``."""
    if isinstance(value, str):
        return AnyValue(string_value=value)
    out = AnyValue()
    out.array_value.values.extend(AnyValue(string_value=v) for v in value)
    return out
