"""The order in which the client's read path sends concurrent readers' reads to one drive.

Emulated drives have no timing, so the order of the reads of concurrent
readers at a drive cannot be recorded from our code: it depends on when each
read completes on the real drive. This module runs the client's read-path
rules (``client/readpath.py``, ``client/reader.py``) as a discrete-event
simulation against a drive model instead:

- a reader reads its files one after another, ``read_size`` bytes at a time
  (a FUSE read), and consumes each read in ``read_size / consume`` seconds
  (0 for ``consume=None``: a reader as fast as the drive delivers);
- a read needs the ``read_extent``-aligned extents covering it; an extent not
  yet requested is read on the reader's own thread (the foreground read) and
  the reader waits for every extent of its read;
- after a read, a reader that reads sequentially (``ReadState.observe``) keeps
  ``readahead`` bytes ahead of its position (``ReadPath._readahead``: nothing
  when the window is within one extent of its target, else the extents from
  where it got to up to position + readahead, capped at the end of the file):
  those extents go to a FIFO pool of ``io_threads`` threads shared by every
  reader of the client; a pool thread hands its extent to the drive and is
  busy until the drive has served it;
- the drive serves the reads handed to it in arrival order, one at a time
  (one actuator); an extent's cost is what the model charges for the drive
  operations the store issued for it (recorded once from the real store, so
  record headers and extents split over records are the store's own).

The seek curve of the HC620 profile is already the effective one at queue
depth 8 (``sim.drives``), so the drive does not reorder here. Hints
(``prefetch``, ``posix_fadvise(WILLNEED)``) are not drive operations and are
not modeled. ``schedule(..., whole_window=True)`` is the alternative this
module can also answer for: every readahead window handed to the drive as one
request (no interleaving inside a window).

Never does: I/O or sleeping; the clock is the model's.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from shinglefs.sim.model import DriveModel
from shinglefs.zoned.model import TraceRecord

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReadPathParams:
    """The client's read-path settings (defaults: ``ClientConfig``'s; a test keeps them equal)."""

    read_extent: int = 4 * MiB
    readahead: int = 64 * MiB
    io_threads: int = 8
    read_size: int = MiB
    consume_mib_s: float | None = None  # per reader; None: as fast as the drive delivers
    whole_window: bool = False  # hand each readahead batch to the drive as one request
    refill: int | None = None  # top the window up when it is this far behind (None: read_extent)


@dataclass(slots=True)
class ReadFile:
    """One file of a reader: its length and the drive operations of each of its extents.

    ``extents[i]`` are the records the store issued to read extent ``i``
    (bytes ``[i * read_extent, (i + 1) * read_extent)`` of the file).
    """

    length: int
    extents: list[list[TraceRecord]]


@dataclass(slots=True)
class ScheduleResult:
    """The drive's order of operations and the modeled time of the whole epoch."""

    records: list[TraceRecord] = field(default_factory=list)
    seconds: float = 0.0  # until the last reader has its last byte
    busy_seconds: float = 0.0  # of those, the drive was serving reads
    bytes_read: int = 0
    requests: int = 0

    @property
    def mib_s(self) -> float:
        return self.bytes_read / MiB / self.seconds if self.seconds else 0.0

    @property
    def busy_mib_s(self) -> float:
        """What the drive delivers while busy: its rate if the readers asked for more."""
        return self.bytes_read / MiB / self.busy_seconds if self.busy_seconds else 0.0


@dataclass(slots=True)
class _Reader:
    files: list[ReadFile]
    ident: int
    file: int = 0
    pos: int = 0
    last_end: int = -1
    streak: int = 0
    prefetched_until: int = 0
    waiting: set[Hashable] = field(default_factory=set)
    pending_size: int = 0


