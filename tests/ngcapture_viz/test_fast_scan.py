"""The fast scan (typed decoders, stored facts) against today's reader (issue 19).

The oracle is ``_reference_scan``: the scan as it was, every line parsed whole and normalized by
``capture_core``. Lines without facts (other writers, older stores) must give identical rows
and damage reports; lines with facts give the writer's facts, which ``verify`` checks against
the bodies.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import ngcapture_viz as ngv
from capture_core.facts import FACTS_KEY, FACTS_VERSION, call_facts
from capture_core.store import ARCHIVE_PREFIX
from capture_core.testing import CaptureLineFactory
from ngcapture_viz.frames.calls import _rate
from ngcapture_viz.load import _scan
from ngcapture_viz.load._facts_rows import _rates, tool_places
from ngcapture_viz.load._index_files import MAX_DELTAS
from ngcapture_viz.load._line_types import micros, micros_series
from tests.ngcapture_viz import _reference_scan as reference


def _with_facts(line: dict[str, Any]) -> dict[str, Any]:
    return {**line, FACTS_KEY: call_facts(line["dialect"], line["request"], line["response"])}


def _lines(seed: int, n: int, *, facts: bool) -> list[bytes]:
    out = []
    for line in CaptureLineFactory(seed=seed, error_rate=0.2, truncation_rate=0.2).lines(n):
        data = line.to_json_dict()
        out.append(orjson.dumps(_with_facts(data) if facts else data))
    return out


#: Hand-made lines at the corners the typed decoders must leave to the exact reader.
SPECIAL = [
    b'{"model_call_id":"a","dialect":"chat","status_code":200.0}',  # a float status
    b'{"model_call_id":"a","dialect":"chat","status_code":true}',
    b'{"model_call_id":"a","dialect":"chat","status_code":123456789012345678901234567890}',
    b'{"model_call_id":"a","dialect":"chat","started_at":-5.5,"completed_at":1e300}',
    b'{"model_call_id":"a","dialect":"chat","started_at":"1786032154"}',
    b'{"model_call_id":"a","dialect":"chat","latency_ms":1e999}',
    b'{"model_call_id":"a","dialect":"chat","request":5}',
    b'{"model_call_id":"a","dialect":"chat","request":[],"response":{}}',
    b'{"model_call_id":"a","dialect":"chat","response":"text"}',
    b'{"model_call_id":"a","dialect":"chat","response_raw":5}',
    b'{"model_call_id":"a","dialect":"chat","model_ref":{"type":"x"}}',
    b'{"model_call_id":"a","dialect":"chat","model_ref":{"name":"n","extra":[1]}}',
    b'{"model_call_id":5,"dialect":"chat"}',
    b'{"dialect":"chat"}',
    b'{"model_call_id":"a","model_call_id":"b","dialect":"chat"}',
    b'{"model_call_id":"a","dialect":"chat","request":{"stream":true,"stream":false,"model":""}}',
    b'{"model_call_id":"a","dialect":"chat","request":{"model":"m\\u00e9","stream":1}}',
    b'{"model_call_id":"a","dialect":"chat","x":"\xff\xfe"}',  # not UTF-8
    b'{"model_call_id":"a","dialect":"chat","x":"\xed\xa0\x80"}',  # an encoded surrogate
    b'{"model_call_id":"a","dialect":"chat","x":"\\ud800"}',  # a lone surrogate escape
    b'{"model_call_id":"a","dialect":"chat","x":' + b"[" * 600 + b"]" * 600 + b"}",
    b'{"model_call_id":"a","dialect":"chat","x":' + b"[" * 1100 + b"]" * 1100 + b"}",
    b'{"model_call_id":"a","dialect":"chat","ngcapture_facts":{"v":1,"tokens_in":"3"}}',
    b'{"model_call_id":"a","dialect":"chat","ngcapture_facts":{"v":99,"tokens_in":3}}',
    b'{"model_call_id":"a","dialect":"chat","ngcapture_facts":[1]}',
    b'{"model_call_id":"a","dialect":"chat","ngcapture_facts":{"v":1,"tokens_in":-1}}',
    b'{"model_call_id":"a","dialect":"chat","ngcapture_facts":{"v":1,"future_key":[{}]}}',
    b'{"model_call_id":"a","dialect":"chat","response":{"choices":[{"message":{"tool_calls":'
    b'[{"id":"t","function":{"name":"f","arguments":"{bad"}}]}}]}}',
    b"[1, 2]",
    b'"a string"',
    b"null",
    b"{not json",
    b"   ",
    b"\t\r",
    b'{"model_call_id":"a","dialect":"chat"} trailing',
]


def _write(root: Path, files: dict[str, list[bytes]], *, torn: bool = False) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        data = b"\n".join(lines) + (b"" if torn else b"\n")
        (root / f"{name}.capture.jsonl").write_bytes(data)


def _tasks(module: Any, root: Path) -> list[Any]:
    names = sorted(n for n in os.listdir(root) if n.endswith(".capture.jsonl"))
    return [module.FileTask(str(root / n), n, n.removesuffix(".capture.jsonl")) for n in names]


def _sorted(damaged: pl.DataFrame) -> pl.DataFrame:
    """Damage rows in line order (today's reader lists the lines that are not JSON last; the
    index sorts them anyway)."""
    return damaged.sort("path", "call_index", "code")


def _assert_same(root: Path, *, verify: bool = False) -> _scan.ScanResult:
    """The fast scan gives today's rows; returns it."""
    old = reference.scan_files(_tasks(reference, root))
    old.damaged = _sorted(old.damaged)
    new = _scan.scan_files(_tasks(_scan, root), verify=verify)
    new.damaged = _sorted(new.damaged)
    # Lines read from their facts come in chunks of their own: the index sorts the rows.
    new.calls = new.calls.sort("path", "call_index")
    new.tool_calls = new.tool_calls.sort("rollout_id", "call_index", "tool_index")
    assert_frame_equal(new.calls, old.calls, check_exact=True)
    assert_frame_equal(new.tool_calls, old.tool_calls, check_exact=True)
    if verify:  # verify adds a gap per line whose facts differ; the rest is the same
        differ = pl.col("code") == "capture_facts_differ"
        assert_frame_equal(new.damaged.filter(~differ), old.damaged, check_exact=True)
    else:
        assert_frame_equal(new.damaged, old.damaged, check_exact=True)
    assert [dataclasses.astuple(s) for s in new.states] == [
        dataclasses.astuple(s) for s in old.states
    ]
    return new


