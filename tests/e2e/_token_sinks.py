"""Token sinks the capture server loads by ``module:Class`` in the e2e tests (its own process).

What they see is written to files, so the test process can read it.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from capture_core.tokens import TokenEntry


class RefusingSink:
    """Refuses every entry; records each incomplete mark as a JSON line in ``marks``."""

    def __init__(self, *, marks: str) -> None:
        self.marks = Path(marks)

    async def put(self, entry: TokenEntry) -> None:
        raise OSError("the staging service is unavailable")

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        with self.marks.open("ab") as out:
            out.write(orjson.dumps([rollout_id, model_call_id]) + b"\n")

    async def close(self) -> None:
        return None
