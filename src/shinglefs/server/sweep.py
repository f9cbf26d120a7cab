"""The orphan sweep: a storage server deletes the copies on its drives that no
slice record names, once they are older than a grace period.

Where orphans come from. A client sends a slice's bytes to the servers
before the record that references them reaches meta (the ordered-commit
rule, client/commit.py): a client killed between the two leaves copies that
nothing names — a slice stored in one piece is recorded only by its commit,
a longer one is recorded WRITING after its first piece (``register_slice``).
A replica the repairer dropped from a record while its server was gone
(server/repair.py) stays on that server's drive when it returns; so does a
repairer's copy of a slice deleted while it was being copied, or a copy
whose recording failed.

What a pass does (``Sweeper.run_once``), per drive of this server, over at
most ``checks_per_pass`` of the slices the drive holds (in id order, resuming
where the last pass stopped: a large drive is covered over several passes),
in batches of ``SLICE_RECORDS_BATCH`` (one ``MetaStore.slice_records`` read
each):

- a slice whose record names this server's drive as a replica is kept,
  whatever its state (a TO_DELETE one is the deletion consumers' to delete);
- a slice recorded WRITING is kept: a client may be writing it, and a
  crashed client's one is the janitor's (client/background/janitor.py, the
  same rule as an embedded file system's: WRITING slices are discarded
  after ``abandoned_slice_age`` and freed through the deletion queue);
- a slice recorded COMMITTED or TO_DELETE whose replicas are all on live
  servers (heartbeat within ``SERVER_TIMEOUT_S``), none of them this drive,
  is a *surplus* copy;
- a slice with no record is *unrecorded*;
- anything else is kept: a record naming a server that is not live now
  might name this very server under an older registration, and a record
  with no replica says nothing of who holds it.

A surplus or unrecorded copy is an orphan; it is deleted once it has been
seen an orphan, at the same stored length, for ``grace_s`` (default
``ORPHAN_GRACE_S``, one hour) by this server's monotonic clock. An
unrecorded one is first *claimed* (``MetaStore.claim_orphans``): in one
transaction, only if it still has no record and its id is below the next id
meta hands out, it gets a TO_DELETE record naming this drive, queued for
deletion with a lease of ``grace_s``. Then the claims are made durable
(``MetaStore.sync``), the copies deleted and the drive flushed. A claimed
record stays queued: once its lease is over, any deletion consumer deletes
the (already gone) copy again and acknowledges it.

Why no live client loses bytes it will commit:

- The age is time since this server first saw the copy as an orphan at its
  present length, on one host's monotonic clock: no clock skew enters, and
  a slice still being written (its length grows) restarts its wait. The
  clock lives in memory: a restart of the server restarts every wait, which
  only delays a deletion.
- A client commits a slice seconds after its last piece is stored (a flush,
  one transaction); the repairer records a copy right after flushing it.
  A commit that arrives while the copy waits finds the record unchanged:
  the next pass sees it named and keeps it.
- The race with a commit inserting the record after the pass read the
  batch: for an unrecorded copy, the claim re-checks inside a transaction.
  The claim's insert and the commit's upsert (``ON CONFLICT``) meet on the
  ``slices`` primary key: if the commit's record came first, the claim does
  nothing and the copy is kept; if the claim came first, the commit fails
  with ESTALE (``SliceStateError``) — the client reports an error instead
  of referencing deleted bytes — for as long as the claimed record lives
  (its lease, ``grace_s``, then until a consumer acknowledges it). A client
  that registers the id after the claim gets EEXIST the same way.
- For a surplus copy the record exists and names other drives, so there is
  nothing to claim: the grace alone covers a record that is about to name
  this drive (a client's commit after a replica moved mid-write, a
  repairer's copy being recorded). Such a record names the copy within
  seconds of its last byte, an hour is the margin.
- Meta restored from an older backup would leave the drives holding slices
  it never heard of: an id at or above meta's slice id counter is never
  claimed (logged), and the surplus rule needs a record. Ids of a batch a
  process took before the backup and used after it are not told apart:
  after restoring meta, stop the servers' sweeps (``--sweep-interval 0``)
  until fsck has run.

Limits: one pass holds a sorted list of every slice id of a drive (the
store's index gives no ordered cursor). A copy deleted and rewritten at the
same length between two passes (a repairer retrying a failed copy) keeps
its old wait; its record follows its flush within milliseconds. The store
records no write time per slice, which would make the age durable.

Thread safety: one ``Sweeper`` runs in one thread (``StorageServer``'s
sweep thread).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from shinglefs.errors import ShingleError
from shinglefs.meta.api import (
    SLICE_RECORDS_BATCH,
    MetaStore,
    Replica,
    SliceInfo,
    SliceState,
)
from shinglefs.server.errors import SliceMissing
from shinglefs.server.node import StorageNode
from shinglefs.store.slice_store import SliceStore

log = logging.getLogger(__name__)

ORPHAN_GRACE_S = 3600.0
"""How long a copy must be seen an orphan before it is deleted (module docstring)."""
SWEEP_INTERVAL_S = 300.0
"""Seconds between a storage server's sweep passes."""
CHECKS_PER_PASS = 100_000
"""Slices of one drive checked against meta per pass."""
MAX_WAITING = 200_000
"""Orphans one server tracks at once (their waits); more wait for a later pass."""