def test_lines_without_facts_give_todays_rows(tmp_path: Path) -> None:
    lines = _lines(1, 300, facts=False)
    _write(tmp_path, {f"{n}-0": lines[n * 10 : n * 10 + 10] for n in range(30)})
    result = _assert_same(tmp_path)
    assert result.decoded == {"facts": 0, "bodies": 300, "exact": 0}


def test_lines_with_facts_give_todays_rows_without_reading_the_bodies(tmp_path: Path) -> None:
    lines = _lines(2, 300, facts=True)
    _write(tmp_path, {f"{n}-0": lines[n * 10 : n * 10 + 10] for n in range(30)})
    result = _assert_same(tmp_path)
    assert result.decoded == {"facts": 300, "bodies": 0, "exact": 0}
    assert _assert_same(tmp_path, verify=True).decoded["bodies"] == 300


def test_the_corner_lines_give_todays_rows_and_damage(tmp_path: Path) -> None:
    good = _lines(3, 4, facts=True)
    _write(tmp_path, {f"{n}-0": [good[n % 4], line, good[(n + 1) % 4]] for n, line in
                      enumerate(SPECIAL)})  # fmt: skip
    _write(tmp_path, {"torn-0": [good[0], good[1][:-40]]}, torn=True)
    result = _assert_same(tmp_path)
    assert result.decoded["exact"] > 10
    _assert_same(tmp_path, verify=True)


