"""The write scheduler's zone runs and its flushes of what is written.

``ZoneRun``: the group a drive's writer stays on (``StoreConfig.switch_bytes``,
store/scheduler.py's module docstring, "Zone runs"). ``DriveSync``: drive
flushes of completed writes, shared by the callers that wait meanwhile
(``WriteScheduler.flush_completed``, a storage server's FLUSH). Both are used
under the scheduler's own locking: ``ZoneRun`` under its condition,
``DriveSync`` from any thread. ``WriteTally``: what the writer wrote (bytes,
runs, group and zone switches), reported as ``WriteFigures`` with the queue.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shinglefs.store.log import SliceLog
    from shinglefs.store.scheduler import PendingWrite

log = logging.getLogger("shinglefs.store")

STARVE_WAITS = 8  # a group waits at most this many switch_wait_s before it is next


@dataclass(frozen=True, slots=True)
class WriteFigures:
    """What a drive's write scheduler wrote since its store opened, and its queue now
    (``WriteScheduler.figures``). ``bytes_written``: payload bytes of its runs;
    ``runs``: its runs (one append of one group each); ``group_switches``: runs
    of another group than the run before; ``zone_switches``: writes to another
    zone than its write before (a group's next zone counts too; GC and index
    writes between them do not); ``queued_pieces``/``queued_bytes``: pieces
    waiting in its queue now."""

    bytes_written: int = 0
    runs: int = 0
    group_switches: int = 0
    zone_switches: int = 0
    queued_pieces: int = 0
    queued_bytes: int = 0

    @property
    def mean_run_bytes(self) -> int:
        """Bytes per run."""
        return self.bytes_written // self.runs if self.runs else 0

    @property
    def bytes_per_zone_switch(self) -> int:
        """Bytes written per zone switch: the drive's sequential stretches."""
        return self.bytes_written // self.zone_switches if self.zone_switches else 0


RECENT_RUNS = 4096
"""``WriteTally.recent`` keeps the (group, bytes) of this many runs, the last ones."""


class WriteTally:
    """The counters behind ``WriteFigures`` and the runs just written, kept by
    whoever writes a run (one thread at a time: the scheduler's ``_busy``
    token); read from any thread (each counter an int, so a read sees each
    one whole). ``on_written`` is told (io_lock held) the (slice, offset) of
    the pieces of each run once it is published, before their futures
    complete (a node's space ledger)."""

    def __init__(self, zone_size: int, name: str) -> None:
        self.zone_size = zone_size
        self.name = name
        self.bytes_written = 0
        self.runs = 0
        self.group_switches = 0
        self.zone_switches = 0
        self.recent: list[tuple[int, int]] = []  # (group, bytes) of the last RECENT_RUNS runs
        self.on_written: Callable[[list[tuple[int, int]]], None] | None = None
        self._group: int | None = None
        self._zone: int | None = None

    def published(self, group: int, pieces: list[PendingWrite], devs: Iterable[int]) -> None:
        """A run of ``group`` was published: ``pieces`` in records at device
        offsets ``devs``. Never raises into the write (a hook's failure is logged)."""
        nbytes = sum(p.data.nbytes for p in pieces)
        self.recent.append((group, nbytes))
        if len(self.recent) > RECENT_RUNS:
            del self.recent[:-RECENT_RUNS]
        self.wrote(group, nbytes, devs)
        if self.on_written is not None:
            try:
                self.on_written([(p.slice_id, p.offset) for p in pieces])
            except Exception:  # pragma: no cover - a hook's bug must not fail a written run
                log.exception("on_written hook of %s failed", self.name)

    def figures(self, queued_pieces: int, queued_bytes: int) -> WriteFigures:
        """The figures, with the queue as the caller sees it now."""
        return WriteFigures(self.bytes_written, self.runs, self.group_switches,
                            self.zone_switches, queued_pieces, queued_bytes)

    def wrote(self, group: int, nbytes: int, devs: Iterable[int]) -> None:
        """A run of ``group``: ``nbytes`` of payload in records at device offsets ``devs``."""
        self.bytes_written += nbytes
        self.runs += 1
        if group != self._group:
            self.group_switches += 1
            self._group = group
        for dev in devs:
            zone = dev // self.zone_size
            if zone != self._zone:
                self.zone_switches += 1
                self._zone = zone


