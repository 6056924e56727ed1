from __future__ import annotations

import pytest

from capture_core import (
    InvalidRolloutIdError,
    RolloutIdParts,
    is_valid_rollout_id,
    make_rollout_id,
    rollout_id_from_body,
    split_attempt,
    validate_rollout_id,
    with_attempt,
)


@pytest.mark.parametrize("rid", ["0-0", "s7-3-2", "step7.task3", "a", "A_b-1.2", "x" * 200])
def test_valid_ids_round_trip_unchanged(rid: str) -> None:
    assert validate_rollout_id(rid) == rid
    assert is_valid_rollout_id(rid)


@pytest.mark.parametrize(
    "rid", ["", ".hidden", "..", "a..b", "has/slash", "has space", "x" * 201, "-a", "é"]
)
def test_invalid_ids_raise_a_value_error_quoting_the_id_and_the_rule(rid: str) -> None:
    with pytest.raises(InvalidRolloutIdError) as info:
        validate_rollout_id(rid)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "^[A-Za-z0-9][A-Za-z0-9._-]*$" in message
    assert "200" in message
    assert ascii(rid[:80]) in message
    assert info.value.rollout_id == rid
    assert not is_valid_rollout_id(rid)


def test_control_characters_are_escaped_in_the_message() -> None:
    with pytest.raises(InvalidRolloutIdError) as info:
        validate_rollout_id("a\nb\x00c")
    assert "\n" not in str(info.value)
    assert "'a\\nb\\x00c'" in str(info.value)


def test_a_very_long_id_is_shortened_in_the_message() -> None:
    with pytest.raises(InvalidRolloutIdError) as info:
        validate_rollout_id("y" * 10_000)
    assert len(str(info.value)) < 500
    assert "10000 characters" in str(info.value)


@pytest.mark.parametrize("value", [None, 7, b"abc", 1.5, ["a"]])
def test_non_strings_are_refused(value: object) -> None:
    with pytest.raises(InvalidRolloutIdError):
        validate_rollout_id(value)


def test_make_rollout_id_and_attempts() -> None:
    assert make_rollout_id(3, 2) == "3-2"
    assert make_rollout_id("3", "2", attempt=1) == "3-2-a1"
    assert make_rollout_id(3, 2, attempt=0) == "3-2"
    assert with_attempt("s7-3-2", 1) == "s7-3-2-a1"
    assert with_attempt("abc", 12) == "abc-a12"
    with pytest.raises(InvalidRolloutIdError):
        make_rollout_id(-1, 2)
    with pytest.raises(InvalidRolloutIdError):
        make_rollout_id(True, 2)
    with pytest.raises(InvalidRolloutIdError):
        with_attempt("abc", -1)
    with pytest.raises(InvalidRolloutIdError):
        with_attempt("x" * 198, 1)  # the suffix would pass 200 characters


@pytest.mark.parametrize(
    ("rid", "parts"),
    [
        ("3-2", RolloutIdParts("3-2", 0)),
        ("3-2-a1", RolloutIdParts("3-2", 1)),
        ("s7-3-2-a12", RolloutIdParts("s7-3-2", 12)),
        ("abc-a0", RolloutIdParts("abc-a0", 0)),  # -a0 is never written, so it is not a suffix
        ("abc-a01", RolloutIdParts("abc-a01", 0)),
        ("-a1", None),
        ("a1", RolloutIdParts("a1", 0)),
    ],
)
def test_split_attempt(rid: str, parts: RolloutIdParts | None) -> None:
    if parts is None:
        with pytest.raises(InvalidRolloutIdError):
            split_attempt(rid)
        return
    assert split_attempt(rid) == parts
    assert parts.rollout_id == rid


def test_rollout_id_from_body() -> None:
    assert rollout_id_from_body({"_ng_task_index": 3, "_ng_rollout_index": 2}) == "3-2"
    body = {"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_attempt_index": 1}
    assert rollout_id_from_body(body) == "3-2-a1"
    assert rollout_id_from_body({**body, "_ng_attempt_index": "2"}) == "3-2-a2"
    assert rollout_id_from_body({**body, "_ng_attempt_index": 0}) == "3-2"
    assert rollout_id_from_body({"_ng_rollout_id": "abc"}) == "abc"
    assert rollout_id_from_body({"_ng_rollout_id": "s7-3-2", "_ng_attempt_index": 1}) == (
        "s7-3-2-a1"
    )
    assert rollout_id_from_body({"_ng_rollout_id": None, **body}) == "3-2-a1"
    assert rollout_id_from_body({"_ng_task_index": 3}) is None
    assert rollout_id_from_body({}) is None
    for bad in (".hidden", "has/slash", "has space", "", 7):
        with pytest.raises(InvalidRolloutIdError):
            rollout_id_from_body({"_ng_rollout_id": bad})
    with pytest.raises(InvalidRolloutIdError):
        rollout_id_from_body({**body, "_ng_attempt_index": "invalid"})
