"""The receiver's JSON limits at their exact boundaries (``wire/protobuf/bounds.py``): one
level or byte inside a limit passes, one past it is refused, and the refusal says
which limit."""

from __future__ import annotations

from typing import Any

import pytest
from gym_sidecar.wire.protobuf.bounds import (
    BadHexId,
    TooDeep,
    json_values_exceed,
    rewrite_json_ids,
    too_deep_message,
)

MAX_DEPTH = 3  # objects; containers (objects and arrays) may nest 2 * 3 = 6 deep


def _lists(depth: int, inner: Any = 1) -> Any:
    for _ in range(depth):
        inner = [inner]
    return inner


def _objects(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        doc = {"a": doc}
    return doc


def test_objects_nest_up_to_max_depth() -> None:
    rewrite_json_ids(_objects(MAX_DEPTH), MAX_DEPTH)
    with pytest.raises(TooDeep) as info:
        rewrite_json_ids(_objects(MAX_DEPTH + 1), MAX_DEPTH)
    assert str(info.value) == too_deep_message(MAX_DEPTH)


def test_containers_nest_up_to_twice_max_depth() -> None:
    # the root object is container 1: five arrays below it reach 6, a sixth is 7
    rewrite_json_ids({"a": _lists(2 * MAX_DEPTH - 1)}, MAX_DEPTH)
    with pytest.raises(TooDeep) as info:
        rewrite_json_ids({"a": _lists(2 * MAX_DEPTH)}, MAX_DEPTH)
    assert str(info.value) == too_deep_message(MAX_DEPTH)


def test_objects_count_as_containers_too() -> None:
    # four arrays (containers 2-5), an object (6, object level 2), then another
    # object: object level 3 is allowed, container 7 is not
    rewrite_json_ids({"a": _lists(4, {"b": 1})}, MAX_DEPTH)
    with pytest.raises(TooDeep, match="deeper than 3 message levels"):
        rewrite_json_ids({"a": _lists(4, {"b": {"c": 1}})}, MAX_DEPTH)


def test_a_bad_hex_id_is_quoted_clipped_to_64_characters() -> None:
    value = "z" * 100
    with pytest.raises(BadHexId) as info:
        rewrite_json_ids({"traceId": value}, MAX_DEPTH)
    assert str(info.value) == f"traceId must be a hex string, got {'z' * 64!r}"


LIMIT = 10


@pytest.mark.parametrize("char", [b"{", b"[", b","])
def test_each_value_opening_byte_counts(char: bytes) -> None:
    assert json_values_exceed(char * (3 * LIMIT), LIMIT)


def test_bodies_up_to_twice_the_limit_are_never_refused() -> None:
    assert not json_values_exceed(b"," * (2 * LIMIT), LIMIT)
    assert json_values_exceed(b"," * (2 * LIMIT + 1), LIMIT)


def test_a_count_equal_to_the_limit_passes() -> None:
    padding = b" " * (LIMIT + 1)  # past the 2 * limit bytes that are never counted
    assert not json_values_exceed(b"," * LIMIT + padding, LIMIT)
    assert json_values_exceed(b"," * (LIMIT + 1) + padding, LIMIT)
