"""A writer's buffers: the client-wide write budget, the open slice and its pending bytes.

:class:`WriteBudget` bounds the bytes all writers of a client hold
(``total_buffer_bytes``: back-pressure, spilling idle writers' pending bytes);
:class:`OpenSlice` is the slice a :class:`~shinglefs.client.writer.FileWriter`
is filling, with its :class:`PendingBytes` (written, not yet submitted) and
its pieces in flight; ``write_would_wait`` asks whether a write fits them
without waiting (the writer's ``wait=False`` path). They hold state only:
what is submitted, stored and committed, and when, is the writer's
(client/writer.py).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Protocol

from shinglefs.client.commit import FinishedSlice
from shinglefs.client.config import ClientConfig
from shinglefs.client.settling import SettlingSlices
from shinglefs.server.node import PieceFuture, SliceNode


class Spiller(Protocol):
    """A writer whose pending bytes the budget may have submitted early."""

    def spill(self, *, own: bool) -> None: ...


class WriteBudget:
    """Bytes buffered by all writers of a client, bounded (back-pressure when full).

    Pending bytes sit in writers until a piece fills, so a full budget could
    be held entirely by idle writers. A writer that must wait therefore first
    *spills* its own pending bytes as a (shorter) piece, and if the budget is
    still full after a short wait, spills the pending bytes of writers that are
    idle (their lock is free). Spilled bytes are released when their piece is
    stored, so a waiter always makes progress.
    """

    SPILL_WAIT = 0.05

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cond = threading.Condition()
        self._writers: weakref.WeakSet[Spiller] = weakref.WeakSet()

    def register(self, writer: Spiller) -> None:
        with self._cond:
            self._writers.add(writer)

    def acquire(self, n: int, owner: Spiller | None = None) -> None:
        """Take ``n`` bytes, waiting while the budget is full (an oversize request
        proceeds alone when nothing else is buffered, so it can never deadlock)."""
        spilled_own = owner is None
        while True:
            with self._cond:
                if self.used == 0 or self.used + n <= self.limit:
                    self.used += n
                    return
                if spilled_own and self._cond.wait(self.SPILL_WAIT):
                    continue
                others = [w for w in self._writers if w is not owner]
            if not spilled_own:
                assert owner is not None
                owner.spill(own=True)
                spilled_own = True
                continue
            for writer in others:
                writer.spill(own=False)

    def has_room(self, n: int) -> bool:
        """Would ``acquire(n)`` return at once (a hint: others may take it first)?"""
        return self.used == 0 or self.used + n <= self.limit

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


class PendingBytes:
    """Bytes written to an open slice and not yet submitted, in file order.

    Large writes of immutable ``bytes`` (what the FUSE layer hands over) are
    *borrowed*: kept as views, never copied; a piece is then a list of
    buffers the drive writes with one ``pwritev``. Smaller or mutable
    buffers (the caller may reuse them after ``write`` returns) are copied
    into a tail ``bytearray``.
    """

    BORROW_MIN = 64 * 1024  # below this a copy is cheaper than one more iovec

    __slots__ = ("nbytes", "parts")

    def __init__(self) -> None:
        self.parts: list[memoryview | bytearray] = []
        self.nbytes = 0

    def __len__(self) -> int:
        return self.nbytes

    def add(self, view: memoryview) -> None:
        """Append ``view`` (a flat byte view); borrows it when its owner is immutable."""
        n = view.nbytes
        if n >= self.BORROW_MIN and isinstance(view.obj, bytes):
            self.parts.append(view)
        else:
            tail = self.parts[-1] if self.parts else None
            if isinstance(tail, bytearray):
                tail += view
            else:
                self.parts.append(bytearray(view))
        self.nbytes += n

    def take(self) -> list[memoryview | bytearray]:
        """Hand over every part (they are never modified again) and start empty."""
        parts = self.parts
        self.parts = []
        self.nbytes = 0
        return parts


class OpenSlice:
    """The slice a writer is filling: ``[start, start + length)`` of the file."""

    __slots__ = (
        "aborted",
        "chunk_index",
        "drive_id",
        "failure",
        "group",
        "inflight",
        "length",
        "pending",
        "registered",
        "slice_id",
        "start",
        "submitted",
    )

    def __init__(self, slice_id: int, chunk_index: int, start: int) -> None:
        self.slice_id = slice_id
        self.chunk_index = chunk_index
        self.start = start
        self.length = 0
        self.submitted = 0
        self.pending = PendingBytes()
        self.drive_id: int | None = None
        self.group: int | None = None
        self.registered = False
        self.inflight: deque[tuple[PieceFuture, int]] = deque()
        # The first failure of one of its pieces: the slice is never committed,
        # no further piece of it is sent, and the failures of pieces sent
        # before it are its consequences (a refused slice's later pieces meet
        # an order error on the server), never reported.
        self.failure: BaseException | None = None
        self.aborted = False  # dropped, its stored bytes deleted (FileWriter._abort)

    @property
    def end(self) -> int:
        return self.start + self.length

    def inflight_bytes(self) -> int:
        """Bytes of this slice's pieces not answered yet. First drops the pieces
        at the head of ``inflight`` answered without error, as reaping them
        would (their budget went back in their done callbacks), so that a
        steady writer's check looks at the few pieces really in flight, not
        at every piece answered since its last reap. The writer's lock is held."""
        inflight = self.inflight
        while inflight:
            head = inflight[0][0]
            if not head.done() or head.cancelled() or head.exception() is not None:
                break
            inflight.popleft()
        return sum(n for f, n in inflight if not f.done())

    def finished(self, ino: int, chunk_size: int, durable: bool,
                 replica_drives: tuple[int, ...], mtime_ns: int | None) -> FinishedSlice:
        """This slice, every byte stored, as its commit names it (``drive_id`` and
        ``group`` set by its first piece; ``mtime_ns``: the last write's time)."""
        assert self.drive_id is not None and self.group is not None
        return FinishedSlice(
            ino=ino, chunk_index=self.chunk_index,
            chunk_offset=self.start - self.chunk_index * chunk_size, slice_id=self.slice_id,
            length=self.length, drive_id=self.drive_id, group=self.group,
            registered=self.registered, durable=durable, replica_drives=replica_drives,
            mtime_ns=mtime_ns)

    def fits_inline(self, limit: int, committed_size: int) -> bool:
        """Is this a whole file of at most ``limit`` bytes written at once: it
        starts the file, covers every byte committed before (``committed_size``),
        and none of it has left the buffer? (``FileWriter._commit_inline``)"""
        return 0 < self.length <= limit and self.start == 0 == self.submitted and (
            committed_size <= self.end)


