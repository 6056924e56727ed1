"""Usage objects of all three dialects → :class:`TokenStats`.

One mapping serves every dialect, because OpenAI-compatible servers mix the shapes (a vLLM
Responses body may carry Chat-style details, an Anthropic-compatible proxy may carry OpenAI
keys):

=================  ==========================  =============================================
value              OpenAI (Responses / Chat)   Anthropic Messages
=================  ==========================  =============================================
tokens_in          input_tokens/prompt_tokens  input_tokens + cache_read + cache_creation
                   (already include cached)    (Anthropic's input_tokens excludes the cache)
tokens_out         output/completion_tokens    output_tokens (cumulative, from message_delta)
tokens_reasoning   *_tokens_details.reasoning  output_tokens_details.thinking_tokens, if any
tokens_total       total_tokens, else in + out in + out
cached_tokens      *_tokens_details.cached     cache_read_input_tokens
cache_creation     *_details.cache_write       cache_creation_input_tokens
=================  ==========================  =============================================

A value is a count only if it is exactly an ``int`` >= 0; anything else counts as not reported,
so an unknown stays ``None`` and never turns into 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from capture_core.dialects._facts import EMPTY_TOKENS, TokenStats, count

__all__ = ["token_stats"]

_DETAIL_GROUPS: Final = ("prompt_tokens_details", "input_tokens_details")
_OUTPUT_GROUPS: Final = ("output_tokens_details", "completion_tokens_details")
_REASONING_KEYS: Final = ("reasoning_tokens", "thinking_tokens")
_CACHED_KEYS: Final = ("cached_tokens", "cached_input_tokens")
_CREATION_KEYS: Final = ("cache_write_tokens",)


def _detail(
    usage: Mapping[str, object], groups: tuple[str, ...], keys: tuple[str, ...]
) -> int | None:
    """The first count found under ``keys`` in the first of ``groups`` that has one."""
    for group_name in groups:
        group = usage.get(group_name)
        if group is None:
            continue
        if type(group) is dict or isinstance(group, Mapping):
            for key in keys:
                value = count(group.get(key))
                if value is not None:
                    return value
    return None


def token_stats(usage: object, dialect: str | None = None) -> TokenStats:
    """Normalize a usage object.

    Anthropic's ``input_tokens`` excludes the cache, so the cache counts are folded back into
    ``tokens_in`` for ``messages`` (and, for an unknown dialect, when the usage has no
    ``prompt_tokens``). OpenAI-style counts already include the cache: never folded there,
    even when a gateway adds Anthropic's cache keys to a chat usage object.

    Example:
        >>> token_stats({"input_tokens": 100, "output_tokens": 50,
        ...              "cache_read_input_tokens": 200, "cache_creation_input_tokens": 30},
        ...             "messages")
        TokenStats(tokens_in=330, tokens_out=50, tokens_reasoning=None, tokens_total=380, \
cached_tokens=200, cache_creation_tokens=30)
    """
    # Checked for a dict first: the ABC check of ``Mapping`` is slow, and this runs per line.
    if type(usage) is not dict and not isinstance(usage, Mapping):
        return EMPTY_TOKENS
    get = usage.get
    # Each value is the first count reported among its keys, in order (looked up lazily).
    tokens_in = count(get("input_tokens"))
    if tokens_in is None:
        tokens_in = count(get("prompt_tokens"))
    tokens_out = count(get("output_tokens"))
    if tokens_out is None:
        tokens_out = count(get("completion_tokens"))
    cache_read = count(get("cache_read_input_tokens"))
    cache_creation = count(get("cache_creation_input_tokens"))
    anthropic = dialect == "messages" or (
        dialect not in ("responses", "chat") and "prompt_tokens" not in usage
    )
    if anthropic and (cache_read is not None or cache_creation is not None):
        # Anthropic reports the uncached remainder only: fold the cache back into the prompt.
        cache_total = (cache_read or 0) + (cache_creation or 0)
        if tokens_in is not None or cache_total > 0:
            tokens_in = (tokens_in or 0) + cache_total
    tokens_total = count(get("total_tokens"))
    if tokens_total is None and tokens_in is not None and tokens_out is not None:
        tokens_total = count(tokens_in + tokens_out)
    reasoning = _detail(usage, _OUTPUT_GROUPS, _REASONING_KEYS)
    if reasoning is None:
        reasoning = count(get("reasoning_output_tokens"))
    cached = _detail(usage, _DETAIL_GROUPS, _CACHED_KEYS)
    if cached is None:
        cached = cache_read if cache_read is not None else count(get("cached_input_tokens"))
    creation = cache_creation
    if creation is None:
        creation = _detail(usage, _DETAIL_GROUPS, _CREATION_KEYS)
    # Positional, in field order: binding keywords costs a third of building the value.
    return TokenStats(tokens_in, tokens_out, reasoning, tokens_total, cached, creation)
