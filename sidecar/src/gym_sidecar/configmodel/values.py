"""The scalar values a configuration holds, read as pydantic reads them (lax for text, as
the environment sends it), with pydantic's messages; and the two secret kinds,
:class:`Opaque` (text passed on, never shown) and :class:`Secret` (a token)."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

REDACTED = "[REDACTED]"
"""What an :class:`Opaque` value shows in dumps, reprs and logs."""
MASK = "**********"
"""What a non-empty :class:`Secret` shows."""


class Opaque(str):
    """A secret configuration value, like the Collector's ``configopaque.String``: it is
    the real text wherever it is used (it *is* a ``str``: headers, metadata), but its
    ``repr`` -- what a dict, a section or a log line shows -- is ``'[REDACTED]'``, and a
    JSON dump (``check-config``) shows ``[REDACTED]``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(REDACTED)


class Secret:
    """A secret that is not text to pass on (the span-group API token): ``str`` and
    ``repr`` show ``**********`` (or that it is empty); :meth:`get_secret_value` gives
    it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __str__(self) -> str:
        return MASK if self._value else ""  # an empty one shows it is empty

    def __repr__(self) -> str:
        return f"Secret({str(self)!r})"


def not_a_mapping(cls: type) -> str:
    return f"Input should be a valid dictionary or instance of {cls.__name__}"


def number(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def choices(values: list[Any]) -> str:
    shown = [repr(v.value if isinstance(v, enum.Enum) else v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _int64(value: float) -> bool:
    """Whether pydantic holds ``value`` as a 64-bit integer (it reads larger ones apart)."""
    return -(2**63) <= value < 2**63


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _check_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, bytes):
        value = check_str(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)  # 1.0 is 1 here, 1.5 no number at all (as in pydantic)
    if isinstance(value, int) and _int64(value):
        if value in (0, 1):
            return bool(value)
        return ValueError("Input should be a valid boolean, unable to interpret input")
    if isinstance(value, str):
        text = value.lower()  # not stripped: " true" is not a boolean (as in pydantic)
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        return ValueError("Input should be a valid boolean, unable to interpret input")
    return ValueError("Input should be a valid boolean")


# Integer text as pydantic reads it: ASCII digits (``_`` between them), a sign, and a
# zero fraction allowed ("4.0", "1_000.00"); int() alone would also take other scripts'
# digits and refuse "4.0".
_INT_TEXT = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0+)?")


def _check_int(value: Any) -> Any:
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return ValueError("Input should be a finite number")
        if not _int64(value):  # pydantic converts floats within int64 only
            return ValueError("Unable to parse input string as an integer, exceeded maximum size")
        if value.is_integer():
            return int(value)
        return ValueError("Input should be a valid integer, got a number with a fractional part")
    if isinstance(value, str):
        text = value.strip()
        if _INT_TEXT.fullmatch(text):
            return int(text.partition(".")[0])
        return ValueError("Input should be a valid integer, unable to parse string as an integer")
    return ValueError("Input should be a valid integer")


def _check_float(value: Any) -> Any:
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an integer beyond the float range
            return ValueError("Input should be a valid number")
    if isinstance(value, str) and value.isascii():
        try:
            return float(value.strip())
        except ValueError:
            pass
    if isinstance(value, str):
        return ValueError("Input should be a valid number, unable to parse string as a number")
    return ValueError("Input should be a valid number")


def check_str(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):  # YAML's !!binary
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return ValueError(
                "Input should be a valid string, unable to parse raw data as a unicode string"
            )
    return ValueError("Input should be a valid string")


def _check_path(value: Any) -> Any:
    if isinstance(value, PurePath | str):
        return Path(value)
    return ValueError("Input is not a valid path for <class 'pathlib.Path'>")


def _check_secret(value: Any) -> Any:
    if isinstance(value, Secret):
        return value
    text = check_str(value)
    return text if isinstance(text, ValueError) else Secret(text)


SCALARS: dict[Any, Callable[[Any], Any]] = {
    bool: _check_bool,
    int: _check_int,
    float: _check_float,
    str: check_str,
    Path: _check_path,
    Secret: _check_secret,
}