class _Epoch:
    """The event loop of one ``schedule`` call (see the module docstring)."""

    def __init__(self, model: DriveModel, zone_size: int, p: ReadPathParams) -> None:
        self.model, self.zone_size, self.p = model, zone_size, p
        self.sim = model.simulation()
        self.now = 0.0
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.started: set[Hashable] = set()
        self.done: set[Hashable] = set()
        self.waiters: dict[Hashable, list[_Reader]] = {}
        self.pool: deque[list[Hashable]] = deque()
        self.pool_busy = 0
        self.drive_queue: deque[tuple[list[Hashable], bool]] = deque()
        self.drive_busy = False
        self.ops: dict[Hashable, list[TraceRecord]] = {}
        self.out = ScheduleResult()

    def at(self, t: float, kind: str, what: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, what))

    # ------------------------------------------------------------- the drive
    def to_drive(self, keys: list[Hashable], pooled: bool) -> None:
        self.drive_queue.append((keys, pooled))
        self.serve()

    def serve(self) -> None:
        if self.drive_busy or not self.drive_queue:
            return
        keys, pooled = self.drive_queue.popleft()
        before = self.sim.result.seconds
        for key in keys:
            for rec in self.ops[key]:
                self.model.apply(self.sim, rec, self.zone_size)
                self.out.records.append(rec)
                self.out.bytes_read += rec.length if rec.op == "read" else 0
        self.out.requests += 1
        self.drive_busy = True
        self.at(self.now + self.sim.result.seconds - before, "served", (keys, pooled))

    def served(self, keys: list[Hashable], pooled: bool) -> None:
        self.drive_busy = False
        for key in keys:
            self.done.add(key)
            for reader in self.waiters.pop(key, []):
                reader.waiting.discard(key)
                if not reader.waiting:
                    self.read_done(reader)
        if pooled:
            self.pool_busy -= 1
            self.pool_next()
        self.serve()

    def pool_next(self) -> None:
        while self.pool and self.pool_busy < self.p.io_threads:
            self.pool_busy += 1
            self.to_drive(self.pool.popleft(), pooled=True)

    # ----------------------------------------------------------- the readers
    def key(self, r: _Reader, index: int) -> Hashable:
        return (r.ident, r.file, index)

    def step(self, r: _Reader) -> None:
        """The reader's next read (a new file starts a new handle: a fresh ReadState)."""
        while r.file < len(r.files) and r.pos >= r.files[r.file].length:
            r.file, r.pos, r.last_end, r.streak, r.prefetched_until = r.file + 1, 0, -1, 0, 0
        if r.file >= len(r.files):
            return
        f, e = r.files[r.file], self.p.read_extent
        size = min(self.p.read_size, f.length - r.pos)
        if r.pos == r.last_end or (r.pos == 0 and r.last_end == -1):  # ReadState.observe
            r.streak += 1
        else:
            r.streak, r.prefetched_until = 0, 0
        r.last_end, r.pending_size = r.pos + size, size
        for index in range(r.pos // e, (r.pos + size - 1) // e + 1):
            key = self.key(r, index)
            if key in self.done:
                continue
            r.waiting.add(key)
            self.waiters.setdefault(key, []).append(r)
            if key not in self.started:
                self.started.add(key)
                self.to_drive([key], pooled=False)  # the foreground read
        if not r.waiting:
            self.read_done(r)

    def read_done(self, r: _Reader) -> None:
        position = r.pos + r.pending_size
        if r.streak >= 1:
            self.readahead(r, position)
        r.pos = position
        delay = 0.0 if self.p.consume_mib_s is None else \
            r.pending_size / MiB / self.p.consume_mib_s
        self.at(self.now + delay, "step", r)

    def readahead(self, r: _Reader, position: int) -> None:
        f, e = r.files[r.file], self.p.read_extent
        target = position + self.p.readahead
        if r.prefetched_until >= target - (self.p.refill or e):
            return
        start, end = max(position, r.prefetched_until), min(target, f.length)
        if start < end:
            batch = []
            for index in range(start // e, (end - 1) // e + 1):
                key = self.key(r, index)
                if key not in self.started:
                    self.started.add(key)
                    batch.append(key)
            if self.p.whole_window and batch:
                self.pool.append(batch)
            else:
                self.pool.extend([k] for k in batch)
            self.pool_next()
        r.prefetched_until = target

    def run(self, readers: Sequence[Sequence[ReadFile]]) -> ScheduleResult:
        rs = [_Reader(list(files), i) for i, files in enumerate(readers)]
        for r in rs:
            for fi, f in enumerate(r.files):
                for index, recs in enumerate(f.extents):
                    self.ops[(r.ident, fi, index)] = recs
        for r in rs:
            self.at(0.0, "step", r)
        while self.events:
            self.now, _, kind, what = heapq.heappop(self.events)
            if kind == "step":
                self.step(what)  # type: ignore[arg-type]
            else:
                self.served(*what)  # type: ignore[misc]
        self.out.seconds = self.now
        self.out.busy_seconds = self.sim.result.seconds
        return self.out


def schedule(model: DriveModel, readers: Sequence[Sequence[ReadFile]], *,
             zone_size: int | None = None, params: ReadPathParams | None = None) -> ScheduleResult:
    """Run ``readers`` (each a list of files read in turn) at once through the client's rules.

    Returns the drive's operations in the order it served them and the
    modeled seconds until the last reader consumed its last byte (with
    ``consume_mib_s=None``, until the drive served the last read). Raises
    ValueError for an extent without a read or a trace operation the model
    does not know.
    """
    p = params or ReadPathParams()
    for files in readers:
        for f in files:
            if len(f.extents) < -(-f.length // p.read_extent):
                raise ValueError(f"a file of {f.length} bytes needs "
                                 f"{-(-f.length // p.read_extent)} extents, got {len(f.extents)}")
    return _Epoch(model, zone_size or model.zone_size, p).run(readers)
