"""The deletion consumer: frees on the drives the slices meta queued for deletion.

Meta queues a slice when nothing references it any more (an unlinked file's
last close, a truncate, an overwrite compacted away, a janitor discard).
``DeletionConsumer.run`` pops the queue in batches, makes meta's commits
durable (``MetaStore.sync``: the unreferencing must survive a crash before
the bytes go), deletes each slice from the local drives its replicas name (every drive when none is recorded: a
crash before ``add_slice``), flushes those drives, and only then
acknowledges the batch: a crash never forgets a slice that still holds
space. A slice whose delete fails stays queued (its lease expires) and is
tried again later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from shinglefs.client.config import ClientConfig
from shinglefs.meta.api import MetaStore
from shinglefs.server.node import SliceNode

log = logging.getLogger(__name__)

__all__ = ["DeletionConsumer"]


class DeletionConsumer:
    """Deletes queued slices; ``before`` runs first on every pass (the closes
    queued so far, whose files may be freed by them)."""

    def __init__(
        self,
        meta: MetaStore,
        node: SliceNode,
        config: ClientConfig,
        *,
        forget_slice: Callable[[int], None],
        before: Callable[[], object],
    ) -> None:
        self.meta = meta
        self.node = node
        self.config = config
        self._forget_slice = forget_slice  # drop a deleted slice from the read cache
        self._before = before
        self._lock = threading.Lock()
        self.deleted_slices = 0

    def run(self) -> int:
        """Delete the slices queued by meta from their drives, then acknowledge them.

        Deletes are made durable on the drives before the acknowledgment, so a
        crash never forgets a slice that still holds space. One pass at a time:
        a call made while another thread runs one waits for it, so on return
        everything queued before the call is deleted. Returns the count.
        """
        self._before()  # files freed by closes queued so far are deleted too
        with self._lock:  # a concurrent pass holds leases: wait for it to finish
            return self._run_locked()

    def _run_locked(self) -> int:
        total = 0
        while True:
            batch = self.meta.pop_deletions(self.config.deletion_batch)
            if not batch:
                return total
            # The commits that unreferenced these slices become durable before
            # their bytes go: a backend that commits lazily (SQLite's or
            # PostgreSQL's synchronous=normal) could lose them in a power cut
            # or a database server crash and come back referencing them.
            self.meta.sync()
            done: list[int] = []
            drives: set[int] = set()
            for info in batch:
                try:
                    local = [d for r in info.replicas
                             if (d := self.node.drive_of_replica(r)) is not None]
                    if not local:  # no replica recorded (crash before add_slice): ask every drive
                        self.node.delete(info.id)
                        drives.update(self.node.drive_ids)
                    for drive_id in local:
                        if drive_id in self.node.drive_ids:
                            self.node.delete(info.id, drive_id)
                            drives.add(drive_id)
                    self._forget_slice(info.id)
                    done.append(info.id)
                except Exception:
                    log.exception("deleting slice %#x failed; it stays queued", info.id)
            if drives or done:
                self.node.flush(sorted(drives) if drives else None)
            self.meta.ack_deletions(done)
            total += len(done)
            self.deleted_slices += len(done)
            if len(batch) < self.config.deletion_batch:
                return total
