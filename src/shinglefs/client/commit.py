"""Ordered commits: the one place where slice references reach the metadata.

The rule (docs/architecture.md, "Ordered commits"), as a journaling file
system's ordered mode states it: **a reference to a slice — and any file size
that covers it — is committed to meta only after the slice's bytes are
flushed on its drive.** A committed reference therefore points at bytes that
survive a crash of any process and a power cut, whatever the metadata backend
makes durable and when (SQLite's checkpoints, another client's fsync,
PostgreSQL's synchronous commits): no crash can leave meta pointing at bytes
the drive rolled back, so no file ever reads EIO because of a crash.

Every commit of a written slice goes through :meth:`OrderedCommits.commit`:
the writer's inline close, its background settle of slices ended while
writing, and the Python API alike. (Compaction's ``replace_chunk`` follows the
same rule with its own flush, see ``Compactor.compact_chunk``.)

Group commit: a caller that arrives while a batch is being committed waits
and joins the next batch; one caller (the *leader*) then flushes each drive
the batch touches once and commits every reference of the batch in one
metadata transaction (``MetaStore.commit_slices``). A lone caller pays one
drive flush and one transaction; N concurrent closers pay about one each per
batch. No timer: a batch is whatever queued while the previous one ran.

Errors: a failed drive flush fails every commit of its batch that needed it
(the slice's bytes may not be durable: it is never referenced). A failed
batch transaction is retried one commit at a time so each caller gets its own
outcome (one file unlinked meanwhile does not fail the others), except when
the metadata was unreachable (``MetaUnavailable``): the batch may have
committed, so each commit fails with it and its writer keeps the slice's
bytes (``FileWriter``: a reference may name them; fsck finds them otherwise). A slice
registered while it was written (``FinishedSlice.registered``) is committed
only while its record exists: if a janitor discarded it while its writer was
silent past ``abandoned_slice_age`` (its bytes deleted, or about to be), the
commit is refused with ESTALE (``SliceStateError``) and never points a file
at those bytes. The client no longer holds them, so it cannot rewrite them:
the error reaches the writer's caller (``FileWriter``: the next write, or
flush / fsync / close), as a failed write-back would.

Thread safety: ``commit`` may be called from any thread, including the FUSE
event loop (it then waits at most for the batch in progress).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from shinglefs.meta.api import (
    INLINE_SLICE_BIT,
    LOCAL_SERVER,
    InodeAttr,
    MetaStore,
    Replica,
    SliceCommit,
    SliceInfo,
    SliceRef,
    SliceState,
)
from shinglefs.meta.errors import MetaUnavailable
from shinglefs.server.errors import PartialFlush

# Naming replicas. A drive of the client's own process has a small id (its
# position in the drive list recorded at format time); a drive of a storage
# server is ``server_id << DRIVE_BITS | drive_id`` (server ids start at 1), so
# one int names any drive in the client and the writer, deletions and
# compaction need not know which kind it is (server/cluster.py).
DRIVE_BITS = 16
"""A cluster drive id is ``server_id << DRIVE_BITS | drive_id``."""


def cluster_drive_id(server_id: int, drive_id: int) -> int:
    """The client's id for drive ``drive_id`` of server ``server_id`` (ids from 1)."""
    if server_id < 1 or not 0 <= drive_id < 1 << DRIVE_BITS:
        raise ValueError(f"no cluster drive id for server {server_id}, drive {drive_id}")
    return server_id << DRIVE_BITS | drive_id


def split_drive_id(drive_id: int) -> tuple[int, int]:
    """``(server_id, drive_id on that server)`` of a cluster drive id; server 0 is local."""
    return drive_id >> DRIVE_BITS, drive_id & ((1 << DRIVE_BITS) - 1)


def replica_for(drive_id: int) -> Replica:
    """The replica meta records for a slice on ``drive_id`` (local or cluster id)."""
    server, drive = split_drive_id(drive_id)
    return Replica(str(server) if server else LOCAL_SERVER, str(drive))


def drive_for(replica: Replica) -> int | None:
    """The drive id of a recorded replica; None for one this code cannot name."""
    try:
        drive = int(replica.drive)
        if replica.server == LOCAL_SERVER:
            return drive
        return cluster_drive_id(int(replica.server), drive)
    except ValueError:
        return None


def register_slice(meta: MetaStore, slice_id: int, drives: Sequence[int], group: int) -> None:
    """Record a slice being written (WRITING, no reference yet) on the drives that
    took its first piece (its replicas): if the writer dies before committing
    it, the janitor finds it (``Janitor.run``) and the deletion consumer frees
    its bytes."""
    meta.add_slice(
        SliceInfo(
            id=slice_id,
            length=0,
            group=group,
            state=SliceState.WRITING,
            replicas=tuple(replica_for(d) for d in drives),
        )
    )


