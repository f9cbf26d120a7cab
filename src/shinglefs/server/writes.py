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

from shinglefs.server.node import StorageNode
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
    drive's write queue: no worker waits in its back-pressure."""

    POLL_S = 0.25  # a waiting reader re-asks whether its group became favoured

    def __init__(self, limit: int, allowance: int) -> None:
        self.limit = limit
        self.allowance = allowance
        self.held = 0  # every drive's
        self.peak = 0  # the most one drive's pieces held at once
        self._by_drive: dict[int, int] = {}
        self._cond = threading.Condition()

    def take(self, n: int, drive: int, favoured: Callable[[], bool],
             closed: threading.Event) -> bool:
        """Wait for room for ``n`` bytes (one piece always fits); False once ``closed``."""
        with self._cond:
            while (held := self._by_drive.get(drive, 0)) and held + n > self.limit and not (
                    held + n <= self.limit + self.allowance and favoured()):
                if closed.is_set():
                    return False
                self._cond.wait(self.POLL_S)
            self._by_drive[drive] = held + n
            self.held += n
            self.peak = max(self.peak, held + n)
            return True

    def give(self, n: int, drive: int) -> None:
        with self._cond:
            self._by_drive[drive] -= n
            self.held -= n
            self._cond.notify_all()

    def wake(self) -> None:
        """A drive's writer changed groups: waiting readers ask again."""
        with self._cond:
            self._cond.notify_all()
