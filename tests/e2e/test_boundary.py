"""The capture boundary under attack: a hostile corpus of request targets, sent byte for byte.

A canary listener on another loopback port counts anything that reaches it: no request may
(the upstream origin is fixed by the settings). No answer may be a 500, no file may appear
outside the capture directory, and every dialect call the proxy served is captured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from capture_core import CaptureStore
from capture_core.pending import pending_calls
from capture_core.testing import request_body
from capture_core.testing.processes import ServiceProcess, run_capture_server
from tests.e2e._raw_http import Canary, RawResponse, send_raw
from tests.e2e.conftest import Stack

# What a case must end as:
REFUSED = "refused"  # answered by the proxy itself with a 4xx JSON error; nothing forwarded
CAPTURED = "captured"  # a dialect call: served and captured (exactly one line)
FORWARDED = "forwarded"  # reached the worker, not a dialect call: no capture
WARNED = "warned"  # an invalid rollout id: served uncaptured, with the warning header

DIALECT_BODY = {
    "chat": orjson.dumps(request_body("chat")),
    "responses": orjson.dumps(request_body("responses")),
    "messages": orjson.dumps(request_body("messages")),
}


@dataclass(frozen=True)
class Case:
    label: str
    target: str  # {rid}: a fresh rollout id; {canary}: the canary's port
    expect: str
    method: str = "POST"
    dialect: str = "chat"
    headers: str = ""  # extra header lines, each ending in \r\n
    raw: Callable[[str, int, int], bytes] | None = None  # build the whole request yourself


def _cl_and_te(rid: str, port: int, canary: int) -> bytes:
    body = DIALECT_BODY["chat"]
    return (
        f"POST /ng-rollout/{rid}/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        f"content-length: {len(body)}\r\ntransfer-encoding: chunked\r\n"
        "connection: close\r\n\r\n0\r\n\r\n"
    ).encode() + body


def _two_lengths(rid: str, port: int, canary: int) -> bytes:
    body = DIALECT_BODY["chat"]
    return (
        f"POST /ng-rollout/{rid}/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        f"content-length: {len(body)}\r\ncontent-length: 5\r\nconnection: close\r\n\r\n"
    ).encode() + body


def _no_colon(rid: str, port: int, canary: int) -> bytes:
    return (
        f"POST /ng-rollout/{rid}/v1/chat/completions HTTP/1.1\r\nhost x\r\n"
        "connection: close\r\n\r\n"
    ).encode()


def _http10(rid: str, port: int, canary: int) -> bytes:
    body = DIALECT_BODY["chat"]
    return (
        f"POST /ng-rollout/{rid}/v1/chat/completions HTTP/1.0\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _chunked(rid: str, port: int, canary: int) -> bytes:
    body = DIALECT_BODY["chat"]
    half = len(body) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]))
    return (
        (
            f"POST /ng-rollout/{rid}/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            "content-type: application/json\r\ntransfer-encoding: chunked\r\n"
            "connection: close\r\n\r\n"
        ).encode()
        + chunks
        + b"0\r\n\r\n"
    )


CORPUS = [
    # Targets that are not origin-form paths: refused before anything else.
    Case("absolute-form to the canary", "http://127.0.0.1:{canary}/v1/chat/completions", REFUSED),
    Case("absolute-form, prefixed", "http://127.0.0.1:{canary}/ng-rollout/{rid}/v1/chat/completions", REFUSED),
    Case("absolute-form https", "https://127.0.0.1:{canary}/v1/chat/completions", REFUSED),
    Case("absolute-form upper-case scheme", "HTTP://127.0.0.1:{canary}/v1/chat/completions", REFUSED),
    Case("absolute-form GET", "http://127.0.0.1:{canary}/", REFUSED, method="GET"),
    Case("userinfo-style target", "@127.0.0.1:{canary}/v1/chat/completions", REFUSED),
    Case("userinfo-style, prefixed", "@127.0.0.1:{canary}/ng-rollout/{rid}/v1/chat/completions", REFUSED),
    Case("user:pass@host target", "user:pass@127.0.0.1:{canary}/v1/chat/completions", REFUSED),
    Case("port-only target", ":{canary}/v1/chat/completions", REFUSED),
    Case("authority-form POST", "127.0.0.1:{canary}", REFUSED),
    Case("authority-form CONNECT", "127.0.0.1:{canary}", REFUSED, method="CONNECT"),
    Case("IPv6 authority", "[::1]:{canary}/v1/chat/completions", REFUSED),
    Case("asterisk-form OPTIONS", "*", REFUSED, method="OPTIONS"),
    Case("asterisk-form POST", "*", REFUSED),
    Case("relative path without slash", "ng-rollout/{rid}/v1/chat/completions", REFUSED),
    Case("backslash host", "\\\\127.0.0.1:{canary}/v1/chat/completions", REFUSED),
    Case("raw backslash in path", "/ng-rollout/{rid}/v1\\chat\\completions", REFUSED),
    # Origin-form paths that look like hosts are just paths on the upstream.
    Case("scheme-relative-looking path", "//127.0.0.1:{canary}/v1/chat/completions", FORWARDED),
    Case("scheme-relative, prefixed inside", "//127.0.0.1:{canary}/ng-rollout/{rid}/v1/chat/completions", FORWARDED),
    Case("URL as a path segment", "/ng-rollout/{rid}/http://127.0.0.1:{canary}/v1/chat/completions", FORWARDED),
    Case("unprefixed dialect path", "/v1/chat/completions", FORWARDED),
    Case("matrix parameter", "/ng-rollout/{rid}/v1/chat/completions;x=1", FORWARDED),
    # Dot segments, escapes, repeated and trailing slashes: captured like the plain path.
    Case("dot-dot inside the rest", "/ng-rollout/{rid}/v1/../v1/chat/completions", CAPTURED),
    Case("encoded dot-dot", "/ng-rollout/{rid}/v1/%2e%2e/v1/chat/completions", CAPTURED),
    Case("encoded dot-dot upper", "/ng-rollout/{rid}/v1/%2E%2E/v1/chat/completions", CAPTURED),
    Case("mixed encoded dot-dot", "/ng-rollout/{rid}/v1/.%2e/v1/chat/completions", CAPTURED),
    Case("dot segment", "/ng-rollout/{rid}/v1/./chat/completions", CAPTURED),
    Case("encoded dot segment", "/ng-rollout/{rid}/v1/%2e/chat/completions", CAPTURED),
    Case("repeated slashes", "/ng-rollout/{rid}//v1//chat///completions", CAPTURED),
    Case("trailing slash", "/ng-rollout/{rid}/v1/chat/completions/", CAPTURED),
    Case("trailing slashes", "/ng-rollout/{rid}/v1/chat/completions//", CAPTURED),
    Case("leading double slash", "//ng-rollout/{rid}/v1/chat/completions", CAPTURED),
    Case("leading dot segment", "/./ng-rollout/{rid}/v1/chat/completions", CAPTURED),
    Case("climb into the prefix", "/x/../ng-rollout/{rid}/v1/chat/completions", CAPTURED),
    Case("dot before the id", "/ng-rollout/./{rid}/v1/chat/completions", CAPTURED),
    Case("encoded unreserved letter", "/ng-rollout/{rid}/v1/chat/c%6Fmpletions", CAPTURED),
    Case("encoded version segment", "/ng-rollout/{rid}/%76%31/chat/completions", CAPTURED),
    Case("upper-case dialect path", "/ng-rollout/{rid}/V1/CHAT/COMPLETIONS", CAPTURED),
    Case("responses with trailing slash", "/ng-rollout/{rid}/v1/responses/", CAPTURED, dialect="responses"),
    Case("messages with dot", "/ng-rollout/{rid}/v1/messages/.", CAPTURED, dialect="messages"),
    Case("messages via a detour", "/ng-rollout/{rid}/v1/x/y/../../messages", CAPTURED, dialect="messages"),
    # Tricks that would change where the request goes: refused.
    Case("climb out of the prefix", "/ng-rollout/{rid}/../../v1/chat/completions", REFUSED),
    Case("climb over the id", "/ng-rollout/{rid}/../v1/chat/completions", REFUSED),
    Case("dot-dot as the id", "/ng-rollout/../v1/chat/completions", REFUSED),
    Case("encoded dot-dot as the id", "/ng-rollout/%2e%2e/v1/chat/completions", REFUSED),
    Case("empty id", "/ng-rollout//v1/chat/completions", REFUSED),
    Case("empty id after a leading dot", "/./ng-rollout//v1/chat/completions", REFUSED),
    Case("climb above the root", "/../../../etc/passwd", REFUSED),
    Case("encoded slash", "/ng-rollout/{rid}/v1/chat%2Fcompletions", REFUSED),
    Case("encoded slashes", "/ng-rollout/{rid}/v1%2fchat%2fcompletions", REFUSED),
    Case("encoded slash after the id", "/ng-rollout/{rid}%2F..%2F..%2Fv1/chat/completions", REFUSED),
    Case("encoded backslash", "/ng-rollout/{rid}/v1/chat%5Ccompletions", REFUSED),
    Case("encoded NUL", "/ng-rollout/{rid}/v1/chat/completions%00", REFUSED),
    Case("encoded CRLF", "/ng-rollout/{rid}/v1/chat/completions%0d%0aX-Evil:%201", REFUSED),
    Case("dangling percent", "/ng-rollout/{rid}/v1/chat/completions%", REFUSED),
    Case("bad escape", "/ng-rollout/{rid}/v1/chat/completions%zz", REFUSED),
    Case("encoded slash dot-dot", "/ng-rollout/{rid}/..%2F..%2Fetc/passwd", REFUSED),
    # Ids that cannot name a file: served, uncaptured, with the warning header.
    Case("hidden id", "/ng-rollout/.hidden/v1/chat/completions", WARNED),
    Case("encoded @ in the id", "/ng-rollout/a%40b/v1/chat/completions", WARNED),
    Case("id of 300 characters", "/ng-rollout/" + "a" * 300 + "/v1/chat/completions", WARNED),
    Case("non-ASCII id", "/ng-rollout/r%C3%B6llout/v1/chat/completions", WARNED),
    Case("id starting with a dash", "/ng-rollout/-x/v1/chat/completions", WARNED),
    # Methods and upgrades.
    Case("GET a dialect path", "/ng-rollout/{rid}/v1/chat/completions", REFUSED, method="GET"),
    Case("PUT a dialect path", "/ng-rollout/{rid}/v1/chat/completions", REFUSED, method="PUT"),
    Case("DELETE a dialect path", "/ng-rollout/{rid}/v1/messages", REFUSED, method="DELETE"),
    Case("TRACE", "/", REFUSED, method="TRACE"),
    Case("unknown method", "/", REFUSED, method="FOO"),
    Case("websocket upgrade", "/ng-rollout/{rid}/v1/chat/completions", REFUSED, method="GET",
         headers="upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\n"
                 "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"),
    Case("h2c upgrade", "/ng-rollout/{rid}/v1/chat/completions", REFUSED,
         headers="upgrade: h2c\r\nconnection: Upgrade, HTTP2-Settings\r\nhttp2-settings: AAA\r\n"),
    # Headers that name other hosts change nothing.
    Case("Host names the canary", "/ng-rollout/{rid}/v1/chat/completions", CAPTURED,
         headers="host: 127.0.0.1:{canary}\r\n"),
    Case("X-Forwarded-Host", "/ng-rollout/{rid}/v1/chat/completions", CAPTURED,
         headers="x-forwarded-host: 127.0.0.1:{canary}\r\nx-forwarded-proto: http\r\n"),
    Case("X-Original-URL", "/ng-rollout/{rid}/v1/chat/completions", CAPTURED,
         headers="x-original-url: http://127.0.0.1:{canary}/\r\nx-rewrite-url: /x\r\n"),
    Case("Forwarded", "/ng-rollout/{rid}/v1/chat/completions", CAPTURED,
         headers="forwarded: for=1.2.3.4;host=127.0.0.1:{canary}\r\n"),
    Case("query naming the canary", "/ng-rollout/{rid}/v1/chat/completions?next=http://127.0.0.1:{canary}/", CAPTURED),
    Case("expect 100-continue", "/ng-rollout/{rid}/v1/chat/completions", CAPTURED,
         headers="expect: 100-continue\r\n"),
    # Framing tricks.
    Case("content-length and chunked", "", REFUSED, raw=_cl_and_te),
    Case("two content-lengths", "", REFUSED, raw=_two_lengths),
    Case("header without a colon", "", REFUSED, raw=_no_colon),
    Case("HTTP/1.0", "", CAPTURED, raw=_http10),
    Case("chunked body", "", CAPTURED, raw=_chunked),
]  # fmt: skip


@pytest.fixture(scope="module")
def boundary(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Path, Canary]]:  # fmt: skip
    root = tmp_path_factory.mktemp("boundary")
    canary = Canary()
    try:
        with run_capture_server(stack.worker.url, root / "calls") as server:
            yield server, root, canary
    finally:
        canary.close()


def _request(case: Case, rid: str, port: int, canary: int) -> bytes:
    if case.raw is not None:
        return case.raw(rid, port, canary)
    body = b"" if case.method in ("GET", "HEAD", "TRACE", "OPTIONS", "CONNECT", "DELETE") \
        else DIALECT_BODY[case.dialect]  # fmt: skip
    target = case.target.format(rid=rid, canary=canary)
    headers = case.headers.format(canary=canary)
    host = "" if "host:" in headers else f"host: 127.0.0.1:{port}\r\n"
    return (
        f"{case.method} {target} HTTP/1.1\r\n{host}{headers}"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode("latin-1") + body


def test_the_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 60
    assert len({case.label for case in CORPUS}) == len(CORPUS)


def test_hostile_targets_never_leave_the_upstream_origin(boundary: tuple[ServiceProcess, Path, Canary]) -> None:  # fmt: skip
    server, root, canary = boundary
    capture_dir = root / "calls"
    before = {p for p in root.rglob("*") if capture_dir not in p.parents and p != capture_dir}
    store = CaptureStore(capture_dir)
    outcomes: dict[str, RawResponse] = {}
    for index, case in enumerate(CORPUS):
        rid = f"b-{index}"
        outcomes[case.label] = answer = send_raw(
            server.port, _request(case, rid, server.port, canary.port)
        )
        where = f"{case.label}: {answer.status} {answer.body[:200]!r}"
        assert answer.status is not None, where
        assert answer.status != 500, where
        lines = store.read(rid).entries if store.path_for(rid).exists() else []
        if case.expect == REFUSED:
            assert 400 <= answer.status < 500, where
            error = answer.json()
            assert isinstance(error, dict) and "error" in error, where
            assert not lines, where
        elif case.expect == CAPTURED:
            assert len(lines) == 1, where
            assert lines[0].data["status_code"] == answer.status, where
            assert lines[0].data["error_category"] in (None, "not_found"), where
        elif case.expect == FORWARDED:
            assert answer.status in (200, 404, 405), where
            assert "x-ngcapture-warning" not in answer.headers, where
            assert not lines, where
        else:
            assert answer.status == 200 and "x-ngcapture-warning" in answer.headers, where
    # the worker served the captured dialect calls: they are real answers
    assert outcomes["dot-dot inside the rest"].status == 200
    assert outcomes["upper-case dialect path"].status == 404  # the worker's routes are exact
    assert canary.connections == 0, canary.received[:500]
    after = {p for p in root.rglob("*") if capture_dir not in p.parents and p != capture_dir}
    assert after == before
    written = sorted(p.name for p in capture_dir.glob("*.capture.jsonl"))
    expected = sorted(
        f"b-{i}.capture.jsonl" for i, case in enumerate(CORPUS) if case.expect == CAPTURED
    )
    assert written == expected
    assert not list(capture_dir.glob("*.capture.incomplete"))
    assert pending_calls(capture_dir) == []


def test_the_upstream_gets_the_headers_the_client_sent_and_no_others(tmp_path: Path) -> None:
    """No accept, accept-encoding or user-agent of the proxy's own; hop-by-hop ones dropped
    (including those named in ``connection``), and ``expect``, which the proxy answered (an
    upstream asked for a 100 again may wait for a body that never comes); host and
    content-length are the upstream's."""
    upstream = Canary()
    try:
        with run_capture_server(f"http://127.0.0.1:{upstream.port}", tmp_path / "calls") as server:
            body = DIALECT_BODY["chat"]
            request = (
                "POST /ng-rollout/h-1/v1/chat/completions HTTP/1.1\r\n"
                f"host: 127.0.0.1:{server.port}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nauthorization: Bearer sk-test\r\n"
                "x-custom: kept\r\nconnection: close, x-hop\r\nx-hop: dropped\r\n"
                "keep-alive: timeout=5\r\nte: trailers\r\nproxy-authorization: Basic eA==\r\n"
                "expect: 100-continue\r\n\r\n"
            ).encode() + body
            answer = send_raw(server.port, request)
    finally:
        upstream.close()
    assert answer.status == 200 and answer.body == b"canary"
    head = upstream.received.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    assert head[0] == "POST /v1/chat/completions HTTP/1.1"
    names = sorted(line.partition(":")[0].lower() for line in head[1:])
    assert names == ["authorization", "content-length", "content-type", "host", "x-custom"]
    sent = dict(line.lower().split(": ", 1) for line in head[1:])
    assert sent["host"] == f"127.0.0.1:{upstream.port}"
    assert sent["content-length"] == str(len(body))
    assert sent["authorization"] == "bearer sk-test"


