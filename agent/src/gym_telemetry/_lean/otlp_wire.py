"""Protocol Buffers wire format for OTLP's common messages: varints, length-prefixed
fields, ``KeyValue`` / ``AnyValue`` (as the SDK's ``_encode_value`` builds them).

Used by ``gym_telemetry._lean.span_encoding``. Functions return the bytes of one field (tag,
length and payload) or of a message payload. Values the stock encoder would log and
skip (an unknown type, an integer outside int64, a string that is not valid UTF-8)
raise ``UnsupportedValue``. The attribute-key cache is bounded (``MAX_CACHED_KEYS``
entries, cleared when full) and safe to share between threads (single dict stores).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

#: Bound of the attribute-key cache (entries); a full cache is cleared, never grown.
MAX_CACHED_KEYS: Final = 4096

_pack_double = struct.Struct("<d").pack
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1

#: The varint of every n < 128 (one byte).
VARINT_1: Final = [bytes([n]) for n in range(128)]

# KeyValue / AnyValue / ArrayValue / KeyValueList
T_KV_KEY: Final = b"\x0a"  # 1, len
T_KV_VALUE: Final = b"\x12"  # 2, len
T_AV_STRING: Final = b"\x0a"  # 1, len
T_AV_BOOL_TRUE: Final = b"\x10\x01"  # 2, varint 1
T_AV_BOOL_FALSE: Final = b"\x10\x00"  # 2, varint 0
T_AV_INT: Final = b"\x18"  # 3, varint
T_AV_DOUBLE: Final = b"\x21"  # 4, fixed64
T_AV_ARRAY: Final = b"\x2a"  # 5, len
T_AV_KVLIST: Final = b"\x32"  # 6, len
T_AV_BYTES: Final = b"\x3a"  # 7, len
T_LIST_VALUE: Final = b"\x0a"  # ArrayValue.values / KeyValueList.values: 1, len


class UnsupportedValue(ValueError):
    """A batch holds something only the stock encoder handles the way users expect."""


def varint(value: int) -> bytes:
    if value < 128:
        return VARINT_1[value]
    if value < 16384:  # two bytes (a token count)
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def len_prefixed(tag: bytes, payload: bytes) -> bytes:
    size = len(payload)
    if size < 128:
        return tag + VARINT_1[size] + payload
    return tag + varint(size) + payload


def string_field(tag: bytes, text: str) -> bytes:
    try:
        return len_prefixed(tag, text.encode())
    except UnicodeEncodeError as exc:
        raise UnsupportedValue(f"string is not valid UTF-8: {exc}") from None


def int64(value: int) -> bytes:
    if value < 0:
        if value < _INT64_MIN:
            raise UnsupportedValue(f"integer outside int64: {value}")
        return varint(value + (1 << 64))
    if value > _INT64_MAX:
        raise UnsupportedValue(f"integer outside int64: {value}")
    return varint(value)


def any_value(value: Any) -> bytes:
    """The AnyValue payload of ``value`` (as ``_encode_value`` of the SDK builds it)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return T_AV_BOOL_TRUE if value else T_AV_BOOL_FALSE
    if isinstance(value, str):
        return string_field(T_AV_STRING, value)
    if isinstance(value, int):
        return T_AV_INT + int64(value)
    if isinstance(value, float):
        return T_AV_DOUBLE + _pack_double(value)
    if isinstance(value, bytes):
        return len_prefixed(T_AV_BYTES, value)
    if isinstance(value, Sequence):
        items = b"".join([len_prefixed(T_LIST_VALUE, any_value(v)) for v in value])
        return len_prefixed(T_AV_ARRAY, items)
    if isinstance(value, Mapping):
        pairs = b"".join(
            [len_prefixed(T_LIST_VALUE, key_value(str(k), v)) for k, v in value.items()]
        )
        return len_prefixed(T_AV_KVLIST, pairs)
    raise UnsupportedValue(f"attribute value of type {type(value).__name__}")


KEY_PREFIXES: dict[str, bytes] = {}


def key_value(key: str, value: Any) -> bytes:
    """A KeyValue payload; the ``key`` part is cached."""
    prefix = KEY_PREFIXES.get(key)
    if prefix is None:
        if not isinstance(key, str):
            raise UnsupportedValue(f"attribute key of type {type(key).__name__}")
        prefix = string_field(T_KV_KEY, key)
        if len(KEY_PREFIXES) >= MAX_CACHED_KEYS:
            KEY_PREFIXES.clear()
        KEY_PREFIXES[key] = prefix
    # Fast paths for the common scalar types; everything else through _any_value.
    kind = type(value)
    if kind is str:
        try:
            data: bytes = value.encode()
        except UnicodeEncodeError as exc:
            raise UnsupportedValue(f"string is not valid UTF-8: {exc}") from None
        size = len(data)
        if size < 126:  # the AnyValue (tag + 1-byte length + data) stays under 128
            return prefix + T_KV_VALUE + VARINT_1[size + 2] + T_AV_STRING + VARINT_1[size] + data
        return prefix + len_prefixed(T_KV_VALUE, len_prefixed(T_AV_STRING, data))
    return prefix + len_prefixed(T_KV_VALUE, any_value(value))


def attributes_field(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    if not attributes:
        return b""
    return b"".join([len_prefixed(tag, key_value(k, v)) for k, v in attributes.items()])
