"""A writer's buffers: the client-wide write budget, the open slice and its pending bytes.

:class:`WriteBudget` bounds the bytes all writers of a client hold
(``total_buffer_bytes``: back-pressure, spilling idle writers' pending bytes);
:class:`OpenSlice` is the slice a :class:`~shinglefs.client.writer.FileWriter`
is filling, with its :class:`PendingBytes` (written, not yet submitted) and
its pieces in flight. They hold state only: what is submitted, stored and
committed, and when, is the writer's (client/writer.py).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Protocol

from shinglefs.server.node import PieceFuture


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
        "chunk_index",
        "drive_id",
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

    @property
    def end(self) -> int:
        return self.start + self.length

    def inflight_bytes(self) -> int:
        return sum(n for f, n in self.inflight if not f.done())

    def fits_inline(self, limit: int, committed_size: int) -> bool:
        """Is this a whole file of at most ``limit`` bytes written at once: it
        starts the file, covers every byte committed before (``committed_size``),
        and none of it has left the buffer? (``FileWriter._commit_inline``)"""
        return 0 < self.length <= limit and self.start == 0 == self.submitted and (
            committed_size <= self.end)
