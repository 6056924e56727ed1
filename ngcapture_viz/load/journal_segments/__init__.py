"""Columnar segments of a facts journal: its entries decoded once and kept as Parquet.

A cold open decodes every entry of a directory's facts journals (``_journal``): for a store
of 250 MB that is about half of the open. A segment holds the entries of one stretch of a
journal (bytes ``start`` to ``end``, whole lines; lines ``first_line`` to ``end_line``) as
columns, decoded by the very decoder the reader uses (``JournalLine``), so a reader that finds
a chain of segments from the journal's first byte reads their columns instead of decoding
those lines, and decodes only the lines after the chain's end. Entries that do not decode
are not in a segment, as the reader would skip them; nothing else is left out.

A segment is a cache of a cache: the entries it gives are checked against the capture files
exactly like decoded ones (``_journal``'s chain of sizes, mtimes and inodes), and a segment is
used only when its name matches the journal as it is now (``chain``)::

    <journal stem>.s<format>.<journal inode>.<start>-<end>.<first line>-<end line>.<tail>.parquet

Segments are written by ``write_segments`` (``ngcapture compact``): a capture server runs that
in a separate process each time its journal has grown by ``journal_segment_bytes`` and when it
stops (``capture_core.facts_journal``), so the server never imports Polars and a segment is
built off the calls' path.

- ``schema``: the format number and the columns (**bump SEGMENT_FORMAT whenever
  ``JournalLine`` — its fields, their types or constraints — or the columns change**: a test
  pins them);
- ``chain``: segment names, and the chain a journal's segments make;
- ``read``: their columns for a scan, and rows from them (``facts_frames``, as decoded ones);
- ``write``: decoding a journal's stretches into segments.
"""

from ngcapture_viz.load.journal_segments.chain import Segment, segment_chain, tail_hash
from ngcapture_viz.load.journal_segments.read import (
    SegmentTools,
    complete,
    read_entries,
    read_where,
    segment_frames,
)
from ngcapture_viz.load.journal_segments.schema import (
    NEVER_NULL,
    SEGMENT_FORMAT,
    SEGMENT_SCHEMA,
    SEGMENT_SUFFIX,
    TAIL_BYTES,
    WHERE_COLUMNS,
)
from ngcapture_viz.load.journal_segments.write import entry_frame, journal_files, write_segments

__all__ = [
    "NEVER_NULL",
    "SEGMENT_FORMAT",
    "SEGMENT_SCHEMA",
    "SEGMENT_SUFFIX",
    "TAIL_BYTES",
    "WHERE_COLUMNS",
    "Segment",
    "SegmentTools",
    "complete",
    "entry_frame",
    "journal_files",
    "read_entries",
    "read_where",
    "segment_chain",
    "segment_frames",
    "tail_hash",
    "write_segments",
]
