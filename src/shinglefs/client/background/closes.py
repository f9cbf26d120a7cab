"""Deferred closes: the last close of a handle reaches meta in a group, one transaction a session.

With ``deferred_close``, ``VFS.release`` queues ``(session, inode)`` here
instead of running ``MetaStore.close_file`` in the caller's thread; the
scheduler drains the queue on every pass, and at once when ``CLOSE_BATCH``
closes are waiting. Deferring costs nothing visible: the open-file row only
keeps an unlinked inode alive, so the worst effect is a freed file's slices
deleted up to one pass later. ``DeletionConsumer.run`` and ``VFS.shutdown``
drain first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from shinglefs.meta.api import MetaStore

__all__ = ["CLOSE_BATCH", "CloseQueue"]

CLOSE_BATCH = 256  # queued closes that wake the scheduler early


class CloseQueue:
    """Closes released by this client and not yet closed in meta (thread-safe)."""

    def __init__(self, meta: MetaStore, wake: Callable[[], None]) -> None:
        self.meta = meta
        self._wake = wake
        self._lock = threading.Lock()
        self._closes: list[tuple[int, int]] = []  # (session, ino)

    def put(self, session: int, ino: int) -> None:
        """Queue the close of one handle of ``ino`` opened in ``session``."""
        with self._lock:
            self._closes.append((session, ino))
            many = len(self._closes) >= CLOSE_BATCH
        if many:
            self._wake()

    def drain(self) -> int:
        """Close every queued handle in meta, one transaction a session; returns
        the number of inodes freed. On failure the closes stay queued (in
        order, ahead of newer ones) for the next drain, and the error is raised."""
        with self._lock:
            closes, self._closes = self._closes, []
        if not closes:
            return 0
        by_session: dict[int, list[int]] = {}
        for session, ino in closes:
            by_session.setdefault(session, []).append(ino)
        freed = 0
        try:
            for session, inos in by_session.items():
                freed += len(self.meta.close_files(session, inos))
        except BaseException:
            with self._lock:  # retried by the next drain
                self._closes[:0] = [(s, i) for s, inos in by_session.items() for i in inos]
            raise
        return freed
