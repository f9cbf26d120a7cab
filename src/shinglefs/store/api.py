"""The contract of a per-drive slice store, as the layers above see it.

A slice is an immutable run of bytes (at most ``MAX_SLICE_SIZE``) named by a
64-bit id: written once, in pieces appended in order, read by range many
times, deleted whole. Every piece names a lifetime group (a 64-bit label for
data expected to die together); a group's pieces fill zones of their own.

``shinglefs.store.SliceStore`` implements this for one drive; the storage node
(``shinglefs.server``) composes several.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from shinglefs.zoned.fileio import Payload
from shinglefs.zoned.model import Buffer

PieceBytes = Buffer | Sequence[Buffer] | Payload
"""A piece's bytes: one buffer, several (written back to back, never copied) or a Payload."""

MAX_SLICE_SIZE = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters of one slice store since it was formatted (persisted across restarts).

    ``write_amplification`` = device_bytes_written / user_bytes_written, where
    device bytes count everything the store wrote to sequential zones (record
    headers, alignment padding, GC copies) and user bytes count payload the
    callers submitted. Index checkpoints on conventional space are reported
    separately in ``checkpoint_bytes_written``.
    """

    user_bytes_written: int
    device_bytes_written: int
    write_amplification: float
    gc_bytes_copied: int
    zone_resets: int
    checkpoint_bytes_written: int
    slices: int
    live_bytes: int
    free_zones: int
    zones_by_condition: dict[str, int] = field(default_factory=dict)
    live_bytes_per_zone: dict[int, int] = field(default_factory=dict)
    group_zone_evictions: int = 0
    capacity_bytes: int = 0
    # What data can still be appended (``SliceLog.writable_bytes``): empty zones
    # beyond the GC reserve, room other groups' zones lend, dead bytes GC reclaims.
    writable_bytes: int = 0
    # Zones GC is collecting right now: while it copies, a zone's room is not
    # lent and its dead bytes are not yet free, so ``writable_bytes`` is low.
    zones_collecting: int = 0


@dataclass(frozen=True, slots=True)
class StoreSpace:
    """What a writer reserves against and placement weighs (``StoreStats``'s
    space fields), cheap enough to read on the write path: no per-zone
    report, no per-zone dict."""

    writable_bytes: int
    zones_collecting: int
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class StoreAbilities:
    """What a slice store offers beyond the abstract methods (``SliceStoreAPI.abilities``).

    Callers test a flag, never ``getattr``.

    - ``scheduler``: writes queue in a per-drive write scheduler, reachable as
      ``store.scheduler`` (a ``WriteQueue``: its counters). Writing goes
      through ``submit`` whatever the store.
    """

    scheduler: bool = False


class Declined(Exception):
    """``submit(..., wait=False)`` could not take the piece without waiting.

    Nothing was queued or written; the caller submits again with ``wait=True``
    (from a thread that may block). Not a ``StoreError``: it never reaches a
    user, and the layers above raise it from their own non-waiting calls
    (``StorageNode.submit``, the client's ``write``/``flush``/``read`` with
    ``wait=False``) for the FUSE event loop to hand the request to a thread.
    """


class PieceFuture(Future[None]):
    """The future of a submitted piece: completes when the piece is written and
    indexed (readable), for a durable piece after the flush covering it.

    ``expedite()`` says the caller is about to wait for it: the store writes
    the piece's queued run in the calling thread when its writer is idle, else
    has the writer take it at once instead of lingering to coalesce. A no-op
    once the piece is being written, or for a store that does not queue.
    ``idle_only``: only if the writer is idle (lingering), a no-op while it
    writes: a caller that waits for the store's progress, not for this piece,
    gets it anyway, and making the group urgent would end the zone run.
    """

    def __init__(self, on_expedite: Callable[[bool], None] | None = None) -> None:
        super().__init__()
        self._on_expedite = on_expedite

    def expedite(self, *, idle_only: bool = False) -> None:
        if self._on_expedite is not None and not (self.done() or self.running()):
            self._on_expedite(idle_only)


class WriteQueue(Protocol):
    """What a store's write scheduler shows beyond the store's contract (``WriteScheduler``):
    counters for benchmarks and tests."""

    @property
    def queued_bytes(self) -> int:
        """Bytes queued and not yet taken by a writer."""
        ...


class SliceStoreAPI(ABC):
    """What the storage node needs of a per-drive slice store. Thread-safe.

    Errors: ``SliceNotFound`` (unknown or deleted slice), ``ChecksumMismatch``
    (naming drive, zone, offset; wrong bytes are never returned),
    ``SliceOrderError`` (a piece not at the slice's current length, or past
    MAX_SLICE_SIZE), ``StoreFull`` (no zone can take the bytes even after GC),
    and the drive's own ``shinglefs.zoned.errors`` wrapped as ``StoreIOError``.
    """

    #: what this store offers beyond the abstract methods (see ``StoreAbilities``)
    abilities: ClassVar[StoreAbilities] = StoreAbilities()

    @property
    def scheduler(self) -> WriteQueue:
        """The store's write queue. Only a store with ``abilities.scheduler`` has one;
        this default raises ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} has no write scheduler")

    @abstractmethod
    def submit(
        self, slice_id: int, offset: int, data: PieceBytes, group: int, *,
        durable: bool = False, urgent: bool = False, wait: bool = True,
    ) -> PieceFuture:
        """Hand over a piece of ``slice_id`` at ``offset`` (== its length so far).

        The one write call of a store. The future completes when the piece is
        written (readable); when ``durable``, only after a flush covering it.
        The caller must not modify ``data`` until the future completes.

        ``urgent``: the caller waits for this piece now. The store writes it in
        the calling thread when its writer is idle and nothing of ``group`` is
        queued before it, else has the writer take it first (no lingering).

        ``wait=False``: never wait for another thread: take the piece at once
        or raise ``Declined`` with nothing queued. A piece is declined when the
        queue has no room for it (``has_room``), and an urgent one unless it is
        written in the calling thread (its future is then complete on return).
        ``wait=True`` (default): wait for queue room instead (back-pressure).

        Raises ``SliceOrderError`` (out of order; nothing queued) and
        ``StoreClosed``; write errors surface through the future.
        """

    def has_room(self, nbytes: int) -> bool:
        """Would ``submit(wait=False)`` of ``nbytes`` (not urgent) be taken? A hint:
        other submitters may take the room first. This default: always."""
        return True

    def write(
        self, slice_id: int, offset: int, data: PieceBytes, group: int, *, durable: bool = False
    ) -> None:
        """``submit`` (urgent: the caller waits) and wait for it."""
        self.submit(slice_id, offset, data, group, durable=durable, urgent=True).result()

    @abstractmethod
    def read(self, slice_id: int, offset: int, length: int) -> bytes:
        """Return ``length`` bytes of the slice from ``offset`` (short at its end)."""

    def readinto(self, slice_id: int, offset: int, buffer: Buffer) -> int:
        """Fill ``buffer`` from ``offset`` of the slice; returns the bytes read
        (short at its end). This default copies what ``read`` returns."""
        view = memoryview(buffer).cast("B")
        data = self.read(slice_id, offset, view.nbytes)
        view[: len(data)] = data
        return len(data)

    def prefetch(self, slice_id: int, offset: int, length: int) -> None:
        """Hint that ``[offset, offset + length)`` of a slice is read soon; returns
        at once and never fails for an unknown slice. This default ignores it."""
        return None

    @abstractmethod
    def length(self, slice_id: int) -> int:
        """Bytes written so far to ``slice_id``; raises SliceNotFound."""

    @abstractmethod
    def contains(self, slice_id: int) -> bool: ...

    @abstractmethod
    def delete(self, slice_id: int) -> None:
        """Delete a slice; logged, so a crash never resurrects it. Idempotent."""

    @abstractmethod
    def flush(self) -> None:
        """Make every completed write and delete durable."""

    @abstractmethod
    def stats(self) -> StoreStats: ...

    @abstractmethod
    def highest_slice_id(self) -> int:
        """The highest slice id the store holds or held (0: none)."""

    @abstractmethod
    def space(self) -> StoreSpace:
        """``stats()``'s space fields alone, in microseconds (the write path's figure)."""

    @abstractmethod
    def close(self) -> None:
        """Flush, write an index checkpoint, stop background work, release the drive."""
