"""What a live export has logged: the JSON state file, where it lives and how it is written."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from ngcapture_viz.exceptions import ExportError
from ngcapture_viz.load.index import default_cache_dir

__all__ = ["STATE_DIR_NAME"]

#: Folder of the state files beside the store (skipped by the store's listing: it starts with .).
STATE_DIR_NAME: Final = ".ngcapture-watch"
_FORMAT: Final = 1


@dataclass
class _State:
    """What has been logged (the JSON state file)."""

    run_id: str | None = None
    batches: int = 0
    step: int | None = None
    calls_logged: int = 0
    rollouts_logged: int = 0
    #: capture file name -> [model_call_id of its first call, next call_index to log]
    files: dict[str, list[Any]] = field(default_factory=dict)
    #: "rollouts" / "failures" -> {"inode", "head", "next_line"}
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: a batch handed to W&B whose commit was not written yet: {"batch": n, "state": {...}}
    pending: dict[str, Any] | None = None

    def committed(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "batches": self.batches,
            "step": self.step,
            "calls_logged": self.calls_logged,
            "rollouts_logged": self.rollouts_logged,
            "files": self.files,
            "records": self.records,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"format": _FORMAT, **self.committed(), "pending": self.pending},
            option=orjson.OPT_INDENT_2,
        )

    @classmethod
    def from_json(cls, data: bytes, path: Path) -> _State:
        try:
            raw = orjson.loads(data)
            if raw.get("format") != _FORMAT:
                raise ExportError(f"watch state {path} has format {raw.get('format')!r}")
            return cls(
                **{k: raw[k] for k in cls().committed()},
                pending=raw.get("pending"),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ExportError(
                f"watch state {path} is unreadable ({exc}); delete it to log everything again"
            ) from None


def _state_place(capture_dir: Path, key: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key)[:100] or "default"
    beside = capture_dir / STATE_DIR_NAME / f"{slug}.json"
    if os.access(capture_dir, os.W_OK):
        return beside
    digest = hashlib.sha256(f"{capture_dir}\0{slug}".encode()).hexdigest()[:20]
    return default_cache_dir().parent / "watch" / f"{digest}.json"


def _read_state(path: Path) -> _State:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _State()
    except OSError as exc:
        raise ExportError(f"watch state {path}: {exc.strerror}") from None
    return _State.from_json(data, path)


def _write_state(path: Path, state: _State) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    with open(temporary, "wb") as out:
        out.write(state.to_json())
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
