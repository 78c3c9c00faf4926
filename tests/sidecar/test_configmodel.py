"""The configuration sections (``configmodel``): every problem with its key path, in
pydantic's wording, checked against pydantic itself on the same schema and inputs."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import pytest
from gym_sidecar import configmodel as cm
from gym_sidecar.configmodel import Field, Opaque, Secret, Section, ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st


class Colour(enum.StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


def _even(value: int) -> int:
    if value % 2:
        raise ValueError("must be even")
    return value


class Inner(Section):
    n: int = Field(default=1, ge=1, le=10)
    tags: list[str] = Field(default_factory=list)


class Outer(Section):
    a: int = Field(default=1, gt=0)
    b: float = Field(default=2.0, ge=1.0)
    c: float = Field(default=0.5, ge=0, lt=1)
    mode: Literal["x", "y", "z"] = "x"
    two: Literal["p", "q"] = "p"
    flag: bool = True
    name: str = Field(default="n", min_length=1)
    bounds: list[float] = Field(default_factory=list)
    caps: dict[str, int] = Field(default_factory=dict)
    colour: Colour = Colour.RED
    colours: dict[str, Colour] = Field(default_factory=dict)
    maybe: int | None = None
    even: Annotated[int, cm.after(_even)] = 2
    inner: Inner = Field(default_factory=Inner)
    inners: dict[str, Inner] = Field(default_factory=dict)
    where: Path | None = None


class PInner(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    n: int = pydantic.Field(default=1, ge=1, le=10)
    tags: list[str] = pydantic.Field(default_factory=list)


class POuter(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    a: int = pydantic.Field(default=1, gt=0)
    b: float = pydantic.Field(default=2.0, ge=1.0)
    c: float = pydantic.Field(default=0.5, ge=0, lt=1)
    mode: Literal["x", "y", "z"] = "x"
    two: Literal["p", "q"] = "p"
    flag: bool = True
    name: str = pydantic.Field(default="n", min_length=1)
    bounds: list[float] = pydantic.Field(default_factory=list)
    caps: dict[str, int] = pydantic.Field(default_factory=dict)
    colour: Colour = Colour.RED
    colours: dict[str, Colour] = pydantic.Field(default_factory=dict)
    maybe: int | None = None
    even: Annotated[int, pydantic.AfterValidator(_even)] = 2
    inner: PInner = pydantic.Field(default_factory=PInner)
    inners: dict[str, PInner] = pydantic.Field(default_factory=dict)
    where: Path | None = None


INPUTS: list[Any] = [
    {},
    {"a": "x", "b": "y", "c": 1, "mode": "q", "two": 1, "flag": "maybe", "name": ""},
    {"a": 1.5, "b": 0.5, "c": -1, "flag": 2, "name": 3, "bounds": [1, "a"], "caps": []},
    {"a": "7", "b": "3", "flag": "yes", "maybe": "4", "bounds": ("1", 2.5), "colour": "green"},
    {"a": True, "flag": 1, "b": True, "maybe": None, "flag2": 0},
    {"a": 0, "colour": "mauve", "colours": {"k": "blue", "j": "teal"}, "even": 3},
    {"a": [], "b": {}, "mode": None, "flag": "off", "name": None, "bounds": "1,2"},
    {"inner": {"n": 0, "tags": [1], "x": 1}, "inners": {"i": {"n": "11"}, "j": 5}},
    {"inner": 5, "inners": [], "caps": {"k": "1.5", "m": "2"}, "even": "4"},
    {"maybe": "", "c": "0.25", "b": "inf", "a": " 12 ", "where": "a/b"},
    {"where": 5},
    {"where": ""},
    {"a": "4.0", "maybe": " +4.00 ", "caps": {"k": "1_000.0", "m": "4."}, "even": "-0.0"},
    {"a": float("inf"), "maybe": float("nan"), "b": 10**400, "c": "\u0661.\u0665"},
    {"a": "\u0663", "flag": " true", "two": "P", "name": b"bytes", "colour": b"red"},
    {"name": b"\xff", "bounds": {2.5}, "inner": {"tags": frozenset({"t"})}},
    {1: 2, "inner": {2: 3, "n": 0}, "bogus": 1, "a": 0},
    7,
    None,
]


def _ours(data: Any) -> tuple[Any, list[tuple[Any, str]]]:
    try:
        return Outer.model_validate(data).model_dump(mode="json"), []
    except ValidationError as exc:
        return None, [(e["loc"], e["msg"]) for e in exc.errors()]


def _theirs(data: Any) -> tuple[Any, list[tuple[Any, str]]]:
    try:
        return POuter.model_validate(data).model_dump(mode="json"), []
    except pydantic.ValidationError as exc:
        # The twins' names differ only by their P.
        return None, [(e["loc"], e["msg"].replace("of P", "of ")) for e in exc.errors()]


@pytest.mark.parametrize("data", INPUTS, ids=range(len(INPUTS)))
def test_values_and_messages_match_pydantic(data: Any) -> None:
    ours, theirs = _ours(data), _theirs(data)
    assert ours[1] == theirs[1]  # the same problems in the same order
    assert ours[0] == theirs[0]


class Checked(Section):
    low: int = 1
    high: int = 2
    items: list[int] = Field(default_factory=list)

    @cm.field_validator("items")
    @classmethod
    def _sorted(cls, value: list[int]) -> list[int]:
        if value != sorted(value):
            raise ValueError("items must be sorted")
        return value

    @cm.model_validator(mode="after")
    def _ordered(self) -> Checked:
        if self.low > self.high:
            raise ValueError("low must not exceed high")
        return self


class Holder(Section):
    checked: Checked = Field(default_factory=Checked)
    extra: bool = False


class Child(Checked):
    """Inherits the parent's fields and checks."""

    top: int = 3


