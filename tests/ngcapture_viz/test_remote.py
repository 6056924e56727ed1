"""Stores on object storage: ``open_run("s3://...")`` against a local S3-compatible server.

moto's server runs in this process on 127.0.0.1 (a free port); s3fs talks to it over HTTP with
explicit dummy credentials, so no other address is ever asked for any (instance metadata is
off too). A store with a damaged line, a rollout whose capture file is missing, an incomplete
marker, a foreign file and a failures file is uploaded; the remote open must equal the local
open of the same files, and a later append must be fetched and parsed incrementally.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import ngcapture_viz as ngv
from capture_core.testing import RunSpec, write_run
from ngcapture_viz.exceptions import SourceError
from ngcapture_viz.load.failures import FAILURE_KEY, failures_file
from ngcapture_viz.load.remote import Mirror, is_remote, remote_label

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")

BUCKET = "ngcapture-test"
FRAMES = ("calls", "rollouts", "gaps", "tool_calls")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A moto S3 server on 127.0.0.1 and the storage options that reach it; the mirrors go to
    a temporary cache. Stopped at the end whatever happens."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {
            "endpoint_url": f"http://{host}:{port}",
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
            patch.setenv("NGCAPTURE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
            for variable in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
                patch.delenv(variable, raising=False)
            boto3 = pytest.importorskip("boto3")
            client = boto3.client("s3", endpoint_url=options["endpoint_url"],
                                  aws_access_key_id="testing", aws_secret_access_key="testing",
                                  region_name="us-east-1")  # fmt: skip
            client.create_bucket(Bucket=BUCKET)
            fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
            yield {"options": options, "fs": fs}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``run-1/`` with every kind of damage the remote open must report like the local one."""
    root = tmp_path_factory.mktemp("local") / "run-1"
    written = write_run(root, RunSpec(tasks=5, repeats=2, calls=(1, 5), seed=11))
    store = written.capture_dir
    with (store / "0-0.capture.jsonl").open("ab") as out:
        out.write(b'{"model_call_id": "torn", "dialect": "chat", broken\n')  # a damaged line
    (store / "1-1.capture.jsonl").unlink()  # its record stays: rollout_not_in_store
    (store / "2-0.capture.incomplete").touch()  # the server failed to record a call
    (store / "notes.txt").write_text("not a capture file\n")  # a foreign file
    lines = written.rollouts.read_bytes().splitlines()
    kept, failed = [], []
    for line in lines:
        row = orjson.loads(line)
        if row["ng_model_call_capture"]["rollout_id"] == "3-0":
            row[FAILURE_KEY] = {"rollout_id": "3-0", "attempt": 0, "error_type": "RateLimitError",
                                "error": "429"}  # fmt: skip
            failed.append(orjson.dumps(row))
        else:
            kept.append(line)
    written.rollouts.write_bytes(b"\n".join(kept) + b"\n")
    failures_file(written.rollouts).write_bytes(b"\n".join(failed) + b"\n")
    return root


