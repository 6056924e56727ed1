"""Internal token fields of a worker's answer, and stripping them before the client sees it.

Token arrays, routed experts and media spans travel only between the worker and the staging
sink; the client's answer must not carry them, nor logprob entries spelled ``token_id:<id>``
(logprobs stay only when the client asked for them).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["TOKEN_FIELDS", "dict_items", "strip_token_fields"]

TOKEN_FIELDS: Final = (
    "prompt_token_ids",
    "compact_prompt_token_ids",
    "token_ids",
    "generation_token_ids",
    "generation_log_probs",
    "routed_experts",
    "media_spans",
)
_TOKEN_ID_PREFIX: Final = "token_id:"


def strip_token_fields(payload: dict[str, Any], *, keep_logprobs: bool) -> None:
    """Remove every internal token field from a worker answer, in place.

    Fields are removed at the top level, from Chat choices and their messages, from Responses
    output items and from Messages content blocks.

    Chat ``logprobs`` entries whose token is ``token_id:<n>`` are removed; the whole
    ``logprobs`` goes unless the client asked for log-probs (``keep_logprobs``).

    Example:
        >>> body = {"prompt_token_ids": [1], "choices": [{"token_ids": [2], "logprobs": {},
        ...         "message": {"content": "x", "generation_token_ids": [2]}}]}
        >>> strip_token_fields(body, keep_logprobs=False)
        >>> body
        {'choices': [{'logprobs': None, 'message': {'content': 'x'}}]}
    """
    for name in TOKEN_FIELDS:
        payload.pop(name, None)
    for choice in dict_items(payload.get("choices")):
        for name in TOKEN_FIELDS:
            choice.pop(name, None)
        for name in TOKEN_FIELDS:
            message = choice.get("message")
            if isinstance(message, dict):
                message.pop(name, None)
        if "logprobs" in choice:
            choice["logprobs"] = _client_logprobs(choice["logprobs"]) if keep_logprobs else None
    for item in [*dict_items(payload.get("output")), *dict_items(payload.get("content"))]:
        for name in TOKEN_FIELDS:
            item.pop(name, None)


def dict_items(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _client_logprobs(logprobs: object) -> object:
    if not isinstance(logprobs, dict):
        return None
    kept = dict(logprobs)
    for key in ("content", "refusal"):
        entries = kept.get(key)
        if isinstance(entries, list):
            kept[key] = [e for e in entries if not _token_id_entry(e)]
    return kept


def _token_id_entry(entry: object) -> bool:
    return isinstance(entry, dict) and str(entry.get("token", "")).startswith(_TOKEN_ID_PREFIX)