def test_whole_files_and_files_read_line_by_line_give_todays_rows(tmp_path: Path) -> None:
    """A file whose every line is read from its facts is decoded in one pass; one line that
    cannot be (blank, without facts, torn...) sends the file line by line: the same rows."""
    good = _lines(20, 12, facts=True)
    first = orjson.loads(good[0])
    facts_first = orjson.dumps({FACTS_KEY: first.pop(FACTS_KEY), **first})
    with_request = [orjson.loads(line) for line in _lines(21, 40, facts=False)]
    planted = next(line for line in with_request if isinstance(line["request"], dict))
    # A client's request holding a key of that name is a body, not the line's facts.
    planted["request"][FACTS_KEY] = {"v": FACTS_VERSION, "tokens_in": 12_345, "model": "x"}
    nested = orjson.dumps(planted)
    planted_too = dict(orjson.loads(good[3]))
    planted_too["request"] = {**(planted_too["request"] or {}), FACTS_KEY: {"v": 1}}
    _write(tmp_path, {
        "0-0": good[:4],
        "0-1": [good[4], facts_first, good[5]],  # facts not the last key
        "0-2": [good[6], nested],  # no facts of its own: read from the bodies
        "0-3": [good[7], orjson.dumps(planted_too)],  # facts last, a nested key before them
        "0-4": [good[8], b"", good[9]],  # a blank line
        "0-5": [good[10], _lines(22, 1, facts=False)[0]],  # another writer's line
        "0-6": [good[11], good[0]],
    })  # fmt: skip
    _write(tmp_path, {"1-0": [good[1], good[2][:-30]], "1-1": [good[1], good[2]]}, torn=True)
    result = _assert_same(tmp_path)
    assert result.decoded == {"facts": 18, "bodies": 2, "exact": 1}  # exact: the torn tail
    row = result.calls.filter(pl.col("model_call_id") == planted["model_call_id"])
    assert row["tokens_in"].item() != 12_345
    assert result.damaged["code"].cast(str).to_list() == ["capture_line_damaged"]  # 1-0's tail
    _assert_same(tmp_path, verify=True)


