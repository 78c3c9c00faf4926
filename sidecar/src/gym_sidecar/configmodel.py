"""Typed configuration sections, validated with every problem's key path.

The sidecar's configuration (and the injection webhook's) is a tree of :class:`Section`
classes: each field is an annotated class attribute with a default (or a :func:`Field`
holding the default and its bounds). Input is validated once, as a whole, and every
problem comes out together with its key path, in pydantic's wording, which the docs
quote (``queue.max_bytes: Input should be greater than 0``)::

    class QueueConfig(Section):
        max_bytes: int = Field(default=64 * MiB, gt=0)
        fsync: Literal["always", "interval"] = "always"

        @field_validator("max_bytes")
        @classmethod
        def _check(cls, value: int) -> int: ...

Why not pydantic, which the sidecar used until 2026-12: imported on the serving path,
pydantic, pydantic-core and the modules they load (email, importlib.metadata, decimal,
zoneinfo, uuid, ...) held ~10 MiB resident in every sidecar (idle 46.1 -> 36.1 MiB, peak
at 10k spans/s 52.2 -> 42.1), to check ~150 settings once at start (docs/benchmarks.md,
the sidecar's RSS, "The fifth session"). This module covers what the configuration
uses, lax as pydantic is for values that arrive as text (environment variables):
``bool``, ``int``, ``float``, ``str``, ``Path``, ``Literal``, string enums, ``X | None``,
``list``, ``dict``, nested sections, :class:`Secret`, and ``Annotated[T, after(check)]``
or ``before(check)``. Anything else is a TypeError when the class is first used, not a
silent pass. The injection webhook's Kubernetes AdmissionReview models stay pydantic
(``webhook/admission.py``): that process parses foreign JSON with aliases, and its memory
is not the sidecar's.
"""

from __future__ import annotations

import copy
import enum
import inspect
import math
import re
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import (
    Annotated,
    Any,
    ClassVar,
    Literal,
    TypeVar,
    Union,
    dataclass_transform,
    get_args,
    get_origin,
)

S = TypeVar("S", bound="Section")
Loc = tuple[str | int, ...]

REDACTED = "[REDACTED]"
"""What an :class:`Opaque` value shows in dumps, reprs and logs."""
_MASK = "**********"
"""What a :class:`Secret` shows."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_INVALID: Any = _Missing()


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


class _FieldCheck:
    __slots__ = ("func", "names")

    def __init__(self, func: Any, names: tuple[str, ...]) -> None:
        self.func = func
        self.names = names


class _SectionCheck:
    __slots__ = ("func",)

    def __init__(self, func: Callable[[Any], Any]) -> None:
        self.func = func


def field_validator(*names: str) -> Callable[[Any], Any]:
    """Decorate a classmethod ``(cls, value) -> value`` checking the named fields once
    their types are valid; a ValueError is reported at each field's key path."""
    return lambda func: _FieldCheck(func, names)


def model_validator(*, mode: Literal["after"]) -> Callable[[Any], Any]:
    """Decorate a method ``(self) -> self`` checking the whole section once every field is
    valid; a ValueError is reported at the section's key path."""
    del mode  # only "after" exists here; the keyword keeps the declaration explicit
    return _SectionCheck


# -- values ---------------------------------------------------------------------------------
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
        return _MASK if self._value else ""  # an empty one shows it is empty

    def __repr__(self) -> str:
        return f"Secret({str(self)!r})"


def _not_a_mapping(cls: type) -> str:
    return f"Input should be a valid dictionary or instance of {cls.__name__}"