@dataclass(frozen=True, slots=True)
class FinishedSlice:
    """A slice whose bytes are stored: what the client commits into the chunk map."""

    ino: int
    chunk_index: int
    chunk_offset: int
    slice_id: int
    length: int
    drive_id: int | None  # None: an inline slice (its bytes travel in ``inline``)
    group: int
    # True: registered (add_slice) before its bytes were stored, so its commit
    # needs the record still there (``SliceCommit.registered``); False: meta
    # learns the slice and its replica in the commit itself.
    registered: bool = True
    durable: bool = False  # True: the store already flushed it (no flush needed here)
    inline: bytes | None = None  # the bytes of an inline slice, committed into meta
    replica_drives: tuple[int, ...] = ()  # every drive holding it (default: ``drive_id``'s)
    # The time of the writer's last write before the commit: the file's mtime
    # (and ctime, unless later), as write(2) sets them; None: the commit's time.
    mtime_ns: int | None = None

    @property
    def drives(self) -> tuple[int, ...]:
        """The drives holding the slice's bytes (none for an inline slice)."""
        if self.drive_id is None:
            return ()
        return self.replica_drives or (self.drive_id,)

    @classmethod
    def inline_slice(cls, ino: int, chunk_index: int, chunk_offset: int, slice_id: int,
                     data: bytes, mtime_ns: int | None = None) -> FinishedSlice:
        """A slice whose bytes go into meta with its reference (``SliceCommit.inline``):
        ``slice_id`` becomes an inline id; nothing to flush, nothing on a drive."""
        return cls(ino, chunk_index, chunk_offset, slice_id | INLINE_SLICE_BIT, len(data),
                   None, 0, registered=False, durable=True, inline=data, mtime_ns=mtime_ns)

    def to_commit(self, file_end: int) -> SliceCommit:
        # Always the drives that hold it now: a replica lost while writing goes.
        replicas = tuple(replica_for(d) for d in self.drives)
        return SliceCommit(
            self.ino,
            self.chunk_index,
            SliceRef(self.slice_id, self.chunk_offset, self.length, 0),
            file_end,
            group=self.group,
            slice_length=self.length,
            replicas=replicas,
            inline=self.inline,
            registered=self.registered,
            mtime_ns=self.mtime_ns,
        )


@dataclass(slots=True)
class _Waiting:
    finished: FinishedSlice
    file_end: int
    done: bool = False
    attr: InodeAttr | None = None
    error: BaseException | None = None

    def settle(self, attr: InodeAttr | None, error: BaseException | None) -> None:
        self.attr, self.error, self.done = attr, error, True


class OrderedCommits:
    """Commits finished slices into meta after flushing their drives, in batches.

    ``flush_drives(drive_ids)`` must return only when every write completed
    on those drives before the call is durable (``StorageNode.flush``), or
    raise ``PartialFlush`` naming the drives it could not flush (servers that
    are gone): a slice with another replica is then committed with the
    replicas that were flushed; one with none fails.
    """

    def __init__(self, meta: MetaStore, flush_drives: Callable[[Iterable[int]], None]) -> None:
        self._meta = meta
        self._flush_drives = flush_drives
        self._cond = threading.Condition()
        self._queue: list[_Waiting] = []
        self._leading = False
        self.batches = 0  # transactions run (statistics)
        self.commits = 0  # references committed
        self.drive_flushes = 0

    @property
    def waiting(self) -> int:
        """Commits queued for the next batch (statistics)."""
        with self._cond:
            return len(self._queue)

    def commit(self, finished: FinishedSlice, file_end: int,
               queued: threading.Event | None = None) -> InodeAttr:
        """Flush ``finished``'s drive (unless already durable), then commit its
        reference and grow the file to at least ``file_end``; returns the new
        attributes. Durable against a process crash when it returns; against a
        power cut as soon as meta's own commit is (``MetaStore.sync``).
        ``queued`` is set once this commit holds its place in the queue: a
        commit queued after it is committed after it (a later batch, or later
        in the same batch's transaction), so a file's next slice may queue as
        soon as this one is queued rather than committed."""
        me = _Waiting(finished, file_end)
        with self._cond:
            self._queue.append(me)
            if queued is not None:
                queued.set()
            while self._leading and not me.done:
                self._cond.wait()
            if not me.done:
                self._leading = True
                batch, self._queue = self._queue, []
        if not me.done:
            try:
                self._commit_batch(batch)
            finally:
                for w in batch:  # never leave a waiter unsettled, whatever failed
                    if not w.done:
                        w.settle(None, RuntimeError("group commit failed before this commit ran"))
                with self._cond:
                    self._leading = False
                    self._cond.notify_all()
        if me.error is not None:
            raise me.error
        assert me.attr is not None
        return me.attr

    @staticmethod
    def _without(batch: Sequence[_Waiting], partial: PartialFlush) -> list[_Waiting]:
        """The batch with the drives a flush missed taken out of each slice's
        replicas; a slice left with none fails (its bytes may not be durable)."""
        kept = []
        for w in batch:
            f = w.finished
            if f.durable or not set(f.drives) & partial.failed:
                kept.append(w)
                continue
            left = tuple(d for d in f.drives if d not in partial.failed)
            if not left:
                w.settle(None, partial)
                continue
            w.finished = replace(f, drive_id=left[0], replica_drives=left)
            kept.append(w)
        return kept

    def _commit_batch(self, batch: Sequence[_Waiting]) -> None:
        try:
            needed = sorted({d for w in batch if not w.finished.durable
                             for d in w.finished.drives})
            if needed:
                self.drive_flushes += len(needed)
                self._flush_drives(needed)
        except PartialFlush as partial:
            batch = self._without(batch, partial)
            if not batch:
                return
        except BaseException as exc:
            for w in batch:
                w.settle(None, exc)
            return
        try:
            attrs = self._meta.commit_slices([w.finished.to_commit(w.file_end) for w in batch])
        except BaseException as exc:
            # Unreachable metadata may have committed the batch (a connection lost
            # with COMMIT in flight): retried one at a time, an earlier slice of a
            # file could land again on top of a later one. Each fails instead.
            if len(batch) == 1 or isinstance(exc, MetaUnavailable):
                for w in batch:
                    w.settle(None, exc)
                return
            for w in batch:  # learn each one's own outcome
                try:
                    w.settle(self._meta.commit_slices([w.finished.to_commit(w.file_end)])[0],
                             None)
                except BaseException as one:
                    w.settle(None, one)
                else:
                    self.commits += 1
            self.batches += len(batch)
            return
        for w, attr in zip(batch, attrs, strict=True):
            w.settle(attr, None)
        self.batches += 1
        self.commits += len(batch)
