"""The staged-row file format: a checksummed header line, then the record JSON and the
attachments' bytes (the layout is in :mod:`~capture_core.staging.fs_sink`'s docstring); how a
row's bytes are encoded, and how its header and parts are read back and checked."""

from __future__ import annotations

import hashlib
import os
from typing import Annotated, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capture_core.staging._base import DigestHex, Identifier, NonNegativeInt
from capture_core.staging.sinks import InvalidAttachmentError, StagedRowDamagedError

__all__ = ["CHUNK", "HEADER_LIMIT", "MAGIC", "Damage", "Header", "encode", "first_error",
           "read_checked", "read_header"]  # fmt: skip

MAGIC: Final = b"ngstage1 "
HEADER_LIMIT: Final = 16 << 20  # a header line longer than this is damage, not a header
CHUNK: Final = 1 << 20
_HEX_LEN: Final = 64


class _Blob(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    length: NonNegativeInt
    sha256: DigestHex


class _Attachment(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Identifier
    length: NonNegativeInt
    sha256: DigestHex


class Header(BaseModel):
    """The first line of a row file: what follows it, and how to check it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    staging_key: Identifier
    record: _Blob
    attachments: Annotated[tuple[_Attachment, ...], Field(default=())]


class Damage(Exception):
    """Internal: the file at a row's path is not an intact row (turned into a keyed error)."""


def encode(key: str, record_json: bytes, attachments: dict[str, bytes]) -> list[bytes]:
    header = Header(
        staging_key=key,
        record=_Blob(length=len(record_json), sha256=_sha256(record_json)),
        attachments=tuple(
            _Attachment(name=name, length=len(data), sha256=_sha256(data))
            for name, data in attachments.items()
        ),
    )
    header_json = orjson.dumps(header.model_dump())
    line = b"%s%s %s\n" % (MAGIC, _sha256(header_json).encode("ascii"), header_json)
    if len(line) > HEADER_LIMIT:
        raise InvalidAttachmentError(None, "too many attachment names to describe in a header")
    return [line, record_json, *attachments.values()]


def read_header(fd: int, key: str) -> tuple[Header, int]:
    """Parse and check a row file's header line; returns it and the offset of the record."""
    size = os.fstat(fd).st_size
    line = _header_line(fd, min(size, HEADER_LIMIT))
    prefix_len = len(MAGIC) + _HEX_LEN + 1
    if not line.startswith(MAGIC) or line[prefix_len - 1 : prefix_len] != b" ":
        raise Damage("does not start with a staged-row header")
    stored_sum, header_json = line[len(MAGIC) : prefix_len - 1], line[prefix_len:-1]
    if _sha256(header_json).encode("ascii") != stored_sum:
        raise Damage("header checksum does not match")
    try:
        header = Header.model_validate_json(header_json)
    except ValidationError as exc:
        raise Damage(f"header is not a staged-row header: {first_error(exc)}") from None
    if header.staging_key != key:
        raise Damage(f"file holds the row of another key ({header.staging_key!a})")
    expected = len(line) + header.record.length + sum(a.length for a in header.attachments)
    if size != expected:
        raise Damage(f"file is {size} bytes, its header describes {expected}")
    return header, len(line)


def _header_line(fd: int, limit: int) -> bytes:
    data = b""
    while len(data) < limit:
        chunk = os.pread(fd, min(CHUNK, limit - len(data)), len(data))
        if not chunk:
            break
        end = chunk.find(b"\n")
        if end >= 0:
            return data + chunk[: end + 1]
        data += chunk
    raise Damage("has no complete header line")


def read_checked(key: str, fd: int, offset: int, length: int, sha256: str) -> bytes:
    parts: list[bytes] = []
    digest = hashlib.sha256()
    done = 0
    while done < length:
        chunk = os.pread(fd, min(CHUNK, length - done), offset + done)
        if not chunk:
            raise StagedRowDamagedError(key, "file ended early")
        digest.update(chunk)
        parts.append(chunk)
        done += len(chunk)
    if digest.hexdigest() != sha256:
        raise StagedRowDamagedError(key, f"bytes at offset {offset} do not match their checksum")
    return b"".join(parts)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def first_error(exc: ValidationError) -> str:
    error = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "row"
    return f"{where}: {error['msg']}"
