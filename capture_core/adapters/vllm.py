"""Reading vLLM's token fields for token capture: :class:`VLLMCaptureAdapter`.

The RL vLLM worker answers an admitted chat completion with its token fields beside the usual
body (``logprobs: true``, ``top_logprobs: 0`` and ``return_tokens_as_token_ids: true`` were set
on the request)::

    {"prompt_token_ids": [...],                      # the final engine prompt, after any splice
     "choices": [{"message": {..., "routed_experts": "nrlre1:int16:5x2x2:..."},
                  "token_ids": [...],                 # the sampled ids (when returned)
                  "logprobs": {"content": [{"token": "token_id:42", "logprob": -0.1}, ...]}}],
     "media_spans": [{...}, ...]}                     # multimodal calls only

Prompt ids are in vLLM's expanded space (one id per projected media embedding); vLLM emits no
compact delta. ``routed_experts`` is validated (the ``nrlre1:`` envelope or the nested-list
form) and staged verbatim in extras, like ``media_spans``, which is passed through untouched.
"""

from __future__ import annotations

import binascii
import math
import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Final

from capture_core.exceptions import quote_value
from capture_core.staging.errors import StagingError

__all__ = [
    "PREFIX_REQUEST_KEY",
    "ROUTED_EXPERTS_ENVELOPE_PREFIX",
    "VLLMCaptureAdapter",
    "VLLMPayloadError",
    "routed_experts_shape",
]

ROUTED_EXPERTS_ENVELOPE_PREFIX: Final = "nrlre1:"
"""Start of the packed routed-experts string ``nrlre1:<dtype>:<S>x<L>x<K>:<base64>``."""
PREFIX_REQUEST_KEY: Final = "required_prefix_token_ids"
"""Request field the RL vLLM worker splices a continuation's staged prefix from."""

_ITEM_SIZES: Final = {"int8": 1, "int16": 2, "int32": 4}
_SHAPE: Final = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)x([1-9][0-9]*)")
_TOKEN_ID: Final = re.compile(r"token_id:(0|[1-9][0-9]*)")
_U64_LIMIT: Final = 1 << 64
_EXPERT_LIMIT: Final = 1 << 31
_MISSING_ROUTE: Final = -1


