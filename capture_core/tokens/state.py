"""The token store's per-rollout state file, ``<id>.tokens.state.json``, and its atomic writes.

The state is one sorted-key JSON object and a newline::

    {"entry_digests": {"<model_call_id>": "<sha256 hex>", ...}, "frozen": false,
     "incomplete": false, "indexed_size": 1234, "retired": false, "snapshot_id": "",
     "version": 3}

A missing file means every default. It is only ever replaced whole: written to a temporary
``.tokens-state-*`` file in the store's directory and renamed over the old one, so a reader (or
a writer killed at any instant) sees the old state or the new one, never half of either.
Durable writes also fsync the file before the rename and the directory after it; they are
used for lifecycle changes (freeze, incomplete, conflict, drop). Ordinary appends write the
state without fsync: the entry line's own fsync is the durability guarantee, and an index that
lags the file is rebuilt from the file's tail.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Final

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from capture_core._locking import fsync_dir, write_all
from capture_core.exceptions import TokenStoreDamagedError

__all__ = ["STATE_TEMP_PREFIX", "TokenCaptureState", "read_state", "write_state"]

STATE_TEMP_PREFIX: Final = ".tokens-state-"
_INDEX_KEYS: Final = ("entry_digests", "indexed_size")


class TokenCaptureState(BaseModel):
    """The lifecycle and digest index of one rollout's token capture.

    Attributes:
        frozen: a snapshot was taken; writes are refused from now on.
        retired: the frozen snapshot was dropped after delivery; the entries are gone and this
            file stays as a fence until ``delete``.
        incomplete: some call of the rollout was lost or conflicted.
        snapshot_id: the frozen snapshot's id (``""`` until frozen).
        version: bumped by every change; a drop must name the version it saw.
        entry_digests: digest of each recorded call's canonical line, by ``model_call_id``.
        indexed_size: the byte length of the entries file the digests cover.
        legacy: the file had no digest index (an older writer); it is rebuilt from the start of
            the entries file. Not written.

    Example:
        >>> TokenCaptureState().model_dump(exclude={"legacy"})["version"]
        0
    """

    model_config = ConfigDict(extra="allow")

    frozen: StrictBool = False
    retired: StrictBool = False
    incomplete: StrictBool = False
    snapshot_id: StrictStr = ""
    version: StrictInt = Field(default=0, ge=0)
    entry_digests: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    indexed_size: StrictInt = 0
    legacy: bool = Field(default=False, exclude=True, repr=False)

    def to_bytes(self) -> bytes:
        """Sorted-key JSON and a newline, as the file holds it."""
        return orjson.dumps(
            self.model_dump(), option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
        )


def read_state(path: Path) -> TokenCaptureState:
    """The state at ``path``; every default when the file does not exist.

    A state without ``entry_digests`` or ``indexed_size`` (written by an older store) is read
    as *legacy*: its index is rebuilt from the whole entries file.

    Raises:
        TokenStoreDamagedError: the file is not a JSON object, or a field has the wrong type
            (never written by this store: refusing is safer than forgetting a fence).

    Example:
        >>> read_state(Path("/tmp/missing.tokens.state.json")).frozen
        False
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return TokenCaptureState()
    with os.fdopen(fd, "rb") as file:
        raw = file.read()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TokenStoreDamagedError(
            f"the token state file is not JSON ({exc})", path=path
        ) from exc
    if not isinstance(data, dict):
        raise TokenStoreDamagedError("the token state file is not a JSON object", path=path)
    legacy = any(key not in data for key in _INDEX_KEYS)
    if legacy:
        data = {k: v for k, v in data.items() if k not in _INDEX_KEYS}
    data.pop("legacy", None)
    try:
        state = TokenCaptureState.model_validate(data)
    except ValidationError as exc:
        raise TokenStoreDamagedError(
            f"the token state file has invalid fields ({_first_error(exc)})", path=path
        ) from exc
    state.legacy = legacy
    return state


def write_state(path: Path, state: TokenCaptureState, *, durable: bool) -> None:
    """Replace the state file with ``state`` atomically (fsynced first when ``durable``).

    Raises:
        OSError: the temporary file could not be written or renamed; the old state is intact.

    Example:
        >>> write_state(Path("/tmp/r.tokens.state.json"), TokenCaptureState(), durable=True)
    """
    fd, temp = tempfile.mkstemp(prefix=STATE_TEMP_PREFIX, dir=path.parent)
    try:
        try:
            write_all(fd, state.to_bytes())
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if durable:
        fsync_dir(path.parent)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "state"
    return f"{where}: {error['msg']}"
