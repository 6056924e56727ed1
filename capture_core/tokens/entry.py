"""``TokenEntry``: the complete token record of one model call, and reading it from a response.

A training framework that takes whole token records (rather than staged deltas) needs, per call,
the prompt ids the engine saw, the ids it generated with their log-probs, and the call's content
items. :class:`TokenEntry` is that record, schema 1; unknown fields are kept and written back, so
an entry from a newer minor writer survives a round trip through an older reader.

:func:`build_token_entry` turns a served response (a Responses object whose output items carry
the token fields, or a Chat completion whose ``choices[].message`` do) into an entry: the token
arrays are stored once at the top level, and the content items keep everything else, with
``token_item_index`` pointing at the item that carried them.

Stricter than the upstream reference (see docs/token-store.md): token ids must be integers
``>= 0`` (no booleans, floats or numeric strings), log-probs and ``created_at`` must be finite,
and ``schema_version`` must be ``>= 0``.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Mapping
from typing import Annotated, Any, Final, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

__all__ = [
    "REQUIRED_TOKEN_FIELDS",
    "TOKEN_ENTRY_SCHEMA_VERSION",
    "TOKEN_FIELDS",
    "TokenEntry",
    "build_token_entry",
    "canonical_line",
    "entry_digest",
    "extract_token_fields",
    "response_to_output_items",
    "split_token_fields",
]

TOKEN_ENTRY_SCHEMA_VERSION: Final = 1
"""The newest ``TokenEntry`` schema this reader understands."""
REQUIRED_TOKEN_FIELDS: Final = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
"""The token fields a carrier item must have all of."""
TOKEN_FIELDS: Final = (*REQUIRED_TOKEN_FIELDS, "routed_experts", "media_spans")
"""Every token field: removed from content items, stored once on the entry."""

TokenId = Annotated[int, Strict(), Field(ge=0)]
LogProb = Annotated[float, Field(allow_inf_nan=False)]


class TokenEntry(BaseModel):
    """The complete token record of one model call (schema 1).

    Attributes:
        schema_version: 1; an older version is read with defaults, a newer one is refused.
        rollout_id: the rollout the call belongs to.
        model_call_id: the call's id (the same one its model-call capture line carries).
        model: the model name, when known.
        prompt_token_ids: the prompt exactly as the engine saw it.
        generation_token_ids: the sampled ids.
        generation_log_probs: one finite log-prob per sampled id.
        routed_experts: opaque routing data of a mixture-of-experts engine, when given.
        media_spans: opaque media placeholder spans of a multimodal engine, when given
            (an addition to the upstream schema; ``None`` otherwise).
        output_items: the call's content items (Responses style) without token fields.
        token_item_index: the index in ``output_items`` of the item that carried the tokens.
        created_at: Unix time of capture; orders chain roots when building.

    Example:
        >>> entry = TokenEntry(rollout_id="3-2", model_call_id="c1", prompt_token_ids=[1, 2],
        ...                    generation_token_ids=[7], generation_log_probs=[-0.25])
        >>> entry.schema_version, entry.token_item_index
        (1, None)
    """

    model_config = ConfigDict(extra="allow")

    schema_version: int = Field(default=TOKEN_ENTRY_SCHEMA_VERSION, ge=0)
    rollout_id: str
    model_call_id: str
    model: str = ""
    prompt_token_ids: list[TokenId]
    generation_token_ids: list[TokenId]
    generation_log_probs: list[LogProb]
    routed_experts: Any = None
    media_spans: Any = None
    output_items: list[dict[str, Any]] = Field(default_factory=list)
    token_item_index: int | None = None
    created_at: float = Field(default=0.0, allow_inf_nan=False)

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        if value > TOKEN_ENTRY_SCHEMA_VERSION:
            raise ValueError(
                f"token entry schema_version {value} is newer than this reader understands "
                f"(up to {TOKEN_ENTRY_SCHEMA_VERSION}); upgrade ngcapture to read it"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        tokens, logprobs = len(self.generation_token_ids), len(self.generation_log_probs)
        if tokens != logprobs:
            raise ValueError(
                f"generation_token_ids has {tokens} ids but generation_log_probs has "
                f"{logprobs} values; they must have the same length"
            )
        index = self.token_item_index
        if index is not None and not 0 <= index < len(self.output_items):
            raise ValueError(
                f"token_item_index {index} is outside output_items (length "
                f"{len(self.output_items)})"
            )
        return self


def canonical_line(entry: TokenEntry) -> bytes:
    """The entry as the store writes it: sorted-key JSON of ``model_dump(mode="json")``, no
    newline.

    Raises:
        ValueError: an extra field holds a value JSON cannot represent.

    Example:
        >>> canonical_line(TokenEntry(rollout_id="r", model_call_id="c", prompt_token_ids=[1],
        ...                generation_token_ids=[], generation_log_probs=[]))[:40]
        b'{"created_at":0.0,"generation_log_probs"'
    """
    try:
        data = entry.model_dump(mode="json")
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except (TypeError, ValueError) as exc:  # PydanticSerializationError is a ValueError
        raise ValueError(f"token entry cannot be written as JSON: {exc}") from exc


def entry_digest(line: bytes) -> str:
    """SHA-256 hex of a canonical line (without its newline): the store's idempotency key.

    Example:
        >>> entry_digest(b"{}")[:12]
        '44136fa355b3'
    """
    return hashlib.sha256(line).hexdigest()


def extract_token_fields(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The token fields of a served response, or ``None`` when it carries none.

    The candidates are the object items of ``output`` and the ``choices[].message`` objects
    that have any of the three required fields non-null.

    Returns:
        ``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``,
        ``routed_experts`` and ``media_spans`` (the last two ``None`` when absent).

    Raises:
        ValueError: more than one item carries token fields ("multiple response items carry
            token metadata"), or a carrier lacks one of the three ("partial token metadata is
            missing: <names>").

    Example:
        >>> extract_token_fields({"output": [{"type": "message", "prompt_token_ids": [1],
        ...     "generation_token_ids": [2], "generation_log_probs": [-0.5]}]})["routed_experts"]
    """
    carriers = [item for item in _candidates(payload) if _has_any_token_field(item)]
    if not carriers:
        return None
    if len(carriers) > 1:
        raise ValueError(f"multiple response items carry token metadata ({len(carriers)})")
    carrier = carriers[0]
    missing = [name for name in REQUIRED_TOKEN_FIELDS if carrier.get(name) is None]
    if missing:
        raise ValueError(f"partial token metadata is missing: {', '.join(missing)}")
    return {name: carrier.get(name) for name in TOKEN_FIELDS}


