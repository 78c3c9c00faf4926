"""Declaring a configuration section: :func:`Field` (a default and its bounds), the
``Annotated`` checks (:func:`after`, :func:`before`), the field and section validators,
and :class:`ValidationError`, which lists every problem with its key path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

Loc = tuple[str | int, ...]
"""A key path: section and field names, list indexes, dict keys."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
INVALID: Any = _Missing()


# -- errors ------------------------------------------------------------------------------
class ValidationError(ValueError):
    """Input that does not fit a section: ``errors()`` lists every problem, each a dict
    with its ``loc`` (the key path, a tuple) and ``msg``."""

    def __init__(self, title: str, problems: list[tuple[Loc, str]]) -> None:
        self.title = title
        self.problems = problems
        n = len(problems)
        lines = [f"{n} validation error{'s' if n != 1 else ''} for {title}"]
        for loc, msg in problems:
            lines += [".".join(str(p) for p in loc) or "<root>", f"  {msg}"]
        super().__init__("\n".join(lines))

    def errors(self) -> list[dict[str, Any]]:
        return [{"loc": loc, "msg": msg} for loc, msg in self.problems]


# -- field declarations ------------------------------------------------------------------
class FieldInfo:
    """A field's default and bounds (what :func:`Field` returns)."""

    __slots__ = ("default", "default_factory", "ge", "gt", "le", "lt", "min_length")

    def __init__(  # noqa: PLR0917 (built by Field, which takes keywords)
        self,
        default: Any,
        default_factory: Callable[[], Any] | None,
        gt: float | None,
        ge: float | None,
        lt: float | None,
        le: float | None,
        min_length: int | None,
    ) -> None:
        self.default = default
        self.default_factory = default_factory
        self.gt, self.ge, self.lt, self.le = gt, ge, lt, le
        self.min_length = min_length


def Field(
    default: Any = MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
) -> Any:
    """A field's default (or ``default_factory``) and its bounds."""
    return FieldInfo(default, default_factory, gt, ge, lt, le, min_length)


class Check:
    """``Annotated`` metadata: a function run on the value after its type is validated
    (:func:`after`) or on the raw input before (:func:`before`); a ValueError it raises is
    the problem reported."""

    __slots__ = ("func", "when")

    def __init__(self, func: Callable[[Any], Any], when: Literal["before", "after"]) -> None:
        self.func = func
        self.when = when


def after(func: Callable[[Any], Any]) -> Check:
    return Check(func, "after")


def before(func: Callable[[Any], Any]) -> Check:
    return Check(func, "before")


class FieldCheck:
    __slots__ = ("func", "names")

    def __init__(self, func: Any, names: tuple[str, ...]) -> None:
        self.func = func
        self.names = names


class SectionCheck:
    __slots__ = ("func",)

    def __init__(self, func: Callable[[Any], Any]) -> None:
        self.func = func


def field_validator(*names: str) -> Callable[[Any], Any]:
    """Decorate a classmethod ``(cls, value) -> value`` checking the named fields once
    their types are valid; a ValueError is reported at each field's key path."""
    return lambda func: FieldCheck(func, names)


def model_validator(*, mode: Literal["after"]) -> Callable[[Any], Any]:
    """Decorate a method ``(self) -> self`` checking the whole section once every field is
    valid; a ValueError is reported at the section's key path."""
    del mode  # only "after" exists here; the keyword keeps the declaration explicit
    return SectionCheck
