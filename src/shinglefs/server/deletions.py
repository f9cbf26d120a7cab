"""A storage server frees its own drives: the copies on them of the slices meta
queued for deletion.

Meta queues a slice when nothing references it any more (an unlinked file's
last close, a truncate, an overwrite compacted away, a janitor discard) and
when a server's orphan sweep claims an unrecorded copy (server/sweep.py: a
TO_DELETE record naming that copy, leased for the grace). A client's
deletion consumer (client/background/deletions.py) frees the replicas on
live servers of what it pops; with no client mounted, nobody did, and the
bytes stayed.
So each server also takes its own share of the queue, every
``--deletion-interval`` seconds (``ServerDeletions.run_once``):

1. ``MetaStore.pop_deletions_on``: the queued slices with a replica on this
   server, leased for ``lease_s`` (another consumer — a server, a client —
   takes none of them meanwhile; a crashed server's are offered again once
   the lease is over), each with its replicas on this server only;
2. ``MetaStore.sync``: the commits that unreferenced them are durable
   before their bytes go (a backend that commits lazily could lose them in
   a power cut and come back referencing the slices);
3. deletes those copies from each drive (one tombstone record for a
   batch on a slice log, ``SliceStore.delete_many``; ``StorageNode.delete``
   one by one on another store; idempotent: a copy already gone is no
   error), then flushes each drive it deleted on, so the deletes are durable;
4. ``MetaStore.ack_replica_deletions``: only then drops this server's
   replicas from the records. A slice left with none is forgotten with its
   queue entry; one with copies on other servers stays queued with its
   lease ended, for the next of them (or a client) at once.

What it never does:

- delete bytes a record still needs: it takes only TO_DELETE slices (no
  commit can reference one again: meta refuses it, ESTALE) and only the
  copies their record names on this server;
- leave a record naming bytes that may be read: between the deletes and the
  acknowledgement the record names deleted copies, but it is TO_DELETE and
  nothing reads it; a crash there (or a failed acknowledgement) leaves the
  slice queued, and a later pass, once the lease is over, deletes again (a
  no-op) and acknowledges;
- touch a slice with no replica recorded (a crash before ``add_slice``
  leaves such WRITING slices, discarded by a janitor): nothing says which
  server holds it, so the clients' consumers free those (they ask every
  live server's drives);
- touch another server's copies: a slice whose other replicas are on a
  server that is down stays queued until that server returns (its own pass
  frees them) or a client's consumer takes it.

A copy on a drive this server does not have open (a drive left out of
``--drive``), or whose delete or flush fails, is left, logged: the slice is
not acknowledged (its other copies here are deleted all the same) and is
offered again once its lease is over. Bounded work: at most ``per_pass``
slices a pass, in batches of ``batch``.

Thread safety: one ``ServerDeletions`` runs in one thread
(``StorageServer``'s deletion thread).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from shinglefs.errors import ShingleError
from shinglefs.meta.api import MetaStore, SliceInfo
from shinglefs.server.node import StorageNode
from shinglefs.store.slice_store import SliceStore

log = logging.getLogger(__name__)

DELETION_INTERVAL_S = 2.0
"""Seconds between a storage server's deletion passes."""
DELETION_BATCH = 500
"""Slices one ``pop_deletions_on`` takes."""
DELETIONS_PER_PASS = 5000
"""Slices one pass takes at most (the rest wait for the next pass)."""
DELETION_LEASE_S = 60.0
"""How long a popped slice is this server's before another consumer may take it."""


@dataclass(slots=True)
class DeletionCounts:
    """What one pass (or every pass so far) did."""

    slices: int = 0  # slices whose copies here were freed and acknowledged
    copies: int = 0  # copies deleted (a slice may have several on this server)
    freed_bytes: int = 0  # their recorded lengths
    left: int = 0  # slices popped but left queued (a copy not deleted here)

    def add(self, other: DeletionCounts) -> None:
        self.slices += other.slices
        self.copies += other.copies
        self.freed_bytes += other.freed_bytes
        self.left += other.left


