"""The slices one file ended and has not committed yet, settling in order in the background.

A :class:`~shinglefs.client.writer.FileWriter` that ends a slice while the
application goes on writing hands it to a shared pool of commit threads: the
task waits for the slice's pieces and commits its reference (ordered
commits). A file's tasks commit in the order its slices ended: each queues
its commit only once the one before it has queued its own (or ended), so
that later slices overlay earlier ones, while the slices of a file written
in small scattered pieces share group commits (one transaction for several)
instead of committing one after another. :class:`SettlingSlices` is that queue for one file:
what is still settling (for reads that must see the bytes, the janitor
that must spare them, and the bound ``max_settling_slices``), and waiting
for it (oldest first, raising each task's failure).

Thread safety: one lock guards the queue, never held while waiting; the
writer that owns the queue is the only one that adds to it or waits on it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future

__all__ = ["SettlingSlices"]


class SettlingSlices:
    """The ended, not yet committed slices of one file, in the order they ended."""

    def __init__(self, settler: Executor, bound: int = 32) -> None:
        self._settler = settler
        self._lock = threading.Lock()
        self._queue: deque[tuple[int, int, Future[None]]] = deque()  # (start, end, future)
        # Recent slice ids: the janitor must spare a slice until its task is done
        # (more than the ``bound`` of tasks settling at once: none drops off early).
        self._ids: deque[tuple[int, Future[None]]] = deque(maxlen=2 * bound + 16)
        self._last_queued: threading.Event | None = None  # the latest task's

    def __len__(self) -> int:
        """Tasks not yet waited for (done or not)."""
        return len(self._queue)

    def ranges(self) -> list[tuple[int, int]]:
        """``(start, end)`` of the file bytes of slices still settling."""
        with self._lock:
            return [(a, b) for a, b, f in self._queue if not f.done()]

    def running(self) -> int:
        """How many slices are still settling."""
        with self._lock:
            return sum(1 for _a, _b, f in self._queue if not f.done())

    def slice_ids(self) -> set[int]:
        """Ids of recently ended slices whose task is not done."""
        with self._lock:
            return {sid for sid, f in self._ids if not f.done()}

    def submit(
        self, slice_id: int, start: int, end: int,
        settle: Callable[[threading.Event | None, threading.Event], None],
    ) -> None:
        """Run ``settle(previous, queued)`` on the pool for the slice ``slice_id``
        holding file bytes ``[start, end)``: ``previous`` is set once the
        file's task before it has queued its commit or ended (None: there is
        none); the task sets ``queued`` when its own commit is queued (it is
        set for it when the task ends, whatever happened)."""
        with self._lock:
            previous = self._last_queued
            queued = threading.Event()

            def task() -> None:
                try:
                    settle(previous, queued)
                finally:
                    queued.set()

            future = self._settler.submit(task)
            self._last_queued = queued
            self._queue.append((start, end, future))
            self._ids.append((slice_id, future))

    def wait_oldest(self) -> None:
        """Wait for the oldest task and forget it; raises its failure."""
        with self._lock:
            _a, _b, future = self._queue[0]
        try:
            future.result()
        finally:
            with self._lock:
                self._queue.popleft()

    def wait_all(self) -> None:
        """Wait until every task is done; raise the first failure."""
        first: BaseException | None = None
        while self._queue:
            try:
                self.wait_oldest()
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first