def _number(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _choices(values: list[Any]) -> str:
    shown = [repr(v.value if isinstance(v, enum.Enum) else v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _check_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, bytes):
        value = _check_str(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)  # 1.0 is 1 here, 1.5 no number at all (as in pydantic)
    if isinstance(value, int) and -(2**63) <= value < 2**63:
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
        if not -(2**63) <= value < 2**63:  # pydantic converts floats within int64 only
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


def _check_str(value: Any) -> Any:
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
    text = _check_str(value)
    return text if isinstance(text, ValueError) else Secret(text)


_SCALARS: dict[Any, Callable[[Any], Any]] = {
    bool: _check_bool,
    int: _check_int,
    float: _check_float,
    str: _check_str,
    Path: _check_path,
    Secret: _check_secret,
}


def _validate(tp: Any, value: Any, loc: Loc, problems: list[tuple[Loc, str]]) -> Any:
    """``value`` as type ``tp``, or ``_INVALID`` with its problems appended."""
    check = _SCALARS.get(tp)
    if check is not None:
        scalar = check(value)
        if isinstance(scalar, ValueError):
            problems.append((loc, str(scalar)))
            return _INVALID
        return scalar
    if tp is Any:
        return value
    if isinstance(tp, type) and issubclass(tp, Section):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return tp._build(value, loc, problems)
        problems.append((loc, _not_a_mapping(tp)))
        return _INVALID
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, bytes) and issubclass(tp, str):
            value = _check_str(value)
        try:
            return tp(value)
        except ValueError:
            problems.append((loc, f"Input should be {_choices(list(tp))}"))
            return _INVALID
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Annotated:
        for meta in tp.__metadata__:
            if isinstance(meta, Check) and meta.when == "before":
                value = _run_check(meta.func, value, loc, problems)
        if value is not _INVALID:
            value = _validate(args[0], value, loc, problems)
        for meta in tp.__metadata__:
            if isinstance(meta, Check) and meta.when == "after" and value is not _INVALID:
                value = _run_check(meta.func, value, loc, problems)
        return value
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        problems.append((loc, f"Input should be {_choices(list(args))}"))
        return _INVALID
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) != 1:
            raise TypeError(f"unsupported union {tp!r}: only X | None")
        return _validate(members[0], value, loc, problems)
    if origin is list:
        if not isinstance(value, list | tuple | set | frozenset):  # YAML's !!set too
            problems.append((loc, "Input should be a valid list"))
            return _INVALID
        items = [_validate(args[0], v, (*loc, i), problems) for i, v in enumerate(value)]
        return _INVALID if any(v is _INVALID for v in items) else items
    if origin is dict:
        if not isinstance(value, Mapping):
            problems.append((loc, "Input should be a valid dictionary"))
            return _INVALID
        out: dict[Any, Any] = {}
        ok = True
        for k, v in value.items():
            key = _validate(args[0], k, (*loc, k, "[key]"), problems)
            item = _validate(args[1], v, (*loc, k), problems)
            if key is _INVALID or item is _INVALID:
                ok = False
            else:
                out[key] = item
        return out if ok else _INVALID
    raise TypeError(f"unsupported configuration type {tp!r}")


def _run_check(
    func: Callable[[Any], Any], value: Any, loc: Loc, problems: list[tuple[Loc, str]]
) -> Any:
    try:
        return func(value)
    except ValueError as exc:
        problems.append((loc, f"Value error, {exc}"))
        return _INVALID


def _check_supported(tp: Any) -> None:
    """Raise TypeError for a type :func:`_validate` does not know, however deep."""
    if tp in _SCALARS or tp is Any:
        return
    if isinstance(tp, type) and issubclass(tp, Section | enum.Enum):
        return
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        _check_supported(args[0])
    elif origin is Literal:
        pass
    elif origin is Union or origin is types.UnionType:
        members = [a for a in args if a is not type(None)]
        if len(members) != 1:
            raise TypeError(f"unsupported union {tp!r}: only X | None")
        _check_supported(members[0])
    elif origin is list or origin is dict:
        for arg in args:
            _check_supported(arg)
    else:
        raise TypeError(f"unsupported configuration type {tp!r}")


