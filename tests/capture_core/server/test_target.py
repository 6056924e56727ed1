"""Request-target normalisation: one path for routing and forwarding, or a refusal."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture_core.exceptions import RequestRefusedError
from capture_core.server.target import normalize_target


@pytest.mark.parametrize(
    ("target", "path"),
    [
        (b"/v1/chat/completions", "/v1/chat/completions"),
        (b"/ng-rollout/0-0/v1/../v1/chat/completions", "/ng-rollout/0-0/v1/chat/completions"),
        (b"/ng-rollout/0-0/v1/%2e%2E/v1//chat/./completions/", "/ng-rollout/0-0/v1/chat/completions"),
        (b"//ng-rollout/0-0/v1/chat/c%6Fmpletions", "/ng-rollout/0-0/v1/chat/completions"),
        (b"/x/../ng-rollout/0-0/v1/messages", "/ng-rollout/0-0/v1/messages"),
        (b"/ng-rollout/./0-0/v1/responses", "/ng-rollout/0-0/v1/responses"),
        (b"/a%20b/%e2%82%ac", "/a b/\u20ac"),
        (b"/", "/"),
        (b"/.well-known/x", "/.well-known/x"),
    ],
)  # fmt: skip
def test_paths_are_normalised(target: bytes, path: str) -> None:
    assert normalize_target(target).path == path


def test_escapes_that_are_data_stay_escaped_for_forwarding() -> None:
    normalized = normalize_target(b"/v1/files/a%20b%3a?x=%2F")
    assert normalized.raw_path == b"/v1/files/a%20b%3A"
    assert normalized.query == b"x=%2F"  # the query goes as sent


@pytest.mark.parametrize(
    "target",
    [b"http://h/x", b"@h:1/x", b"h:1", b":1/x", b"*", b"x/y", b"", b"/../x", b"/a/../../x",
     b"/ng-rollout/0-0/../x", b"/ng-rollout/0-0/../../x", b"/ng-rollout/%2e%2e/x",
     b"/v1/a%2Fb", b"/v1/a%5cb", b"/v1/a%00", b"/v1/a%0a", b"/v1/a%7f", b"/v1/%", b"/v1/%g0",
     b"/v1/a\\b", b"/v1/a b", b"/v1/#frag", b"/v1/\xff",
     # an empty id, however the path reaches the prefix: not the next segment as the id
     b"/ng-rollout//v1/chat/completions", b"/./ng-rollout//v1/x", b"/x/../ng-rollout//v1/x",
     b"/ng-rollout/.//v1/x", b"/ng-rollout//./v1/x"],
)  # fmt: skip
def test_targets_that_would_go_elsewhere_are_refused(target: bytes) -> None:
    with pytest.raises(RequestRefusedError) as caught:
        normalize_target(target)
    assert caught.value.status == 400


SEGMENT = st.sampled_from(["", ".", "..", "%2e", "%2E%2e", "v1", "chat", "%41", "a%20b",
                           "ng-rollout", "0-0", "%2F", "x;y", "~", "%zz", "%"])  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(SEGMENT, max_size=8), st.booleans())
def test_normalising_is_total_and_idempotent(segments: list[str], leading: bool) -> None:
    target = (("/" if leading else "") + "/".join(segments)).encode()
    try:
        normalized = normalize_target(target)
    except RequestRefusedError as exc:
        refused = exc.status
    else:
        refused = None
    if refused is not None:
        assert refused == 400
        return
    raw = normalized.raw_path
    assert raw.startswith(b"/")
    assert raw == b"/" or not raw.endswith(b"/")
    assert b"//" not in raw
    parts = raw.split(b"/")[1:]
    assert b"." not in parts and b".." not in parts
    assert b"%2F" not in raw.upper() and b"%2E" not in raw.upper()
    assert normalize_target(raw) == normalized  # normalising again changes nothing
    sent = [s for s in target.split(b"/")[1:] if s and s not in (b".", b"%2e", b"%2E")]
    if sent[:1] == [b"ng-rollout"] and len(sent) >= 2:
        # a request that started in a rollout prefix stays in the same one, or was refused
        assert parts[:1] == [b"ng-rollout"]
