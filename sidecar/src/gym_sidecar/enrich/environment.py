"""The environment source: the sidecar's own ``OTEL_RESOURCE_ATTRIBUTES``.

Format (OpenTelemetry resource SDK spec): ``key1=value1,key2=value2``, W3C-Baggage-like
without ``;`` metadata; optional whitespace around members is trimmed; ``,`` and ``=``
inside keys or values are percent-encoded and everything is percent-decoded as UTF-8.
On any error the whole variable is discarded and the error reported (as the spec says),
rather than applying half of it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from urllib.parse import unquote

from gym_sidecar.enrich.attributes import AttributeValue

logger = logging.getLogger(__name__)

ENV_VAR = "OTEL_RESOURCE_ATTRIBUTES"

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


class ResourceAttributesError(ValueError):
    """``OTEL_RESOURCE_ATTRIBUTES`` is malformed; the message says where."""


def _decode(text: str, what: str) -> str:
    if _BAD_ESCAPE.search(text):
        raise ResourceAttributesError(f"{what}: malformed percent-encoding in {text!r}")
    try:
        return unquote(text, encoding="utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise ResourceAttributesError(f"{what}: percent-encoded bytes are not UTF-8") from exc


def parse_resource_attributes(text: str) -> dict[str, str]:
    """Parse an ``OTEL_RESOURCE_ATTRIBUTES`` value; raise ResourceAttributesError if bad.

    Empty members (``a=1,,b=2`` or a trailing comma) are ignored; a later duplicate key
    wins, as in the SDKs.
    """
    out: dict[str, str] = {}
    for index, raw_member in enumerate(text.split(",")):
        member = raw_member.strip(" \t")
        if not member:
            continue
        key, sep, value = member.partition("=")
        where = f"member {index + 1}"
        if not sep:
            raise ResourceAttributesError(f"{where}: {member!r} has no '='")
        key = _decode(key.strip(" \t"), where)
        if not key:
            raise ResourceAttributesError(f"{where}: empty key")
        out[key] = _decode(value.strip(" \t"), where)
    return out


def environment_attributes(environ: Mapping[str, str] | None = None) -> dict[str, AttributeValue]:
    """The attributes of ``OTEL_RESOURCE_ATTRIBUTES`` in ``environ`` (default: os.environ).

    A malformed value is logged once as an error and contributes nothing.
    """
    env = os.environ if environ is None else environ
    text = env.get(ENV_VAR, "")
    if not text.strip():
        return {}
    try:
        return dict(parse_resource_attributes(text))
    except ResourceAttributesError as exc:
        logger.error("ignoring %s: %s", ENV_VAR, exc)
        return {}