def _bounds(info: FieldInfo, value: Any) -> str | None:
    if info.gt is not None and not value > info.gt:
        return f"Input should be greater than {_number(info.gt)}"
    if info.ge is not None and not value >= info.ge:
        return f"Input should be greater than or equal to {_number(info.ge)}"
    if info.lt is not None and not value < info.lt:
        return f"Input should be less than {_number(info.lt)}"
    if info.le is not None and not value <= info.le:
        return f"Input should be less than or equal to {_number(info.le)}"
    if info.min_length is not None and len(value) < info.min_length:
        n = info.min_length
        if isinstance(value, str):
            return f"String should have at least {n} character{'s' if n != 1 else ''}"
        items = f"{n} item{'s' if n != 1 else ''}"
        return f"List should have at least {items} after validation, not {len(value)}"
    return None


class _Spec:
    """One field, resolved: its type, default and checks."""

    __slots__ = ("checks", "info", "tp")

    def __init__(self, tp: Any, info: FieldInfo, checks: list[Any]) -> None:
        self.tp = tp
        self.info = info
        self.checks = checks


# -- sections -------------------------------------------------------------------------------
@dataclass_transform(kw_only_default=True, field_specifiers=(Field,))
class Section:
    """A configuration section: keyword construction validates (raising
    :class:`ValidationError`), unknown keys are errors, defaults are not validated."""

    _specs: ClassVar[dict[str, _Spec] | None] = None
    _section_checks: ClassVar[tuple[Callable[[Any], Any], ...]] = ()
    _field_checks: ClassVar[tuple[_FieldCheck, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._specs = None  # resolved on first use: annotations may name later classes
        checks = list(cls._section_checks)
        field_checks = list(cls._field_checks)
        for name, attr in list(vars(cls).items()):
            if isinstance(attr, _SectionCheck):
                checks.append(attr.func)
                setattr(cls, name, attr.func)
            elif isinstance(attr, _FieldCheck):
                field_checks.append(attr)
                setattr(cls, name, attr.func)
        cls._section_checks = tuple(checks)
        cls._field_checks = tuple(field_checks)

    @classmethod
    def _fields(cls) -> dict[str, _Spec]:
        cached: dict[str, _Spec] | None = cls.__dict__.get("_specs")
        if cached is not None:
            return cached
        specs: dict[str, _Spec] = {}
        field_checks: dict[str, list[Any]] = {}
        for check in cls._field_checks:
            for name in check.names:
                field_checks.setdefault(name, []).append(check.func)
        for klass in reversed(cls.__mro__):
            if not (isinstance(klass, type) and issubclass(klass, Section)) or klass is Section:
                continue
            module = sys.modules[klass.__module__].__dict__
            for name, ann in inspect.get_annotations(klass).items():
                if name.startswith("_"):
                    continue
                tp = eval(ann, module, dict(vars(klass))) if isinstance(ann, str) else ann
                if get_origin(tp) is ClassVar:
                    continue
                _check_supported(tp)
                raw = klass.__dict__.get(name, MISSING)
                info = raw if isinstance(raw, FieldInfo) else Field(raw)
                specs[name] = _Spec(tp, info, [])
        for name, funcs in field_checks.items():
            if name not in specs:
                raise TypeError(f"{cls.__name__}: a validator names unknown field {name!r}")
            specs[name].checks = [f.__get__(None, cls) for f in funcs]
        cls._specs = specs
        return specs

    @classmethod
    def _build(
        cls: type[S], data: Mapping[Any, Any], loc: Loc, problems: list[tuple[Loc, str]]
    ) -> S:
        specs = cls._fields()
        obj = cls.__new__(cls)
        ok = True
        for name, spec in specs.items():
            where = (*loc, name)
            if name in data:
                value = _validate(spec.tp, data[name], where, problems)
                if value is not _INVALID:
                    value = _check_field(spec, value, where, problems)
            elif spec.info.default_factory is not None:
                value = spec.info.default_factory()
            elif spec.info.default is not MISSING:
                value = copy.copy(spec.info.default)
            else:
                problems.append((where, "Field required"))
                value = _INVALID
            if value is _INVALID:
                ok = False
            else:
                obj.__dict__[name] = value
        # After the fields' problems, as pydantic lists them.
        for key in data:
            if not isinstance(key, str):
                problems.append(((*loc, key), "Keys should be strings"))
                ok = False
            elif key not in specs:
                problems.append(((*loc, key), "Extra inputs are not permitted"))
                ok = False
        if not ok:
            return _INVALID  # type: ignore[no-any-return]
        for check in cls._section_checks:
            try:
                check(obj)
            except ValueError as exc:
                problems.append((loc, f"Value error, {exc}"))
                return _INVALID  # type: ignore[no-any-return]
        return obj

    def __init__(self, **data: Any) -> None:
        problems: list[tuple[Loc, str]] = []
        built = type(self)._build(data, (), problems)
        if problems:
            raise ValidationError(type(self).__name__, problems)
        self.__dict__.update(built.__dict__)

    @classmethod
    def model_validate(cls: type[S], data: Any) -> S:
        """``data`` (a mapping, or already a ``cls``) as a validated ``cls``."""
        if isinstance(data, cls):
            return data
        problems: list[tuple[Loc, str]] = []
        if not isinstance(data, Mapping):
            problems.append(((), _not_a_mapping(cls)))
            built = _INVALID
        else:
            built = cls._build(data, (), problems)
        if problems:
            raise ValidationError(cls.__name__, problems)
        return built  # type: ignore[no-any-return]

    def model_dump(
        self, *, mode: Literal["python", "json"] = "python", exclude_none: bool = False
    ) -> dict[str, Any]:
        """The fields as plain data; ``json`` mode gives text for enums and secrets."""
        out: dict[str, Any] = {}
        for name in self._fields():
            value = self.__dict__[name]
            if not (exclude_none and value is None):
                out[name] = _dump(value, mode == "json", exclude_none)
        return out

    def model_copy(self: S, *, update: Mapping[str, Any] | None = None) -> S:
        """A shallow copy with ``update``'s fields replaced (not validated)."""
        new = copy.copy(self)
        new.__dict__.update(update or {})
        return new

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(self.__dict__[n] == other.__dict__[n] for n in self._fields())

    __hash__ = None  # type: ignore[assignment]

    def __setattr__(self, name: str, value: Any) -> None:
        # A typo in code (cfg.queue.max_byte = ...) is an error, as it was with pydantic;
        # private attributes (``_source``) are the class's own business.
        if not name.startswith("_") and name not in self._fields():
            raise ValueError(f'"{type(self).__name__}" object has no field "{name}"')
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={self.__dict__[n]!r}" for n in self._fields())
        return f"{type(self).__name__}({fields})"


def _check_field(spec: _Spec, value: Any, loc: Loc, problems: list[tuple[Loc, str]]) -> Any:
    bad = _bounds(spec.info, value) if value is not None else None
    if bad is not None:
        problems.append((loc, bad))
        return _INVALID
    for check in spec.checks:
        value = _run_check(check, value, loc, problems)
        if value is _INVALID:
            break
    return value


def _dump(value: Any, as_json: bool, exclude_none: bool) -> Any:
    if isinstance(value, Section):
        return value.model_dump(mode="json" if as_json else "python", exclude_none=exclude_none)
    if isinstance(value, list | tuple):
        return [_dump(v, as_json, exclude_none) for v in value]
    if isinstance(value, dict):
        return {
            _dump(k, as_json, exclude_none): _dump(v, as_json, exclude_none)
            for k, v in value.items()
        }
    if as_json:
        if isinstance(value, Opaque):
            return REDACTED
        if isinstance(value, Secret):
            return str(value)
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, PurePath):
            return str(value)
    return value
