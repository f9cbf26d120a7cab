"""The write path of one file: a buffer that streams slices to the storage node.

A :class:`FileWriter` holds at most one *open slice*: a run of file bytes
that grows as long as the application writes sequentially within one chunk.
Bytes are appended to a pending buffer; whenever it reaches ``piece_size``
(4 MiB) it is handed to the node as the next piece of the slice, while the
application goes on writing. The slice *ends* (its last piece is stored,
made durable, and its reference committed into the chunk map) when it reaches
the chunk end, on close / flush / fsync, on a non-sequential write, on
truncate, or before a read of the range it covers. A slice ended while the
application goes on writing *settles* on the commit pool, in the order the
file's slices ended (:class:`~shinglefs.client.settling.SettlingSlices`).

Memory: a file holds at most ``file_buffer_bytes`` pending + in flight (a
writer past it waits for its oldest piece); all files of a client together
at most ``total_buffer_bytes`` (:class:`WriteBudget`; a writer past it waits
for anyone's piece to complete: back-pressure).

Errors: a piece that fails in the background is reported by the next call on
this writer (write, flush, fsync, close) as the original typed error, like
Linux reports write-back errors; the failed slice is never committed. So is
a refused commit: ESTALE for a slice a janitor discarded while this writer
was silent past the abandoned age (its bytes are gone; ``client.commit``).
A slice is dead from its first failed piece: none of its pieces is sent
after it, none is ever sent twice, and what its pieces sent before meet is
never reported; running out of space (a storage server refused a piece) is
sticky for writes: every later ``write`` raises ENOSPC, a flush or close
reports it once (client/writefailures.py, ``WriteFailures``).

Thread safety: every public method takes the writer's lock, so one file's
writes are serialised; different files proceed in parallel.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future

from shinglefs.client.commit import FinishedSlice
from shinglefs.client.config import ClientConfig
from shinglefs.client.settling import SettlingSlices
from shinglefs.client.writebuffers import OpenSlice, WriteBudget, write_would_wait
from shinglefs.client.writefailures import WriteFailures
from shinglefs.meta.errors import FsError, MetaUnavailable
from shinglefs.meta.records import MAX_FILE_SIZE
from shinglefs.server.errors import NodeFull
from shinglefs.server.node import Declined, SliceNode, wait_piece
from shinglefs.zoned.model import Buffer

log = logging.getLogger(__name__)


class FileWriter:
    """The write buffer of one inode in one client (shared by all its handles).

    ``new_slice_id()`` allocates slice ids; ``choose_group(small)`` returns the
    lifetime group once per writer (``small``: the file's first slice ended
    below ``small_file_bytes``); ``register(slice_id, drive_id, group)`` is
    called when a slice gets its first piece (meta records the replica);
    ``commit(FinishedSlice, file_end)`` puts a finished slice into the chunk map;
    ``in_doubt(slice_id, drive_id)`` is told of a slice whose commit is in
    doubt (its bytes kept: ``background/indoubt.py`` settles it later).
    """

    def __init__(
        self,
        ino: int,
        *,
        node: SliceNode,
        config: ClientConfig,
        chunk_size: int,
        budget: WriteBudget,
        new_slice_id: Callable[[], int],
        choose_group: Callable[[bool], int],
        register: Callable[[int, int, int], None],
        commit: Callable[[FinishedSlice, int, threading.Event | None], None],
        settler: Executor,
        committed_size: int = 0,
        in_doubt: Callable[[int, int | None], None] | None = None,
    ) -> None:
        self.ino = ino
        self._node = node
        self._config = config
        self._chunk_size = chunk_size
        self._budget = budget
        self._new_slice_id = new_slice_id
        self._choose_group = choose_group
        self._register = register
        self._commit = commit
        self._in_doubt = in_doubt
        self.lock = threading.RLock()
        self.open_slice: OpenSlice | None = None
        self.group: int | None = None
        self._committed_size = committed_size
        self._written_end = 0
        self._appended = 0  # bytes taken into pending buffers, ever (reservation bookkeeping)
        self.written_ns: int | None = None  # the time of the last write (write(2)'s mtime)
        self._noted = threading.Lock()  # _note_committed
        self._failures = WriteFailures()
        self.slices_committed = 0
        self.pieces_submitted = 0
        self._settling = SettlingSlices(settler, config.max_settling_slices)
        budget.register(self)

    # ------------------------------------------------------------------ state
    def _unsettled(self) -> list[tuple[int, int]]:
        """``(start, end)`` of the open slice and of ended slices not yet committed."""
        ranges = self._settling.ranges()
        s = self.open_slice
        if s is not None and s.length > 0:
            ranges.append((s.start, s.end))
        return ranges

    def slice_ids_in_progress(self) -> set[int]:
        """Ids of this writer's slices not yet committed (open or settling)."""
        s = self.open_slice
        ids = {s.slice_id} if s is not None else set()
        ids.update(self._settling.slice_ids())
        return ids

    def buffered_end(self) -> int:
        """A floor for the file size from this writer: the end of every byte written
        through it since it was created or last truncated (committed or not).

        It only grows (truncation lowers it under the writer lock), so
        ``max(meta size, buffered_end())`` is right whichever is read first,
        even while slices settle in the background.
        """
        return self._written_end

    def overlaps(self, offset: int, length: int) -> bool:
        """Must this writer commit before reading ``[offset, offset + length)``?

        True when an uncommitted slice holds bytes of that range, or when the
        range reaches past the committed size into the hole before such a
        slice (which reads as zeros only once the slice is committed and the
        size grown).
        """
        end = offset + length
        return any(
            offset < s_end and (s_start < end or end > self._committed_size)
            for s_start, s_end in self._unsettled()
        )

    def note_committed_size(self, size: int) -> None:
        """The file was truncated to ``size`` (call with the writer lock held)."""
        self._committed_size = size
        self._written_end = min(self._written_end, size)
        self._failures.truncated(size)

    def _raise_pending_error(self, *, writing: bool = False,
                             at: tuple[int, int] | None = None) -> None:
        """Raise what ``WriteFailures.due`` says is due (``writing``: the sticky
        ENOSPC too); drop the open slice then (its bytes are partly lost: rather
        than commit a gap)."""
        s = self.open_slice
        if s is not None and s.failure is not None:
            self._failures.all_answered(s)  # report the first failed piece's failure
        error = self._failures.due(s, writing=writing, at=at)
        if error is None:
            return
        if s is not None:
            self.open_slice = None
            self._abort(s)
        raise error

    # ------------------------------------------------------------------ writing
    def _release(self, n: int) -> None:
        """``n`` accepted bytes were stored or dropped: give back their write
        budget and their reservation of drive space."""
        self._budget.release(n)
        self._node.unreserve(n, self.ino)

    def write(self, offset: int, data: Buffer, *, wait: bool = True) -> int:
        """Buffer ``data`` at ``offset``; returns its length. May block on back-pressure.

        The bytes' drive space is reserved first: a full file system raises
        ``NodeFull`` (ENOSPC) here, with nothing buffered, not at ``close``.

        ``wait=False``: the same if nothing in it has to wait — the writer's
        lock is free, no error is pending, the bytes fit both buffer bounds,
        and the pieces and slices the write completes can be handed to the
        node without waiting (the drive's queue has room, fewer than
        ``max_settling_slices`` slices settle); else raises ``Declined``
        having done nothing (as for an empty write, or when the drives are
        full: ``write`` reports that after what may free space). Never waits
        for a drive (barring a race with another writer for the same queue
        room, which costs one short wait)."""
        view = memoryview(data).cast("B")
        if offset + len(view) > MAX_FILE_SIZE:  # as a file size limit: cut at it, EFBIG there
            if offset >= MAX_FILE_SIZE:
                raise FsError(errno.EFBIG, f"write at {offset}: past the largest file size, "
                              f"{MAX_FILE_SIZE}", ino=self.ino)
            view = view[:MAX_FILE_SIZE - offset]
        if view:  # the file's mtime when these bytes commit (FinishedSlice.mtime_ns)
            self.written_ns = time.time_ns()
        if not wait:
            return self._write_at_once(offset, view)
        with self.lock:
            self._raise_pending_error(writing=True, at=(offset, len(view)))
            if not view:
                return 0
            self._node.reserve(len(view), self.ino)
            return self._write_with_reservation(offset, view)

    def _write_at_once(self, offset: int, view: memoryview) -> int:
        """``write(wait=False)``."""
        n = len(view)
        if not n or not self.lock.acquire(blocking=False):
            raise Declined("the file's writer is busy" if n else "an empty write")
        try:
            if not self._failures.healthy(self.open_slice) or write_would_wait(
                    self.open_slice, offset, n, config=self._config, chunk_size=self._chunk_size,
                    budget=self._budget, settling=self._settling, node=self._node,
                    group=self.group if self.group is not None else self.ino):
                raise Declined("the write would wait")
            try:
                self._node.reserve(n, self.ino)
            except NodeFull:
                raise Declined("the drives are full") from None
            return self._write_with_reservation(offset, view)
        finally:
            self.lock.release()

    def _write_with_reservation(self, offset: int, view: memoryview) -> int:
        """``write`` once the bytes' space is reserved (writer lock held)."""
        total = len(view)
        appended_before = self._appended
        try:
            self._append_all(offset, view)
        except BaseException:
            self._node.unreserve(total - (self._appended - appended_before), self.ino)
            raise
        self._written_end = max(self._written_end, offset + total)
        return total

    def _append_all(self, offset: int, view: memoryview) -> None:
        pos = offset
        while view:
            chunk_index = pos // self._chunk_size
            chunk_end = (chunk_index + 1) * self._chunk_size
            n = min(len(view), chunk_end - pos)
            s = self.open_slice
            if s is None or s.end != pos or s.chunk_index != chunk_index:
                if s is not None:
                    self._finish(s, wait=False)
                s = self.open_slice = OpenSlice(self._new_slice_id(), chunk_index, pos)
            self._append(s, view[:n])
            if s.end == chunk_end:
                self._finish(s, wait=False)
            pos += n
            view = view[n:]

    def _append(self, s: OpenSlice, data: memoryview) -> None:
        piece = self._config.piece_size
        while data:
            part = data[: piece - len(s.pending)]
            n = len(part)
            # Per-file bound: pending + in flight stay under file_buffer_bytes.
            while s.inflight and s.inflight_bytes() + len(s.pending) + n > (
                self._config.file_buffer_bytes
            ):
                self._reap_oldest(s)
            self._budget.acquire(n, self)
            s.pending.add(part)
            self._appended += n
            s.length += n
            data = data[n:]
            if len(s.pending) >= piece:
                self._submit_pending(s, durable=False, ending=False)

    def _decide_group(self, s: OpenSlice, ending: bool) -> int:
        if self.group is None:
            small = ending and s.end < self._config.small_file_bytes and s.start == 0
            small = small and self._committed_size <= s.end
            self.group = self._choose_group(small)
        return self.group

    def _submit_pending(self, s: OpenSlice, *, durable: bool, ending: bool) -> None:
        """Send the pending bytes of ``s`` as its next piece. A dead slice sends
        nothing more: its failure is raised (``_raise_pending_error``, which
        drops it); so is a ``submit`` that fails at once (its bytes never left:
        given back)."""
        if s.failure is not None:
            self._raise_pending_error()
            raise s.failure  # (only the open slice is ever submitted: never reached)
        n = len(s.pending)
        if n == 0:
            return
        if s.group is None:
            s.group = self._decide_group(s, ending)
        data = s.pending.take()
        first = s.drive_id is None
        try:
            drive_id, future = self._node.submit(  # reserved: released in _done
                s.slice_id, s.submitted, data, s.group, drive_id=s.drive_id, durable=durable,
                reserved=True)
        except BaseException as exc:
            self._release(n)
            self._failures.piece_failed(s, exc)
            self._raise_pending_error()
            raise
        release, failures = self._release, self._failures

        def _done(f: Future[None], n: int = n) -> None:
            release(n)
            failures.piece_done(s, f)

        future.add_done_callback(_done)
        s.inflight.append((future, n))
        s.submitted += n
        self.pieces_submitted += 1
        if first:
            s.drive_id = drive_id
            if not ending:  # a slice stored in one piece is registered by its commit
                self._register(s.slice_id, drive_id, s.group)
                s.registered = True

    def _reap_oldest(self, s: OpenSlice) -> None:
        future, _n = s.inflight.popleft()
        assert s.drive_id is not None
        wait_piece(future, s.slice_id, s.drive_id)

    def _finish(self, s: OpenSlice, *, wait: bool = True) -> None:
        """End slice ``s``: submit its last piece, then *settle* it in the background
        (wait for every piece, commit its reference through the ordered commits,
        which flush its drive first), in order with this file's earlier slices.
        ``wait``: return only once every ended slice of this file is committed
        (raising the first failure)."""
        if s.length == 0:
            self.open_slice = None
            return
        # A durable last piece: the drive's writer flushes in the same batch,
        # and the commit needs no flush of its own.
        durable = bool(s.pending)
        try:
            self._submit_pending(s, durable=durable, ending=True)
            while len(self._settling) >= self._config.max_settling_slices:
                self._settling.wait_oldest()
        except BaseException as exc:
            self.open_slice = None
            self._failures.error = None  # reported now, by this raise
            self._failures.commit_failed(s, exc)  # its accepted bytes are dropped
            self._abort(s)
            raise
        self._settling.submit(
            s.slice_id, s.start, s.end,
            lambda previous, queued: self._settle(s, previous, queued, durable),
        )
        # Only now: a lock-free reader (``overlaps``) always sees the slice somewhere.
        self.open_slice = None
        if wait:
            self._settling.wait_all()

    def _settle(self, s: OpenSlice, previous: threading.Event | None,
                queued: threading.Event, durable: bool) -> None:
        """Background: wait for the pieces of ``s``, then queue its commit once
        the file's slice before it has queued its own (``previous``), so it
        commits after it (``OrderedCommits.commit``)."""
        try:
            while s.inflight:
                self._reap_oldest(s)
            if s.failure is not None:
                raise s.failure
            if previous is not None:
                previous.wait()
            self._commit(self._finished(s, durable), s.end, queued)
        except BaseException as exc:
            self._failures.commit_failed(s, exc)
            self._abort(s, in_doubt=isinstance(exc, MetaUnavailable))
            raise
        self._note_committed(s)
        self._node.forget(s.slice_id)

    def _finished(self, s: OpenSlice, durable: bool) -> FinishedSlice:
        assert s.drive_id is not None  # a dead slice is never committed (s.failure)
        return s.finished(self.ino, self._chunk_size, durable,
                          self._node.replicas_of(s.slice_id, s.drive_id), self.written_ns)

    def _finish_inline(self, s: OpenSlice) -> None:
        """End slice ``s`` in the caller's thread (flush/close/fsync): commit this
        file's earlier slices, store the last piece without lingering, commit.

        ``s`` stays the open slice until its reference is committed, so a
        lock-free ``overlaps`` never misses its bytes. Raises the first failure
        (an earlier slice's or this one's); a failed ``s`` is deleted.
        """
        first: BaseException | None = None
        try:
            self._settling.wait_all()
        except BaseException as exc:
            first = exc
        if s.length == 0:
            self.open_slice = None
        elif first is None and self._fits_inline(s):
            self._commit_inline(s)
        else:
            durable = bool(s.pending)
            try:
                self._submit_pending(s, durable=durable, ending=True)
                if s.inflight:  # this thread waits for them: no lingering
                    s.inflight[-1][0].expedite()
                while s.inflight:
                    self._reap_oldest(s)
            except BaseException as exc:
                self._drop_open(s, exc)
                raise
            self._commit_open(s, durable)
        if first is not None:
            raise first

    def _fits_inline(self, s: OpenSlice) -> bool:
        return not self._settling and s.fits_inline(self._config.inline_max_bytes,
                                                    self._committed_size)

    def _commit_inline(self, s: OpenSlice) -> None:
        """Commit ``s`` as an inline slice: bytes and reference into meta in one
        transaction (no drive write, no flush: nothing to order); ``s`` stays
        open until committed; a failed commit drops it."""
        data = b"".join(s.pending.take())
        self._release(len(data))
        try:
            self._commit(FinishedSlice.inline_slice(self.ino, s.chunk_index, s.start,
                                                    s.slice_id, data, self.written_ns), s.end,
                         None)
        except BaseException as exc:
            self._drop_open(s, exc)
            raise
        self.open_slice = None
        self._note_committed(s)

    def _note_committed(self, s: OpenSlice) -> None:
        # Settle tasks of one file may return from one batch at once.
        with self._noted:
            self._committed_size = max(self._committed_size, s.end)
            self.slices_committed += 1

    def _drop_open(self, s: OpenSlice, exc: BaseException, *, in_doubt: bool = False) -> None:
        """The open slice ``s`` failed with ``exc``: forget it and delete what it
        stored (``in_doubt``: keep it, see ``_abort``); its bytes count as lost
        for later writes (``WriteFailures.commit_failed``)."""
        self.open_slice = None
        self._failures.error = None  # reported now, by the caller's raise
        self._failures.commit_failed(s, exc)
        self._abort(s, in_doubt=in_doubt)

    def _commit_open(self, s: OpenSlice, durable: bool) -> None:
        """Commit the open slice ``s``, every byte of it stored (writer lock held).
        ``s`` stays the open slice until committed, so a lock-free ``overlaps``
        never misses its bytes; a failed commit deletes it."""
        try:
            self._commit(self._finished(s, durable), s.end, None)
        except BaseException as exc:
            self._drop_open(s, exc, in_doubt=isinstance(exc, MetaUnavailable))
            raise
        self.open_slice = None
        self._note_committed(s)
        self._node.forget(s.slice_id)

    def _flush_at_once(self) -> None:
        """``flush(wait=False)``: see ``flush``."""
        if not self.lock.acquire(blocking=False):
            raise Declined("the file's writer is busy")
        try:
            if not self._failures.quiet(self.open_slice) or self._settling:
                raise Declined("slices are settling")
            s = self.open_slice
            if s is None:
                return
            if s.length == 0:
                self.open_slice = None
                return
            if s.submitted or s.drive_id is not None:
                raise Declined("the open slice has pieces in flight")
            if self._fits_inline(s):
                self._commit_inline(s)
                return
            if s.group is None:
                s.group = self._decide_group(s, True)
            n = len(s.pending)
            s.drive_id, future = self._node.submit(s.slice_id, 0, s.pending.parts, s.group,
                                                   durable=True, urgent=True, wait=False)
            s.pending.take()
            s.submitted = n
            self._release(n)
            self.pieces_submitted += 1
            try:
                wait_piece(future, s.slice_id, s.drive_id)
            except BaseException as exc:
                self._drop_open(s, exc)
                raise
            self._commit_open(s, True)
        finally:
            self.lock.release()

    def _abort(self, s: OpenSlice, *, in_doubt: bool = False) -> None:
        """Drop a failed slice's bytes from its drive (best effort; once). In-flight
        pieces are left to complete (their futures belong to the store: never
        cancel them); the delete removes whatever they wrote, and their failures
        are not reported (``WriteFailures.piece_failed``). ``in_doubt``: its
        commit failed with the metadata unreachable and may have happened:
        the bytes stay (a reference may name them; if none does, fsck
        re-attaches them under /lost+found)."""
        if s.aborted:
            return
        s.aborted = True
        if s.pending:
            self._release(len(s.pending))
            s.pending.take()
        if in_doubt:
            log.warning("commit of slice %#x failed with the metadata unreachable and may "
                        "have happened: its bytes are kept until the metadata says",
                        s.slice_id)
            if self._in_doubt is not None:
                self._in_doubt(s.slice_id, s.drive_id)
            return
        if s.drive_id is not None:
            try:
                self._node.delete(s.slice_id, s.drive_id)
            except Exception as exc:  # one line: the janitor collects it later
                log.warning("could not delete failed slice %#x (%s); it is collected later",
                            s.slice_id, exc)

    def spill(self, *, own: bool) -> None:
        """Submit pending bytes now (a short piece) to free write budget.

        ``own``: called by this writer's own thread (holding its lock); else by
        another writer waiting for budget, which skips a writer that is busy.
        """
        if not own and not self.lock.acquire(blocking=False):
            return
        try:
            s = self.open_slice
            if s is not None and s.pending:
                self._submit_pending(s, durable=False, ending=False)
        except BaseException as exc:
            if own:
                raise
            self._failures.keep(exc)  # this writer's failure, for its own next call
        finally:
            if not own:
                self.lock.release()

    # ------------------------------------------------------------------ ending
    def flush(self, *, wait: bool = True) -> None:
        """End the open slice (if any) and commit it; report a pending background error.

        When it returns every byte written through this writer is flushed on
        its drive and referenced in meta (ordered commits, ``client.commit``):
        it survives a crash of this process; a power cut too once meta's
        commit is durable (``MetaStore.sync``, which ``fsync`` calls).

        ``wait=False``: the same if it completes without waiting for another
        thread: when nothing is buffered, or when the open slice was never
        submitted and its drive's writer is idle: the bytes are then stored
        and flushed in this thread (an urgent ``StorageNode.submit`` with
        ``wait=False``, durable) and committed. Else raises ``Declined``
        having changed nothing a later ``flush`` would not redo; raises what
        ``flush`` would for a failure of the slice it stored."""
        if not wait:
            self._flush_at_once()
            return
        with self.lock:
            s = self.open_slice
            if s is not None and s.failure is None:
                self._finish_inline(s)
            else:
                try:
                    self._settling.wait_all()
                finally:
                    if s is not None:  # dead: dropped, its failure raised if not yet
                        self._raise_pending_error()
            self._raise_pending_error()

    def flush_for_another(self) -> None:
        """``flush`` on behalf of an operation that is not this file's (a snapshot
        wanting every buffered byte committed): a failure is not raised to that
        caller but kept for this file's own next call, which reports it."""
        try:
            self.flush()
        except Exception as exc:
            self._failures.keep(exc)

    def abandon(self) -> None:
        """Forget buffered bytes without storing them (process death in tests)."""
        with self.lock:
            s = self.open_slice
            self.open_slice = None
            if s is not None and s.pending:
                self._release(len(s.pending))
                s.pending.take()
