"""The capture middleware driven message by message, with hand-written receive/send."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core import CaptureStore
from capture_core.pending import pending_writes
from capture_core.server import WARNING_HEADER, CaptureCounters, CaptureMiddleware
from capture_core.testing import Answer, messages_stream, request_body

Message = dict[str, Any]
App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
REQUEST = orjson.dumps(request_body("messages", stream=True))


def scope_for(path: str) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": [(b"content-type", b"application/json")]}  # fmt: skip


def sse_app(chunks: list[bytes], *, raise_after: int | None = None) -> App:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})  # fmt: skip
        for index, chunk in enumerate(chunks):
            if raise_after is not None and index == raise_after:
                raise RuntimeError("worker exploded")
            await send({"type": "http.response.body", "body": chunk,
                        "more_body": index < len(chunks) - 1})  # fmt: skip

    return app


async def drive(
    middleware: CaptureMiddleware, path: str, on_send: Callable[[Message], None]
) -> None:
    sent_request = False

    async def receive() -> Message:
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": REQUEST, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        on_send(message)

    await middleware(scope_for(path), receive, send)


def make(app: App, store: CaptureStore | None) -> CaptureMiddleware:
    return CaptureMiddleware(app, store=store, model_server_name="policy_model",
                             counters=CaptureCounters())  # fmt: skip


def lines(store: CaptureStore, rollout_id: str = "0-0") -> int:
    path = store.path_for(rollout_id)
    return path.read_bytes().count(b"\n") if path.exists() else 0


def split_events(body: bytes) -> list[bytes]:
    return [part + b"\n\n" for part in body.split(b"\n\n") if part]


def test_the_terminal_event_is_held_until_the_line_is_on_disk(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    events = split_events(messages_stream(Answer()))
    # three body messages; the second carries message_stop, the third is trailing bytes
    stop = next(i for i, e in enumerate(events) if e.startswith(b"event: message_stop"))
    chunks = [b"".join(events[:stop]), events[stop], b": trailing comment\n\n"]
    seen: list[tuple[str, int]] = []
    middleware = make(sse_app(chunks), store)
    asyncio.run(drive(middleware, "/ng-rollout/0-0/v1/messages",
                      lambda m: seen.append((m["type"], lines(store)))))  # fmt: skip
    assert seen == [
        ("http.response.start", 0),
        ("http.response.body", 0),  # content before the terminal event flows at once
        ("http.response.body", 1),  # the terminal event only after the line is durable
        ("http.response.body", 1),
    ]
    (record,) = store.read_records("0-0").records
    assert record.error_category is None
    assert record.finish_reason == "end_turn"
    assert record.response_raw == b"".join(chunks).decode()
    assert record.latency_ttft_ms is not None
    assert record.latency_total_ms is not None
    assert record.latency_ttft_ms <= record.latency_total_ms


def test_the_client_receives_exactly_the_apps_messages(tmp_path: Path) -> None:
    chunks = split_events(messages_stream(Answer(reasoning="hm")))
    for store in (CaptureStore(tmp_path), None):
        sent: list[Message] = []
        asyncio.run(drive(make(sse_app(chunks), store), "/ng-rollout/0-0/v1/messages",
                          sent.append))  # fmt: skip
        assert [m.get("body") for m in sent[1:]] == chunks
        assert sent[0]["headers"] == [(b"content-type", b"text/event-stream; charset=utf-8")]


def test_an_exception_after_partial_stream_is_recorded_then_reraised(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    chunks = split_events(messages_stream(Answer()))
    sent: list[Message] = []
    with pytest.raises(RuntimeError, match="exploded"):
        asyncio.run(drive(make(sse_app(chunks, raise_after=3), store),
                          "/ng-rollout/0-0/v1/messages", sent.append))  # fmt: skip
    (record,) = store.read_records("0-0").records
    assert record.status_code == 200
    assert record.error_category == "exception"
    # what was seen is kept: the partial reassembly (the message had started) and the raw bytes
    assert record.response is not None and record.response["type"] == "message"
    assert record.response_id == "resp_123"
    assert record.response_raw == b"".join(chunks[:3]).decode()


def test_cancellation_still_lands_the_line(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    release = asyncio.Event

    async def scenario() -> None:
        started = asyncio.Event()
        hold = release()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
            await send({"type": "http.response.body", "body": b"event: ping\ndata: {}\n\n",
                        "more_body": True})  # fmt: skip
            started.set()
            await hold.wait()

        middleware = make(app, store)
        task = asyncio.create_task(drive(middleware, "/ng-rollout/0-0/v1/messages", lambda m: None))
        await asyncio.wait_for(started.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await middleware.drain(30) == 0  # one fsync; generous for a busy disk

    asyncio.run(scenario())
    (record,) = store.read_records("0-0").records
    assert record.error_category == "exception"
    assert record.response_raw == "event: ping\ndata: {}\n\n"


def test_capture_failure_never_fails_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)

    def broken(*args: object, **kwargs: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "append_encoded", broken)  # what the server appends with
    chunks = split_events(messages_stream(Answer()))
    middleware = make(sse_app(chunks), store)
    sent: list[Message] = []
    asyncio.run(drive(middleware, "/ng-rollout/0-0/v1/messages", sent.append))
    assert [m.get("body") for m in sent[1:]] == chunks
    assert store.is_incomplete("0-0")
    assert middleware.counters.capture_failures == 1
    assert middleware.counters.calls_captured == 0
    assert pending_writes(store.root, "0-0") == []


def held_appends(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Make ``store``'s appends wait: the first event is set when one starts, and it goes on
    once the second is set."""
    original = store.append_encoded
    entered, release = threading.Event(), threading.Event()

    def slow(name: str, payload: bytes) -> Any:
        entered.set()
        assert release.wait(30)
        return original(name, payload)

    monkeypatch.setattr(store, "append_encoded", slow)
    return entered, release


