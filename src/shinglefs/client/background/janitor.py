"""The janitor: finds the slices dead writers left behind and queues them for deletion.

A slice is registered (``add_slice``) WRITING when its first piece is
stored, and committed when it ends. While it is in progress, the session
heartbeat of the client writing it vouches for it (``touch_slices``, every
``ClientConfig.heartbeat_interval``, at most a quarter of the abandoned
age): its registration time moves to now. So a WRITING slice that nobody
vouched for within ``abandoned_slice_age`` belongs to a writer that died or
went silent that long: any client's janitor may discard it, whichever
client or process was writing it. The janitor asks meta for such slices,
spares the ones this client is writing right now (its own heartbeat may not
have run yet), and has meta discard the rest (``discard_slices`` queues a
slice only while it is still WRITING with no reference); the deletion
consumer then frees their bytes. A writer silent that long loses the slice:
its commit is refused (ESTALE), while the discarded record is queued and
after it is gone (a registered slice commits only onto its own record).

What this assumes: every client of the file system heartbeats well within
every other client's ``abandoned_slice_age`` (10 s against 6 h by default),
and host clocks agree to well within that age (the registration time is
the writer's clock, the cutoff the janitor's). A compaction's new slice is
not vouched for: it is written and committed in one go, far below the age.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from shinglefs.client.writer import FileWriter
from shinglefs.meta.api import MetaStore

log = logging.getLogger(__name__)

__all__ = ["Janitor", "slices_in_progress"]


def slices_in_progress(writers: Iterable[FileWriter]) -> set[int]:
    """The ids of every slice ``writers`` have not committed yet (open or settling)."""
    return {sid for w in writers for sid in w.slice_ids_in_progress()}


class Janitor:
    """Queues abandoned slices; ``writers()`` lists this client's writers,
    ``wake()`` starts a deletion pass."""

    def __init__(
        self,
        meta: MetaStore,
        *,
        abandoned_age: float,
        writers: Callable[[], list[FileWriter]],
        wake: Callable[[], None],
    ) -> None:
        self.meta = meta
        self.abandoned_age = abandoned_age
        self._writers = writers
        self._wake = wake

    def run(self, older_than_s: float | None = None, limit: int = 1000) -> int:
        """Queue for deletion the WRITING slices of dead or silent writers; returns the count.

        A slice registered or last vouched for by its writer's heartbeat more
        than ``older_than_s`` ago (default ``abandoned_age``:
        ``ClientConfig.abandoned_slice_age``) and never committed is queued
        (in meta, one transaction); the deletion pass is woken. Slices this
        client is writing right now are never discarded; a live writer of
        another client or process is safe when its heartbeat runs well within
        the age (module docstring). Raises what the meta calls raise.
        """
        age = self.abandoned_age if older_than_s is None else older_than_s
        mine = slices_in_progress(self._writers())
        candidates = [i.id for i in self.meta.abandoned_slices(age, limit) if i.id not in mine]
        if not candidates:
            return 0
        queued = self.meta.discard_slices(candidates)
        if queued:
            log.info("janitor: %d abandoned slices queued for deletion", len(queued))
            self._wake()
        return len(queued)
