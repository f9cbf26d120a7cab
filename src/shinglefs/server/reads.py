"""A storage server's read scheduler: one per drive, serving each reader's stream in long runs.

Many clients read different files at once (an epoch read by several
DataLoader workers on several hosts). Each client reads ahead a few extents
of its file, so a server holds several READs of each stream at once; served
as they arrive, a drive alternates between streams extent by extent (the
measurement that led here: 8 readers of 8 files over 3 servers, a mean run
of 4.3 MiB at the drives against 16-64 MiB for one reader alone — docs/cluster.md).

:class:`DriveReads` queues the READs of one drive by *stream* (a slice: the
requests of every connection naming it) and serves them from ``threads``
threads (four by default, all on the stream whose run it is: the drive
serves one stream at a time, a few of its requests deep — on the test VM's
disk one request at a time lost a fifth of the throughput of 8 readers):

- a stream is served for a *run* of up to ``run_bytes`` before the drive
  switches to another stream with requests waiting, or sooner when it has
  none left and none being read (no thread waits for a stream's next
  request once its reads ended while others wait);
- within a stream, requests are taken in offset order, and adjacent ones
  (each starting where the last ended) are merged into one read of the node
  of up to ``merge_bytes``, answered as views of that one buffer;
- streams take turns round robin in the order they started waiting, so a
  stream waits at most one run of each other stream: none starves.

Memory: the scheduler holds only the requests' descriptors; how many a
connection has outstanding, and their bytes, is bounded by the connection
(``Limits.max_in_flight``/``max_in_flight_bytes``), so the queue is bounded by
the connections. A merged read's buffer lives until the last of its answers
is sent.

Counters (``stats``): requests, node reads (after merging), runs and their
bytes, so the mean run length a drive sees is ``run_bytes_total / runs``.

Thread safety: ``submit`` from any thread; ``close`` fails what is queued.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

__all__ = ["DriveReads", "ReadRequest", "ReadStats", "SchedulerClosed"]

RUN_BYTES = 32 * 1024 * 1024
"""A stream's run before the drive switches to another stream waiting."""
MERGE_BYTES = 4 * 1024 * 1024
"""Adjacent requests of a stream merged into one read of the node, at most."""

ReadFn = Callable[[int, int, int], bytes | bytearray | memoryview]
"""``read(slice_id, offset, length)`` of the drive: its bytes (short at the slice's end);
raises the node's typed errors."""
Done = Callable[[memoryview | None, BaseException | None], None]
"""A request's answer: ``(bytes, None)`` or ``(None, error)``; called once, from a
scheduler thread (or ``close``'s caller)."""


class SchedulerClosed(Exception):
    """The server closed while the request waited (its connection is closing too)."""


@dataclass(slots=True, order=True)
class ReadRequest:
    """One READ waiting: ``slice_id``'s ``[offset, offset + length)``; ``done`` gets
    its answer; ``cancelled()`` True skips it (its connection closed)."""

    offset: int
    length: int = field(compare=False)
    slice_id: int = field(compare=False)
    done: Done = field(compare=False)
    cancelled: Callable[[], bool] = field(compare=False, default=lambda: False)


@dataclass(slots=True)
class ReadStats:
    """What a drive's read scheduler did (see the module docstring)."""

    requests: int = 0
    node_reads: int = 0
    runs: int = 0
    run_bytes_total: int = 0
    queued: int = 0  # requests waiting now

    @property
    def mean_run_bytes(self) -> float:
        return self.run_bytes_total / self.runs if self.runs else 0.0


