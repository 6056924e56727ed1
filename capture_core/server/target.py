"""Request targets: refuse what cannot be forwarded, normalise the rest once.

Only an origin-form target (a path starting with ``/``, RFC 9112 §3.2.1) is forwarded;
absolute-form (``http://host/x``), authority-form (``host:443``), asterisk-form (``*``) and
anything else (``@host:port/x``, ``:8080/x``) is refused with a 400 before any routing.

The path is then normalised, and the one normalised path is used both to route (prefix,
dialect) and to forward, so what is captured is what the upstream serves:

- percent-encoded unreserved characters (``%2e``, ``%41``...) are decoded, other escapes keep
  their bytes with upper-case hex;
- an encoded ``/``, ``\\``, control character or a malformed ``%`` escape is refused (an
  upstream that decodes them would route differently from us);
- empty segments (``//``, a trailing ``/``) are dropped, ``.`` segments removed and ``..``
  segments resolved; a ``..`` that climbs above the root, or out of a ``/ng-rollout/<id>/``
  prefix the request started with, is refused, and so is a prefix whose id is empty (a
  client that left it out: dropping the empty segment would make the next one the id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

from capture_core.exceptions import RequestRefusedError

__all__ = ["Target", "normalize_target"]

_UNRESERVED: Final = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
)
# Escapes an upstream could decode into path structure or a different request: refused.
_FORBIDDEN_ESCAPES: Final = frozenset([*range(0x20), 0x7F, ord("/"), ord("\\")])
# Visible ASCII except '\\' and the delimiters that cannot appear in a path.
_PATH_BYTES: Final = re.compile(rb"^[!$&'()*+,\-./0-9:;=@A-Z_a-z~%]*$")
_FAST_PATH: Final = re.compile(
    rb"^(?:/[!$&'()*+,\-0-9:;=@A-Z_a-z~][!$&'()*+,\-.0-9:;=@A-Z_a-z~]*)+$"
)
_ESCAPE: Final = re.compile(rb"%(..)?", re.DOTALL)
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
PREFIX_SEGMENT: Final = b"ng-rollout"


@dataclass(frozen=True, slots=True)
class Target:
    """A normalised request target.

    Attributes:
        raw_path: the normalised path, still percent-encoded where it must be (forwarded).
        path: ``raw_path`` fully percent-decoded (for routing).
        query: the query string as sent, without ``?``.
    """

    raw_path: bytes
    path: str
    query: bytes


def _refuse(reason: str) -> RequestRefusedError:
    return RequestRefusedError(400, reason)


def _decode_segment(segment: bytes) -> bytes:
    def replace(match: re.Match[bytes]) -> bytes:
        digits = match.group(1)
        if digits is None or not all(c in _HEX for c in digits):
            raise _refuse("malformed percent-escape in the path")
        value = int(digits, 16)
        if value in _UNRESERVED:
            return bytes([value])
        if value in _FORBIDDEN_ESCAPES:
            raise _refuse(f"the path encodes a separator or control character (%{value:02X})")
        return b"%" + digits.upper()

    return _ESCAPE.sub(replace, segment) if b"%" in segment else segment


def _prefix_of(segments: list[bytes]) -> list[bytes] | None:
    """The ``[ng-rollout, <id>]`` segments a segment list starts with, if any."""
    if len(segments) >= 2 and segments[0] == PREFIX_SEGMENT:
        return segments[:2]
    return None


def normalize_target(target: bytes) -> Target:
    """Check and normalise a request target (the bytes after the method).

    Raises:
        RequestRefusedError: the target is not an origin-form path, or normalising it would
            change where it goes (status 400, with the reason).

    Example:
        >>> normalize_target(b"/ng-rollout/0-0/v1/../v1//chat/completions/?a=1")
        Target(raw_path=b'/ng-rollout/0-0/v1/chat/completions', path='/ng-rollout/0-0/v1/chat/completions', query=b'a=1')
    """  # noqa: E501
    if not target.startswith(b"/"):
        raise _refuse("the request target must be a path starting with '/' (origin-form)")
    raw_path, _, query = target.partition(b"?")
    if b"#" in target:
        raise _refuse("the request target must not carry a fragment")
    if _FAST_PATH.match(raw_path):
        # The common case: nothing to decode, no empty segments, no segment starting with '.'.
        return Target(raw_path, raw_path.decode("ascii"), query)
    if not _PATH_BYTES.match(raw_path):
        raise _refuse("the path contains characters that must be percent-encoded")
    sent: list[bytes] = []
    after_empty: set[int] = set()  # where in ``sent`` are segments an empty one came before
    gap = False  # (``.`` segments in between do not count)
    for segment in map(_decode_segment, raw_path.split(b"/")[1:]):
        if not segment:
            gap = True
            continue
        if gap and segment != b".":
            after_empty.add(len(sent))
            gap = False
        sent.append(segment)
    as_sent = [s for s in sent if s != b"."]
    resolved: list[bytes] = []
    places: list[int] = []  # where in ``sent`` each resolved segment was
    for place, segment in enumerate(sent):
        if segment == b".":
            continue
        if segment == b"..":
            if not resolved:
                raise _refuse("the path climbs above the root ('..')")
            resolved.pop()
            places.pop()
        else:
            resolved.append(segment)
            places.append(place)
    prefix = _prefix_of(as_sent)
    if prefix is not None and _prefix_of(resolved) != prefix:
        raise _refuse("'..' would take the request out of its /ng-rollout/<id>/ prefix")
    if resolved[:1] == [PREFIX_SEGMENT] and len(resolved) > 1 and places[1] in after_empty:
        # A client that left its id out (``/ng-rollout//v1/chat/...``): dropping the empty
        # segment would make ``v1`` the id and ``/chat/...`` the path, served uncaptured.
        raise _refuse("the /ng-rollout/<id>/ prefix has an empty rollout id")
    normalized = b"/" + b"/".join(resolved)
    return Target(normalized, unquote(normalized.decode("ascii"), errors="replace"), query)
