"""The janitor: finds the slices crashed writers left behind and queues them for deletion.

A slice registered (``add_slice``) long ago and never committed belongs to a
writer that died mid-slice. The janitor asks meta for such slices, spares
the ones this client is writing right now, and has meta discard the rest
(``discard_slices`` queues a slice only while it is still WRITING with no
reference); the deletion consumer then frees their bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shinglefs.client.writer import FileWriter
from shinglefs.meta.api import MetaStore

log = logging.getLogger(__name__)

__all__ = ["Janitor"]


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
        """Queue for deletion the WRITING slices left by crashed clients; returns the count.

        A slice registered more than ``older_than_s`` ago (default
        ``abandoned_age``: ``ClientConfig.abandoned_slice_age``) and never
        committed is queued. Slices this client is writing right now are
        never discarded.
        """
        age = self.abandoned_age if older_than_s is None else older_than_s
        mine = {sid for w in self._writers() for sid in w.slice_ids_in_progress()}
        candidates = [i.id for i in self.meta.abandoned_slices(age, limit) if i.id not in mine]
        if not candidates:
            return 0
        queued = self.meta.discard_slices(candidates)
        if queued:
            log.info("janitor: %d abandoned slices queued for deletion", len(queued))
            self._wake()
        return len(queued)
