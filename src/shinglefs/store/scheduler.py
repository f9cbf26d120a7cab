"""The write scheduler: the one writer of a drive, turning many callers into long appends.

Rules:

- ``submit`` (any thread) is the one way in. It checks the piece is at the
  slice's current length (counting pieces still queued), queues it under its
  lifetime group and returns a ``PieceFuture``. While more than
  ``max_queue_bytes`` are queued it waits (back-pressure), never while
  holding a lock the writer needs, or with ``wait=False`` raises
  ``Declined`` having queued nothing.
- The writer thread picks groups oldest-head first (round robin by age). A
  group is eligible when it has ``min_run_bytes`` queued, or a durable piece,
  or a flush barrier covers it, or it lingered: no piece came to the store
  for ``linger_s`` (a lone writer waiting for its piece), or its oldest
  piece waited ``LINGER_BOUND`` lingers (submitters that keep feeding the
  store let its groups grow towards full runs, up to that bound). It
  takes up to ``max_run_bytes`` of each eligible group (up to ``batch_bytes``
  a batch), so 16 writers of 16 groups become 16 long per-group runs rather
  than interleaved small writes. Within a run, consecutive pieces of one slice
  become one record, and the run's records go out as one ``pwritev`` of the
  callers' own memoryviews (no concatenation).
- Zone runs (``switch_bytes`` > 0: a storage server): the writer stays on
  the group it took, writing its pieces as they come and no other group's,
  until it wrote ``switch_bytes`` of it in a row, a piece of it was durable,
  or none of it came for ``switch_wait_s`` (``ZoneRun``). So many clients'
  groups, each sent a few MiB at a time, reach the drive as runs of
  ``switch_bytes`` per zone switch. A durable piece of another group (its
  sender waits for it) ends a run that waits. The next group is the eligible
  one with the most bytes queued, or one whose oldest piece waited too long.
- Admission under pressure: while a submitter waits for room, the writer
  takes only what frees that room — the groups a caller waits for, then
  the oldest group (eligible or not: a waiting submitter never waits out a
  linger) — instead of every eligible group. Pieces arriving round robin
  over many groups (a checkpoint's ranks) then stagger the groups' queues
  and a run grows to about twice ``max_queue_bytes`` / groups, not once;
  the oldest-first order is the fairness (every group's turn comes, and a
  single submitter feeding many groups never waits for one it does not
  feed).
- A caller about to wait for a piece (``urgent=True``, or
  ``PieceFuture.expedite()`` on a piece already queued) skips the wait: when
  the writer is idle, the calling thread writes the queued run of the piece's
  group itself (no thread hand-off: a small file's close costs one
  ``pwritev``, not two context switches); else the group becomes eligible at
  once, never paying the ``linger_s`` coalescing timer. One writer at a time:
  whoever writes holds the ``_busy`` token, taken together with the pieces,
  so a group's runs are written in order.
- An urgent piece submitted with ``wait=False`` is written in the calling
  thread without queueing if nothing stands before it, else ``Declined``.
- Group commit: one flush a batch when any piece in it asked for durability.
  A future completes when its bytes are written and indexed (readable), and
  for a durable piece only after that flush. ``flush``: every piece submitted
  before it (queued ones are written first); ``flush_completed``: only the
  completed ones (a server's FLUSH), forcing nothing out of the queue.
- A caller may cancel a piece's future while it is still queued: the piece is
  written anyway (a slice has no holes) and its future stays cancelled; the
  writer thread never dies of it (futures are marked running when taken).
- A piece that fails fails every later queued piece of its slice (a slice has
  no holes); the slice's length falls back to what was written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from shinglefs.store.api import MAX_SLICE_SIZE, Declined, PieceFuture
from shinglefs.store.errors import SliceOrderError, StoreClosed, StoreError
from shinglefs.store.zonerun import DriveSync, WriteFigures, WriteTally, ZoneRun
from shinglefs.zoned.fileio import Payload

if TYPE_CHECKING:
    from shinglefs.store.log import SliceLog

log = logging.getLogger("shinglefs.store.scheduler")

COLLECTOR_WAKE_S = 0.05  # the zone collector is woken at most this often by writes
LINGER_BOUND = 25  # while the store is fed, a short run waits at most this many lingers


@dataclass(slots=True, eq=False)
class PendingWrite:
    """One queued piece: ``data`` must stay unchanged until ``future`` completes."""

    slice_id: int
    offset: int
    data: Payload
    group: int
    durable: bool
    ticket: int
    queued_at: float
    future: PieceFuture


class WriteScheduler:
    """Drains queued pieces into the slice log; see the module docstring for the rules."""

    def __init__(self, slice_log: SliceLog) -> None:
        """Start the writer thread of ``slice_log``; the tunables (queue bound, run
        lengths, batch size, linger) are its ``StoreConfig``'s."""
        self.log = slice_log
        cfg = slice_log.config
        self.max_queue_bytes = cfg.max_queue_bytes
        self.min_run_bytes = cfg.min_run_bytes
        self.max_run_bytes = cfg.max_run_bytes
        self.batch_bytes = cfg.batch_bytes
        self.linger_s = cfg.linger_s
        self.zone_run = ZoneRun(cfg.switch_bytes or 0, cfg.switch_wait_s)
        self._sync = DriveSync(slice_log)
        self._cond = threading.Condition(threading.Lock())
        self._groups: dict[int, deque[PendingWrite]] = {}
        self._group_bytes: dict[int, int] = {}
        self._group_durable: dict[int, int] = {}
        self._group_pending: dict[int, int] = {}
        self._queued_bytes = 0
        self._room_wanted = 0  # bytes submitters wait to queue (back-pressure)
        self._last_queued = 0.0  # when the newest piece was queued
        self._ticket = 0
        self._expected: dict[int, int] = {}
        self._slice_pending: dict[int, int] = {}
        self._failed: dict[int, tuple[int, BaseException]] = {}
        self._barriers: list[tuple[int, Future[None]]] = []
        self._urgent: set[int] = set()  # groups expedited by a waiting caller
        self._collector_woken = 0.0
        self._busy = False  # a thread (the writer or an inline caller) is writing runs
        self._stopping = False
        self._stopped = False
        self.batches = 0
        self.queued_bytes_peak = 0  # the most bytes ever queued at once (back pressure bounds it)
        # What ``figures`` reports, the last runs, and the hook told of each run
        self.tally = WriteTally(slice_log.zs, slice_log.name)
        self.runs_written = self.tally.recent  # (group, bytes) of the last runs
        self._thread = threading.Thread(target=self._run, name=f"writer-{slice_log.name}",
                                        daemon=True)
        self._thread.start()

    # ================================================================= callers
    def submit(self, slice_id: int, offset: int, data: Payload, group: int, *,
               durable: bool, urgent: bool, wait: bool,
               indexed_length: Callable[[int], int]) -> PieceFuture:
        """Take a piece (``SliceStoreAPI.submit``: the flags' contract is there).

        Raises SliceOrderError (nothing queued) when it is out of order,
        ``Declined`` (nothing queued) when ``wait`` is False and it cannot be
        taken at once, ``StoreClosed`` once the store is closing."""
        if urgent and not wait:
            return self._write_now(slice_id, offset, data, group, durable, indexed_length)
        piece = self._enqueue(slice_id, offset, data, group, durable, indexed_length, wait)
        if urgent:
            piece.future.expedite()
        return piece.future

    def _enqueue(self, slice_id: int, offset: int, data: Payload, group: int, durable: bool,
                 indexed_length: Callable[[int], int], wait: bool) -> PendingWrite:
        """Queue a piece, waiting for room (``wait``) or declining."""
        n = data.nbytes
        with self._cond:
            if self._stopping:
                raise StoreClosed("store is closing", drive=self.log.name)
            bound = self.max_queue_bytes + self.zone_run.allowance(group)
            if self._queued_bytes and self._queued_bytes + n > bound:
                if not wait:
                    raise Declined(f"{self.log.name}: the write queue is full")
                self._wait_for_room(n, group)
            piece = self._new_piece(slice_id, offset, data, group, durable, indexed_length)
            if n == 0:
                piece.future.set_result(None)
                return piece
            queue = self._groups.get(group)
            if queue is None:
                queue = self._groups[group] = deque()
                self._group_bytes[group] = 0
                self._group_durable[group] = 0
            queue.append(piece)
            self._last_queued = piece.queued_at
            self._group_bytes[group] += n
            self._group_pending[group] = self._group_pending.get(group, 0) + 1
            if durable:
                self._group_durable[group] += 1
            self._queued_bytes += n
            self.queued_bytes_peak = max(self.queued_bytes_peak, self._queued_bytes)
            self._cond.notify_all()
            return piece

    def _wait_for_room(self, n: int, group: int) -> None:
        """Back-pressure: wait until ``n`` more bytes of ``group`` fit the queue
        (``_cond`` held). While it waits the writer drains only as much as it
        needs (``_take``)."""
        self._room_wanted += n
        self._cond.notify_all()  # the writer may sleep out a linger: pressure changes that
        try:
            while self._queued_bytes and self._queued_bytes + n > (
                    self.max_queue_bytes + self.zone_run.allowance(group)):
                self._cond.wait()
                if self._stopping:
                    raise StoreClosed("store is closing", drive=self.log.name)
        finally:
            self._room_wanted -= n
            self._cond.notify_all()  # the writer goes back to its usual rules

    def _new_piece(self, slice_id: int, offset: int, data: Payload, group: int,
                   durable: bool, indexed_length: Callable[[int], int]) -> PendingWrite:
        """Check the piece's order and count it as pending (``_cond`` held)."""
        n = data.nbytes
        expected = self._expected.get(slice_id)
        if expected is None:
            expected = indexed_length(slice_id)
        if offset != expected:
            raise SliceOrderError(slice_id, offset, expected, drive=self.log.name)
        if offset + n > MAX_SLICE_SIZE:
            raise SliceOrderError(slice_id, offset, expected, drive=self.log.name,
                                  detail=f"{offset + n} bytes exceed {MAX_SLICE_SIZE}")
        self._ticket += 1
        piece = PendingWrite(slice_id, offset, data, group, durable, self._ticket,
                             time.monotonic(), PieceFuture(partial(self._expedite, group)))
        if n:
            self._expected[slice_id] = offset + n
            self._slice_pending[slice_id] = self._slice_pending.get(slice_id, 0) + 1
        return piece

    def _write_now(self, slice_id: int, offset: int, data: Payload, group: int,
                   durable: bool, indexed_length: Callable[[int], int]) -> PieceFuture:
        """Write one piece in the calling thread at once (a small file's close: one
        ``pwritev``, no hand-off), or raise ``Declined`` with nothing queued:
        when a thread writes, a flush barrier waits, ``group`` has queued
        pieces or another group's zone run is on, the store closes, an index
        checkpoint is due (the writer thread's job) or the collector holds the
        log. The returned future is complete (its exception is the write's)."""
        n = data.nbytes
        with self._cond:
            if (self._busy or self._stopping or self._barriers or self._groups.get(group)
                    or self.zone_run.group not in (None, group) or self.log.checkpoint_due):
                raise Declined(f"{self.log.name}: the writer is busy")
            # The collector holds io_lock while it copies a zone: never wait for it.
            if not self.log.io_lock.acquire(blocking=False):
                raise Declined(f"{self.log.name}: the log is held")
            try:
                piece = self._new_piece(slice_id, offset, data, group, durable, indexed_length)
            except BaseException:
                self.log.io_lock.release()
                raise
            if n == 0:
                self.log.io_lock.release()
                piece.future.set_result(None)
                return piece.future
            self._group_pending[group] = self._group_pending.get(group, 0) + 1
            piece.future.set_running_or_notify_cancel()
            self._busy = True
        try:
            # io_lock is reentrant: held across the write. No checkpoint here: once
            # one is due, _write_now declines and the writer thread writes it.
            self._write([(group, [piece])], checkpoint=False)
        finally:
            self.log.io_lock.release()
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        return piece.future

    def flush(self) -> None:
        """Wait until every piece submitted before the call is written and durable.

        When nothing is queued and no thread is writing, the drive is flushed
        in the calling thread (no hand-off to the writer): what the ordered
        commit of a closed file pays."""
        if self._flush_now():
            return
        fut: Future[None] = Future()
        with self._cond:
            if self._stopped:
                self.log.flush_drive()
                return
            self._barriers.append((self._ticket, fut))
            self._cond.notify_all()
        fut.result()

    def _flush_now(self) -> bool:
        """Flush in this thread if every submitted piece is written and the
        writer is idle; False (nothing done) otherwise."""
        with self._cond:
            if (self._busy or self._stopping or self._barriers or self._queued_bytes
                    or any(self._groups.values())):
                return False
            if not self.log.io_lock.acquire(blocking=False):
                return False
            self._busy = True
        try:
            self.log.flush_drive()
        finally:
            self.log.io_lock.release()
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        return True

    def flush_completed(self) -> None:
        """Make every piece whose future completed before the call, and every
        delete done before it, durable; queued pieces stay queued (``DriveSync``)."""
        self._sync.flush()

    def _expedite(self, group: int, idle_only: bool = False) -> None:
        """A caller waits for a queued piece of ``group`` (``PieceFuture.expedite``):
        write the group's queued run in this thread when no other thread is
        writing, else make the group eligible at once (``idle_only``: else
        nothing)."""
        with self._cond:
            if not self._groups.get(group) or (idle_only and self._busy):
                return
            if (self._busy or self._stopping or self._barriers
                    or self.zone_run.group not in (None, group)):
                self._urgent.add(group)
                self._cond.notify_all()
                return
            runs = self._take_groups([group])
            self._busy = True
        try:
            self._write(runs)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def wait_slice(self, slice_id: int) -> None:
        """Wait until no piece of ``slice_id`` is queued or being written."""
        with self._cond:
            self._cond.wait_for(lambda: not self._slice_pending.get(slice_id))

    def wait_group(self, group: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._group_pending.get(group))

    def pending_length(self, slice_id: int) -> int | None:
        """The slice's length counting queued pieces, or None when none is queued."""
        with self._cond:
            return self._expected.get(slice_id)

    @property
    def flush_waiting(self) -> bool:
        """A ``flush`` waits for the writes queued before it (urgent submits decline)."""
        with self._cond:
            return bool(self._barriers)

    def has_room(self, nbytes: int) -> bool:
        """Would ``submit(wait=False)`` of ``nbytes`` (not urgent) take them (a hint)?"""
        queued = self._queued_bytes
        return not queued or queued + nbytes <= self.max_queue_bytes

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def figures(self) -> WriteFigures:
        """What the writer wrote since the store opened, and the queue now."""
        with self._cond:
            return self.tally.figures(sum(len(q) for q in self._groups.values()),
                                      self._queued_bytes)

    def close(self) -> None:
        """Write everything queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    # ================================================================= the writer
    def _eligible(self, now: float) -> list[int]:
        barrier = max((t for t, _ in self._barriers), default=0)
        out = []
        for group, queue in self._groups.items():
            if not queue:
                continue
            head = queue[0]
            if (self._stopping or self._group_bytes[group] >= self.min_run_bytes
                    or self._group_durable[group] or head.ticket <= barrier
                    or group in self._urgent
                    or now >= lingered_until(queue, self._last_queued, self.linger_s)):
                out.append(group)
        out.sort(key=lambda g: self._groups[g][0].ticket)
        return out

    def _take(self, now: float) -> list[tuple[int, list[PendingWrite]]]:
        run = self.zone_run
        forced = self._stopping or self._barriers or self._urgent
        if run.group is not None and not forced:
            if self._groups.get(run.group):
                return run.took_runs(self._take_groups([run.group]), self._groups, now)
            until = run.waits_until()  # unless a submitter or a durable piece waits:
            if until is not None and now < until and not (
                    self._room_wanted or any(self._group_durable.values())):
                return []  # the writer waits for the group's next piece
            run.end()
        groups = self._eligible(now)
        if self._room_wanted and not self._stopping:
            groups = self._for_waiters(groups)
        if run.switch_bytes and not forced:
            chosen = run.choose(groups, self._groups, self._group_bytes, now)
            return run.took_runs(self._take_groups(chosen), self._groups, now)
        run.end()
        return self._take_groups(groups)

    def _for_waiters(self, eligible: list[int]) -> list[int]:
        """The groups to take under queue pressure (a submitter waits for room;
        ``_cond`` held): those a caller waits for (urgent, durable, under a
        flush barrier), then, oldest head first, only as many as free the room
        needed, of the ``eligible`` groups or, when none is, of all (module
        docstring, "Admission under pressure")."""
        barrier = max((t for t, _ in self._barriers), default=0)
        out = [g for g in eligible
               if g in self._urgent or self._group_durable[g]
               or self._groups[g][0].ticket <= barrier]
        need = self._queued_bytes + self._room_wanted - self.max_queue_bytes
        need -= sum(min(self._group_bytes[g], self.max_run_bytes) for g in out)
        candidates = eligible or sorted((g for g, q in self._groups.items() if q),
                                        key=lambda g: self._groups[g][0].ticket)
        for group in candidates:
            if need <= 0:
                break
            if group not in out:
                out.append(group)
                need -= min(self._group_bytes[group], self.max_run_bytes)
        return out

    def _take_groups(self, groups: list[int]) -> list[tuple[int, list[PendingWrite]]]:
        runs = []
        total = 0
        for group in groups:
            queue = self._groups[group]
            run: list[PendingWrite] = []
            size = 0
            while queue and (not run or size + queue[0].data.nbytes <= self.max_run_bytes):
                piece = queue.popleft()
                n = piece.data.nbytes
                size += n
                self._group_bytes[group] -= n
                self._queued_bytes -= n
                if piece.durable:
                    self._group_durable[group] -= 1
                # Running from now on: a cancel() can no longer race our set_result.
                piece.future.set_running_or_notify_cancel()
                run.append(piece)
            self._urgent.discard(group)
            if not queue:
                del self._groups[group]
                del self._group_bytes[group]
                del self._group_durable[group]
            runs.append((group, run))
            total += size
            if total >= self.batch_bytes:
                break
        if runs:
            self._cond.notify_all()  # back-pressure waiters
        return runs

    def _next_wait(self, now: float) -> float | None:
        if self._room_wanted:
            return None  # the waiting submitters wake the writer (``_wait_for_room``)
        run = self.zone_run
        held = run.waits_until()
        if held is not None and run.group is not None and not self._groups.get(run.group):
            return max(0.0, held - now)  # a piece of the group (or its deadline) wakes it
        until = [lingered_until(q, self._last_queued, self.linger_s)
                 for q in self._groups.values() if q]
        if not until:
            return None
        return max(0.0, min(until) - now)

    def _ready_barriers(self) -> list[tuple[int, Future[None]]]:
        """Barriers none of whose pieces is still queued (``_cond`` held)."""
        if not self._barriers:
            return []
        heads = [q[0].ticket for q in self._groups.values() if q]
        oldest = min(heads) if heads else self._ticket + 1
        ready = [b for b in self._barriers if b[0] < oldest]
        if ready:
            self._barriers = [b for b in self._barriers if b[0] >= oldest]
        return ready

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._busy:  # an inline caller is writing: wait for it
                        self._cond.wait()
                        continue
                    runs = self._take(now)
                    # Pieces taken now are written before these barriers complete.
                    barriers = self._ready_barriers()
                    if runs or barriers or (self._stopping and not self._groups):
                        break
                    self._cond.wait(self._next_wait(now))
                done = self._stopping and not self._groups and not runs and not self._barriers
                self._busy = bool(runs or barriers)
            try:
                if runs:
                    self._write(runs)
                if barriers:
                    self._complete_barriers(barriers)
            finally:
                if runs or barriers:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
            if done:
                with self._cond:
                    self._stopped = True
                    self._cond.notify_all()
                return

    def _complete_barriers(self, barriers: list[tuple[int, Future[None]]]) -> None:
        err: BaseException | None = None
        try:
            with self.log.io_lock:
                self.log.flush_drive()
        except BaseException as exc:
            err = exc
        for _, fut in barriers:
            _resolve(fut, err)

    def _write(self, runs: list[tuple[int, list[PendingWrite]]], *,
               checkpoint: bool = True) -> None:
        outcome: list[tuple[list[PendingWrite], BaseException | None]] = []
        durable = False
        with self.log.io_lock:
            for group, run in runs:
                live: list[PendingWrite] = []
                for piece in run:
                    failed = self._failed.get(piece.slice_id)
                    if failed is not None and piece.ticket < failed[0]:
                        outcome.append(([piece], failed[1]))
                    else:
                        live.append(piece)
                if not live:
                    continue
                try:
                    extents = self.log.append(
                        ("g", group), [(p.slice_id, p.offset, p.data, group) for p in live])
                    self.log.publish(extents)
                    self.tally.published(group, live, (e.dev for e in extents))
                    outcome.append((live, None))
                    durable = durable or any(p.durable for p in live)
                except StoreError as exc:
                    outcome.append((live, exc))
                except Exception as exc:
                    log.exception("writing a run of group %d failed", group)
                    outcome.append((live, exc))
            if durable:
                try:
                    self.log.flush_drive()
                except StoreError as exc:
                    outcome = [(pieces, err if err is not None
                                else (exc if any(p.durable for p in pieces) else None))
                               for pieces, err in outcome]
            try:
                if checkpoint:
                    self.log.maybe_checkpoint()
            except Exception as exc:  # the writer must survive; the next interval retries
                log.warning("checkpoint of %s failed: %s", self.log.name, exc)
        self.batches += 1
        now = time.monotonic()
        if self.log.collector is not None and now - self._collector_woken >= COLLECTOR_WAKE_S:
            # At most every COLLECTOR_WAKE_S: waking it per small write costs more than the write.
            self._collector_woken = now
            self.log.collector.wake()
        with self._cond:
            for pieces, err in outcome:
                for piece in pieces:
                    self._settle(piece, err)
            self._cond.notify_all()
        for pieces, err in outcome:
            for piece in pieces:
                _resolve(piece.future, err)

    def _settle(self, piece: PendingWrite, err: BaseException | None) -> None:
        """Book-keeping for a finished piece (``_cond`` held)."""
        sid = piece.slice_id
        if err is not None:
            failed = self._failed.get(sid)
            if failed is None or piece.ticket >= failed[0]:
                # Every piece of this slice queued so far fails too; the slice resumes here.
                self._failed[sid] = (self._ticket + 1, err)
                self._expected[sid] = piece.offset
        left = self._slice_pending.get(sid, 1) - 1
        if left:
            self._slice_pending[sid] = left
        else:
            self._slice_pending.pop(sid, None)
            self._expected.pop(sid, None)  # the index is the truth again
            self._failed.pop(sid, None)
        group = piece.group
        left = self._group_pending.get(group, 1) - 1
        if left:
            self._group_pending[group] = left
        else:
            self._group_pending.pop(group, None)


def lingered_until(queue: deque[PendingWrite], last_queued: float, linger_s: float) -> float:
    """When a group's short run stops waiting for more: once no piece came to
    the store for ``linger_s`` since ``last_queued`` (while submitters keep
    feeding it, a group grows towards a full run), or at the latest
    ``LINGER_BOUND`` lingers after its oldest piece."""
    return min(last_queued + linger_s, queue[0].queued_at + LINGER_BOUND * linger_s)


def _resolve(future: Future[None], err: BaseException | None) -> None:
    """Complete ``future`` unless its caller cancelled it (never raises for that)."""
    if future.cancelled():
        return
    try:
        if err is None:
            future.set_result(None)
        else:
            future.set_exception(err)
    except InvalidStateError:  # cancelled between the check and the set
        log.debug("piece future was cancelled before it completed")