def test_a_write_in_flight_is_visible_to_other_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    entered, release = held_appends(store, monkeypatch)
    middleware = make(sse_app(split_events(messages_stream(Answer()))), store)

    async def scenario() -> list[str]:
        task = asyncio.create_task(drive(middleware, "/ng-rollout/0-0/v1/messages", lambda m: None))
        assert await asyncio.to_thread(entered.wait, 30)
        seen = pending_writes(store.root, "0-0")
        assert middleware.counters.writes_outstanding == 1
        release.set()
        await task
        return seen

    seen = asyncio.run(scenario())
    assert len(seen) == 1
    assert len(seen[0]) == 32
    assert pending_writes(store.root, "0-0") == []
    assert middleware.counters.writes_outstanding == 0
    assert store.read_records("0-0").records[0].model_call_id == seen[0]


@pytest.mark.parametrize(
    ("path", "captured", "invalid"),
    [
        ("/v1/messages", False, False),
        ("/ng-rollout/0-0/v1/models", False, False),
        ("/ng-rollout/..%2F/v1/messages", False, True),
        ("/ng-rollout/.hidden/v1/messages", False, True),
        ("/ng-rollout/0-0/v1/messages", True, False),
    ],
)
def test_what_is_captured(tmp_path: Path, path: str, captured: bool, invalid: bool) -> None:
    store = CaptureStore(tmp_path / "store", create=True)
    seen_paths: list[str] = []
    inner = sse_app(split_events(messages_stream(Answer())))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen_paths.append(scope["path"])
        await inner(scope, receive, send)

    sent: list[Message] = []
    middleware = make(app, store)
    asyncio.run(drive(middleware, path, sent.append))
    assert seen_paths[0] in ("/v1/messages", "/v1/models")
    assert (lines(store) == 1) is captured
    assert middleware.counters.invalid_rollout_ids == int(invalid)
    warned = any(name == WARNING_HEADER for name, _ in sent[0]["headers"])
    assert warned is invalid
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == (
        ["0-0.capture.jsonl"] if captured else []
    )


@pytest.mark.parametrize(("depth", "as_object"), [(300, True), (1022, False), (1023, False)])
def test_bodies_too_deep_to_encode_are_kept_raw(
    tmp_path: Path, depth: int, as_object: bool
) -> None:
    """A compact body deeper than the encoder goes is embedded as sent; one at the decoder's
    limit (which would make the line unreadable one level down) is kept raw."""
    store = CaptureStore(tmp_path)
    deep = b'{"model":"m","x":' + b"[" * depth + b"]" * depth + b"}"

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": deep})

    async def scenario() -> None:
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": deep, "more_body": False}

        async def send(message: Message) -> None:
            pass

        await make(app, store)(scope_for("/ng-rollout/0-0/v1/chat/completions"), receive, send)

    asyncio.run(scenario())
    (record,) = store.read_records("0-0").records
    if as_object:
        assert record.request == record.response == orjson.loads(deep)
        assert record.request_raw is None and record.response_raw is None
    else:
        assert record.request is None and record.response is None
        assert record.request_raw == deep.decode()
        assert record.response_raw == deep.decode()
    assert not store.is_incomplete("0-0")