@dataclass(slots=True)
class SweepCounts:
    """What one pass (or every pass so far) found and did."""

    checked: int = 0  # copies looked up in meta
    waiting: int = 0  # orphans still within their grace
    swept: int = 0  # orphan copies deleted
    swept_bytes: int = 0
    kept: int = 0  # ripe orphans a record or meta's id counter saved at the claim

    def add(self, other: SweepCounts) -> None:
        self.checked += other.checked
        self.waiting += other.waiting
        self.swept += other.swept
        self.swept_bytes += other.swept_bytes
        self.kept += other.kept


def held_slice_ids(node: StorageNode, drive_id: int) -> list[int]:
    """The ids of the slices drive ``drive_id`` of ``node`` holds, ascending (a
    snapshot). Through the concrete ``SliceStore.slice_ids``: neither the store
    contract nor ``StorageNode`` lists a drive's slices (a store of another
    kind lists none, and is never swept)."""
    store = node.store(drive_id)
    if not isinstance(store, SliceStore):
        return []
    return sorted(store.slice_ids())


def _batches(ids: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for at in range(0, len(ids), size):
        yield ids[at:at + size]


class Sweeper:
    """Deletes the orphan copies on this server's drives (module docstring).

    ``clock``: seconds, monotonic (tests pass their own to decide when a
    grace is over)."""

    def __init__(self, meta: MetaStore, node: StorageNode, server_id: int, *,
                 grace_s: float = ORPHAN_GRACE_S, checks_per_pass: int = CHECKS_PER_PASS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if grace_s < 0 or checks_per_pass < 1:
            raise ValueError(f"grace {grace_s} s must not be negative and checks per pass "
                             f"{checks_per_pass} positive")
        self.meta = meta
        self.node = node
        self.server_id = server_id
        self.grace_s = grace_s
        self.checks_per_pass = checks_per_pass
        self.clock = clock
        self.totals = SweepCounts()  # every pass so far (statistics)
        self.passes = 0
        # drive -> {slice id: (first seen an orphan, length then)}
        self._waiting: dict[int, dict[int, tuple[float, int]]] = {}
        self._cursor: dict[int, int] = {}  # drive -> the last slice id checked

    def run_once(self) -> SweepCounts:
        """One pass over (part of) every drive; returns its counts. A drive whose
        pass fails (meta unreachable included) is logged and tried at the next
        pass; what was deleted before the failure stays deleted and counted."""
        live = {str(s.id) for s in self.meta.list_servers() if s.live}
        counts = SweepCounts()
        for drive in self.node.drive_ids:
            try:
                self._sweep_drive(drive, live, counts)
            except (ShingleError, OSError) as exc:
                log.warning("orphan sweep of drive %d of server %d failed: %s; trying again "
                            "at the next pass", drive, self.server_id, exc)
        self.passes += 1
        self.totals.add(counts)
        if counts.swept or counts.kept:
            log.info("orphan sweep of server %d: %d copies (%d bytes) deleted, %d waiting for "
                     "their grace, %d kept at the claim, %d checked", self.server_id,
                     counts.swept, counts.swept_bytes, counts.waiting, counts.kept,
                     counts.checked)
        return counts

    def _window(self, drive: int) -> list[int]:
        """The slice ids of ``drive`` this pass checks: up to ``checks_per_pass``
        after the cursor, which starts over at the drive's end."""
        ids = held_slice_ids(self.node, drive)
        after = self._cursor.get(drive, -1)
        start = bisect.bisect_right(ids, after)
        window = ids[start:start + self.checks_per_pass]
        self._cursor[drive] = window[-1] if start + len(window) < len(ids) else -1
        waiting = self._waiting.setdefault(drive, {})
        if window:  # forget the waits of slices no longer on the drive
            lo, hi, held = window[0], window[-1], set(window)
            for sid in [s for s in waiting if lo <= s <= hi and s not in held]:
                del waiting[sid]
        return window

    def _sweep_drive(self, drive: int, live: set[str], counts: SweepCounts) -> None:
        for batch in _batches(self._window(drive), SLICE_RECORDS_BATCH):
            lengths: dict[int, int] = {}
            for sid in batch:
                try:
                    lengths[sid] = self.node.length(sid, drive)
                except SliceMissing:  # deleted since the listing
                    continue
            records = self.meta.slice_records(list(lengths))
            counts.checked += len(lengths)
            ripe = self._ripe(drive, lengths, records, live, counts)
            self._delete(drive, ripe, lengths, records, counts)

    def _ripe(self, drive: int, lengths: dict[int, int], records: dict[int, SliceInfo],
              live: set[str], counts: SweepCounts) -> list[int]:
        """The orphans of a batch whose grace is over; starts the wait of new ones."""
        waiting = self._waiting[drive]
        now = self.clock()
        mine = Replica(str(self.server_id), str(drive))
        ripe = []
        for sid, length in lengths.items():
            if not _orphan(records.get(sid), mine, live):
                waiting.pop(sid, None)
                continue
            seen = waiting.get(sid)
            first = seen[0] if seen is not None and seen[1] == length else now
            if seen is None and len(waiting) >= MAX_WAITING:
                continue
            waiting[sid] = (first, length)
            if now - first >= self.grace_s:
                ripe.append(sid)
            else:
                counts.waiting += 1
        return ripe

    def _delete(self, drive: int, ripe: list[int], lengths: dict[int, int],
                records: dict[int, SliceInfo], counts: SweepCounts) -> None:
        """Claim the unrecorded ones of ``ripe``, then delete every one still an
        orphan from ``drive`` and flush it."""
        if not ripe:
            return
        unrecorded = {sid: lengths[sid] for sid in ripe if sid not in records}
        claimed = set(self.meta.claim_orphans(self.server_id, drive, unrecorded, self.grace_s)
                      if unrecorded else [])
        kept = [sid for sid in unrecorded if sid not in claimed]
        if kept:
            counts.kept += len(kept)
            self._explain_kept(kept)
        doomed = [sid for sid in ripe if sid in records or sid in claimed]
        if claimed:
            self.meta.sync()  # the claims survive a crash before the bytes go
        waiting = self._waiting[drive]
        for sid in doomed:
            self.node.delete(sid, drive)
            waiting.pop(sid, None)
            counts.swept += 1
            counts.swept_bytes += lengths[sid]
            log.info("orphan copy of slice %#x (%d bytes, %s) deleted from drive %d",
                     sid, lengths[sid], "surplus" if sid in records else "unrecorded", drive)
        if doomed:
            self.node.flush([drive])

    def _explain_kept(self, kept: list[int]) -> None:
        """Log why ripe unrecorded copies were not claimed: a record came first
        (a commit racing the sweep), or meta never handed their ids out."""
        records = self.meta.slice_records(kept)
        never = [sid for sid in kept if sid not in records]
        if len(never) < len(kept):
            log.info("%d orphan copies got a record before their claim: kept",
                     len(kept) - len(never))
        if never:
            log.warning("drives of server %d hold %d slice(s) with ids meta never handed out "
                        "(e.g. %#x): was meta restored from an older backup? They are kept; "
                        "run fsck", self.server_id, len(never), never[0])


def _orphan(record: SliceInfo | None, mine: Replica, live: set[str]) -> bool:
    """Whether a copy on drive ``mine`` with this record is an orphan
    (module docstring): unrecorded, or surplus."""
    if record is None:
        return True
    if mine in record.replicas or record.state == SliceState.WRITING:
        return False
    return bool(record.replicas) and all(r.server in live for r in record.replicas)
