"""One training call's state (admission to first byte) and the worker's collected answer."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from capture_core.server.namespaced_tools import NamespaceMap
from capture_core.staging import CaptureAdmission
from capture_core.tokens import TokenCallCapture


@dataclass
class _Call:
    """One training call's state between admission and the first byte."""

    rollout_id: str
    dialect: str
    body: dict[str, Any]
    model_call_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    admitted_at: float = field(default_factory=time.time)
    admission: CaptureAdmission | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    namespaces: NamespaceMap = field(default_factory=dict)
    """Joined ``<ns>__<name>`` tool names the worker saw -> (namespace, short name)."""
    tokens: TokenCallCapture | None = None
    """The call's token-id capture (``None``: token-id capture is off)."""

    @property
    def client_stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True


@dataclass
class _Upstream:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)