def test_section_checks_run_once_fields_are_valid_and_report_at_the_section() -> None:
    with pytest.raises(ValidationError) as info:
        Holder.model_validate({"checked": {"low": 5, "high": 1}})
    assert [(e["loc"], e["msg"]) for e in info.value.errors()] == [
        (("checked",), "Value error, low must not exceed high")
    ]
    # A field problem: the section check does not run on a half-valid section.
    with pytest.raises(ValidationError) as info:
        Holder.model_validate({"checked": {"low": 5, "high": 1, "items": [2, 1]}, "x": 1})
    assert [(e["loc"], e["msg"]) for e in info.value.errors()] == [
        (("checked", "items"), "Value error, items must be sorted"),
        (("x",), "Extra inputs are not permitted"),
    ]


def test_subclasses_inherit_fields_and_checks() -> None:
    assert Child(top=4).model_dump() == {"low": 1, "high": 2, "items": [], "top": 4}
    with pytest.raises(ValidationError, match="low must not exceed high"):
        Child(low=3, high=2)
    with pytest.raises(ValidationError, match="items must be sorted"):
        Child(items=[3, 1])


def test_keyword_construction_validates_and_names_the_class() -> None:
    with pytest.raises(ValidationError) as info:
        Outer(a=0, flag="perhaps")
    text = str(info.value)
    assert text.startswith("2 validation errors for Outer\n")
    assert "a\n  Input should be greater than 0" in text
    assert Outer(a="3").a == 3  # type: ignore[arg-type]  # lax, as for the environment


def test_defaults_are_fresh_per_instance_and_sections_compare_by_value() -> None:
    one, two = Outer(), Outer()
    one.bounds.append(1.0)
    one.inner.tags.append("t")
    assert two.bounds == [] and two.inner.tags == []
    assert Outer(a=2) == Outer(a="2")  # type: ignore[arg-type]
    assert Outer(a=2) != Outer(a=3)
    copied = one.model_copy(update={"a": 9})
    assert copied.a == 9 and one.a == 1 and copied.inner is one.inner
    assert repr(Inner()) == "Inner(n=1, tags=[])"


class Secrets(Section):
    header: Annotated[str, cm.after(Opaque)] = "x"
    token: Secret | None = None


def test_secrets_stay_out_of_reprs_and_json_dumps() -> None:
    s = Secrets.model_validate({"header": "Bearer abc", "token": "t0k"})
    assert isinstance(s.header, Opaque) and s.header == "Bearer abc"
    assert s.token is not None and s.token.get_secret_value() == "t0k"
    assert "abc" not in repr(s) and "t0k" not in repr(s) and "t0k" not in str(s.token)
    assert s.model_dump(mode="json") == {"header": "[REDACTED]", "token": "**********"}
    assert s.model_dump()["token"] == Secret("t0k")
    assert Secrets().model_dump(exclude_none=True) == {"header": "x"}


def test_an_empty_secret_shows_that_it_is_empty() -> None:
    empty = Secrets.model_validate({"token": ""})
    assert str(empty.token) == "" and repr(empty.token) == "Secret('')"
    assert empty.model_dump(mode="json")["token"] == ""


def _refuse(value: object) -> object:
    raise ValueError(f"no {value!r}")


class Before(Section):
    value: Annotated[int, cm.before(_refuse)] = 1


def test_a_failing_check_before_the_type_is_a_reported_problem() -> None:
    with pytest.raises(ValidationError) as info:
        Before.model_validate({"value": 3})
    assert [(e["loc"], e["msg"]) for e in info.value.errors()] == [
        (("value",), "Value error, no 3")
    ]


def test_setting_an_unknown_field_is_an_error() -> None:
    inner = Inner()
    inner.n = 5
    with pytest.raises(ValueError, match='"Inner" object has no field "m"'):
        inner.m = 5  # type: ignore[attr-defined]
    inner._private = 1  # private attributes are the class's own (SidecarConfig._source)


def test_unsupported_types_and_unknown_validator_fields_are_errors_at_first_use() -> None:
    class Odd(Section):
        value: int | str = 1

    with pytest.raises(TypeError, match=r"only X \| None"):
        Odd(value="a")

    class Typo(Section):
        value: int = 1

        @cm.field_validator("valeu")
        @classmethod
        def _check(cls, value: int) -> int:
            return value

    with pytest.raises(TypeError, match="unknown field 'valeu'"):
        Typo()


def test_the_serving_path_does_not_import_pydantic() -> None:
    import subprocess
    import sys

    code = (
        "import sys, gym_sidecar.cli, gym_sidecar.server\n"
        "from gym_sidecar.config import load_config\n"
        "load_config(None, {})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


_TEXT = st.sampled_from(
    [
        "",
        "x",
        "1",
        " 2 ",
        "4.0",
        "4.",
        "-0.0",
        "1_0",
        "1e3",
        "inf",
        "nan",
        "0.5",
        "true",
        "off",
        "YES",
        " on",
        "red",
        "blue",
        "p",
        "q",
        "z",
        "a/b",
        "\u0663",
        "1.5",
    ]
)
_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT,
    st.text(max_size=4),
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=6,
)
_KEYS = st.sampled_from([*Outer._fields(), "bogus", "n", "tags"])


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(st.dictionaries(_KEYS, _VALUE, max_size=6))
def test_random_inputs_validate_as_pydantic_validates_them(data: dict[str, Any]) -> None:
    ours, theirs = _ours(data), _theirs(data)
    assert ours[1] == theirs[1]
    assert repr(ours[0]) == repr(theirs[0])  # repr: nan equals itself there