class ZoneRun:
    """The group the writer stays on (``switch_bytes``; module docstring, "Zone runs").

    ``switch_bytes`` 0: off (``group`` stays None). While on a group, a piece
    of it is queued up to ``switch_bytes`` over ``max_queue_bytes`` (its
    sender is the one the writer waits for). A flush barrier, an urgent
    piece, closing, or, with nothing of it queued, queue pressure or a
    durable piece of another group end the run at once. ``switches``: zone runs begun."""

    def __init__(self, switch_bytes: int, wait_s: float) -> None:
        self.switch_bytes = switch_bytes
        self.wait_s = wait_s
        self.group: int | None = None
        self.written = 0  # bytes of ``group`` taken in a row
        self.idle_since: float | None = None  # when nothing of ``group`` was left queued
        self.switches = 0
        self.on_switch: Callable[[], None] | None = None  # called when ``group`` changes

    def allowance(self, group: int) -> int:
        """Bytes a piece of ``group`` may be queued over ``max_queue_bytes``."""
        return self.switch_bytes if group == self.group else 0

    def took(self, group: int, run: list[PendingWrite], drained: bool, now: float) -> None:
        """The writer took ``run`` of ``group`` (``drained``: nothing of it is left queued)."""
        if group != self.group:
            self.group, self.written = group, 0
            self.switches += 1
            if self.on_switch is not None:
                self.on_switch()
        self.written += sum(p.data.nbytes for p in run)
        if self.written >= self.switch_bytes or any(p.durable for p in run):
            self.end()
        else:
            self.idle_since = now if drained else None

    def choose(self, eligible: list[int], queues: dict[int, deque[PendingWrite]],
               queued: dict[int, int], now: float) -> list[int]:
        """The group of the next zone run: of the ``eligible`` ones (oldest head
        first), the one with the most bytes ``queued`` (the longest run at once),
        unless the oldest head waited ``STARVE_WAITS`` waits (fairness)."""
        if not eligible:
            return []
        if now - queues[eligible[0]][0].queued_at >= STARVE_WAITS * self.wait_s:
            return eligible[:1]
        return [max(eligible, key=queued.__getitem__)]

    def took_runs(self, runs: list[tuple[int, list[PendingWrite]]],
                  queues: dict[int, deque[PendingWrite]],
                  now: float) -> list[tuple[int, list[PendingWrite]]]:
        """``took`` for each of ``runs`` (the writer's ``queues`` after it); returns them."""
        for group, pieces in runs:
            self.took(group, pieces, not queues.get(group), now)
        return runs

    def end(self) -> None:
        self.group, self.written, self.idle_since = None, 0, None

    def waits_until(self) -> float | None:
        """Until when the writer waits for the next piece of ``group`` (None: it does not)."""
        if self.group is None or self.idle_since is None:
            return None
        return self.idle_since + self.wait_s


class DriveSync:
    """Group-committed drive flushes of what is already written: callers that
    come while a flush runs share the next one."""

    def __init__(self, slice_log: SliceLog) -> None:
        self.log = slice_log
        self._cond = threading.Condition(threading.Lock())
        self._asked = self._done = 0
        self._running = False

    def flush(self) -> None:
        """Return once a drive flush that began after the call completed; raises
        the drive's ``StoreError`` (nothing is then promised)."""
        with self._cond:
            self._asked += 1
            asked = self._asked
            while self._running:
                self._cond.wait()
            if self._done >= asked:
                return  # a flush that began after our call covered it
            self._running = True
            covers = self._asked
        flushed = False
        try:
            # Not under io_lock: a drive's flush is thread-safe and covers every
            # write completed before it, so the writer goes on writing meanwhile
            # (an fdatasync behind GBs of dirty pages takes seconds).
            self.log.flush_drive()
            flushed = True
        finally:
            with self._cond:
                self._running = False
                if flushed:
                    self._done = covers
                self._cond.notify_all()
