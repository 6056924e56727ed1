"""Compressed upstreams: the client gets the bytes it would get directly, the record is decoded.

Real processes: upstreams behind Starlette's ``GZipMiddleware`` and behind a middleware that
always answers ``br`` or ``zstd``; curl as the client (without ``--compressed`` it sends no
``accept-encoding`` and decodes nothing, so what it writes is what came over the wire).
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from capture_core import CaptureStore
from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def compressing_upstream(kind: str) -> Iterator[str]:
    workdir = Path(tempfile.mkdtemp(prefix=f"ngcapture-{kind}-"))
    port_file, log = workdir / "port", workdir / "log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e._compressing_upstreams", kind, "--port-file",
             str(port_file)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().endswith("\n")):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the upstream did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)


def curl(url: str, body: bytes, *extra: str) -> tuple[dict[str, str], bytes]:
    """POST with curl; returns response headers (lower-case) and the body exactly as written."""
    with tempfile.TemporaryDirectory() as tmp:
        head, out = Path(tmp) / "head", Path(tmp) / "out"
        subprocess.run(
            ["curl", "-s", "--fail-with-body", "-o", str(out), "-D", str(head), "-X", "POST",
             "-H", "content-type: application/json", "--data-binary", "@-", *extra, url],
            input=body, check=True, timeout=60,
        )  # fmt: skip
        headers = {}
        for line in head.read_text("latin-1").splitlines()[1:]:
            name, _, value = line.partition(":")
            if value:
                headers[name.strip().lower()] = value.strip()
        return headers, out.read_bytes()


@pytest.fixture(scope="module", params=["gzip", "br", "zstd"])
def upstream(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str, CaptureStore]]:  # fmt: skip
    directory = tmp_path_factory.mktemp(f"compress-{request.param}") / "calls"
    with (
        compressing_upstream(request.param) as direct,
        run_capture_server(direct, directory) as proxy,
    ):
        yield request.param, direct, proxy.url, CaptureStore(directory)


def test_identity_bytes_without_accept_encoding_are_exactly_the_direct_ones(upstream: tuple[str, str, str, CaptureStore]) -> None:  # fmt: skip
    kind, direct, proxy, store = upstream
    body = orjson.dumps(request_body("chat"))
    direct_headers, direct_bytes = curl(direct + "/v1/chat/completions", body)
    rollout = f"{kind}-plain"
    proxy_headers, proxy_bytes = curl(f"{proxy}/ng-rollout/{rollout}/v1/chat/completions", body)
    assert proxy_bytes == direct_bytes
    assert proxy_headers.get("content-encoding") == direct_headers.get("content-encoding")
    if kind == "gzip":  # asked for nothing, got identity: the proxy asked for nothing either
        assert "content-encoding" not in proxy_headers
        answer = orjson.loads(proxy_bytes)
    else:  # this upstream always encodes: the client still gets the encoded bytes untouched
        assert proxy_headers["content-encoding"] == kind
        answer = orjson.loads(_decode(kind, proxy_bytes))
    (record,) = store.read_records(rollout).records
    assert record.error_category is None
    assert record.response == answer
    assert record.tokens_in == answer["usage"]["prompt_tokens"]
    assert record.tokens_out == answer["usage"]["completion_tokens"]


def test_compressed_answers_are_relayed_as_sent_and_recorded_decoded(upstream: tuple[str, str, str, CaptureStore]) -> None:  # fmt: skip
    kind, direct, proxy, store = upstream
    body = orjson.dumps(request_body("chat"))
    accept = ("-H", f"accept-encoding: {kind}")
    _, direct_bytes = curl(direct + "/v1/chat/completions", body, *accept)
    rollout = f"{kind}-accepting"
    headers, proxy_bytes = curl(f"{proxy}/ng-rollout/{rollout}/v1/chat/completions", body, *accept)
    assert headers["content-encoding"] == kind
    assert _decode(kind, proxy_bytes) == _decode(kind, direct_bytes)
    if kind != "gzip":  # deterministic encoders: the very same bytes
        assert proxy_bytes == direct_bytes
    (record,) = store.read_records(rollout).records
    answer = orjson.loads(_decode(kind, proxy_bytes))
    assert record.error_category is None and record.response == answer
    assert record.tokens_total == answer["usage"]["total_tokens"]


# Starlette's GZipMiddleware never compresses text/event-stream: streams go to br and zstd.
@pytest.mark.parametrize("upstream", ["br", "zstd"], indirect=True)
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_compressed_streams_are_decoded_as_they_pass(upstream: tuple[str, str, str, CaptureStore], dialect: str) -> None:  # fmt: skip
    kind, direct, proxy, store = upstream
    body = orjson.dumps({**request_body(dialect, stream=True),
                         **({"stream_options": {"include_usage": True}} if dialect == "chat" else {})})  # fmt: skip
    path = {
        "chat": "/v1/chat/completions",
        "responses": "/v1/responses",
        "messages": "/v1/messages",
    }
    _, direct_bytes = curl(direct + path[dialect], body)
    rollout = f"{kind}-stream-{dialect}"
    headers, proxy_bytes = curl(f"{proxy}/ng-rollout/{rollout}{path[dialect]}", body)
    assert headers["content-encoding"] == kind
    assert proxy_bytes == direct_bytes
    (record,) = store.read_records(rollout).records
    assert record.stream is True
    assert record.error_category is None  # the terminal event was seen through the coding
    assert record.response_raw == _decode(kind, proxy_bytes).decode()
    assert record.tokens_out is not None and record.tokens_out > 0


def _decode(kind: str, data: bytes) -> bytes:
    from capture_core.server.decoding import decode_body

    return gzip.decompress(data) if kind == "gzip" else decode_body(data, kind)
