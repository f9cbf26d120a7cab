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
from collections.abc import Sequence
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
class StoreAbilities:
    """What a slice store offers beyond the abstract methods (``SliceStoreAPI.abilities``).

    Callers test a flag, never ``getattr``.

    - ``scheduler``: writes queue in a per-drive write scheduler, reachable as
      ``store.scheduler`` (a ``WriteQueue``): a caller may ask it for queue
      room or have a slice's queued pieces written at once.
    """

    scheduler: bool = False


class WriteQueue(Protocol):
    """The part of a store's write scheduler the storage node uses (``WriteScheduler``)."""

    def has_room(self, nbytes: int) -> bool:
        """Would ``submit`` of ``nbytes`` queue them without waiting (a hint)?"""
        ...

    def write_inline(self, slice_id: int) -> bool:
        """Write the queued run holding ``slice_id``'s pieces in the calling thread
        when no other thread is writing; False when it could not (``expedite``)."""
        ...

    def expedite(self, slice_id: int) -> None:
        """Have the writer take ``slice_id``'s queued pieces at once instead of lingering."""
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
        self, slice_id: int, offset: int, data: PieceBytes, group: int, *, durable: bool = False
    ) -> Future[None]:
        """Queue a piece of ``slice_id`` at ``offset`` (== its length so far).

        The future completes when the piece is written (readable); when
        ``durable`` it completes only after a flush covering it. The caller
        must not modify ``data`` until the future completes.
        """

    def write_now(
        self, slice_id: int, offset: int, data: PieceBytes, group: int, *, durable: bool = False
    ) -> Future[None] | None:
        """Write a piece in the calling thread without waiting for any other
        thread, returning its completed future, or do nothing and return None
        (the drive is busy: ``submit`` instead). Never blocks on a queue.
        This default never writes now."""
        return None

    def write(
        self, slice_id: int, offset: int, data: PieceBytes, group: int, *, durable: bool = False
    ) -> None:
        """``submit`` and wait for it."""
        self.submit(slice_id, offset, data, group, durable=durable).result()

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
    def close(self) -> None:
        """Flush, write an index checkpoint, stop background work, release the drive."""
