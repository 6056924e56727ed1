"""Sinks and sources the settings and delivery tests load by ``module:Class`` or pass in."""

from __future__ import annotations

from typing import Any

from capture_core.tokens import TokenCaptureSnapshot, TokenEntry


class RecordingSink:
    """A TokenSink that keeps what it is given."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.entries: list[TokenEntry] = []
        self.marks: list[tuple[str, str]] = []
        self.closed = False

    async def put(self, entry: TokenEntry) -> None:
        self.entries.append(entry)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        self.marks.append((rollout_id, model_call_id))

    async def close(self) -> None:
        self.closed = True


class StrictKwargsSink(RecordingSink):
    def __init__(self, *, endpoint: str) -> None:
        super().__init__(endpoint=endpoint)


class NoMarkSink:
    async def put(self, entry: TokenEntry) -> None:
        return None

    async def close(self) -> None:
        return None


class NonCallablePutSink(RecordingSink):
    put = None  # type: ignore[assignment]


class SyncPutSink(RecordingSink):
    def put(self, entry: TokenEntry) -> None:  # type: ignore[override]
        self.entries.append(entry)


class ExplodingSink(RecordingSink):
    def __init__(self) -> None:
        raise OSError("cannot reach the staging service")


class FakeSource:
    """A TokenSource over fixed snapshots; records drops; can be told to fail."""

    def __init__(self, snapshots: dict[str, TokenCaptureSnapshot], *, fail: bool = False) -> None:
        self.snapshots = snapshots
        self.fail = fail
        self.freezes: list[str] = []
        self.drops: list[tuple[str, str, int]] = []
        self.closed = False
        self.freeze_threads: list[int] = []

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        import threading

        self.freezes.append(rollout_id)
        self.freeze_threads.append(threading.get_ident())
        if self.fail:
            raise ConnectionError("token source unreachable")
        return self.snapshots[rollout_id]

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        self.drops.append((rollout_id, snapshot_id, version))
        return True

    async def close(self) -> None:
        self.closed = True
