"""A reversible byte-level tokenizer and deterministic log-probs, for simulated training capture.

Token ids are UTF-8 bytes shifted past a few special tokens, so every id sequence decodes back
to its text exactly and no vocabulary file is needed. ``render_prompt`` applies a tiny chat
template; continuations of a conversation therefore extend the previous call's ids, which is
what prefix (``token_in``) capture relies on.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

__all__ = ["IMAGE_TOKENS", "SPECIAL_TOKENS", "ByteTokenizer", "logprobs_for", "media_spans"]

SPECIAL_TOKENS: Final = {"<|bos|>": 0, "<|user|>": 1, "<|assistant|>": 2, "<|end|>": 3,
                         "<|tool|>": 4, "<|system|>": 5, "<|image|>": 6}  # fmt: skip
IMAGE_TOKENS: Final = 16
"""Placeholder tokens an image part expands to (like a processor's projected embeddings)."""
_OFFSET: Final = 16


class ByteTokenizer:
    """UTF-8 bytes as tokens (id = byte + 16); ids below 16 are special tokens.

    Example:
        >>> tok = ByteTokenizer()
        >>> tok.decode(tok.encode("héllo"))
        'héllo'
    """

    vocab_size: Final = 256 + _OFFSET

    def encode(self, text: str) -> list[int]:
        return [byte + _OFFSET for byte in text.encode("utf-8")]

    def decode(self, ids: Iterable[int]) -> str:
        names = {v: k for k, v in SPECIAL_TOKENS.items()}
        out = bytearray()
        for token in ids:
            if token >= _OFFSET:
                out.append(token - _OFFSET)
            else:
                out.extend(names.get(token, "<|?|>").encode())
        return out.decode("utf-8", "replace")

    def render_prompt(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt ids of a conversation, ending with the assistant header."""
        ids = [SPECIAL_TOKENS["<|bos|>"]]
        for message in messages:
            role = str(message.get("role", "user"))
            ids.append(SPECIAL_TOKENS.get(f"<|{role}|>", SPECIAL_TOKENS["<|user|>"]))
            content = message.get("content")
            if isinstance(content, list):
                ids += self._parts(content)
            else:
                ids += self.encode(content if isinstance(content, str) else repr(content))
            ids.append(SPECIAL_TOKENS["<|end|>"])
        ids.append(SPECIAL_TOKENS["<|assistant|>"])
        return ids

    def _parts(self, parts: Sequence[Any]) -> list[int]:
        """Content parts: text is encoded, each image expands to ``IMAGE_TOKENS`` placeholders."""
        ids: list[int] = []
        for part in parts:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in ("image_url", "input_image", "image"):
                ids += [SPECIAL_TOKENS["<|image|>"]] * IMAGE_TOKENS
            elif kind in ("text", "input_text") and isinstance(part.get("text"), str):
                ids += self.encode(part["text"])
            else:
                ids += self.encode(repr(part))
        return ids


def media_spans(ids: Sequence[int]) -> list[dict[str, Any]]:
    """Where image placeholders sit in expanded prompt ids: ``[{modality, offset, length}]``."""
    image = SPECIAL_TOKENS["<|image|>"]
    spans: list[dict[str, Any]] = []
    start = None
    for position, token in enumerate([*ids, -1]):
        if token == image and start is None:
            start = position
        elif token != image and start is not None:
            spans.append({"modality": "image", "offset": start, "length": position - start})
            start = None
    return spans


def logprobs_for(seed: int, prompt: Sequence[int], generated: Sequence[int]) -> list[float]:
    """Deterministic log-probs in (-8, 0], exactly representable as float32."""
    digest = hashlib.sha256(f"{seed}:{list(prompt)}".encode()).digest()
    values = []
    for position, token in enumerate(generated):
        word = hashlib.blake2b(digest + f"{position}:{token}".encode(), digest_size=4)
        fraction = int.from_bytes(word.digest(), "little") / 2**32
        value = -8.0 * fraction
        values.append(struct.unpack("<f", struct.pack("<f", value))[0])
    return values
