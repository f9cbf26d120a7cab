"""What one file's writer has to report: failures of its pieces, and running out of space.

A :class:`~shinglefs.client.writer.FileWriter` sends pieces in the background;
a piece that fails is reported by the writer's next call (write, flush,
fsync, close), as Linux reports write-back errors. :class:`WriteFailures`
keeps that state:

- the failure not reported yet (``error``), the first of any slice;
- a slice is dead from its first failed piece (``OpenSlice.failure``); the
  failures of pieces of it already sent are consequences (a server that
  refused one answers the next with an order error: EINVAL) and never
  reported. Answers may come out of order: an order error while an earlier
  piece is unanswered kills the slice but is not reported, the earlier
  piece's failure is (the writer waits for a dead slice's pieces before it
  reports);
- a failed slice is *sticky* for writes: from a piece that failed (a storage
  server refused it for want of room -- another client took the room this
  one's reservation counted on --, or died, or the owner of the drives went
  away) every later ``write`` raises that error (ENOSPC, else EIO), since
  bytes ``write`` had accepted are lost with the slice and the file would go
  on past a gap that reads as zeros; the file keeps what was committed
  before (its old content or a prefix of the new). A truncation at or below
  the first lost byte ends it, and so does writing the lost bytes again:
  a write that begins at or before the first byte still lost is taken and
  moves that byte past its end; once the lost range is written over, the
  file is whole again. A slice whose commit failed, or is in doubt (the
  metadata unreachable), counts as lost alike (``commit_failed``). (Before, only ENOSPC was: a `connect()`
  writer whose `up` was restarted got one EIO, wrote on, and closed a file
  whose first 9 MB read zeros.)

Thread safety: ``piece_failed`` runs on whatever thread completes a piece;
the rest under the writer's lock. Each field is one assignment, and a race
between two failures only chooses which one is reported.
"""

from __future__ import annotations

import errno
import itertools
from concurrent import futures

from shinglefs.client.writebuffers import OpenSlice
from shinglefs.errors import ShingleError
from shinglefs.server.errors import NodeFull, RemoteNodeError
from shinglefs.store.errors import SliceOrderError

__all__ = ["WriteFailures"]


class WriteFailures:
    """The failures one writer has to report (module docstring)."""

    __slots__ = ("error", "full", "lost_from", "lost_to")

    def __init__(self) -> None:
        self.error: BaseException | None = None  # not reported yet
        self.full: BaseException | None = None  # the first failure of a slice: sticky
        self.lost_from = 0  # with ``full``: the file offset of the first byte still lost
        self.lost_to = 0  # with ``full``: the end of the bytes lost

    def piece_failed(self, s: OpenSlice, exc: BaseException, *, behind: bool = False) -> None:
        """A piece of ``s`` failed: the first failure kills the slice and is to be
        reported; later ones (and any of a slice dropped already) are not.
        ``behind``: an earlier piece of ``s`` is not answered yet; an order error
        then only kills the slice (module docstring)."""
        if s.aborted or exc is s.failure or (
                s.failure is not None and not _out_of_order(s.failure)):
            return
        if behind and _out_of_order(exc):
            if s.failure is None:
                s.failure = exc
            return
        s.failure = exc
        if self.full is None or s.start < self.lost_from:
            self.full, self.lost_from = exc, s.start
        self.lost_to = max(self.lost_to, s.end)
        if self.error is None:
            self.error = exc

    def commit_failed(self, s: OpenSlice, exc: BaseException) -> None:
        """Every piece of ``s`` was stored but its commit failed (its bytes are
        deleted), or may have failed (the metadata unreachable: kept, in
        doubt): bytes ``write`` accepted are lost as with a failed piece, and
        sticky alike; the caller raises ``exc`` itself (reported once). Before,
        an fsync said EIO once and every later write, fsync and close
        succeeded over a 16 MiB hole of zeros."""
        if self.full is None or s.start < self.lost_from:
            self.full, self.lost_from = exc, s.start
        self.lost_to = max(self.lost_to, s.end)

    def piece_done(self, s: OpenSlice, f: futures.Future[None]) -> None:
        """``f``, a piece of ``s``, completed (its done callback): note its failure."""
        exc = None if f.cancelled() else f.exception()
        if exc is not None:
            earlier = itertools.takewhile(lambda g: g is not f, [g for g, _n in list(s.inflight)])
            self.piece_failed(s, exc, behind=not all(g.done() for g in earlier))

    def all_answered(self, s: OpenSlice) -> None:
        """Wait for every piece of the dead slice ``s`` in flight; the failure of the
        first that failed is then its own (callbacks may not have run yet)."""
        futures.wait([f for f, _n in s.inflight])
        failed = (f.exception() for f, _n in s.inflight if not f.cancelled())
        first = next((exc for exc in failed if exc is not None), None)
        if first is not None:
            self.piece_failed(s, first)

    def keep(self, exc: BaseException) -> None:
        """Report ``exc`` at the writer's next call (unless one is waiting already)."""
        if self.error is None:
            self.error = exc

    def healthy(self, s: OpenSlice | None) -> bool:
        """Nothing to report, not full, and no dead open slice ``s``."""
        return self.error is None and self.full is None and (s is None or s.failure is None)

    def quiet(self, s: OpenSlice | None) -> bool:
        """Nothing to report and no dead open slice ``s`` (a flush has nothing to
        raise; the sticky loss is for writes)."""
        return self.error is None and (s is None or s.failure is None)

    def due(self, s: OpenSlice | None, *, writing: bool,
            at: tuple[int, int] | None = None) -> BaseException | None:
        """What the writer's call must raise now, taken (reported once), or None:
        the failure not reported yet; else (``writing`` ``at`` = (offset,
        length)) the sticky loss, unless that write begins at or before the
        first byte still lost; else the failure of the dead open slice ``s``."""
        error, self.error = self.error, None
        if error is None and writing and self.full is not None and at is not None \
                and at[0] <= self.lost_from:
            self.lost_from = max(self.lost_from, at[0] + at[1])  # written again
            if self.lost_from >= self.lost_to:
                self.full = None
        if error is None and writing and self.full is not None:
            error = _lost(self.full, self.lost_from, s.slice_id if s is not None else 0)
        if error is None and s is not None:
            error = s.failure
        return error

    def truncated(self, size: int) -> None:
        """The file was cut to ``size``: below the lost bytes, writing may go on."""
        if self.full is not None and size <= self.lost_from:
            self.full = None


def _lost(first: BaseException, lost_from: int, slice_id: int) -> BaseException:
    """What a write raises once bytes of the file from ``lost_from`` were lost
    to ``first``: ENOSPC when the drives refused them, else EIO."""
    if getattr(first, "errno", None) == errno.ENOSPC:
        return NodeFull(slice_id, None, f"bytes of this file were refused earlier ({first})")
    return WriteLost(f"bytes of this file from offset {lost_from} were lost when writing them "
                     f"failed ({first}): truncate it to {lost_from} or below, or write it anew")


class WriteLost(ShingleError):
    """Bytes a ``write`` had accepted were lost (their slice failed): later writes
    past them would leave a gap; EIO until the file is cut below them."""

    errno = errno.EIO


def _out_of_order(exc: BaseException) -> bool:
    """Is ``exc`` a store's answer to a piece not at its slice's length?"""
    return isinstance(exc, SliceOrderError) or (
        isinstance(exc, RemoteNodeError) and exc.kind == SliceOrderError.__name__)