def _mutate(line: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(7)
    at = rng.randrange(len(line))
    if kind == 0:  # flip a byte
        return line[:at] + bytes([line[at] ^ (1 << rng.randrange(8))]) + line[at + 1 :]
    if kind == 1:  # cut short (a torn write closed by the next append)
        return line[:at]
    if kind == 2:  # a byte inserted
        return line[:at] + bytes([rng.randrange(256)]) + line[at:]
    if kind == 3:  # a span deleted
        return line[:at] + line[at + rng.randrange(1, 40) :]
    if kind == 4:  # a structural character
        return line[:at] + rng.choice([b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\"]) + line[at:]
    if kind == 5:  # a digit changed (the line stays JSON more often than not)
        digits = [n for n, byte in enumerate(line) if 48 <= byte <= 57]
        if digits:
            at = rng.choice(digits)
            return line[:at] + str(rng.randrange(10)).encode() + line[at + 1 :]
        return line
    return line  # untouched


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_damage_gives_todays_rows_and_damage(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    facts = seed % 2 == 1
    lines = [_mutate(line, rng) for line in _lines(10 + seed, 400, facts=facts)]
    lines = [line.replace(b"\n", b" ") for line in lines]  # one line stays one line
    _write(tmp_path, {f"{n}-0": lines[n * 8 : n * 8 + 8] for n in range(50)})
    if facts:
        # Damage that keeps a line JSON may change a body and not its facts: the rows from
        # the facts differ from today's there, and verify finds every such line.
        verified = _assert_same(tmp_path, verify=True)
        flagged = verified.damaged.filter(pl.col("code") == "capture_facts_differ")
        assert flagged.height > 0  # the fuzz does reach lines that stay JSON
        plain = _scan.scan_files(_tasks(_scan, tmp_path))
        old = reference.scan_files(_tasks(reference, tmp_path))
        key = ["rollout_id", "call_index"]
        unflagged = plain.calls.join(flagged.select(key), on=key, how="anti").sort(
            "path", "call_index"
        )
        assert_frame_equal(
            unflagged, old.calls.join(flagged.select(key), on=key, how="anti"), check_exact=True
        )
        assert_frame_equal(_sorted(plain.damaged), _sorted(old.damaged), check_exact=True)
    else:
        assert _assert_same(tmp_path).damaged.height > 50


def test_verify_flags_planted_disagreements(tmp_path: Path) -> None:
    capture_dir = tmp_path / "model-calls"
    lines = [orjson.loads(line) for line in _lines(5, 6, facts=True)]
    ok = [line for line in lines if line["status_code"] == 200]
    planted = dict(ok[0])
    planted[FACTS_KEY] = {**planted[FACTS_KEY], "tokens_in": 999_999, "model": "planted"}
    other = dict(ok[1])
    other[FACTS_KEY] = {**other[FACTS_KEY], "tool_calls": [{"name": "ghost"}]}
    _write(capture_dir, {"0-0": [orjson.dumps(x) for x in (planted, ok[2])],
                         "0-1": [orjson.dumps(other)]})  # fmt: skip

    trusting = ngv.open_run(capture_dir, index=False)
    row = trusting.calls.filter(pl.col("model_call_id") == planted["model_call_id"])
    assert row["tokens_in"].item() == 999_999 and row["model"].cast(str).item() == "planted"
    assert trusting.gaps.height == 0

    checked = ngv.open_run(capture_dir, verify=True)
    assert not (capture_dir / ".ngcapture-index").exists()  # verify saves nothing
    differ = checked.gaps.filter(pl.col("code") == "capture_facts_differ").sort("rollout_id")
    assert differ["model_call_id"].to_list() == [planted["model_call_id"], other["model_call_id"]]
    assert differ["detail"].to_list() == [
        "stored facts differ from the bodies in: model, tokens",
        "stored facts differ from the bodies in: tool_calls",
    ]
    assert differ["line_number"].to_list() == [1, 1]
    fixed = checked.calls.filter(pl.col("model_call_id") == planted["model_call_id"])
    truth = ngv.open_run(capture_dir, index=False).calls  # facts of the two lines differ...
    assert fixed["tokens_in"].item() == ok[0][FACTS_KEY]["tokens_in"] != 999_999
    assert truth.height == checked.calls.height == 3


def test_an_append_writes_a_delta_and_reads_back_the_same(tmp_path: Path) -> None:
    capture_dir = tmp_path / "model-calls"
    lines = _lines(6, 60, facts=True)
    _write(capture_dir, {f"{n}-0": lines[n * 5 : n * 5 + 5] for n in range(8)})
    ngv.open_run(capture_dir)
    meta = capture_dir / ".ngcapture-index" / "meta.json"
    generation = orjson.loads(meta.read_bytes())["generation"]
    for round_ in range(MAX_DELTAS + 1):
        with (capture_dir / f"{round_ % 8}-0.capture.jsonl").open("ab") as handle:
            handle.write(lines[40 + round_] + b"\n")
        run = ngv.open_run(capture_dir)
        assert run.index_stats is not None
        assert (run.index_stats.appended, run.index_stats.bytes_parsed) == (
            1,
            len(lines[40 + round_]) + 1,
        )
        state = orjson.loads(meta.read_bytes())
        fresh = ngv.open_run(capture_dir, index=False)
        for name in ("calls", "tool_calls", "gaps", "rollouts"):
            assert_frame_equal(getattr(run, name), getattr(fresh, name), check_exact=True)
        if round_ < MAX_DELTAS:
            assert state["generation"] == generation and len(state["deltas"]) == round_ + 1
        else:  # too many deltas: folded into a new generation
            assert state["generation"] != generation and "deltas" not in state
    warm = ngv.open_run(capture_dir)
    assert warm.index_stats is not None and warm.index_stats.bytes_parsed == 0
    assert_frame_equal(warm.calls, ngv.open_run(capture_dir, index=False).calls)


def test_a_completed_torn_tail_rewrites_the_generation(tmp_path: Path) -> None:
    capture_dir = tmp_path / "model-calls"
    lines = _lines(7, 4, facts=True)
    _write(capture_dir, {"0-0": [lines[0], lines[1][:50]]}, torn=True)
    first = ngv.open_run(capture_dir)
    assert first.gaps["code"].cast(str).to_list() == ["capture_line_damaged"]
    generation = orjson.loads((capture_dir / ".ngcapture-index" / "meta.json").read_bytes())
    with (capture_dir / "0-0.capture.jsonl").open("ab") as handle:
        handle.write(lines[1][50:] + b"\n")
    run = ngv.open_run(capture_dir)
    state = orjson.loads((capture_dir / ".ngcapture-index" / "meta.json").read_bytes())
    assert state["generation"] != generation["generation"]  # a row went: not a delta
    assert run.gaps.height == 0 and run.calls.height == 2


def test_scan_calls_is_the_calls_frame_lazily(tmp_path: Path) -> None:
    capture_dir = tmp_path / "model-calls"
    lines = _lines(8, 40, facts=True)
    _write(capture_dir, {f"{n}-0": lines[n * 4 : n * 4 + 4] for n in range(10)})
    lazy = ngv.scan_calls(capture_dir)
    assert isinstance(lazy, pl.LazyFrame)
    assert_frame_equal(lazy.collect(), ngv.open_run(capture_dir).calls, check_exact=True)
    with (capture_dir / "0-0.capture.jsonl").open("ab") as handle:
        handle.write(lines[0] + b"\n")  # an appended line: a delta, scanned too
    slow = ngv.scan_calls(capture_dir).filter(pl.col("rollout_id") == "0-0").collect()
    assert slow.height == 5


def test_microseconds_round_as_datetime_does() -> None:
    rng = random.Random(0)
    values = [rng.uniform(0, 2e11) for _ in range(20_000)]
    values += [1786032154.1234565, 0.0000005, 0.0000015, 1.9999995, 2.5e-7, 1e11 + 0.5e-6]
    values += [math.nextafter(v, math.inf) for v in values[-6:]]
    for value in values:
        moment = datetime.fromtimestamp(value, tz=UTC)
        delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
        expected = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        assert micros(value) == expected, value
    assert micros(-1.0) is None and micros(math.nan) is None and micros(3e11) is None
    assert FACTS_VERSION == 1
    # The whole-column version (a cold open's) gives the same microseconds, nulls kept.
    column = micros_series(pl.Series("started_at", [*values, None], dtype=pl.Float64))
    assert column.name == "started_at" and column.dtype == pl.Int64
    assert column.to_list() == [*map(micros, values), None]


def test_tokens_per_second_of_a_whole_column_are_the_row_by_row_ones() -> None:
    rng = random.Random(1)

    def maybe(value: float | int) -> float | int | None:
        return None if rng.random() < 0.15 else value

    rows = [
        (maybe(rng.randrange(0, 5000)), maybe(rng.choice([0.0, 1e-3, rng.uniform(-5, 9e4)])),
         maybe(rng.choice([0.0, rng.uniform(0, 9e4)])), rng.choice([True, False]))
        for _ in range(20_000)
    ] + [(7, 1000.0, 999.0, True), (3, 1.0, 1.0, True), (3, 0.3, None, False), (1, 3.0, None, True)]  # fmt: skip
    frame = pl.DataFrame(
        rows, orient="row",
        schema={"tokens_out": pl.Int64, "latency_total_ms": pl.Float64,
                "latency_ttft_ms": pl.Float64, "stream": pl.Boolean},
    )  # fmt: skip
    rates = _rates(frame, frame["stream"])
    assert rates.name == "output_tokens_per_s" and rates.dtype == pl.Float64
    assert rates.to_list() == [_rate(*row) for row in rows]  # bit for bit, nulls where unknown
    assert _rates(frame.clear(), frame.clear()["stream"]).to_list() == []


def test_tool_places_give_each_call_its_row_and_position() -> None:
    counts = [0, 2, 0, 3, 1, 0]
    rows, positions = tool_places(pl.Series(counts, dtype=pl.Int64))
    expected = [(row, position) for row, count in enumerate(counts) for position in range(count)]
    assert list(zip(rows, positions, strict=True)) == expected
    assert rows.dtype == positions.dtype == pl.Int64
    assert tool_places(pl.Series([0, 0], dtype=pl.Int64))[0].to_list() == []


def test_the_listing_sorts_names_as_is_valid_rollout_id_does(tmp_path: Path) -> None:
    from ngcapture_viz.load._listing import DirListing, _sort_names, _sort_names_slowly

    names = ["3-1.capture.jsonl", "0-0.capture.jsonl", "0-0.capture.incomplete", "notes.txt",
             "a..b.capture.jsonl", "-x.capture.jsonl", "x y.capture.jsonl", "é.capture.jsonl",
             ".hidden.capture.jsonl", "x" * 200 + ".capture.jsonl", "x" * 201 + ".capture.jsonl",
             "ok.capture.jsonl.bak", "a\nb.capture.jsonl", "1-0-a1.capture.jsonl",
             "1-0.capture.incomplete.capture.jsonl", ".capture.jsonl", "Z_9.capture.incomplete"]  # fmt: skip
    fast_frame, *fast = _sort_names(names)
    slow_frame, *slow = _sort_names_slowly(names)
    assert fast_frame.equals(slow_frame) and fast == slow
    fast_names = fast_frame["name"].to_list()
    assert fast_names == sorted(fast_names)
    rng = random.Random(11)  # and names made of the pieces that matter, at random
    pieces = ["a", "Z", "0", "9", ".", "..", "-", "_", " ", "é", "x" * 99, ".capture.jsonl",
              ".capture.incomplete", "capture", "jsonl", ARCHIVE_PREFIX]  # fmt: skip
    ends = ["", ".capture.jsonl", ".capture.incomplete"]
    made = ["".join(rng.choices(pieces, k=rng.randrange(1, 5))) + rng.choice(ends)
            for _ in range(3000)]  # fmt: skip
    made = list(dict.fromkeys(made))  # a directory lists each name once
    made_frame, *made_rest = _sort_names(made)
    slow_frame, *slow_rest = _sort_names_slowly(made)
    assert made_frame.equals(slow_frame) and made_rest == slow_rest
    assert made_frame.height > 100 and len(made_rest[0]) > 20  # both kinds were exercised
    assert [names[at] for at in fast_frame["at"].to_list()] == fast_names  # where each was listed
    assert fast_frame["rollout_id"].to_list() == [
        "0-0",
        "1-0-a1",
        "1-0.capture.incomplete",
        "3-1",
        "x" * 200,
    ]
    root = tmp_path / "store"
    root.mkdir()
    for name in ("0-0.capture.jsonl", "notes.txt"):
        (root / name).write_bytes(b"")
    (root / "d.capture.jsonl").mkdir()
    fd = os.open(bytes(root) + b"/\xff.capture.jsonl", os.O_CREAT | os.O_WRONLY)
    os.close(fd)
    listing = DirListing.read(root)  # a name that is not UTF-8: sorted the slow way
    assert listing.data_frame.rows() == [("0-0", "0-0.capture.jsonl")]
    assert listing.foreign == sorted(["d.capture.jsonl", "notes.txt", "\udcff.capture.jsonl"])
    assert listing.stat_frame["name"].to_list() == ["0-0.capture.jsonl"]


def test_the_listing_keeps_a_data_file_it_could_not_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ngcapture_viz.load._file_state import FileStat
    from ngcapture_viz.load._listing import DirListing

    for name in ("b.capture.jsonl", "a.capture.jsonl", "c.capture.incomplete", "notes.txt"):
        (tmp_path / name).write_bytes(b"x" * len(name))
    (tmp_path / "d.capture.jsonl").mkdir()
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if path == "b.capture.jsonl":  # gone between the listing and its stat, say
            raise FileNotFoundError(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    listing = DirListing.read(tmp_path)
    monkeypatch.undo()
    assert listing.data_frame.rows() == [("a", "a.capture.jsonl"), ("b", "b.capture.jsonl")]
    assert listing.stat_frame["name"].to_list() == ["a.capture.jsonl"]  # b: no stat to plan by
    assert listing.foreign == ["d.capture.jsonl", "notes.txt"]  # a directory is no data file
    assert listing.markers == {"c"}
    a = real_stat(tmp_path / "a.capture.jsonl")
    assert listing.files_outside(pl.Series(dtype=pl.String())) == [
        ("a", "a.capture.jsonl", FileStat(a.st_ino, a.st_size, a.st_mtime_ns)),
        ("b", "b.capture.jsonl", None),
    ]
    assert listing.files_outside(pl.Series(["a.capture.jsonl"])) == [("b", "b.capture.jsonl", None)]
    assert listing.stat_frame.row(0) == ("a.capture.jsonl", a.st_ino, a.st_size, a.st_mtime_ns)


def test_call_totals_of_calls_in_rollout_order_match_the_hashed_group_by() -> None:
    from ngcapture_viz.frames.calls import CALLS
    from ngcapture_viz.frames.rollouts import TOKEN_TOTALS, call_totals

    rng = random.Random(7)
    rows = []
    for rollout in range(60):
        for call_index in range(rng.randrange(1, 6)):

            def maybe(value: Any) -> Any:
                return None if rng.random() < 0.3 else value

            rows.append({
                "rollout_id": f"r{rollout:03d}", "call_index": call_index,
                "error_category": maybe("upstream_error"), "num_tool_calls": rng.randrange(3),
                **{name: maybe(rng.randrange(1000)) for name in TOKEN_TOTALS},
                "latency_total_ms": maybe(rng.random() * 1000),
                "started_at": maybe(datetime(2026, 12, 5, 1, rng.randrange(60), tzinfo=UTC)),
                "completed_at": maybe(datetime(2026, 12, 5, 2, rng.randrange(60), tzinfo=UTC)),
            })  # fmt: skip
    calls = CALLS.conform(pl.DataFrame(rows)).sort("rollout_id", "call_index")
    in_order = calls.with_columns(pl.col("rollout_id").set_sorted())
    assert in_order["rollout_id"].flags["SORTED_ASC"]
    assert not calls.sample(fraction=1.0, shuffle=True, seed=3)["rollout_id"].flags["SORTED_ASC"]
    hashed = call_totals(calls.sample(fraction=1.0, shuffle=True, seed=3)).sort("rollout_id")
    assert_frame_equal(call_totals(in_order), hashed)  # same values, same dtypes, same order
    assert call_totals(in_order)["rollout_id"].to_list() == sorted({r["rollout_id"] for r in rows})


@pytest.mark.parametrize("kind", ["appends", "anywhere", "equal keys", "null keys", "no rows"])
def test_in_order_merges_as_a_stable_sort_of_the_two_does(kind: str) -> None:
    from ngcapture_viz.load._index_files import in_order

    rng = random.Random(kind)
    keys = ("rollout_id", "call_index", "tool_index")
    rows = pl.DataFrame(
        [{"rollout_id": f"r{rng.randrange(40):02d}", "call_index": rng.randrange(6),
          "tool_index": rng.randrange(2), "seen": n} for n in range(400)],
        schema={"rollout_id": pl.String(), "call_index": pl.Int64(), "tool_index": pl.Int32(),
                "seen": pl.Int64()},
    ).sort(*keys, maintain_order=True)  # fmt: skip
    if kind == "no rows":
        rows = rows.clear()
    last = dict(rows.group_by("rollout_id").agg(pl.col("call_index").max()).iter_rows())
    added = []
    for n in range(60):
        rollout_id = f"r{rng.randrange(45):02d}"  # some rollouts only in the added rows
        if kind in ("appends", "no rows"):
            call_index = last.get(rollout_id, -1) + 1 + rng.randrange(3)
        elif kind == "equal keys":  # the same keys as a row: after it, as the sort keeps them
            rollout_id, call_index, _, _ = rows.row(rng.randrange(rows.height))
        else:
            call_index = rng.randrange(6)
        added.append({"rollout_id": None if kind == "null keys" and n % 7 == 0 else rollout_id,
                      "call_index": call_index, "tool_index": rng.randrange(2), "seen": 1000 + n})  # fmt: skip
    fresh = pl.DataFrame(added, schema={**rows.schema, "tool_index": pl.Int64()})  # cast on merge
    expected = pl.concat([rows, fresh.cast(rows.schema)]).sort(*keys, maintain_order=True)
    merged = in_order(rows, fresh, keys)
    assert_frame_equal(merged, expected)  # the same rows in the same order, "seen" included
    assert merged.schema == rows.schema