class DriveReads:
    """The READ queue of one drive, served in runs per stream (module docstring)."""

    def __init__(self, read: ReadFn, *, name: str = "drive", threads: int = 4,
                 run_bytes: int = RUN_BYTES, merge_bytes: int = MERGE_BYTES) -> None:
        if threads < 1 or run_bytes < 1 or merge_bytes < 1:
            raise ValueError("a read scheduler needs threads, run_bytes and merge_bytes >= 1")
        self._read = read
        self.run_bytes = run_bytes
        self.merge_bytes = merge_bytes
        self._cond = threading.Condition()
        self._streams: OrderedDict[int, list[ReadRequest]] = OrderedDict()  # turn order
        self._current: int | None = None  # the stream whose run the drive is in
        self._reading: dict[int, int] = {}  # stream -> its batches being read now
        self._served = 0  # bytes of the current run so far
        self._closed = False
        self._stats = ReadStats()
        self._threads = [threading.Thread(target=self._serve_loop, name=f"reads-{name}-{i}",
                                          daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, request: ReadRequest) -> None:
        """Queue a READ; returns at once (``request.done`` is called when served).
        Raises ``SchedulerClosed`` once closed."""
        with self._cond:
            if self._closed:
                raise SchedulerClosed()
            queue = self._streams.get(request.slice_id)
            if queue is None:
                queue = self._streams[request.slice_id] = []
            bisect.insort(queue, request)
            self._stats.requests += 1
            self._stats.queued += 1
            self._cond.notify()

    def stats(self) -> ReadStats:
        """A copy of the counters."""
        with self._cond:
            s = self._stats
            return ReadStats(s.requests, s.node_reads, s.runs, s.run_bytes_total, s.queued)

    def _take(self) -> list[ReadRequest] | None:
        """The next batch (adjacent requests of one stream), waiting for one;
        None once closed. Called with the condition held."""
        while True:
            if self._closed:
                return None
            stream = self._pick()
            if stream is not None:
                break
            self._cond.wait()  # for a READ, or for a stream's batch being read to end
        queue = self._streams[stream]
        batch = [queue.pop(0)]
        end = batch[0].offset + batch[0].length
        span = batch[0].length
        while queue and queue[0].offset == end and span + queue[0].length <= self.merge_bytes:
            batch.append(queue.pop(0))
            end += batch[-1].length
            span += batch[-1].length
        if not queue:
            del self._streams[stream]  # it takes its turn anew when it asks again
        self._served += span
        self._reading[stream] = self._reading.get(stream, 0) + 1
        self._stats.run_bytes_total += span
        self._stats.queued -= len(batch)
        self._stats.node_reads += 1
        return batch

    def _pick(self) -> int | None:
        """The stream to serve next: the current one while its run lasts and it
        has requests, else the next waiting stream in turn (a new run). While
        another thread still reads the current stream within its run, none:
        the run goes on if its stream asks again before that read ends, so
        threads add depth to one stream's run, never a second stream beside it."""
        current = self._current
        if current is not None and self._served < self.run_bytes:
            if current in self._streams:
                return current
            if self._reading.get(current):
                return None
        if current is not None and current in self._streams:
            self._streams.move_to_end(current)  # its run is over: the others' turn first
        for stream in self._streams:
            self._current, self._served = stream, 0
            self._stats.runs += 1
            return stream
        return None

    def _serve_loop(self) -> None:
        while True:
            with self._cond:
                batch = self._take()
            if batch is None:
                return
            try:
                self._serve(batch)
            finally:
                with self._cond:
                    stream = batch[0].slice_id
                    self._reading[stream] -= 1
                    if not self._reading[stream]:
                        del self._reading[stream]
                    self._cond.notify_all()

    def _serve(self, batch: list[ReadRequest]) -> None:
        """Read a batch with one read of the node and answer each request (never raises)."""
        live = [r for r in batch if not r.cancelled()]
        if not live:
            return
        first, last = live[0], live[-1]
        try:
            data = memoryview(self._read(first.slice_id, first.offset,
                                         last.offset + last.length - first.offset))
        except BaseException as exc:  # the node's error goes to every request of the batch
            for request in live:
                _answer(request, None, exc)
            return
        for request in live:
            start = request.offset - first.offset
            _answer(request, data[start : start + request.length], None)

    def close(self) -> None:
        """Stop the threads (after the batches they are reading); every request
        still queued is answered with ``SchedulerClosed``. Idempotent."""
        with self._cond:
            self._closed = True
            left = [r for queue in self._streams.values() for r in queue]
            self._streams.clear()
            self._stats.queued = 0
            self._cond.notify_all()
        for request in left:
            _answer(request, None, SchedulerClosed())
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()


def _answer(request: ReadRequest, data: memoryview | None, exc: BaseException | None) -> None:
    try:
        request.done(data, exc)
    except Exception:  # an answer that cannot be queued must not stop the drive's reads
        log.exception("answering a READ of slice %#x failed", request.slice_id)
