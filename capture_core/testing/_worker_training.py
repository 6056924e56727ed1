"""The simulated worker's training mode: stage the call's tokens, return commit coordinates.

When a request carries ``ng_capture`` (a :class:`CaptureAdmission`), the worker tokenizes the
conversation with the reversible :class:`ByteTokenizer`, "generates" the answer's tokens with
deterministic log-probs, stages them through :class:`RolloutTokenCapture` into a
:class:`FilesystemStagingSink`, and answers like vLLM with ``return_token_ids``: top-level
``prompt_token_ids``, ``choices[0].token_ids`` and ``logprobs.content`` entries whose token is
``token_id:<id>`` (Chat), the token fields on the output message (Responses) or at the top
level of the message (Messages), plus ``ng_commit_coords``. Token arrays never need to travel
back through the model server.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from capture_core.adapters import VLLMCaptureAdapter
from capture_core.staging import (
    COMMIT_COORDS_KEY,
    CaptureAdmission,
    FilesystemStagingSink,
    RolloutTokenCapture,
)
from capture_core.testing.answers import Answer
from capture_core.testing.tokenizer import (
    SPECIAL_TOKENS,
    ByteTokenizer,
    logprobs_for,
    media_spans,
)

__all__ = ["TRAINING_KEY", "TrainingStager"]

TRAINING_KEY: Final = "ng_capture"
_TOKENIZER: Final = ByteTokenizer()


def _messages(dialect: str, body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if dialect == "chat":
        return [m for m in body.get("messages", []) if isinstance(m, Mapping)]
    if dialect == "messages":
        return _anthropic_turns(body)
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[Mapping[str, Any]] = []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, Mapping):
            content = item.get("content", item.get("output", ""))
            messages.append({"role": item.get("role", "tool"), "content": content})
    return messages


def _anthropic_turns(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Anthropic ``system`` + ``messages`` as chat-like turns the tokenizer renders.

    ``tool_result`` blocks become ``tool`` turns and ``tool_use`` blocks assistant text (the
    call as JSON, exactly what the worker generated for it), so a continuation renders its
    parent's turns the way they were staged.
    """
    turns: list[Mapping[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(b.get("text", "") for b in system if isinstance(b, Mapping))
    if isinstance(system, str) and system:
        turns.append({"role": "system", "content": system})
    for message in body.get("messages", []):
        if not isinstance(message, Mapping):
            continue
        role, content = message.get("role", "user"), message.get("content", "")
        if not isinstance(content, list):
            turns.append({"role": role, "content": content})
            continue
        parts: list[Any] = []
        for block in content:
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "tool_result":
                if parts:
                    turns.append({"role": role, "content": parts})
                    parts = []
                turns.append({"role": "tool", "content": _result_text(block.get("content"))})
            elif kind == "tool_use":
                args = orjson.dumps(block.get("input") or {}).decode()
                call = {"name": block.get("name"), "arguments": args}
                parts.append({"type": "text", "text": orjson.dumps(call).decode()})
            elif kind != "thinking":
                parts.append(block)
        if parts:
            turns.append({"role": role, "content": parts})
    return turns


def _result_text(content: object) -> str:
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
    return content if isinstance(content, str) else ""


def _prompt(dialect: str, body: Mapping[str, Any], prefix: list[int]) -> list[int]:
    """The prompt ids: the rendered conversation, forced to start with the staged prefix."""
    rendered = _TOKENIZER.render_prompt(_messages(dialect, body))
    if not prefix or rendered[: len(prefix)] == prefix:
        return rendered
    last = _messages(dialect, body)[-1:]  # the newest turn, appended after the prefix
    return prefix + _TOKENIZER.render_prompt(last)[1:]


def _answer_text(answer: Answer) -> str:
    if answer.tool_calls:
        call = answer.tool_calls[0]
        return orjson.dumps({"name": call.name, "arguments": call.arguments_json}).decode()
    return answer.text


class TrainingStager:
    """Stages calls into ``root`` for one worker process (one sink, one capture object)."""

    def __init__(
        self, root: str | Path, *, seed: int, weight_version: int = 1, routed_experts: bool = False
    ) -> None:
        self.sink = FilesystemStagingSink(root)
        self.seed = seed
        self.routed_experts = routed_experts
        self.capture = RolloutTokenCapture(
            sink=self.sink, weight_version_fn=lambda: weight_version, adapter=VLLMCaptureAdapter()
        )

    def stage(
        self, dialect: str, body: Mapping[str, Any], answer: Answer, payload: dict[str, Any]
    ) -> None:
        """Stage one call and add its token fields and coordinates to ``payload``.

        Chat answers are staged the way a vLLM worker does it: the token fields are written
        into the response first and :class:`VLLMCaptureAdapter` reads them back.

        Raises:
            ValueError: the admission is invalid (the worker answers 400).
        """
        admission = CaptureAdmission.model_validate(body[TRAINING_KEY])
        prefix = list(admission.required_prefix_token_ids)
        if not prefix and admission.staging_chain:
            snapshots = self.sink.fetch(admission.staging_chain)
            prefix = [t for snapshot in snapshots for t in snapshot.token_ids_delta]
        prompt = _prompt(dialect, body, prefix)
        generated = [*_TOKENIZER.encode(_answer_text(answer)), SPECIAL_TOKENS["<|end|>"]]
        logprobs = logprobs_for(self.seed, prompt, generated)
        call = self.capture.begin_call(admission, prefix_token_ids=prefix or None)
        if dialect == "chat":
            _add_vllm_fields(payload, prompt, generated, logprobs)
            spans = media_spans(prompt)
            if spans:
                payload["media_spans"] = spans
            if self.routed_experts:
                payload["choices"][0]["message"]["routed_experts"] = _routes(
                    self.seed, len(prompt) + len(generated) - 1
                )
            coords = self.capture.complete_call_from_response(call, payload)
        else:
            if dialect == "messages":
                payload.update(prompt_token_ids=prompt, generation_token_ids=generated,
                               generation_log_probs=logprobs)  # fmt: skip
            else:
                _add_response_fields(payload, prompt, generated, logprobs)
            coords = self.capture.complete_call(
                call, prompt_token_ids=prompt, generated_token_ids=generated,
                generated_logprobs=logprobs,
            )  # fmt: skip
        payload[COMMIT_COORDS_KEY] = coords.model_dump(mode="json")


def _routes(seed: int, rows: int, layers: int = 2, top_k: int = 2) -> list[list[list[int]]]:
    """Deterministic routed experts, one row per token but the last (nested-list form)."""
    return [
        [[(seed + row * 7 + layer * 3 + k) % 8 for k in range(top_k)] for layer in range(layers)]
        for row in range(rows)
    ]


def _add_vllm_fields(
    payload: dict[str, Any], prompt: list[int], generated: list[int], logprobs: list[float]
) -> None:
    """vLLM with ``return_token_ids`` and ``return_tokens_as_token_ids``."""
    payload["prompt_token_ids"] = prompt
    choice = payload["choices"][0]
    choice["token_ids"] = generated
    choice["logprobs"] = {
        "content": [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(generated, logprobs, strict=True)
        ]
    }


def _add_response_fields(
    payload: dict[str, Any], prompt: list[int], generated: list[int], logprobs: list[float]
) -> None:
    """Gym's Responses output items carry the token fields of their call."""
    for item in payload.get("output", []):
        if item.get("type") in ("message", "function_call"):
            item["prompt_token_ids"] = prompt
            item["generation_token_ids"] = generated
            item["generation_log_probs"] = logprobs
            return
