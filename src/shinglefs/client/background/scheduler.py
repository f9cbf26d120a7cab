"""The scheduler of a client's background jobs: one thread, passes in a fixed order.

A *pass* runs every registered job in the order it was added: a job without
an interval on every pass, a job with one only when that long has passed
since it last ran (the first time one interval after ``start``). A pass
starts every ``period`` seconds, or at once when someone calls ``wake``
(a file was freed, a chunk is due for compaction, many closes are queued).

Errors: a job that raises ends its pass (the jobs after it wait for the
next one); the failure is logged and the thread carries on. ``stop``
returns once the thread has finished its current job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

__all__ = ["BackgroundScheduler"]


@dataclass(slots=True)
class _Job:
    name: str
    run: Callable[[], object]
    every: float | None
    last: float = 0.0


class BackgroundScheduler:
    """Runs the jobs added with ``add`` on a daemon thread named ``name``."""

    def __init__(self, period: float, name: str = "shinglefs-maintenance") -> None:
        self.period = period
        self._jobs: list[_Job] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def add(self, name: str, run: Callable[[], object], every: float | None = None) -> None:
        """Run ``run()`` on every pass, or every ``every`` seconds; before ``start``."""
        self._jobs.append(_Job(name, run, every))

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Start the next pass now (or as soon as the current one ends)."""
        self._wake.set()

    def pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` inside a job; True when stopping (give up)."""
        return self._stop.wait(seconds)

    def stop(self, timeout: float = 30.0) -> None:
        """End the thread after its current job (not waited for from the thread itself)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        started = time.monotonic()
        for job in self._jobs:
            job.last = started
        while not self._stop.is_set():
            self._wake.wait(self.period)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._run_pass()

    def _run_pass(self) -> None:
        for job in self._jobs:
            if job.every is not None and time.monotonic() - job.last <= job.every:
                continue
            try:
                job.run()
            except Exception:
                if not self._stop.is_set():
                    log.exception("maintenance job %r failed; the pass ends, retrying later",
                                  job.name)
                return
            if job.every is not None:
                job.last = time.monotonic()
