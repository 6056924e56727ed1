"""The facts journal: where each captured line landed, with the facts a reader needs of it.

A capture server appends one entry per captured call to ``.facts/<writer token>.jsonl`` in the
capture directory, right after the call's line is durable: the file, the line's offset and
length, the file's size and mtime as the append found it and its size, mtime and inode as the
append left it, the line's envelope fields (``model_call_id``, ``dialect``, timestamps,
latencies, status, error category, model ref) and its ``ngcapture_facts``. A reader that finds
a capture file exactly as the journal's last entry for it left it (same size, mtime and inode;
every byte covered by the entries, line after line, each append finding the file as the one
before left it) builds that file's rows from the journal and never reads the capture file;
any other file (written by another writer, appended to since, damaged, torn) is read from its
own lines as before. The journal is a cache, not evidence: it is not fsynced, a crash can lose
its last entries (their files are then read the slow way), and deleting it loses nothing.

Only lines a reader would read from their facts get an entry: lines carrying facts of the
current :data:`~capture_core.facts.FACTS_VERSION`. Entries are written whole, one ``write``
each (or one per batch of lines made durable together) on a descriptor opened at start-up
(``O_APPEND``: entries of concurrent writers never interleave); the capture server's appender
process (:mod:`capture_core.appender`) writes them for the lines it appends.

The file itself, and the compaction of a journal into columnar segments, are
:mod:`capture_core.journal_file`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field

from capture_core._appending import Appended
from capture_core.facts import FACTS_KEY, FACTS_VERSION
from capture_core.journal_file import (
    CLOSE_SEGMENT_BYTES,
    JOURNAL_DIR,
    JOURNAL_SUFFIX,
    SEGMENT_BYTES,
    JournalFile,
    join_entry,
)
from capture_core.records import ModelRef

__all__ = [
    "CLOSE_SEGMENT_BYTES",
    "ENVELOPE_KEYS",
    "JOURNAL_DIR",
    "JOURNAL_SUFFIX",
    "SEGMENT_BYTES",
    "FactsJournal",
    "FactsJournalEntry",
    "journal_entry",
    "journal_fields",
]

#: The capture line's fields an entry repeats (besides its facts).
ENVELOPE_KEYS: Final = (
    "model_call_id",
    "dialect",
    "model_ref",
    "started_at",
    "completed_at",
    "latency_ms",
    "latency_ttft_ms",
    "status_code",
    "error_category",
)


class FactsJournalEntry(BaseModel):
    """One line of a facts journal (the server writes it with ``orjson``; this model is its
    documented shape, and what tests validate entries against)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    file: str = Field(description="The capture file's name, in the same directory.")
    offset: int = Field(ge=0, description="Byte offset of the line in the file.")
    length: int = Field(ge=0, description="The line's length in bytes, without its newline.")
    size: int = Field(ge=0, description="The file's size right after this append.")
    mtime_ns: int = Field(description="The file's mtime (ns) right after this append.")
    inode: int = Field(ge=0, description="The file's inode.")
    size_before: int = Field(ge=0, description="The file's size when this append took its lock.")
    mtime_before_ns: int = Field(description="The file's mtime (ns) at that moment.")
    model_call_id: str
    dialect: str
    model_ref: ModelRef | None = None
    started_at: float | None = None
    completed_at: float | None = None
    latency_ms: float | None = None
    latency_ttft_ms: float | None = None
    status_code: int | None = None
    error_category: str | None = None
    ngcapture_facts: dict[str, Any] = Field(description="The line's facts, as in the line.")


def journal_fields(line: Mapping[str, Any]) -> bytes | None:
    """What an entry repeats of ``line`` (a capture line as a mapping): its envelope fields and
    facts, as a JSON object; ``None`` when the line carries no facts of the current version (a
    reader reads such a line from its bodies, so the journal has nothing to save it).

    Raises:
        TypeError: a field cannot be encoded.
    """
    facts = line.get(FACTS_KEY)
    if not isinstance(facts, Mapping) or facts.get("v") != FACTS_VERSION:
        return None
    fields = {key: line[key] for key in ENVELOPE_KEYS if key in line}
    fields[FACTS_KEY] = facts
    return orjson.dumps(fields, default=str)


def journal_entry(file_name: str, appended: Appended, line: Mapping[str, Any]) -> bytes | None:
    """The journal line for ``line`` (a capture line as a mapping) just appended to
    ``file_name``; ``None`` when the line carries no facts of the current version, or when
    another writer's bytes came between."""
    fields = journal_fields(line)
    return None if fields is None else join_entry(file_name, appended, fields)


class FactsJournal(JournalFile):
    """A writer's journal, noting each line its threads append (see :class:`JournalFile`)."""

    def note(self, rollout_file: str, appended: Appended, line: Mapping[str, Any]) -> None:
        """Journal ``line``, just appended to ``rollout_file`` (a name in the directory)."""
        if self._fd is None:
            return
        try:
            entry = journal_entry(rollout_file, appended, line)
        except (TypeError, ValueError) as exc:
            self._failed(str(exc))
            return
        if entry is not None:
            self.write(entry)
