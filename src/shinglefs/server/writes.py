"""A storage server's side of the write scheduling across clients.

Its drives' write schedulers merge the pieces every client sends into zone
runs (store/scheduler.py, "Zone runs"). Here: a FLUSH covers the writes
already answered and forces no queued piece out (``flush_answered``), and the
PUT payloads a server holds are bounded per drive (``HeldBytes``), a piece
of the group a drive's writer is on going first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from shinglefs.server.node import PieceFuture, StorageNode
from shinglefs.store.scheduler import WriteScheduler

if TYPE_CHECKING:
    from shinglefs.server.service import ServedNode


def drive_scheduler(node: ServedNode, drive_id: int) -> WriteScheduler | None:
    """A drive's write scheduler (None: the node is not a ``StorageNode``, or the
    store has none: ``abilities.scheduler``); ``UnknownDrive``, ``NodeClosed``."""
    if not isinstance(node, StorageNode):
        return None
    store = node.store(drive_id)
    if not store.abilities.scheduler:
        return None
    scheduler = store.scheduler
    return scheduler if isinstance(scheduler, WriteScheduler) else None


def flush_answered(node: ServedNode, drive_ids: list[int] | None) -> None:
    """A FLUSH: the writes already answered made durable on those drives (None:
    all) by ``WriteScheduler.flush_completed``, which leaves other clients'
    queued pieces queued: one client's fsync cuts no group's zone run short."""
    for drive_id in drive_ids if drive_ids is not None else node.drive_ids:
        scheduler = drive_scheduler(node, drive_id)
        if scheduler is None:
            node.flush([drive_id])
        else:
            scheduler.flush_completed()


class HeldBytes:
    """PUT payloads held (read, not yet stored), per drive, by every connection
    together: a reader waits for room before a PUT's payload. A piece its
    drive's writer waits for (``favoured``: the zone run's group) may go
    ``allowance`` over; ``wake`` when that group changes. ``limit`` <= a
    drive's write queue: no worker waits in its back-pressure.

    A waiting reader never depends on the frames behind it: the held pieces
    may be lingering for one of them (a durable piece of their group, say,
    with a long ``linger_s``), unread behind the reader that waits. So when
    ``STUCK_S`` pass with no held piece stored, the reader expedites the
    oldest held piece of the drive that is still queued (``submitted``;
    ``PieceFuture.expedite``), as the write scheduler's own admission does
    for a submitter waiting for room: a stall of ``STUCK_S``, not of a linger.
    Only when the drive's writer is idle (``idle_only``): one that is writing
    (a long run, a flush: 0.25 s is common with 16 writers on a busy host)
    stores pieces soon without help, and an urgent group ends its zone run
    (expediting regardless cut ``bench cluster``'s mean run per zone switch
    from ~41 to ~27 MiB with 16 writers)."""

    POLL_S = 0.25  # a waiting reader re-asks whether its group became favoured
    STUCK_S = 0.25  # no held piece stored for this long: the oldest queued one is expedited

    def __init__(self, limit: int, allowance: int) -> None:
        self.limit = limit
        self.allowance = allowance
        self.held = 0  # every drive's
        self.peak = 0  # the most one drive's pieces held at once
        self.expedited = 0  # pieces expedited for a stuck reader
        self._by_drive: dict[int, int] = {}
        self._queued: dict[int, dict[int, PieceFuture]] = {}  # drive -> oldest first
        self._stored = 0  # gives so far
        self._cond = threading.Condition()

    def take(self, n: int, drive: int, favoured: Callable[[], bool],
             closed: threading.Event) -> bool:
        """Wait for room for ``n`` bytes (one piece always fits); False once ``closed``."""
        with self._cond:
            waited = 0.0
            while (held := self._by_drive.get(drive, 0)) and held + n > self.limit and not (
                    held + n <= self.limit + self.allowance and favoured()):
                if closed.is_set():
                    return False
                stored = self._stored
                self._cond.wait(self.POLL_S)
                waited = 0.0 if self._stored != stored else waited + self.POLL_S
                if waited >= self.STUCK_S:
                    waited = 0.0
                    self._expedite_oldest(drive)
            self._by_drive[drive] = held + n
            self.held += n
            self.peak = max(self.peak, held + n)
            return True

    def _expedite_oldest(self, drive: int) -> None:
        """Expedite the oldest held piece of ``drive`` still queued if its writer is
        idle (``_cond`` held; released meanwhile: the store may write it in
        this thread, and its done callbacks ``give``). ``expedited`` counts the
        attempts."""
        oldest = next((f for f in self._queued.get(drive, {}).values()
                       if not (f.done() or f.running())), None)
        if oldest is None:
            return
        self.expedited += 1
        self._cond.release()
        try:
            oldest.expedite(idle_only=True)
        finally:
            self._cond.acquire()

    def submitted(self, drive: int, future: PieceFuture) -> None:
        """A held piece of ``drive`` (the key ``take`` counted it under) was handed
        to its store; ``give`` it back with ``future`` once done."""
        with self._cond:
            self._queued.setdefault(drive, {})[id(future)] = future

    def give(self, n: int, drive: int, future: PieceFuture | None = None) -> None:
        with self._cond:
            left = self._by_drive[drive] - n
            if left:
                self._by_drive[drive] = left
            else:  # no entry kept per drive id ever named, only per drive holding bytes
                del self._by_drive[drive]
            self.held -= n
            self._stored += 1
            if future is not None:
                queued = self._queued.get(drive)
                if queued is not None:
                    queued.pop(id(future), None)
            self._cond.notify_all()

    def wake(self) -> None:
        """A drive's writer changed groups: waiting readers ask again."""
        with self._cond:
            self._cond.notify_all()
