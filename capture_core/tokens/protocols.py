"""Where complete token records go and where they come back from: ``TokenSink``, ``TokenSource``.

* :class:`TokenSink` — the model server's side: ``put`` one :class:`TokenEntry` per call,
  ``mark_incomplete`` when a call's tokens were lost, ``close`` at shutdown. A sink may also
  implement :class:`CallIntentSink` (``begin_call`` before generation), so a call that never
  commits is detected as lost.
* :class:`TokenSource` — the collector's side: ``freeze`` a rollout (no write succeeds after
  it returns) and get a :class:`TokenCaptureSnapshot`; ``drop`` exactly that snapshot once its
  result is durable; ``close``.

:class:`~capture_core.tokens.TokenCaptureStore` is both. The contracts every implementation
keeps:

* ``put`` is durable when it returns; putting the same call again with the same payload is a
  no-op, with a different payload it fails (and the rollout is marked incomplete); putting
  after a freeze fails.
* ``freeze`` is idempotent; the order of a snapshot's entries carries no meaning.
* ``drop`` returns ``False`` (and keeps everything) when the rollout changed after the
  snapshot; after a successful drop, later writers are refused until the id is deleted. A
  source that cannot delete returns ``True`` and its owner keeps the data's retention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from capture_core.tokens.entry import TokenEntry

__all__ = ["CallIntentSink", "TokenCaptureSnapshot", "TokenSink", "TokenSource"]


@dataclass(frozen=True, slots=True)
class TokenCaptureSnapshot:
    """A frozen rollout's token entries, and the id and version a ``drop`` must name.

    Attributes:
        rollout_id: the rollout.
        entries: its entries, each call once.
        incomplete: some call was lost: marked incomplete, or announced by ``begin_call`` and
            never committed.
        snapshot_id: the freeze's id (the same for every freeze until the id is deleted).
        version: the state version the snapshot saw.
    """

    rollout_id: str
    entries: tuple[TokenEntry, ...]
    incomplete: bool
    snapshot_id: str
    version: int


@runtime_checkable
class TokenSink(Protocol):
    """Receives complete token records from the model server (one per call).

    Example:
        >>> isinstance(TokenCaptureStore("/tmp/tokens", create=True), TokenSink)
        True
    """

    async def put(self, entry: TokenEntry) -> None:
        """Store ``entry`` durably (a no-op when the same call was stored with the same payload).

        Raises:
            Exception: the entry was not stored (conflict, frozen, retired, disk).
        """
        ...

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of the rollout lost its tokens (``""``: not tied to one call)."""
        ...

    async def close(self) -> None:
        """Release resources; the model server awaits it at shutdown."""
        ...


@runtime_checkable
class CallIntentSink(Protocol):
    """The optional sink extension: announce a call before generation.

    A call announced and never put makes the rollout's snapshot incomplete.
    """

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Record the call's intent durably; raising fails the model call before generation."""
        ...


@runtime_checkable
class TokenSource(Protocol):
    """Gives the collector each finished rollout's entries, then forgets them on request.

    Example:
        >>> isinstance(TokenCaptureStore("/tmp/tokens", create=True), TokenSource)
        True
    """

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Stop all writes for the rollout and return what it holds (idempotent)."""
        ...

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Remove exactly the frozen snapshot; ``False`` when the rollout changed since."""
        ...

    async def close(self) -> None:
        """Release resources (the collector closes only sources it created)."""
        ...