def upload(fs: Any, local: Path, prefix: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file() and ".ngcapture-index" not in path.parts:
            fs.put_file(str(path), f"{BUCKET}/{prefix}/{path.relative_to(local).as_posix()}")


def normalized(run: ngv.CaptureRun, roots: list[Path]) -> dict[str, pl.DataFrame]:
    """The four frames with every path made relative to its source root."""
    out = {}
    for name in FRAMES:
        frame: pl.DataFrame = getattr(run, name)
        if "path" in frame.columns:
            path = pl.col("path")
            for root in roots:
                path = path.str.replace(str(root) + os.sep, "", literal=True)
            frame = frame.with_columns(path)
        out[name] = frame
    return out


def test_urls_are_told_from_paths_and_labelled_like_local_runs() -> None:
    assert is_remote("s3://b/x") and is_remote("gs://b/x") and is_remote("memory://x")
    assert not is_remote("/data/x") and not is_remote("file:///data/x")
    assert not is_remote(Path("s3:/b/x"))
    assert remote_label("s3://b/run-7/model-calls", None) == "run-7"
    assert remote_label("s3://b/run-7/store/", None) == "store"
    assert remote_label(None, "s3://b/run-7/rollouts.jsonl") == "rollouts"


def test_open_run_from_s3_equals_the_local_open_including_gaps(
    s3: dict[str, Any], local_run: Path
) -> None:
    upload(s3["fs"], local_run, "run-1")
    local = ngv.open_run(local_run / "model-calls", local_run / "rollouts.jsonl", index=False)
    remote = ngv.open_run(
        f"s3://{BUCKET}/run-1/model-calls",
        f"s3://{BUCKET}/run-1/rollouts.jsonl",
        storage_options=s3["options"],
    )
    assert remote.label == local.label == "run-1"
    codes = set(remote.gaps["code"].cast(pl.String))
    assert {"capture_line_damaged", "rollout_not_in_store", "model_call_capture_incomplete",
            "capture_dir_foreign_file"} <= codes  # fmt: skip
    assert remote.rollouts.filter(pl.col("rollout_id") == "3-0")["failed"].to_list() == [True]
    assert remote.capture_dir is not None and remote.rollouts_path is not None
    mine = normalized(remote, [remote.capture_dir, remote.rollouts_path.parent])
    theirs = normalized(local, [local_run / "model-calls", local_run])
    for name in FRAMES:
        assert_frame_equal(mine[name], theirs[name], check_row_order=True)
    # The index is cached locally, beside the mirror; payloads read back from it, offline.
    assert remote.index_stats is not None and remote.index_stats.location is not None
    assert remote.index_stats.location.is_relative_to(os.environ["NGCAPTURE_CACHE_DIR"])
    first = remote.calls.row(0, named=True)
    assert remote.payload(first["model_call_id"], rollout_id=first["rollout_id"]) == (
        local.payload(first["model_call_id"], rollout_id=first["rollout_id"])
    )


def test_a_grown_object_is_fetched_from_where_the_copy_ends_and_parsed_incrementally(
    s3: dict[str, Any], local_run: Path, tmp_path: Path
) -> None:
    fs, options = s3["fs"], s3["options"]
    store = tmp_path / "run-2" / "model-calls"
    store.mkdir(parents=True)
    for path in (local_run / "model-calls").glob("*.capture.jsonl"):
        (store / path.name).write_bytes(path.read_bytes())
    upload(fs, store, "run-2/model-calls")
    url = f"s3://{BUCKET}/run-2/model-calls"
    first = ngv.open_run(url, storage_options=options)
    assert first.index_stats is not None and first.index_stats.new == len(list(store.iterdir()))

    again = ngv.open_run(url, storage_options=options)  # nothing moved: nothing parsed
    assert again.index_stats is not None and again.index_stats.bytes_parsed == 0

    grown = store / "4-1.capture.jsonl"
    extra = (local_run / "model-calls" / "4-0.capture.jsonl").read_bytes()
    with grown.open("ab") as out:
        out.write(extra)
    fs.put_file(str(grown), f"{BUCKET}/run-2/model-calls/{grown.name}")
    (store / "2-1.capture.jsonl").unlink()
    fs.rm_file(f"{BUCKET}/run-2/model-calls/2-1.capture.jsonl")
    mirror = Mirror(url, storage_options=options)
    stats = mirror.sync_folder()
    assert (stats.appended, stats.fetched, stats.removed) == (1, 0, 1)
    assert stats.bytes_fetched == len(extra)
    after = ngv.open_run(url, storage_options=options)
    assert after.index_stats is not None
    assert (after.index_stats.appended, after.index_stats.bytes_parsed) == (1, len(extra))
    expected = ngv.open_run(store, index=False)
    assert after.capture_dir is not None
    mine = normalized(after, [after.capture_dir])
    theirs = normalized(expected, [store])
    for name in FRAMES:
        assert_frame_equal(mine[name].drop("run"), theirs[name].drop("run"))

    # Rewritten under the same name (not a continuation): fetched whole, parsed again.
    fs.pipe_file(f"{BUCKET}/run-2/model-calls/{grown.name}", extra)
    assert Mirror(url, storage_options=options).sync_folder().fetched == 1
    rewritten = ngv.open_run(url, storage_options=options)
    assert rewritten.index_stats is not None and rewritten.index_stats.reread == 1


def test_missing_sources_are_source_errors_like_local_ones(
    s3: dict[str, Any], local_run: Path
) -> None:
    upload(s3["fs"], local_run, "run-3")
    options = s3["options"]
    with pytest.raises(SourceError, match=r"rollout file 's3://.*/nope\.jsonl' does not exist"):
        ngv.open_run(f"s3://{BUCKET}/run-3/model-calls", f"s3://{BUCKET}/run-3/nope.jsonl",
                     storage_options=options)  # fmt: skip
    with pytest.raises(SourceError, match=r"capture directory 's3://.*/absent' does not exist"):
        ngv.open_run(f"s3://{BUCKET}/absent", storage_options=options)
    with pytest.raises(SourceError, match="no-such-bucket"):
        ngv.open_run("s3://no-such-bucket/x/model-calls", storage_options=options)
    # Only a rollout file: its failures file comes along.
    run = ngv.open_run(rollouts=f"s3://{BUCKET}/run-3/rollouts.jsonl", storage_options=options)
    assert run.failures_path is not None and run.failures_path.is_file()