def write_would_wait(s: OpenSlice | None, offset: int, n: int, *, config: ClientConfig,
                     chunk_size: int, budget: WriteBudget, settling: SettlingSlices,
                     node: SliceNode, group: int) -> bool:
    """Could a writer whose open slice is ``s`` wait for budget, a piece, a slice
    or the placement of a new slice of ``group`` (a tier read from meta) to
    ``write(offset, n bytes)``? (``FileWriter.write(wait=False)``)"""
    if not budget.has_room(n):
        return True
    sequential = s is not None and s.end == offset and s.chunk_index == offset // chunk_size
    pending = len(s.pending) if sequential and s is not None else 0
    in_flight = s.inflight_bytes() if sequential and s is not None and s.inflight else 0
    if in_flight + pending + n > config.file_buffer_bytes:
        return True  # the per-file bound: write() would reap its oldest piece
    # Slices this write ends: the open one if it does not continue it, and
    # one for every chunk end it reaches.
    ends = (offset + n) // chunk_size - offset // chunk_size
    ends += 1 if s is not None and not sequential else 0
    if ends and settling.running() + ends > config.max_settling_slices:
        return True
    # Room in the drive's queue for what is submitted: the pieces this write
    # fills and the last pieces of the slices it ends (the open slice's
    # pending bytes included). A slice not placed yet may go to any drive.
    if pending + n >= config.piece_size or ends:
        queued = n + (len(s.pending) if s is not None else 0)
        drive = s.drive_id if s is not None else None
        if drive is None and not node.placement_known(group):
            return True
        return not node.has_room(drive, queued)
    return False