class VLLMPayloadError(StagingError, ValueError):
    """A vLLM response (or request) without the token fields capture needs, or with bad ones.

    Attributes:
        field: where in the payload, e.g. ``"choices[0].logprobs.content[3].token"``.
        reason: what is wrong, in words.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class VLLMCaptureAdapter:
    """The :class:`~capture_core.staging.CaptureAdapter` for the RL vLLM worker's responses.

    Example:
        >>> payload = {
        ...     "prompt_token_ids": [1, 2, 3],
        ...     "choices": [{"message": {"role": "assistant", "content": "hi"},
        ...                  "logprobs": {"content": [
        ...                      {"token": "token_id:7", "logprob": -0.5},
        ...                      {"token": "token_id:8", "logprob": -0.25}]}}],
        ... }
        >>> adapter = VLLMCaptureAdapter()
        >>> adapter.extract_prompt_ids(payload), adapter.extract_generation(payload)
        ([1, 2, 3], ([7, 8], [-0.5, -0.25]))
        >>> adapter.extract_extras(payload) is None
        True
    """

    def enter_prefix(self, request: MutableMapping[str, Any], prefix_ids: Sequence[int]) -> None:
        """Ask the worker to start the prompt with a continuation's staged tokens.

        Example:
            >>> request = {"model": "m"}
            >>> VLLMCaptureAdapter().enter_prefix(request, [1, 2])
            >>> request
            {'model': 'm', 'required_prefix_token_ids': [1, 2]}
        """
        request[PREFIX_REQUEST_KEY] = _token_ids(PREFIX_REQUEST_KEY, prefix_ids)

    def extract_prompt_ids(self, payload: Mapping[str, Any]) -> list[int]:
        """The final engine prompt: top-level ``prompt_token_ids`` (else the message's).

        Raises:
            VLLMPayloadError: no prompt ids, or ones that are not token ids.
        """
        ids = _mapping("payload", payload).get("prompt_token_ids")
        field = "prompt_token_ids"
        if ids is None:
            message = _message(_only_choice(payload))
            ids = message.get("prompt_token_ids")
            field = "choices[0].message.prompt_token_ids"
        if ids is None:
            raise VLLMPayloadError(
                "prompt_token_ids",
                "missing: the worker must return the final engine prompt as prompt_token_ids",
            )
        return _token_ids(field, ids)

    def extract_generation(self, payload: Mapping[str, Any]) -> tuple[list[int], list[float]]:
        """The sampled ids and their log-probs, from the only choice.

        Ids come from the message's ``generation_token_ids`` (with ``generation_log_probs``),
        else from the choice's ``token_ids`` or the ``token_id:<n>`` tokens of
        ``logprobs.content``; log-probs from ``logprobs.content[i].logprob``. When both
        ``token_ids`` and ``token_id:`` tokens are present they must agree.

        Raises:
            VLLMPayloadError: not exactly one choice, no ids or log-probs, or ones that disagree.
        """
        choice = _only_choice(payload)
        message = _message(choice)
        if (
            message.get("generation_token_ids") is not None
            and message.get("generation_log_probs") is not None
        ):
            field = "choices[0].message.generation"
            ids = _token_ids(f"{field}_token_ids", message["generation_token_ids"])
            logprobs = _logprobs(f"{field}_log_probs", message["generation_log_probs"])
        else:
            ids, logprobs = _from_logprobs_content(choice)
        if len(ids) != len(logprobs):
            raise VLLMPayloadError(
                "choices[0]", f"{len(ids)} generated ids but {len(logprobs)} log-probs"
            )
        return ids, logprobs

    def extract_extras(self, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """``routed_experts`` (validated) and ``media_spans`` (passed through), or ``None``.

        Raises:
            VLLMPayloadError: a malformed ``routed_experts``, or ``media_spans`` that is not a
                list of objects.
        """
        extras: dict[str, Any] = {}
        routed = _message(_only_choice(payload)).get("routed_experts")
        if routed is not None:
            routed_experts_shape(routed)
            extras["routed_experts"] = routed
        spans = payload.get("media_spans")
        if spans is not None:
            if not isinstance(spans, list) or not all(isinstance(s, Mapping) for s in spans):
                raise VLLMPayloadError("media_spans", "must be a list of objects")
            extras["media_spans"] = [dict(span) for span in spans]
        return extras or None


def routed_experts_shape(value: object) -> tuple[int, int, int]:
    """Check a routed-experts value and return its ``(tokens, layers, top_k)`` shape.

    Two forms are accepted: the packed string ``nrlre1:<dtype>:<S>x<L>x<K>:<base64>`` (dtype
    ``int8``, ``int16`` or ``int32``, little-endian, exactly ``S*L*K`` values, every dimension
    positive), and the nested list ``[tokens][layers][top_k]`` of ints with constant widths,
    where ``-1`` marks a missing route.

    Raises:
        VLLMPayloadError: any other value.

    Example:
        >>> routed_experts_shape("nrlre1:int8:1x1x2:AAE=")
        (1, 1, 2)
        >>> routed_experts_shape([[[1, 2]], [[3, -1]]])
        (2, 1, 2)
    """
    if isinstance(value, str):
        return _envelope_shape(value)
    if isinstance(value, list):
        return _nested_shape(value)
    raise VLLMPayloadError(
        "routed_experts",
        f"must be an {ROUTED_EXPERTS_ENVELOPE_PREFIX!r} string or a nested list, "
        f"got {type(value).__name__}",
    )


def _envelope_shape(value: str) -> tuple[int, int, int]:
    field = "routed_experts"
    parts = value.split(":")
    if len(parts) != 4 or f"{parts[0]}:" != ROUTED_EXPERTS_ENVELOPE_PREFIX:
        raise VLLMPayloadError(field, "is not 'nrlre1:<dtype>:<S>x<L>x<K>:<base64>'")
    _, dtype, shape_text, data = parts
    item_size = _ITEM_SIZES.get(dtype)
    if item_size is None:
        raise VLLMPayloadError(field, f"dtype {quote_value(dtype)} is not int8, int16 or int32")
    shape = _SHAPE.fullmatch(shape_text)
    if shape is None:
        raise VLLMPayloadError(field, f"shape {quote_value(shape_text)} is not <S>x<L>x<K> > 0")
    tokens, layers, top_k = (int(size) for size in shape.groups())
    try:
        payload = binascii.a2b_base64(data.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError):
        raise VLLMPayloadError(field, "payload is not strict base64") from None
    expected = tokens * layers * top_k * item_size
    if len(payload) != expected:
        raise VLLMPayloadError(
            field, f"payload has {len(payload)} bytes, shape and dtype need {expected}"
        )
    return tokens, layers, top_k


def _nested_shape(value: list[Any]) -> tuple[int, int, int]:
    field = "routed_experts"
    widths: set[tuple[int, int]] = set()
    for position, token in enumerate(value):
        if not isinstance(token, list) or not token:
            raise VLLMPayloadError(f"{field}[{position}]", "must be a non-empty list of layers")
        for layer in token:
            if not isinstance(layer, list) or not layer:
                raise VLLMPayloadError(f"{field}[{position}]", "layers must be non-empty lists")
            for expert in layer:
                if type(expert) is not int or not _MISSING_ROUTE <= expert < _EXPERT_LIMIT:
                    raise VLLMPayloadError(
                        f"{field}[{position}]", f"{quote_value(expert)} is not an expert index"
                    )
            widths.add((len(token), len(layer)))
        if len(widths) > 1:
            raise VLLMPayloadError(f"{field}[{position}]", "layer or top-k widths differ")
    if not widths:
        raise VLLMPayloadError(field, "must hold at least one token")
    ((layers, top_k),) = widths
    return len(value), layers, top_k


def _from_logprobs_content(choice: Mapping[str, Any]) -> tuple[list[int], list[float]]:
    logprobs = choice.get("logprobs")
    content = _mapping("choices[0].logprobs", logprobs).get("content") if logprobs else None
    if not isinstance(content, list):
        raise VLLMPayloadError(
            "choices[0].logprobs.content",
            "missing: request logprobs with return_tokens_as_token_ids to capture tokens",
        )
    values: list[float] = []
    from_tokens: list[int | None] = []
    for position, entry in enumerate(content):
        where = f"choices[0].logprobs.content[{position}]"
        item = _mapping(where, entry)
        values.append(_logprob(f"{where}.logprob", item.get("logprob")))
        token = item.get("token")
        match = _TOKEN_ID.fullmatch(token) if isinstance(token, str) else None
        from_tokens.append(int(match.group(1)) if match else None)
    explicit = choice.get("token_ids")
    if explicit is not None:
        ids = _token_ids("choices[0].token_ids", explicit)
        if len(ids) == len(from_tokens) and any(
            parsed is not None and parsed != own
            for parsed, own in zip(from_tokens, ids, strict=True)
        ):
            raise VLLMPayloadError(
                "choices[0].token_ids", "disagree with the token_id: tokens of logprobs.content"
            )
        return ids, values
    if None in from_tokens:
        position = from_tokens.index(None)
        raise VLLMPayloadError(
            f"choices[0].logprobs.content[{position}].token",
            "is not 'token_id:<int>': request return_tokens_as_token_ids",
        )
    return [token_id for token_id in from_tokens if token_id is not None], values


def _only_choice(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = _mapping("payload", payload).get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
        count = len(choices) if isinstance(choices, list) else 0
        raise VLLMPayloadError(
            "choices", f"token capture needs exactly one choice object, got {count}"
        )
    return choices[0]


def _message(choice: Mapping[str, Any]) -> Mapping[str, Any]:
    message = choice.get("message")
    return {} if message is None else _mapping("choices[0].message", message)


def _mapping(field: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise VLLMPayloadError(field, f"must be an object, got {type(value).__name__}")
    return value


def _token_ids(field: str, value: object) -> list[int]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise VLLMPayloadError(field, f"must be a list of token ids, got {type(value).__name__}")
    for position, token in enumerate(value):
        if type(token) is not int or not 0 <= token < _U64_LIMIT:
            raise VLLMPayloadError(
                f"{field}[{position}]", f"{quote_value(token)} is not a token id"
            )
    return list(value)


def _logprobs(field: str, value: object) -> list[float]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise VLLMPayloadError(field, f"must be a list of log-probs, got {type(value).__name__}")
    return [_logprob(f"{field}[{position}]", item) for position, item in enumerate(value)]


def _logprob(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VLLMPayloadError(field, f"{quote_value(value)} is not a number")
    try:
        number = float(value)
    except OverflowError:
        raise VLLMPayloadError(field, f"{quote_value(value)} is out of float range") from None
    if not math.isfinite(number):
        raise VLLMPayloadError(field, f"{number!r} is not a finite log-prob")
    return number