class ServerDeletions:
    """Frees this server's copies of the slices queued for deletion (module
    docstring)."""

    def __init__(self, meta: MetaStore, node: StorageNode, server_id: int, *,
                 lease_s: float = DELETION_LEASE_S, batch: int = DELETION_BATCH,
                 per_pass: int = DELETIONS_PER_PASS) -> None:
        if lease_s <= 0 or batch < 1 or per_pass < 1:
            raise ValueError(f"lease {lease_s} s, batch {batch} and per pass {per_pass} "
                             "must be positive")
        self.meta = meta
        self.node = node
        self.server_id = server_id
        self.lease_s = lease_s
        self.batch = batch
        self.per_pass = per_pass
        self.totals = DeletionCounts()  # every pass so far (statistics)

    def run_once(self) -> DeletionCounts:
        """One pass: take, free and acknowledge batches until the queue holds no
        more for this server or ``per_pass`` slices were taken; returns its
        counts. A meta failure propagates (what was acknowledged stays so; the
        rest is offered again once its lease is over)."""
        counts = DeletionCounts()
        taken = 0
        try:
            while taken < self.per_pass:
                batch = self.take(min(self.batch, self.per_pass - taken))
                if not batch:
                    break
                taken += len(batch)
                freed = self.free(batch, counts)
                if freed:
                    self.meta.ack_replica_deletions(self.server_id, freed)
                counts.slices += len(freed)
                if len(batch) < self.batch:
                    break
        finally:
            self.totals.add(counts)
            if counts.slices or counts.left:
                log.info("deletion pass of server %d: %d slice(s) freed here (%d copies, %d "
                         "bytes), %d left queued", self.server_id, counts.slices,
                         counts.copies, counts.freed_bytes, counts.left)
        return counts

    def take(self, limit: int | None = None) -> list[SliceInfo]:
        """Pop (lease) up to ``limit`` queued slices with a copy here, each with
        its replicas on this server, then make meta durable
        (``MetaStore.sync``): their bytes may go once this returns."""
        batch = self.meta.pop_deletions_on(self.server_id, limit or self.batch, self.lease_s)
        if batch:
            self.meta.sync()
        return batch

    def free(self, batch: Sequence[SliceInfo], counts: DeletionCounts | None = None) -> list[int]:
        """Delete the copies of ``batch`` on this server's drives and flush those
        drives; returns the ids whose every copy here is deleted durably (to be
        acknowledged). The others stay queued, logged."""
        counts = counts if counts is not None else DeletionCounts()
        drives = set(self.node.drive_ids)
        by_drive: dict[int, list[SliceInfo]] = {}
        failed: set[int] = set()
        for info in batch:
            for replica in info.replicas:
                drive = _drive_id(replica.drive)
                if drive is None or drive not in drives:
                    log.warning("slice %#x queued for deletion names drive %s of server %d, "
                                "which it does not have open: left queued", info.id,
                                replica.drive, self.server_id)
                    failed.add(info.id)
                else:
                    by_drive.setdefault(drive, []).append(info)
        for drive, infos in sorted(by_drive.items()):
            done = self._free_drive(drive, infos, failed)
            counts.copies += len(done)
            counts.freed_bytes += sum(info.length for info in done)
        counts.left += len(failed)
        return [info.id for info in batch if info.id not in failed]

    def _free_drive(self, drive: int, infos: Sequence[SliceInfo],
                    failed: set[int]) -> list[SliceInfo]:
        """Delete ``infos`` from ``drive``, then flush it; returns those deleted
        durably. A slice whose delete fails joins ``failed``; so do all of them
        when the flush fails."""
        try:
            deleted = self._delete(drive, infos, failed)
            if deleted:
                self.node.flush([drive])
        except (ShingleError, OSError) as exc:
            log.warning("deleting %d slice(s) from drive %d failed: %s; they stay queued",
                        len(infos), drive, exc)
            failed.update(info.id for info in infos)
            return []
        return deleted

    def _delete(self, drive: int, infos: Sequence[SliceInfo],
                failed: set[int]) -> list[SliceInfo]:
        """Delete ``infos`` from ``drive`` (durable at its next flush). A slice
        log takes them in one tombstone record (measured: 2,000 slices in 0.14 s
        against 1.4 s one by one); another store one by one, a failure each."""
        store = self.node.store(drive)
        if isinstance(store, SliceStore):
            store.delete_many([info.id for info in infos])
            for info in infos:
                self.node.forget(info.id)
            return list(infos)
        deleted = []
        for info in infos:
            try:
                self.node.delete(info.id, drive)
                deleted.append(info)
            except (ShingleError, OSError) as exc:
                log.warning("deleting slice %#x from drive %d failed: %s; it stays queued",
                            info.id, drive, exc)
                failed.add(info.id)
        return deleted


def _drive_id(text: str) -> int | None:
    """A replica's drive as this server numbers its drives; None if not a number."""
    try:
        return int(text)
    except ValueError:
        return None
