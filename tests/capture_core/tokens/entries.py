"""Token entries for the token-store tests."""

from __future__ import annotations

from typing import Any

from capture_core.tokens import TokenEntry


def entry(
    call: str,
    prompt: list[int],
    generated: list[int],
    *,
    rollout: str = "r1",
    created_at: float = 0.0,
    text: str | None = None,
    **extra: Any,
) -> TokenEntry:
    """An entry whose one content item carried the tokens (``token_item_index`` 0)."""
    fields: dict[str, Any] = {
        "output_items": [
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": text if text is not None else call}]}
        ],
        "token_item_index": 0,
        **extra,
    }  # fmt: skip
    return TokenEntry(
        rollout_id=rollout,
        model_call_id=call,
        prompt_token_ids=prompt,
        generation_token_ids=generated,
        generation_log_probs=[-0.5 - i / 100 for i in range(len(generated))],
        created_at=created_at,
        **fields,
    )


def three_turns(rollout: str = "r1") -> list[TokenEntry]:
    """An append-only rollout: prompts [1,2,3], [..,4,5], [..,12,6]; generations [10,11], [12],
    [13,14] (the reference's builder example)."""
    return [
        entry("c1", [1, 2, 3], [10, 11], rollout=rollout, created_at=1.0),
        entry("c2", [1, 2, 3, 10, 11, 4, 5], [12], rollout=rollout, created_at=2.0),
        entry("c3", [1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], rollout=rollout, created_at=3.0),
    ]
