"""Rules every staging wire model shares: closed, finite, strict, versioned, round-trippable."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from capture_core import staging
from capture_core.staging import UNSUPPORTED_VERSION_ERROR_TYPE
from tests.capture_core.staging.examples import valid_bodies

MODELS: dict[str, type[BaseModel]] = {name: getattr(staging, name) for name in valid_bodies()}

# A path to an int field of each model besides schema_version (None: it has no other).
INT_FIELD: dict[str, tuple[Any, ...] | None] = {
    "CaptureAdmission": ("prev_len",),
    "GenerationCutContinuation": ("prefix_token_count",),
    "StagedCallBaseSnapshot": ("token_ids_delta", 0),
    "StagedCallRecord": ("weight_version",),
    "StagedCallSnapshot": ("token_ids_delta", 1),
    "StageResult": None,
    "CommitCoords": ("weight_version",),
    "CallRecord": ("fingerprint_version",),
    "ManifestFailure": None,
    "RolloutManifest": ("records", 0, "cum_len"),
    "RolloutReceipt": ("manifest", 1, "weight_version"),
    "RolloutRemoval": None,
}

# A path to a float field (None: the model has no float field).
FLOAT_FIELD: dict[str, tuple[Any, ...] | None] = {
    "CaptureAdmission": None,
    "GenerationCutContinuation": None,
    "StagedCallBaseSnapshot": ("generation_log_probs_delta", 2),
    "StagedCallRecord": ("token_mask_delta", 2),
    "StagedCallSnapshot": ("generation_log_probs_delta", 1),
    "StageResult": None,
    "CommitCoords": None,
    "CallRecord": ("admitted_at",),
    "ManifestFailure": None,
    "RolloutManifest": ("records", 1, "admitted_at"),
    "RolloutReceipt": ("reward",),
    "RolloutRemoval": None,
}

# A path to a nested model, where the model has one.
NESTED_MODEL: dict[str, tuple[Any, ...]] = {
    "CaptureAdmission": ("generation_cut",),
    "RolloutManifest": ("failures", 0),
    "RolloutReceipt": ("manifest", 0),
}

DIGESTED = [
    name
    for name, model in MODELS.items()
    if "digest_version" in model.model_fields and "extras_digest_version" in model.model_fields
]


def _with(body: dict[str, Any], path: tuple[Any, ...], value: object) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    target: Any = changed
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return changed


def _errors(name: str, body: dict[str, Any]) -> list[Any]:
    with pytest.raises(ValidationError) as caught:
        MODELS[name].model_validate(body)
    return caught.value.errors()


def test_every_listed_model_has_cases() -> None:
    assert set(MODELS) == set(INT_FIELD) == set(FLOAT_FIELD)
    assert set(DIGESTED) == {
        "StagedCallBaseSnapshot",
        "StagedCallRecord",
        "StagedCallSnapshot",
        "CommitCoords",
        "CallRecord",
        "RolloutReceipt",
    }


@pytest.mark.parametrize("name", MODELS)
def test_valid_body_round_trips_unchanged(name: str) -> None:
    body = valid_bodies()[name]
    model = MODELS[name].model_validate(body)
    # Every field is present in the dump, defaults and versions included.
    assert model.model_dump(mode="json") == body
    assert list(model.model_dump(mode="json")) == list(MODELS[name].model_fields)
    text = model.model_dump_json()
    again = MODELS[name].model_validate_json(text)
    assert again == model
    assert again.model_dump_json() == text
    assert json.loads(text) == body


@pytest.mark.parametrize("name", MODELS)
def test_unknown_top_level_key_is_refused(name: str) -> None:
    errors = _errors(name, {**valid_bodies()[name], "finish_reason": "stop"})
    assert [(e["type"], e["loc"]) for e in errors] == [("extra_forbidden", ("finish_reason",))]


@pytest.mark.parametrize("name", NESTED_MODEL)
def test_unknown_nested_key_is_refused(name: str) -> None:
    path = NESTED_MODEL[name]
    body = valid_bodies()[name]
    errors = _errors(name, _with(body, (*path, "capture_note"), "x"))
    assert [(e["type"], e["loc"]) for e in errors] == [("extra_forbidden", (*path, "capture_note"))]


@pytest.mark.parametrize("name", [n for n, path in FLOAT_FIELD.items() if path])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_float_is_refused(name: str, value: float) -> None:
    path = FLOAT_FIELD[name]
    assert path is not None
    errors = _errors(name, _with(valid_bodies()[name], path, value))
    assert [(e["type"], e["loc"]) for e in errors] == [("finite_number", path)]


@pytest.mark.parametrize("name", [n for n, path in FLOAT_FIELD.items() if path])
@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_float_in_json_is_refused(name: str, token: str) -> None:
    path = FLOAT_FIELD[name]
    assert path is not None
    marker = 123456.5
    text = json.dumps(_with(valid_bodies()[name], path, marker)).replace(str(marker), token)
    with pytest.raises(ValidationError) as caught:
        MODELS[name].model_validate_json(text)
    assert caught.value.errors()[0]["loc"] == path


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("value", [3.0, True, "3", float("nan")])
def test_schema_version_must_be_an_exact_int(name: str, value: object) -> None:
    errors = _errors(name, {**valid_bodies()[name], "schema_version": value})
    assert [e["loc"] for e in errors] == [("schema_version",)]
    assert errors[0]["type"] == "int_type"


@pytest.mark.parametrize("name", [n for n, path in INT_FIELD.items() if path])
@pytest.mark.parametrize("value", [5.0, True, "5", float("inf")])
def test_int_field_refuses_float_bool_and_string(name: str, value: object) -> None:
    path = INT_FIELD[name]
    assert path is not None
    errors = _errors(name, _with(valid_bodies()[name], path, value))
    assert [(e["type"], e["loc"]) for e in errors] == [("int_type", path)]


@pytest.mark.parametrize("name", [n for n, path in INT_FIELD.items() if path])
def test_int_field_refuses_a_float_in_json(name: str) -> None:
    path = INT_FIELD[name]
    assert path is not None
    text = json.dumps(_with(valid_bodies()[name], path, 987654.0))
    with pytest.raises(ValidationError) as caught:
        MODELS[name].model_validate_json(text)
    assert [(e["type"], e["loc"]) for e in caught.value.errors()] == [("int_type", path)]


@pytest.mark.parametrize("name", MODELS)
def test_newer_schema_version_is_refused_with_an_upgrade_message(name: str) -> None:
    errors = _errors(name, {**valid_bodies()[name], "schema_version": 4})
    assert [(e["type"], e["loc"]) for e in errors] == [
        (UNSUPPORTED_VERSION_ERROR_TYPE, ("schema_version",))
    ]
    assert "newer than this ngcapture supports (3)" in errors[0]["msg"]
    assert "upgrade" in errors[0]["msg"]


@pytest.mark.parametrize("name", MODELS)
def test_older_schema_version_is_refused(name: str) -> None:
    errors = _errors(name, {**valid_bodies()[name], "schema_version": 2})
    assert "version 2 is no longer supported" in errors[0]["msg"]


@pytest.mark.parametrize("name", DIGESTED)
@pytest.mark.parametrize(("field", "newer"), [("digest_version", 3), ("extras_digest_version", 2)])
def test_newer_digest_versions_are_refused(name: str, field: str, newer: int) -> None:
    errors = _errors(name, {**valid_bodies()[name], field: newer})
    assert [(e["type"], e["loc"]) for e in errors] == [(UNSUPPORTED_VERSION_ERROR_TYPE, (field,))]
    assert f"{field}: version {newer} is newer" in errors[0]["msg"]


@pytest.mark.parametrize("name", MODELS)
def test_versions_default_to_current(name: str) -> None:
    versions = {"schema_version", "digest_version", "extras_digest_version"}
    body = {k: v for k, v in valid_bodies()[name].items() if k not in versions}
    dumped = MODELS[name].model_validate(body).model_dump()
    assert dumped["schema_version"] == 3
    if name in DIGESTED:
        assert (dumped["digest_version"], dumped["extras_digest_version"]) == (2, 1)


@pytest.mark.parametrize("name", MODELS)
def test_models_are_frozen(name: str) -> None:
    model = MODELS[name].model_validate(valid_bodies()[name])
    with pytest.raises(ValidationError, match="frozen"):
        model.schema_version = 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("CaptureAdmission", "rollout_id"),
        ("StagedCallRecord", "model_call_id"),
        ("CommitCoords", "rollout_id"),
        ("CallRecord", "response_id"),
        ("ManifestFailure", "reason"),
        ("RolloutManifest", "rollout_id"),
    ],
)
@pytest.mark.parametrize("value", ["", 7, None])
def test_identifiers_are_non_empty_strings(name: str, field: str, value: object) -> None:
    errors = _errors(name, {**valid_bodies()[name], field: value})
    assert errors[0]["loc"][0] == field
    assert errors[0]["type"] in {"string_too_short", "string_type"}


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("StagedCallRecord", "digest"),
        ("StagedCallRecord", "chain_hash"),
        ("CommitCoords", "cumulative_hash"),
        ("CallRecord", "extras_digest"),
        ("CaptureAdmission", "parent_chain_hash"),
        ("GenerationCutContinuation", "prefix_digest"),
    ],
)
@pytest.mark.parametrize("value", ["A" * 64, "a" * 63, "a" * 65, "g" * 64, " " + "a" * 63])
def test_digests_are_64_lowercase_hex(name: str, field: str, value: str) -> None:
    errors = _errors(name, {**valid_bodies()[name], field: value})
    assert [(e["type"], e["loc"]) for e in errors] == [("string_pattern_mismatch", (field,))]
