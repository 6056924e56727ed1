"""Projection: a chain back into ``response.output`` items that carry its token ids.

Each link's content items are copied; the item that carried the call's tokens (its
``token_item_index``) gets the *running* prompt (the root prompt plus every generation and
interstitial before it, so each call's prompt extends the last one's exactly), the generated
ids and their log-probs, and ``routed_experts`` / ``media_spans`` when the call had them.
"""

from __future__ import annotations

import copy
from typing import Any

from capture_core.exceptions import TokenBuildError
from capture_core.tokens.builders import BuildOutput, Chain
from capture_core.tokens.entry import TOKEN_FIELDS, TokenEntry

__all__ = [
    "check_prefix_contiguity",
    "project_chain_to_output_items",
    "project_main_chain_response",
]

_OPTIONAL_FIELDS = ("routed_experts", "media_spans")


def project_chain_to_output_items(chain: Chain) -> list[dict[str, Any]]:
    """The chain's content items, each call's carrier item holding its token fields.

    The carrier is ``output_items[token_item_index]``; for an entry without that index (an
    older writer) every item still holding ``generation_token_ids``, else the last item. A
    call without content items gives a bare ``{"type": "message", ...}`` carrier.

    Example:
        >>> from capture_core.tokens.builders import prefix_merging
        >>> chain = prefix_merging([TokenEntry(rollout_id="r", model_call_id="a",
        ...     prompt_token_ids=[1], generation_token_ids=[2], generation_log_probs=[-0.5])]
        ...     ).chains[0]
        >>> project_chain_to_output_items(chain)[0]["prompt_token_ids"]
        [1]
    """
    items: list[dict[str, Any]] = []
    cumulative = list(chain.root_prompt)
    for position, link in enumerate(chain.links):
        if position:
            cumulative.extend(link.interstitial)
        entry = link.entry
        copied = [copy.deepcopy(item) for item in entry.output_items]
        carriers = _carriers(entry, copied)
        for index, item in enumerate(copied):
            if index not in carriers:
                for name in TOKEN_FIELDS:
                    item.pop(name, None)
        if not copied:
            copied, carriers = [{"type": "message"}], {0}
        for index in sorted(carriers):
            copied[index].update(_token_fields(entry, cumulative))
        items.extend(copied)
        cumulative.extend(entry.generation_token_ids)
    return items


def _carriers(entry: TokenEntry, items: list[dict[str, Any]]) -> set[int]:
    index = entry.token_item_index
    if index is not None and 0 <= index < len(items):
        return {index}
    legacy = {i for i, item in enumerate(items) if item.get("generation_token_ids") is not None}
    if legacy:
        return legacy
    return {len(items) - 1} if items else set()


def _token_fields(entry: TokenEntry, cumulative: list[int]) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "prompt_token_ids": list(cumulative),
        "generation_token_ids": list(entry.generation_token_ids),
        "generation_log_probs": list(entry.generation_log_probs),
    }
    for name in _OPTIONAL_FIELDS:
        value = getattr(entry, name)
        if value is not None:
            fields[name] = copy.deepcopy(value)
    return fields


def project_main_chain_response(rollout_id: str, out: BuildOutput, model: str) -> dict[str, Any]:
    """A Responses-shaped object whose ``output`` is the main chain's projection.

    Returns:
        ``{"id": "proj-<rollout_id>", "model", "object": "response", "output", "usage":
        {"input_tokens", "output_tokens"}}``; input tokens are the first token-bearing item's
        prompt length, output tokens the sum of generation lengths.

    Raises:
        TokenBuildError: there is no chain ("capture produced no safe trainable chain"),
            ``per_request`` built other than one chain, or no item carries generated tokens.
    """
    if not out.chains:
        raise TokenBuildError("capture produced no safe trainable chain")
    if out.notes.builder == "per_request" and len(out.chains) != 1:
        raise TokenBuildError(
            f"per_request built {len(out.chains)} chains; one response holds exactly one"
        )
    chain = next((c for c in out.chains if c.chain_id == "main"), out.chains[0])
    items = project_chain_to_output_items(chain)
    bearing = [item for item in items if item.get("generation_token_ids")]
    if not bearing:
        raise TokenBuildError("capture has no trainable generated tokens")
    return {
        "id": f"proj-{rollout_id}",
        "model": model,
        "object": "response",
        "output": items,
        "usage": {
            "input_tokens": len(bearing[0]["prompt_token_ids"]),
            "output_tokens": sum(len(item["generation_token_ids"]) for item in bearing),
        },
    }


def check_prefix_contiguity(response: dict[str, Any]) -> None:
    """Check each token-bearing item's prompt starts with every token before it (the previous
    token-bearing item's prompt and generation).

    Raises:
        TokenBuildError: an item breaks the prefix (the upstream reference raises
            ``AssertionError``; a validation error is not an assertion).
    """
    seen: list[int] = []
    for position, item in enumerate(response.get("output", [])):
        if not isinstance(item, dict) or not item.get("generation_token_ids"):
            continue
        prompt = item.get("prompt_token_ids") or []
        if prompt[: len(seen)] != seen:
            raise TokenBuildError(
                f"output item {position} does not extend the tokens before it "
                f"({len(seen)} expected as its prompt's prefix)"
            )
        seen = [*prompt, *item["generation_token_ids"]]