def response_to_output_items(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The response's content items, deep-copied: ``output`` when it is a non-empty list, else
    one ``{"type": "message", "role": "assistant", ...}`` item per ``choices[].message``.

    Example:
        >>> response_to_output_items({"choices": [{"message": {"content": "hi"}}]})
        [{'content': 'hi', 'type': 'message', 'role': 'assistant'}]
    """
    output = payload.get("output")
    if isinstance(output, list) and output:
        return [copy.deepcopy(item) for item in output if isinstance(item, dict)]
    items: list[dict[str, Any]] = []
    for choice in _dicts(payload.get("choices")):
        message = choice.get("message")
        if isinstance(message, dict):
            item = copy.deepcopy(message)
            item.setdefault("type", "message")
            item.setdefault("role", "assistant")
            items.append(item)
    return items


def split_token_fields(items: list[dict[str, Any]]) -> int | None:
    """Remove every token field from ``items`` in place; return the index of the item whose
    ``generation_token_ids`` was non-null (``None`` when no item had one).

    Raises:
        ValueError: more than one item carried ``generation_token_ids``.

    Example:
        >>> items = [{"type": "reasoning"}, {"type": "message", "generation_token_ids": [4]}]
        >>> split_token_fields(items), items[1]
        (1, {'type': 'message'})
    """
    index: int | None = None
    for position, item in enumerate(items):
        if item.get("generation_token_ids") is not None:
            if index is not None:
                raise ValueError("multiple response items carry generation_token_ids")
            index = position
        for name in TOKEN_FIELDS:
            item.pop(name, None)
    return index


def build_token_entry(
    payload: Mapping[str, Any],
    *,
    rollout_id: str,
    model_call_id: str,
    model: str = "",
    created_at: float | None = None,
) -> TokenEntry | None:
    """The :class:`TokenEntry` of a served response, or ``None`` when it carries no token ids.

    Args:
        payload: the complete response object, as the engine answered (before any SSE
            synthesis or dialect conversion).
        rollout_id: the call's rollout.
        model_call_id: the call's id.
        model: the model name; ``payload["model"]`` when empty.
        created_at: the capture time (default: now).

    Raises:
        ValueError: the token fields are partial or carried twice, or the entry is invalid
            (a pydantic ``ValidationError``, e.g. mismatched lengths).

    Example:
        >>> entry = build_token_entry(
        ...     {"model": "m", "output": [{"type": "message", "content": [],
        ...      "prompt_token_ids": [1], "generation_token_ids": [2],
        ...      "generation_log_probs": [-0.5]}]}, rollout_id="3-2", model_call_id="c1")
        >>> entry.model, entry.token_item_index, "prompt_token_ids" in entry.output_items[0]
        ('m', 0, False)
    """
    fields = extract_token_fields(payload)
    if fields is None:
        return None
    items = response_to_output_items(payload)
    index = split_token_fields(items)
    payload_model = payload.get("model")
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=model_call_id,
        model=model or (payload_model if isinstance(payload_model, str) else ""),
        output_items=items,
        token_item_index=index,
        created_at=time.time() if created_at is None else created_at,
        **fields,
    )


def _candidates(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = [choice.get("message") for choice in _dicts(payload.get("choices"))]
    return [*_dicts(payload.get("output")), *[m for m in messages if isinstance(m, dict)]]


def _has_any_token_field(item: Mapping[str, Any]) -> bool:
    return any(item.get(name) is not None for name in REQUIRED_TOKEN_FIELDS)


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
