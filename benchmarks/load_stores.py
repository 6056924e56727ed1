"""The load benchmark's stores: written once under ``results/bench/load/`` and reused.

``build_store`` writes a store of about a given size from a fixed base set of lines (fresh call
ids, with or without the ``ngcapture_facts`` and facts journal our server writes);
``_append_one_percent`` and ``_restore`` grow a store by 1 % of its calls for the incremental
open and cut it back to the store its journal describes. ``benchmarks.ray_index`` shares them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import orjson

from capture_core._appending import Appended
from capture_core.facts import FACTS_KEY, call_facts
from capture_core.facts_journal import (
    ENVELOPE_KEYS,
    JOURNAL_DIR,
    JOURNAL_SUFFIX,
    FactsJournalEntry,
    journal_entry,
)
from capture_core.testing import CaptureLineFactory

ROOT = Path("results/bench/load")
STAMP = "complete.json"
BASE_LINES = 12_000


def _base_lines() -> list[dict[str, Any]]:
    """The base set every store is made of (generated once, cached)."""
    path = ROOT / "base-lines.jsonl"
    if not path.is_file():
        ROOT.mkdir(parents=True, exist_ok=True)
        factory = CaptureLineFactory(seed=1)
        data = b"".join(line.to_jsonl() for line in factory.lines(BASE_LINES))
        path.with_suffix(".tmp").write_bytes(data)
        path.with_suffix(".tmp").replace(path)
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def build_store(
    path: Path, target_bytes: int, *, facts: bool = True, seed: int = 1
) -> dict[str, Any]:
    """Write a store of about ``target_bytes`` (reused when complete).

    Lines are the base lines in turn, each with a fresh ``model_call_id``; with ``facts``, each
    carries the ``ngcapture_facts`` the capture server computes for it.
    """
    stamp = path / STAMP
    if stamp.is_file():
        found = dict(json.loads(stamp.read_text()))
        # Stores of before the journal, or whose journal is of an older shape (a reader would
        # ignore it and read every line), are written again.
        if found.get("journal") == facts and (not facts or _journal_current(path)):
            return found
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    encoded = []
    envelopes = []
    for line in _base_lines():
        if facts:
            line[FACTS_KEY] = call_facts(line["dialect"], line["request"], line["response"])
        line["model_call_id"] = "0" * 32
        encoded.append(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
        keys: tuple[str, ...] = (*ENVELOPE_KEYS, FACTS_KEY)
        envelopes.append({key: line[key] for key in keys if key in line})
    prefix = len(b'{"model_call_id":"')
    rng = random.Random(seed)
    total = calls = rollouts = 0
    journal = _Journal(path) if facts else None
    while total < target_bytes:
        count = rng.randint(1, 9)
        parts = []
        ids = []
        for _ in range(count):
            base = encoded[calls % len(encoded)]
            call_id = f"{seed:08x}{calls:024x}".encode()
            parts.append(base[:prefix] + call_id + base[prefix + 32 :])
            ids.append((calls % len(encoded), call_id.decode()))
            calls += 1
        data = b"".join(parts)
        file = path / f"{rollouts // 8}-{rollouts % 8}.capture.jsonl"
        file.write_bytes(data)
        if journal is not None:
            journal.note(file, [len(part) for part in parts], [
                {**envelopes[base], "model_call_id": call_id} for base, call_id in ids
            ])  # fmt: skip
        total += len(data)
        rollouts += 1
    if journal is not None:
        journal.close()
    info = {"bytes": total, "calls": calls, "rollouts": rollouts, "facts": facts,
            "journal": facts}  # fmt: skip
    stamp.write_text(json.dumps(info))
    return info


def _journal_current(store: Path) -> bool:
    """Whether the store's journal begins with an entry of the shape the server writes now."""
    try:
        with (store / JOURNAL_DIR / f"benchmark{JOURNAL_SUFFIX}").open("rb") as handle:
            FactsJournalEntry.model_validate_json(handle.readline())
    except (OSError, ValueError):
        return False
    return True


class _Journal:
    """The facts journal the capture server would have written beside a store's files (the
    server's own ``journal_entry``; every entry of a file notes the file as its last append
    left it, which is all a reader compares)."""

    def __init__(self, store: Path) -> None:
        (store / JOURNAL_DIR).mkdir(exist_ok=True)
        self.path = store / JOURNAL_DIR / f"benchmark{JOURNAL_SUFFIX}"
        self.handle = self.path.open("ab")

    def note(
        self,
        file: Path,
        lengths: list[int],
        lines: list[dict[str, Any]],
        before: tuple[int, int] = (0, 0),
    ) -> None:
        """Entries for ``lines`` (of ``lengths`` bytes with their newline) just written at the
        end of ``file``, which was ``before`` (size, mtime) until then. Lines written at once
        share the file's final mtime, as if appended within one clock tick."""
        stat = file.stat()
        offset = stat.st_size - sum(lengths)
        mtime_before = before[1] if offset else stat.st_mtime_ns
        for length, line in zip(lengths, lines, strict=True):
            at = Appended(length, False, offset, offset + length, stat.st_mtime_ns, stat.st_ino,
                          length - 1, offset, mtime_before)  # fmt: skip
            entry = journal_entry(file.name, at, line)
            if entry is not None:
                self.handle.write(entry)
            offset += length
            mtime_before = stat.st_mtime_ns

    def close(self) -> None:
        self.handle.close()


def _append_one_percent(
    store: Path, info: dict[str, Any], seed: int
) -> tuple[int, dict[Path, tuple[int, int]]]:
    """Append 1% more calls to random rollouts (lines as the rest of the store: with facts
    when it has them); returns the bytes added and the files' sizes and mtimes before."""
    rng = random.Random(seed)
    factory = CaptureLineFactory(seed=10_000 + seed)
    files = sorted(store.glob("*.capture.jsonl"))
    original: dict[Path, tuple[int, int]] = {}
    added = 0
    journal = _Journal(store) if info.get("journal") else None
    if journal is not None:  # cut back with the files, so the store stays as it was built
        original[journal.path] = _size_mtime(journal.path)
    for _ in range(max(1, info["calls"] // 100)):
        path = rng.choice(files)
        original.setdefault(path, _size_mtime(path))
        line = factory.line().to_json_dict()
        if info.get("facts", True):
            line[FACTS_KEY] = call_facts(line["dialect"], line["request"], line["response"])
        data = orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
        before = _size_mtime(path)
        with path.open("ab") as handle:
            handle.write(data)
        if journal is not None:
            journal.note(path, [len(data)], [line], before)
        added += len(data)
    if journal is not None:
        journal.close()
    return added, original


def _size_mtime(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _restore(original: dict[Path, tuple[int, int]]) -> None:
    """Cut the files back and give them their mtimes again: the store is then the one its
    facts journal describes (a file whose mtime moved would be read from its lines)."""
    for path, (size, mtime_ns) in original.items():
        os.truncate(path, size)
        os.utime(path, ns=(mtime_ns, mtime_ns))
