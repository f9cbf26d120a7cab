"""A storage node's space ledger: what its drives can still take, each byte counted once.

``StorageNode.reserve`` must say ENOSPC from ``write(2)`` itself when the
space is gone (never only at ``close``), and must not say it while room is
left. A drive's own figure (``SliceStore.space().writable_bytes``) is read
at most every ``stats_ttl`` seconds, and afresh before a refusal; between
two reads the ledger counts what happened since.

A piece the node submits is *queued* until its run is published on the
drive (its bytes are in the drive's figure from then on: the write
scheduler's ``on_written``), then *written* until its future completes
(after the batch's flush, which can take long), then *done*. A store
without a scheduler says nothing: its pieces count as written when done.

The invariant, per drive ``d`` and for the figure last read of it:

    room = sum over d of (writable[d] - written_since[d] - queued_unreserved[d])
           - (reserved - written_reserved)

- ``reserved``: what writers accepted (``reserve``) and did not give back. A
  piece submitted with ``reserved=True`` stays in it until done (its writer
  gives it back in a done callback);
- ``written_reserved``: reserved pieces written and not done, on any drive —
  in some figure or in ``written_since``, so taken off ``reserved``;
- ``written_since[d]``: pieces written after ``d``'s figure was read;
- ``queued_unreserved[d]``: pieces submitted with ``reserved=False`` (a
  server's PUT, compaction, a small file stored at once) not written yet.

So a byte a writer accepted or a caller submitted is counted exactly once:
in the figure, in ``written_since``, in ``queued_unreserved``, or in the
reservation. Errors are on the safe side only: a run published just before a
figure is read and told just after (``on_written`` follows ``publish`` at
once, under the drive's write lock) counts twice until the next read, and
so does a piece that failed (counted as written when it completes). Record
headers and block alignment are not counted per piece: each ``reserve`` asks
``RESERVE_SLACK`` beyond its bytes, and the figure keeps back a margin of
zone granularity.

What it does not see: the room is a sum over drives, and a byte goes to the
drive its slice was placed on. A drive whose slices continue past its
figure (a continuing slice may take the drive's reserve zones) makes the
sum refuse while another drive has room. Placement keeps that rare: it
weighs each drive's figure less what is queued or written since and the
unused claims of its open slices (``StorageNode.place``). When it counted a
slice's queued bytes in its claim too, filling one file through 2 SMR
drives + 1 conventional of 1.5 GiB with 64 MiB per file in flight was
refused with figures 36/65/103 MB against 63/96/67 MB queued, and 40 MB
were left on the third drive after close.

What this replaces: ``since`` (bytes submitted since the read) less the
reservation counted a reserved piece in flight twice (ENOSPC came early by
the bytes written and not yet completed, and by all in flight between
reads), and a piece submitted before a read and done after it nowhere. An
overlap of ``min(pending, since)`` would over-admit: a piece nobody
reserved is not in ``reserved``.

Thread safety: one lock, never held while calling out except for the
stores' ``space()``; ``written`` runs on a drive's writing thread under its
``io_lock`` and only counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass

from shinglefs.store.api import SliceStoreAPI, StoreSpace


@dataclass(slots=True, eq=False)
class _Piece:
    """A piece the node submitted and whose future has not completed."""

    drive_id: int
    key: tuple[int, int, int]  # (drive, slice, offset): what on_written names
    size: int
    reserved: bool
    written: bool = False


class SpaceLedger:
    """Space figures and the bytes not in them, per drive (module docstring)."""

    def __init__(self, stores: dict[int, SliceStoreAPI], *, stats_ttl: float) -> None:
        self._stores = stores
        self._stats_ttl = stats_ttl
        self._lock = threading.Lock()
        self._figures: dict[int, tuple[float, StoreSpace]] = {}
        # (drive, slice, offset) -> its pieces not done: a retry of a failed piece
        # may come at the same offset before the failed one's future completed.
        self._pieces: dict[tuple[int, int, int], list[_Piece]] = {}
        self._pending: dict[int, int] = dict.fromkeys(stores, 0)  # submitted, not done
        self._queued: dict[int, int] = dict.fromkeys(stores, 0)  # submitted, not written
        self._queued_unreserved: dict[int, int] = dict.fromkeys(stores, 0)
        self._written_since: dict[int, int] = dict.fromkeys(stores, 0)
        self._written_reserved = 0
        self.reserved = 0

    # ------------------------------------------------------------------ figures
    def figure(self, drive_id: int) -> StoreSpace:
        """A drive's space figures, read at most every ``stats_ttl``."""
        with self._lock:
            return self._figure(drive_id)

    def _figure(self, drive_id: int) -> StoreSpace:
        now = time.monotonic()
        cached = self._figures.get(drive_id)
        if cached is not None and now - cached[0] < self._stats_ttl:
            return cached[1]
        # Under the lock: a run told written before the read is in the figure,
        # one told after it counts in written_since.
        figure = self._stores[drive_id].space()
        self._figures[drive_id] = (now, figure)
        self._written_since[drive_id] = 0
        return figure

    def forget_figures(self) -> None:
        """The next question reads every drive's figure afresh."""
        with self._lock:
            self._figures.clear()

    def estimated_free(self, drive_id: int) -> tuple[int, StoreSpace]:
        """What ``drive_id`` can still take, and its figure: the figure less what
        was written since and everything queued to it, reserved or not
        (placement weighs drives; it admits no bytes)."""
        with self._lock:
            figure = self._figure(drive_id)
            unseen = self._written_since[drive_id] + self._queued[drive_id]
            return figure.writable_bytes - unseen, figure

    def pending(self, drive_id: int) -> int:
        """Bytes submitted to ``drive_id`` whose futures have not completed."""
        with self._lock:
            return self._pending[drive_id]

    # ------------------------------------------------------------------ reservations
    def room(self, drive_ids: Iterable[int], *, fresh: bool) -> tuple[int, int]:
        """``(room, zones_collecting)``: the module docstring's room (``fresh``:
        every figure read now) and the zones the drives' GC is collecting."""
        with self._lock:
            return self._room(drive_ids, fresh=fresh)

    def _room(self, drive_ids: Iterable[int], *, fresh: bool) -> tuple[int, int]:
        if fresh:
            self._figures.clear()
        room = collecting = 0
        for drive_id in drive_ids:
            figure = self._figure(drive_id)
            room += (figure.writable_bytes - self._written_since[drive_id]
                     - self._queued_unreserved[drive_id])
            collecting += figure.zones_collecting
        return room - (self.reserved - self._written_reserved), collecting

    def take(self, nbytes: int, need: int, drive_ids: list[int]) -> tuple[bool, int, int]:
        """Reserve ``nbytes`` if ``need`` bytes fit the room, reading every figure
        afresh before saying no; returns ``(taken, room, zones_collecting)``
        (``zones_collecting`` of the fresh figures when not taken, else 0)."""
        with self._lock:
            room, _ = self._room(drive_ids, fresh=False)
            collecting = 0
            if room < need:
                room, collecting = self._room(drive_ids, fresh=True)
            if room < need:
                return False, room, collecting
            self.reserved += nbytes
            return True, room, 0

    def give_back(self, nbytes: int) -> None:
        """Return what ``take`` reserved (the bytes were stored or dropped)."""
        with self._lock:
            self.reserved -= nbytes

    # ------------------------------------------------------------------ pieces
    def submitted(self, drive_id: int, slice_id: int, offset: int, size: int, *,
                  reserved: bool) -> _Piece:
        """A piece goes to ``drive_id``: queued (``reserved``: its writer's
        reservation holds it until it is done). Before the store sees it, so
        that ``written`` always finds it. Returns its token for
        ``withdrawn`` or ``settle_when_done``."""
        piece = _Piece(drive_id, (drive_id, slice_id, offset), size, reserved)
        if not size:
            return piece
        with self._lock:
            self._pieces.setdefault(piece.key, []).append(piece)
            self._pending[drive_id] += size
            self._queued[drive_id] += size
            if not reserved:
                self._queued_unreserved[drive_id] += size
        return piece

    def withdrawn(self, piece: _Piece) -> None:
        """``submitted`` undone: the store did not take the piece."""
        with self._lock:
            if self._forget(piece) and not piece.written:
                self._queued[piece.drive_id] -= piece.size
                if not piece.reserved:
                    self._queued_unreserved[piece.drive_id] -= piece.size

    def _forget(self, piece: _Piece) -> bool:
        """Drop a piece that is no longer pending; False if it was not tracked."""
        same = self._pieces.get(piece.key)
        if not same or piece not in same:
            return False
        same.remove(piece)
        if not same:
            del self._pieces[piece.key]
        self._pending[piece.drive_id] -= piece.size
        return True

    def written(self, drive_id: int, pieces: list[tuple[int, int]]) -> None:
        """The drive published these ``(slice, offset)`` pieces: its figure holds them
        (``WriteScheduler.on_written``; pieces the node did not submit are not here)."""
        with self._lock:
            for slice_id, offset in pieces:
                for piece in self._pieces.get((drive_id, slice_id, offset), ()):
                    if not piece.written:
                        self._mark_written(piece)
                        break

    def _mark_written(self, piece: _Piece) -> None:
        piece.written = True
        self._queued[piece.drive_id] -= piece.size
        self._written_since[piece.drive_id] += piece.size
        if piece.reserved:
            self._written_reserved += piece.size
        else:
            self._queued_unreserved[piece.drive_id] -= piece.size

    def settle_when_done(self, future: Future[None], piece: _Piece) -> None:
        """Count ``piece`` done when ``future`` completes. Call before the
        submitter adds its callbacks (they run in the order added): the piece
        leaves ``written_reserved`` before its writer gives back its
        reservation."""
        def _done(_f: Future[None]) -> None:
            with self._lock:
                if not self._forget(piece):
                    return
                if not piece.written:
                    # Not told (no scheduler, or a failed write that may have used
                    # part of a zone): counted written now, until the next read.
                    self._mark_written(piece)
                if piece.reserved:
                    self._written_reserved -= piece.size

        future.add_done_callback(_done)
