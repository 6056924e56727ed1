"""The base of every staging wire model: strict field types, enumerations and versions.

Every model forbids unknown keys and NaN/infinity, and is frozen. Integers are strict (a float,
bool or numeric string is refused), strings are strict, and ``schema_version`` (plus
``digest_version`` and ``extras_digest_version`` on the version-bearing models) defaults to the
current version and refuses any other, with an "upgrade" message for a newer one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Final

from annotated_types import Ge, Lt
from pydantic import AfterValidator, BaseModel, ConfigDict, Strict, StringConstraints
from pydantic_core import PydanticCustomError

from capture_core.staging._rules import check_version
from capture_core.staging.digests import (
    DIGEST_VERSION,
    EXTRAS_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
)
from capture_core.staging.errors import (
    STAGING_RULE_ERROR_TYPE,
    UNSUPPORTED_VERSION_ERROR_TYPE,
    InvalidStagedCallError,
)

_U64_LIMIT: Final = 1 << 64

Identifier = Annotated[str, StringConstraints(strict=True, min_length=1)]
"""A non-empty string."""
DigestHex = Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9a-f]{64}$")]
"""A SHA-256 digest as 64 lowercase hex characters."""
NonNegativeInt = Annotated[int, Strict(), Ge(0), Lt(_U64_LIMIT)]
"""A strict int in [0, 2**64): lengths, weight versions and token ids."""
PositiveInt = Annotated[int, Strict(), Ge(1), Lt(_U64_LIMIT)]
"""A strict int in [1, 2**64)."""


def rule_violation(error: InvalidStagedCallError, error_type: str) -> PydanticCustomError:
    """The pydantic error for a broken staging rule: ``"<field>: <reason>"`` with that ctx."""
    context = {"field": error.field, "reason": error.reason}
    return PydanticCustomError(error_type, "{field}: {reason}", context)


@contextmanager
def staging_rules(error_type: str = STAGING_RULE_ERROR_TYPE) -> Iterator[None]:
    """Report an :class:`InvalidStagedCallError` raised inside as a pydantic error."""
    try:
        yield
    except InvalidStagedCallError as error:
        raise rule_violation(error, error_type) from None


def _current(field: str, current: int) -> Callable[[int], int]:
    def check(value: int) -> int:
        with staging_rules(UNSUPPORTED_VERSION_ERROR_TYPE):
            return check_version(field, value, current)

    return check


SchemaVersion = Annotated[
    int, Strict(), AfterValidator(_current("schema_version", STAGING_SCHEMA_VERSION))
]
DigestVersion = Annotated[int, Strict(), AfterValidator(_current("digest_version", DIGEST_VERSION))]
ExtrasDigestVersion = Annotated[
    int, Strict(), AfterValidator(_current("extras_digest_version", EXTRAS_DIGEST_VERSION))
]


class CaptureMode(StrEnum):
    """How a call's prompt reached the engine: a fresh root, or a continuation of staged tokens."""

    TEXT = "text"
    TOKEN_IN = "token_in"


class Disposition(StrEnum):
    """What the worker did with a call's tokens."""

    STAGED = "staged"
    CAPTURE_FAILED = "capture_failed"


class TerminalSelection(StrEnum):
    """How a receipt's terminal call was chosen (strongest witness first)."""

    DECLARED = "declared"
    RESPONSE_ID = "response_id"
    CONTENT = "content"
    HEURISTIC = "heuristic"


class StagingModel(BaseModel):
    """Root of the staging wire models: strict, closed, frozen, versioned."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    schema_version: SchemaVersion = STAGING_SCHEMA_VERSION


class DigestedStagingModel(StagingModel):
    """A staging model that also names the digest layouts its hashes were made with."""

    digest_version: DigestVersion = DIGEST_VERSION
    extras_digest_version: ExtrasDigestVersion = EXTRAS_DIGEST_VERSION