def test_the_last_json_bytes_wait_for_the_line_too(tmp_path: Path) -> None:
    """With a content-length the client is done at the last byte, not at the empty final
    message, so the last non-empty chunk is held as well."""
    store = CaptureStore(tmp_path)
    body = orjson.dumps({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:], "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    seen: list[tuple[bytes, int]] = []
    asyncio.run(drive(make(app, store), "/ng-rollout/0-0/v1/chat/completions",
                      lambda m: seen.append((m.get("body", b"start"), lines(store)))))  # fmt: skip
    assert seen == [(b"start", 0), (body[:10], 0), (body[10:], 1), (b"", 1)]
    (record,) = store.read_records("0-0").records
    assert record.tokens_in == 3


def test_a_lost_call_keeps_its_mark_when_nothing_else_can_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line, the failure log and the incomplete marker all fail (a dead disk): the call's
    pending mark is the only evidence left, so it stays (and reads as lost once the server is
    gone). When the failure log works, the mark goes."""
    from capture_core.pending import pending_calls
    from capture_core.writers import CaptureWriter

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    for log_works in (False, True):
        root = tmp_path / f"log-{log_works}"
        store = CaptureStore(root, create=True)
        writer = CaptureWriter(root)
        monkeypatch.setattr(store, "append_encoded", broken)
        monkeypatch.setattr(store, "mark_incomplete", broken)
        if not log_works:
            monkeypatch.setattr(writer, "record_failure", broken)
        middleware = CaptureMiddleware(sse_app(split_events(messages_stream(Answer()))),
                                       store=store, model_server_name="p",
                                       counters=CaptureCounters(), writer=writer)  # fmt: skip
        sent: list[Message] = []
        asyncio.run(drive(middleware, "/ng-rollout/0-0/v1/messages", sent.append))
        assert middleware.counters.capture_failures == 1
        left = [p.model_call_id for p in pending_calls(root, "0-0")]
        assert len(left) == (0 if log_works else 1)
        writer.close()


def test_a_line_the_appender_cannot_write_is_recorded_per_call(tmp_path: Path) -> None:
    """The server's own path: the line goes to a real appender process, which answers with
    the OS's reason (here the rollout's file is a directory); the call is still served, and
    its failure is in the failure log, counted, and the rollout marked incomplete."""
    from capture_core.appender import Appender
    from capture_core.failures import read_capture_failures
    from capture_core.writers import CaptureWriter

    store = CaptureStore(tmp_path, create=True)
    store.path_for("0-0").mkdir()
    writer = CaptureWriter(tmp_path, journal=False)
    chunks = split_events(messages_stream(Answer()))

    async def scenario() -> list[Message]:
        appender = Appender(tmp_path, writer.token)
        middleware = CaptureMiddleware(sse_app(chunks), store=store, model_server_name="p",
                                       counters=CaptureCounters(), writer=writer,
                                       appender=appender)  # fmt: skip
        sent: list[Message] = []
        try:
            await drive(middleware, "/ng-rollout/0-0/v1/messages", sent.append)
            assert await middleware.drain(30) == 0
        finally:
            await appender.aclose()
        assert middleware.counters.capture_failures == 1
        assert middleware.counters.calls_captured == 0
        return sent

    try:
        sent = asyncio.run(scenario())
    finally:
        writer.close()
    assert [m.get("body") for m in sent[1:]] == chunks  # served whole
    (failure,) = read_capture_failures(tmp_path).failures
    assert failure.rollout_id == "0-0" and "EISDIR" in failure.reason, failure.reason
    assert store.is_incomplete("0-0")
    assert pending_writes(store.root, "0-0") == []


def test_a_one_chunk_answers_status_line_goes_out_while_its_line_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status line of a non-streamed answer whose body came in one piece goes to the
    client while its line is written, not held until the line is durable (which made the
    client's wake-ups come back to back at the end); the body waits for the line."""
    store = CaptureStore(tmp_path)
    entered, release = held_appends(store, monkeypatch)
    body = orjson.dumps({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    seen: list[tuple[str, int]] = []

    async def scenario() -> None:
        task = asyncio.create_task(drive(make(app, store), "/ng-rollout/0-0/v1/chat/completions",
                                         lambda m: seen.append((m["type"], lines(store)))))  # fmt: skip
        assert await asyncio.to_thread(entered.wait, 30)
        assert seen == [("http.response.start", 0)]  # while the line is being written
        release.set()
        await task

    asyncio.run(scenario())
    assert seen == [("http.response.start", 0), ("http.response.body", 1)]