def _through_proxy(tmp_path: Path, reply: str, case: Case, rid: str) -> tuple[RawResponse, int]:
    """``case`` sent through a capture server in front of an upstream that answers ``reply``
    (``{port}`` in it: the upstream's own port); the answer and that port."""
    upstream = Canary(reply.encode())
    try:
        with run_capture_server(f"http://127.0.0.1:{upstream.port}", tmp_path / "calls") as server:
            return send_raw(server.port, _request(case, rid, server.port, 0)), upstream.port
    finally:
        upstream.close()


@pytest.mark.parametrize(
    ("location", "client_sees"),
    [
        ("http://127.0.0.1:{port}/v1/files/f1?x=1", "/ng-rollout/r-1/v1/files/f1?x=1"),
        ("/v1/files/f1", "/ng-rollout/r-1/v1/files/f1"),
        ("f1", "f1"),  # relative to the request's own (prefixed) URL already
    ],
)
def test_a_redirect_never_shows_the_upstream_address(tmp_path: Path, location: str, client_sees: str) -> None:  # fmt: skip
    reply = f"HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"
    case = Case("redirect", "/ng-rollout/r-1/v1/models", FORWARDED, method="GET")
    answer, port = _through_proxy(tmp_path, reply, case, "r-1")
    assert answer.status == 307
    assert answer.headers["location"] == client_sees
    assert str(port) not in answer.headers["location"]


