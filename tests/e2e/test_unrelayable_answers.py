"""Upstream answers the server cannot pass on as they are: the client gets a 502, and the line
says the 502 (was: the client's connection was dropped without a status while the line said the
upstream's 200, with a traceback in the log), and upstream redirects the proxy cannot vouch
for are refused whatever slashes they are spelt with."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture_core import CaptureStore
from capture_core.testing.processes import run_capture_server
from tests.e2e._raw_http import Canary, send_raw

BODY = b'{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}'


def answer(status: bytes = b"200 OK", header: bytes = b"x-ok: 1") -> bytes:
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n%s\r\ncontent-length: %d\r\n\r\n"
            % (status, header, len(BODY)) + BODY)  # fmt: skip


CASES = {
    "control character in a header value": answer(header=b"x-evil: a\x7fb"),
    "another control character": answer(header=b"x-evil: a\x01b"),
    "status out of range": answer(status=b"999 Weird"),
    "switching protocols": b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
    b"connection: upgrade\r\n\r\n",
    "redirect to a host spelt with backslashes": b"HTTP/1.1 302 Found\r\n"
    b"location: \\\\127.0.0.1:9/x\r\ncontent-length: 0\r\n\r\n",
    "redirect to a host after a slash and a backslash": b"HTTP/1.1 302 Found\r\n"
    b"location: /\\127.0.0.1:9/x\r\ncontent-length: 0\r\n\r\n",
}


def request(rollout_id: str, path: str = "/v1/chat/completions") -> bytes:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    prefix = f"/ng-rollout/{rollout_id}" if rollout_id else ""
    return (f"POST {prefix}{path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body  # fmt: skip


def test_answers_that_cannot_be_relayed_are_a_502_on_both_sides(tmp_path: Path) -> None:
    upstream = Canary()
    try:
        with run_capture_server(f"http://127.0.0.1:{upstream.port}", tmp_path / "calls") as server:
            seen = {}
            for index, (label, reply) in enumerate(CASES.items()):
                upstream.reply = reply
                seen[label] = send_raw(server.port, request(f"u-{index}"))
                seen[label + " (uncaptured)"] = send_raw(server.port, request("", "/v1/x"))
            log = server.log()
    finally:
        upstream.close()
    store = CaptureStore(tmp_path / "calls")
    for index, label in enumerate(CASES):
        for key in (label, label + " (uncaptured)"):
            assert seen[key].status == 502, (key, seen[key])
            assert "127.0.0.1:9" not in str(seen[key].headers), key
        (line,) = store.read(f"u-{index}").entries
        assert line.data["status_code"] == 502, label
        assert line.data["error_category"] == "upstream_error", label
    assert "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("location", ["/ng-rollout/r/v1/x", "/v1/files/f1"])
def test_a_redirect_within_the_upstream_still_passes(tmp_path: Path, location: str) -> None:
    reply = f"HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"
    upstream = Canary(reply.encode())
    try:
        with run_capture_server(f"http://127.0.0.1:{upstream.port}", tmp_path / "calls") as server:
            got = send_raw(server.port, request("", "/v1/x"))
    finally:
        upstream.close()
    assert got.status == 307 and got.headers["location"] == location
