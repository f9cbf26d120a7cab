"""The scheduler of a client's background jobs: one thread, passes in a fixed order.

A *pass* runs every registered job in the order it was added: a job without
an interval on every pass, a job with one only when that long has passed
since it last ran (the first time one interval after ``start``). A pass
starts every ``period`` seconds, or at once when someone calls ``wake``
(a file was freed, a chunk is due for compaction, many closes are queued).

Errors: each job runs on its own. One that raises does not end the pass:
the jobs after it run as usual (the session heartbeat after a failing
compaction scan or janitor, say), and the failing job waits before its next
try, ``retry_first`` seconds, doubling with every failure in a row up to
``retry_max`` (and never longer than its own interval), so a job failing
on every try neither spins nor starves the others. Its failure is logged
with its traceback once per distinct error (type and message) in a row,
repeats at debug level; its first success after failures is logged.
``stop`` returns once the thread has finished its current job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

__all__ = ["BackgroundScheduler"]


RETRY_FIRST_S = 1.0
"""A failed job's first wait before it runs again (doubled each failure in a row)."""
RETRY_MAX_S = 60.0
"""The longest wait of a job failing again and again (or its interval, if shorter)."""


@dataclass(slots=True)
class _Job:
    name: str
    run: Callable[[], object]
    every: float | None
    last: float = 0.0  # when it last succeeded (or the scheduler started)
    failures: int = 0  # failures in a row
    retry_at: float = 0.0  # not before then, after a failure
    error: str | None = None  # the last failure, as logged


def _error_key(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"


class BackgroundScheduler:
    """Runs the jobs added with ``add`` on a daemon thread named ``name``."""

    def __init__(self, period: float, name: str = "shinglefs-maintenance", *,
                 retry_first: float = RETRY_FIRST_S, retry_max: float = RETRY_MAX_S) -> None:
        self.period = period
        self.retry_first = retry_first
        self.retry_max = retry_max
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
        """Every job that is due, each in its own ``try`` (module docstring)."""
        for job in self._jobs:
            if self._stop.is_set():
                return
            now = time.monotonic()
            if now < job.retry_at or (job.every is not None and now - job.last <= job.every):
                continue
            try:
                job.run()
            except Exception as exc:
                self._failed(job, exc)
                continue
            if job.failures:
                log.info("maintenance job %r runs again after %d failures", job.name,
                         job.failures)
            job.failures, job.retry_at, job.error = 0, 0.0, None
            if job.every is not None:
                job.last = time.monotonic()

    def _failed(self, job: _Job, exc: Exception) -> None:
        """Note ``job``'s failure: its next try waits (doubling), logged once per error."""
        if self._stop.is_set():
            return  # a job cut short by stop (its resources are closing)
        job.failures += 1
        cap = self.retry_max if job.every is None else min(self.retry_max, job.every)
        delay = min(cap, self.retry_first * 2 ** min(job.failures - 1, 30))
        job.retry_at = time.monotonic() + delay
        key = _error_key(exc)
        if key != job.error:
            job.error = key
            log.error("maintenance job %r failed; the other jobs go on, this one is "
                      "retried in %.3g s (doubling while it fails)", job.name, delay,
                      exc_info=exc)
        else:
            log.debug("maintenance job %r failed again (%d in a row): %s", job.name,
                      job.failures, exc)