def test_a_redirect_to_another_host_is_refused(tmp_path: Path) -> None:
    other = Canary()
    reply = f"HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:{other.port}/x\r\ncontent-length: 0\r\n\r\n"
    try:
        case = Case("redirect", "/ng-rollout/r-2/v1/chat/completions", CAPTURED)
        answer, _ = _through_proxy(tmp_path, reply, case, "r-2")
    finally:
        other.close()
    assert answer.status == 502
    assert "redirect" in answer.body.decode()
    assert str(other.port) not in answer.body.decode() and "location" not in answer.headers
    assert other.connections == 0
    (line,) = CaptureStore(tmp_path / "calls").read("r-2").entries
    assert line.data["status_code"] == 502 and line.data["error_category"] == "upstream_error"


def test_links_and_refreshes_never_show_the_upstream_address(tmp_path: Path) -> None:
    """``Link`` targets on the upstream and a ``Refresh`` URL point at the proxy, as a
    ``Location`` does; a link to another host is a link, left as it is."""
    reply = (
        "HTTP/1.1 200 OK\r\n"
        "link: <http://127.0.0.1:{port}/v1/files?page=2>; rel=next, </v1/files?page=0>; "
        'rel=prev, <https://docs.example/api>; rel="help"\r\n'
        "refresh: 0; url=http://127.0.0.1:{port}/v1/files\r\ncontent-length: 2\r\n\r\nok"
    )
    case = Case("links", "/ng-rollout/r-3/v1/files", FORWARDED, method="GET")
    answer, _ = _through_proxy(tmp_path, reply, case, "r-3")
    assert answer.status == 200 and answer.body == b"ok"
    assert answer.headers["link"] == (
        "</ng-rollout/r-3/v1/files?page=2>; rel=next, </ng-rollout/r-3/v1/files?page=0>; "
        'rel=prev, <https://docs.example/api>; rel="help"'
    )
    assert answer.headers["refresh"] == "0; url=/ng-rollout/r-3/v1/files"


def test_a_refresh_to_another_host_is_refused_as_a_redirect(tmp_path: Path) -> None:
    reply = "HTTP/1.1 200 OK\r\nrefresh: 3;url=http://127.0.0.1:9/x\r\ncontent-length: 0\r\n\r\n"
    case = Case("refresh", "/ng-rollout/r-4/v1/files", FORWARDED, method="GET")
    answer, _ = _through_proxy(tmp_path, reply, case, "r-4")
    assert answer.status == 502 and "refresh" not in answer.headers
