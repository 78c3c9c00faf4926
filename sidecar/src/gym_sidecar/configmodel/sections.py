"""Sections: validating input against a :class:`Section` class's annotated fields
(every type form the configuration uses), building the instance, and dumping it back to
plain data."""

from __future__ import annotations

import copy
import enum
import inspect
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import PurePath
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

from gym_sidecar.configmodel.declare import (
    INVALID,
    MISSING,
    Check,
    Field,
    FieldCheck,
    FieldInfo,
    Loc,
    SectionCheck,
    ValidationError,
)
from gym_sidecar.configmodel.values import (
    REDACTED,
    SCALARS,
    Opaque,
    Secret,
    check_str,
    choices,
    not_a_mapping,
    number,
)

S = TypeVar("S", bound="Section")


def _validate(tp: Any, value: Any, loc: Loc, problems: list[tuple[Loc, str]]) -> Any:
    """``value`` as type ``tp``, or ``INVALID`` with its problems appended."""
    check = SCALARS.get(tp)
    if check is not None:
        scalar = check(value)
        if isinstance(scalar, ValueError):
            problems.append((loc, str(scalar)))
            return INVALID
        return scalar
    if tp is Any:
        return value
    if isinstance(tp, type) and issubclass(tp, Section):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return tp._build(value, loc, problems)
        problems.append((loc, not_a_mapping(tp)))
        return INVALID
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, bytes) and issubclass(tp, str):
            value = check_str(value)
        try:
            return tp(value)
        except ValueError:
            problems.append((loc, f"Input should be {choices(list(tp))}"))
            return INVALID
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Annotated:
        for meta in tp.__metadata__:
            if isinstance(meta, Check) and meta.when == "before":
                value = _run_check(meta.func, value, loc, problems)
        if value is not INVALID:
            value = _validate(args[0], value, loc, problems)
        for meta in tp.__metadata__:
            if isinstance(meta, Check) and meta.when == "after" and value is not INVALID:
                value = _run_check(meta.func, value, loc, problems)
        return value
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        problems.append((loc, f"Input should be {choices(list(args))}"))
        return INVALID
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        [member] = _non_none(args)  # X | None only (_check_supported)
        return _validate(member, value, loc, problems)
    if origin is list:
        if not isinstance(value, list | tuple | set | frozenset):  # YAML's !!set too
            problems.append((loc, "Input should be a valid list"))
            return INVALID
        items = [_validate(args[0], v, (*loc, i), problems) for i, v in enumerate(value)]
        return INVALID if any(v is INVALID for v in items) else items
    if origin is dict:
        if not isinstance(value, Mapping):
            problems.append((loc, "Input should be a valid dictionary"))
            return INVALID
        out: dict[Any, Any] = {}
        ok = True
        for k, v in value.items():
            key = _validate(args[0], k, (*loc, k, "[key]"), problems)
            item = _validate(args[1], v, (*loc, k), problems)
            if key is INVALID or item is INVALID:
                ok = False
            else:
                out[key] = item
        return out if ok else INVALID
    raise TypeError(f"unsupported configuration type {tp!r}")  # _check_supported refused it


def _non_none(args: tuple[Any, ...]) -> list[Any]:
    return [a for a in args if a is not type(None)]


def _run_check(
    func: Callable[[Any], Any], value: Any, loc: Loc, problems: list[tuple[Loc, str]]
) -> Any:
    try:
        return func(value)
    except ValueError as exc:
        problems.append((loc, f"Value error, {exc}"))
        return INVALID


def _check_supported(tp: Any) -> None:
    """Raise TypeError for a type :func:`_validate` does not know, however deep."""
    if tp in SCALARS or tp is Any:
        return
    if isinstance(tp, type) and issubclass(tp, Section | enum.Enum):
        return
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        _check_supported(args[0])
    elif origin is Literal:
        pass
    elif origin is Union or origin is types.UnionType:
        members = _non_none(args)
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
        return f"Input should be greater than {number(info.gt)}"
    if info.ge is not None and not value >= info.ge:
        return f"Input should be greater than or equal to {number(info.ge)}"
    if info.lt is not None and not value < info.lt:
        return f"Input should be less than {number(info.lt)}"
    if info.le is not None and not value <= info.le:
        return f"Input should be less than or equal to {number(info.le)}"
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
    _field_checks: ClassVar[tuple[FieldCheck, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._specs = None  # resolved on first use: annotations may name later classes
        checks = list(cls._section_checks)
        field_checks = list(cls._field_checks)
        for name, attr in list(vars(cls).items()):
            if isinstance(attr, SectionCheck):
                checks.append(attr.func)
                setattr(cls, name, attr.func)
            elif isinstance(attr, FieldCheck):
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
            if not issubclass(klass, Section) or klass is Section:
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
                if value is not INVALID:
                    value = _check_field(spec, value, where, problems)
            elif spec.info.default_factory is not None:
                value = spec.info.default_factory()
            elif spec.info.default is not MISSING:
                value = copy.copy(spec.info.default)
            else:
                problems.append((where, "Field required"))
                value = INVALID
            if value is INVALID:
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
            return INVALID  # type: ignore[no-any-return]
        for check in cls._section_checks:
            try:
                check(obj)
            except ValueError as exc:
                problems.append((loc, f"Value error, {exc}"))
                return INVALID  # type: ignore[no-any-return]
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
            problems.append(((), not_a_mapping(cls)))
            built = INVALID
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
        return INVALID
    for check in spec.checks:
        value = _run_check(check, value, loc, problems)
        if value is INVALID:
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
