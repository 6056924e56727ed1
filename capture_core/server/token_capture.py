"""Token-id capture on the capture server: one :class:`~capture_core.tokens.TokenEntry` per call.

A call takes part when token-id capture is configured (``token_id_capture.enabled``) and the
call comes in on the training-capture route, ``/ng-rollout/<id>/training-token-capture/v1/...``:
that is where the :class:`~capture_core.server.training.TrainingGate` asks the worker for token
ids. Per call the gate:

1. announces it (``begin``) before the worker sees it; a refusal (the rollout's token capture is
   frozen or retired, the disk failed) fails the call: nothing is generated that could not be
   accounted for;
2. reads the token fields from the worker's complete answer, before they are stripped for the
   client (:func:`read_worker_tokens`, per dialect);
3. builds the entry from them and from the answer as served (content items, namespaces
   restored) and commits it through the sink, before the client's first byte.

Nothing after ``begin`` fails the call: an answer without usable token ids, a sink that refuses
the entry, a call served without admission or an endpoint that is not captured marks the
rollout incomplete instead (a skipped call's generated tokens would enter the next prompt with
loss mask 0). With no destination configured (``rebuild_response: false`` and no directory or
sink) the tokens are an external framework's to stage: nothing is written and nothing marked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from capture_core.adapters import VLLMCaptureAdapter
from capture_core.tokens import (
    REQUIRED_TOKEN_FIELDS,
    TOKEN_FIELDS,
    TokenCallCapture,
    TokenEntry,
    TokenIdCaptureConfig,
    TokenSink,
    extract_token_fields,
    resolve_token_sink,
    response_to_output_items,
    split_token_fields,
)

__all__ = ["ServerTokenCapture", "WorkerTokens", "read_worker_tokens", "served_output_items"]

logger = logging.getLogger(__name__)

_VLLM: Final = VLLMCaptureAdapter()
_TOKEN_ID_PREFIX: Final = "token_id:"


@dataclass(frozen=True, slots=True)
class WorkerTokens:
    """The token fields of one worker answer.

    Attributes:
        fields: ``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``,
            ``routed_experts`` and ``media_spans`` (the last two ``None`` when not given).
        carrier: the index, among the served content items, of the item that carried them
            (``None``: the answer's last item, as for Messages, whose fields are top-level).
    """

    fields: dict[str, Any]
    carrier: int | None


def read_worker_tokens(dialect: str, payload: Mapping[str, Any]) -> WorkerTokens | None:
    """The token fields of a worker's complete answer; ``None`` when it carries none.

    * ``responses``: the one output item (or chat message) carrying them;
    * ``chat``: a message carrying them (Gym's shape), else vLLM's shape read by
      :class:`~capture_core.adapters.VLLMCaptureAdapter` (top-level ``prompt_token_ids``, the
      choice's ``token_ids`` or ``token_id:<n>`` log-prob tokens, ``routed_experts`` on the
      message, top-level ``media_spans``);
    * ``messages``: top-level ``prompt_token_ids``, ``generation_token_ids`` and
      ``generation_log_probs`` (with ``routed_experts`` and ``media_spans``).

    Raises:
        ValueError: the fields are partial, carried twice or malformed (the message says how).

    Example:
        >>> read_worker_tokens("messages", {"prompt_token_ids": [1], "generation_token_ids": [2],
        ...                                 "generation_log_probs": [-0.5]}).carrier is None
        True
    """
    if dialect == "messages":
        return _top_level_tokens(payload)
    fields = extract_token_fields(payload)
    if fields is not None:
        return WorkerTokens(fields, _carrier_index(payload))
    if dialect == "chat" and _has_vllm_tokens(payload):
        prompt = _VLLM.extract_prompt_ids(payload)
        generated, logprobs = _VLLM.extract_generation(payload)
        extras = _VLLM.extract_extras(payload) or {}
        fields = {
            "prompt_token_ids": prompt,
            "generation_token_ids": generated,
            "generation_log_probs": logprobs,
            "routed_experts": extras.get("routed_experts"),
            "media_spans": extras.get("media_spans"),
        }
        return WorkerTokens(fields, 0)
    return None


def _carrier_index(payload: Mapping[str, Any]) -> int | None:
    """Which content item carries the token fields, counted as
    :func:`~capture_core.tokens.response_to_output_items` lists them (without copying)."""
    output = payload.get("output")
    if isinstance(output, list) and output:
        items = _dicts(output)
    else:
        messages = [choice.get("message") for choice in _dicts(payload.get("choices"))]
        items = [m for m in messages if isinstance(m, dict)]
    for index, item in enumerate(items):
        if item.get("generation_token_ids") is not None:
            return index
    return None


def _top_level_tokens(payload: Mapping[str, Any]) -> WorkerTokens | None:
    present = [name for name in REQUIRED_TOKEN_FIELDS if payload.get(name) is not None]
    if not present:
        return None
    missing = [name for name in REQUIRED_TOKEN_FIELDS if name not in present]
    if missing:
        raise ValueError(f"partial token metadata is missing: {', '.join(missing)}")
    return WorkerTokens({name: payload.get(name) for name in TOKEN_FIELDS}, None)


def _has_vllm_tokens(payload: Mapping[str, Any]) -> bool:
    if payload.get("prompt_token_ids") is not None:
        return True
    for choice in _dicts(payload.get("choices")):
        if choice.get("token_ids") is not None:
            return True
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
        for entry in content if isinstance(content, list) else ():
            token = entry.get("token") if isinstance(entry, Mapping) else None
            if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX):
                return True
    return False


def served_output_items(dialect: str, served: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The served answer's content items, Responses style, without token fields.

    Responses: its ``output``; Chat: one ``message`` item per choice (as the upstream
    reference does); Messages: text blocks as one assistant ``message`` with ``output_text``
    parts, each ``tool_use`` as a ``function_call`` (``input`` as JSON ``arguments``), each
    ``thinking`` as a ``reasoning`` item with a summary, any other block as it came.

    Example:
        >>> served_output_items("messages", {"content": [{"type": "text", "text": "B"}]})
        [{'type': 'message', 'role': 'assistant', 'status': 'completed', 'content': [{'type': 'output_text', 'text': 'B', 'annotations': []}]}]
    """  # noqa: E501
    items = _messages_items(served) if dialect == "messages" else response_to_output_items(served)
    split_token_fields(items)
    return items


def _messages_items(served: Mapping[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if parts:
            items.append({"type": "message", "role": "assistant", "status": "completed",
                          "content": list(parts)})  # fmt: skip
            parts.clear()

    for block in _dicts(served.get("content")):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "output_text", "text": block.get("text", ""),
                          "annotations": []})  # fmt: skip
            continue
        flush()
        if kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            items.append({"type": "function_call", "call_id": block.get("id"),
                          "name": block.get("name"), "arguments": arguments,
                          "status": "completed"})  # fmt: skip
        elif kind == "thinking":
            summary = [{"type": "summary_text", "text": block.get("thinking", "")}]
            items.append({"type": "reasoning", "summary": summary})
        else:
            items.append(dict(block))
    flush()
    return items


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


class ServerTokenCapture:
    """Token-id capture in one server process: its config and the sink entries go to.

    Args:
        config: the run's token-capture config (enabled).
        sink: where entries go; ``None``: an external framework stages the tokens (nothing is
            written or marked here).

    Use :meth:`from_config` to pick the sink as the settings say (configured, else installed,
    else the file store).
    """

    def __init__(self, config: TokenIdCaptureConfig, sink: TokenSink | None) -> None:
        self.config = config
        self.sink = sink

    @classmethod
    def from_config(cls, config: TokenIdCaptureConfig | None) -> ServerTokenCapture | None:
        """``None`` when token-id capture is off; else the capture with its sink.

        Raises:
            TokenCaptureConfigError: the configured sink cannot be built.
        """
        if config is None or not config.token_id_capture.enabled:
            return None
        return cls(config, resolve_token_sink(config))

    def call(self, rollout_id: str, model_call_id: str, *, model: str = "") -> TokenCallCapture:
        """The capture of one call."""
        return TokenCallCapture(rollout_id, model_call_id, self.sink, model=model)

    def entry(
        self,
        capture: TokenCallCapture,
        dialect: str,
        tokens: WorkerTokens,
        served: Mapping[str, Any],
    ) -> TokenEntry:
        """The call's entry: the worker's token fields and the served content items.

        Raises:
            ValueError: the entry is invalid (e.g. mismatched lengths, a carrier index that
                the served items do not have).
        """
        items = served_output_items(dialect, served)
        carrier = tokens.carrier
        if carrier is None and items:
            carrier = len(items) - 1
        payload_model = served.get("model")
        return TokenEntry(
            rollout_id=capture.rollout_id,
            model_call_id=capture.model_call_id,
            model=capture.model or (payload_model if isinstance(payload_model, str) else ""),
            output_items=items,
            token_item_index=carrier,
            created_at=time.time(),
            **tokens.fields,
        )

    async def aclose(self) -> None:
        """Close the sink at shutdown; a failure is logged."""
        if self.sink is None:
            return
        try:
            await self.sink.close()
        except Exception as exc:
            logger.warning("closing the token sink failed: %s: %s", type(exc).__name__, exc)
