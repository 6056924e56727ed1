"""The ``/ng-rollout/<rollout_id>/`` prefix: find it, strip it, and pick the dialect.

The prefix is read from the path as screening normalised it (``server/target.py``): escapes of
unreserved characters are decoded there (``%2e`` is ``.``), an encoded ``/`` was refused, and
other escapes stay encoded, so one in the id makes it invalid instead of turning into path
structure.
The prefix is always stripped, whether or not capture is on and whether or not the id is
valid; only a valid id on a dialect path is captured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

from capture_core.dialects import DialectSpec, dialect_for_path
from capture_core.ids import is_valid_rollout_id

__all__ = ["PREFIX", "TRAINING_SEGMENT", "RolloutRoute", "route_path"]

PREFIX: Final = "ng-rollout"
TRAINING_SEGMENT: Final = "training-token-capture"
_PREFIXED: Final = re.compile(
    rf"^/{PREFIX}/(?P<rollout_id>[^/]+)(?:/(?P<training>{TRAINING_SEGMENT}))?(?P<rest>/.*)$",
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class RolloutRoute:
    """Where a prefixed request goes.

    Attributes:
        rollout_id: the id as sent (percent-decoded); may be invalid.
        valid: whether the id may name a capture file.
        training: the training-capture segment was present.
        path: the stripped path, percent-decoded (ASGI ``path``).
        raw_path: the stripped path as sent (ASGI ``raw_path``).
        dialect: the dialect served at ``path``, or ``None`` (not captured).
    """

    rollout_id: str
    valid: bool
    training: bool
    path: str
    raw_path: bytes
    dialect: DialectSpec | None


def route_path(raw_path: bytes) -> RolloutRoute | None:
    """Parse a request's raw path; ``None`` when it carries no rollout prefix.

    Example:
        >>> route = route_path(b"/ng-rollout/3-2/v1/chat/completions")
        >>> route.rollout_id, route.valid, route.path, route.dialect.name
        ('3-2', True, '/v1/chat/completions', 'chat')
    """
    text = raw_path.decode("latin-1")
    path, _, _query = text.partition("?")
    match = _PREFIXED.match(path)
    if match is None:
        return None
    encoded_id = match.group("rollout_id")
    rollout_id = unquote(encoded_id, errors="replace")
    rest = match.group("rest")
    decoded_rest = unquote(rest, errors="replace")
    # The id is valid only if it needed no decoding: '%2e%2e' is refused, not turned into '..'.
    valid = encoded_id == rollout_id and is_valid_rollout_id(rollout_id)
    return RolloutRoute(
        rollout_id=rollout_id,
        valid=valid,
        training=match.group("training") is not None,
        path=decoded_rest,
        raw_path=rest.encode("latin-1"),
        dialect=dialect_for_path(decoded_rest),
    )
