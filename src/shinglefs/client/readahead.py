"""How far each sequential reader reads ahead, so that all of them fit the read cache.

One client serves many sequential readers at once (an epoch read by several
DataLoader workers, each streaming its own file). Each would read
``readahead_bytes`` ahead; eight of them at 64 MiB ask for 512 MiB of
read-ahead, twice a 256 MiB read cache, and the cache then evicts one
stream's next extents to hold another's before either is read: the same
bytes come off the drive twice. :class:`StreamWindows` shares the cache
between the streams active now and tells each its :class:`Window`:

- ``bytes``: how far ahead of its reader a stream is read, at most
  ``readahead_bytes`` and at most its share (``SHARE`` of the cache over the
  streams active now), never below ``MIN_EXTENTS`` extents; a whole number
  of extents;
- ``step``: read-ahead is topped up once the reader has eaten this much of
  it (half the window), so the drive gets long requests of one stream
  rather than one extent of each stream in turn;
- ``run``: extents per pool job (``ExtentCache.prefetch``): one stream's
  step spread over its share of ``io_threads``, so one reader alone keeps
  every thread busy and many readers get one thread each, reading its
  stream in order.

The windows are computed from the streams seen so far, so the first of
several streams starting together would take more than their share: the
read path also keeps all read-ahead not read yet within ``budget``
(``SHARE`` of the cache), every stream still getting ``minimum``.

A stream is active from its read-ahead until ``IDLE_S`` seconds pass without
one, or until its handle is released (``forget``). Keeping the streams in the
order they last read ahead makes that O(1) a call, however many small files
are opened and read a second (a DataLoader over images opens thousands).
Thread-safe; never does I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["IDLE_S", "MIN_EXTENTS", "SHARE", "StreamWindows", "Window"]

SHARE = 0.75  # of the read cache, for read-ahead not yet read (the rest: what readers hold)
MIN_EXTENTS = 2  # the smallest window: the extent being read and the next
IDLE_S = 1.0  # a stream without read-ahead this long no longer counts


@dataclass(frozen=True, slots=True)
class Window:
    """A stream's read-ahead now (see the module docstring)."""

    bytes: int
    step: int
    run: int


class StreamWindows:
    """The read-ahead window of each of a client's sequential streams."""

    def __init__(self, *, readahead: int, extent: int, cache_bytes: int, io_threads: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.readahead = readahead
        self.extent = extent
        self.cache_bytes = cache_bytes
        self.io_threads = max(1, io_threads)
        self._clock = clock
        self.budget = int(cache_bytes * SHARE)  # read-ahead not read yet, all streams
        self.minimum = MIN_EXTENTS * extent  # every stream's read-ahead, whatever the budget
        self._lock = threading.Lock()
        # stream -> when it last read ahead; in that order (oldest first).
        self._seen: dict[int, float] = {}

    def active(self) -> int:
        """Streams that read ahead within the last ``IDLE_S`` seconds."""
        with self._lock:
            return self._prune(self._clock())

    def _prune(self, now: float) -> int:
        """Drop the streams idle for ``IDLE_S``: the oldest first, stopping at the
        first one still active (``_seen`` is in last-read-ahead order)."""
        seen = self._seen
        while seen:
            stream, at = next(iter(seen.items()))
            if now - at <= IDLE_S:
                break
            del seen[stream]
        return len(seen)

    def window(self, stream: int) -> Window:
        """The window of ``stream`` (a handle number) now; counts it as active."""
        now = self._clock()
        with self._lock:
            self._seen.pop(stream, None)  # to the end: the newest
            self._seen[stream] = now
            streams = self._prune(now)
        return self.window_for(streams)

    def window_for(self, streams: int) -> Window:
        """The window of each of ``streams`` active streams."""
        e = self.extent
        share = int(self.cache_bytes * SHARE) // max(1, streams)
        extents = max(MIN_EXTENTS, min(self.readahead, share) // e)
        step = max(1, extents // 2)
        threads = max(1, self.io_threads // max(1, streams))
        run = max(1, -(-step // threads))
        return Window(bytes=extents * e, step=step * e, run=run)

    def forget(self, stream: int) -> None:
        """``stream`` stopped reading ahead (released, or no longer sequential)."""
        with self._lock:
            self._seen.pop(stream, None)
