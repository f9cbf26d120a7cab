"""Slices whose commit is in doubt, settled once the metadata answers again.

A commit that fails with the metadata unreachable (``MetaUnavailable``: a
PostgreSQL connection lost with its COMMIT in flight, a server stopped
mid-write) may have happened or not. The writer keeps the slice's bytes then
(deleting them could leave a committed reference pointing at nothing) and
notes the slice here (``note``). Each background pass, ``resolve`` asks meta
about every slice noted at least ``grace_s`` ago:

- meta holds it COMMITTED (or already TO_DELETE): the commit happened; the
  bytes are the file's (or on their way out) and nothing is done;
- meta holds it WRITING with no reference (registered when its first piece
  was stored; the commit did not happen): it is queued for deletion
  (``discard_slices``, which leaves it alone if it got a reference);
- meta does not know it (stored in one piece, so never registered; the
  commit, which would have recorded it, did not happen): its bytes are
  deleted from the drive.

Before, the bytes stayed for good: ``fsck`` said "damaged" (unknown slices)
after every metadata outage that caught a write, and only ``--repair``
filed them under /lost+found. ``grace_s`` (30 s) leaves a COMMIT that the
server was still running when the connection broke the time to finish
before meta is asked. A slice still unresolved when the process ends (or
beyond ``capacity`` entries) is what ``fsck`` reports, as before.

Thread-safe: ``note`` runs on the writers' threads, ``resolve`` on the
background thread.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from shinglefs.meta.api import MetaStore, SliceState
from shinglefs.meta.errors import FsError, MetaUnavailable
from shinglefs.server.node import SliceNode

log = logging.getLogger(__name__)

__all__ = ["IN_DOUBT_GRACE_S", "InDoubtSlices"]

IN_DOUBT_GRACE_S = 30.0
IN_DOUBT_CAPACITY = 4096


class InDoubtSlices:
    """Slices noted in doubt, and what settles them (module docstring)."""

    def __init__(self, meta: MetaStore, node: SliceNode, *, wake: Callable[[], None],
                 grace_s: float = IN_DOUBT_GRACE_S, capacity: int = IN_DOUBT_CAPACITY) -> None:
        self.meta = meta
        self.node = node
        self.grace_s = grace_s
        self.capacity = capacity
        self._wake = wake
        self._lock = threading.Lock()
        self._noted: OrderedDict[int, tuple[int | None, float]] = OrderedDict()

    def note(self, slice_id: int, drive_id: int | None) -> None:
        """The commit of ``slice_id`` (stored on ``drive_id``; None: no byte
        stored) is in doubt."""
        with self._lock:
            self._noted[slice_id] = (drive_id, time.monotonic())
            if len(self._noted) > self.capacity:
                dropped, _ = self._noted.popitem(last=False)
                log.warning("more than %d slices in doubt: slice %#x is left to fsck",
                            self.capacity, dropped)

    def __len__(self) -> int:
        with self._lock:
            return len(self._noted)

    def resolve(self) -> int:
        """Settle every slice noted ``grace_s`` ago or more; returns how many
        were settled. Stops at the first one meta cannot answer for (it is
        unreachable still: the next pass tries again)."""
        cutoff = time.monotonic() - self.grace_s
        with self._lock:
            due = [(sid, drive) for sid, (drive, at) in self._noted.items() if at <= cutoff]
        settled = 0
        for slice_id, drive_id in due:
            try:
                done = self._settle(slice_id, drive_id)
            except MetaUnavailable:
                break
            if done:
                with self._lock:
                    self._noted.pop(slice_id, None)
                settled += 1
        return settled

    def _settle(self, slice_id: int, drive_id: int | None) -> bool:
        """What meta says of ``slice_id``, acted on; False: try again later."""
        try:
            info = self.meta.get_slice(slice_id)
        except FsError as exc:
            if exc.errno != errno.ENOENT:
                raise
            info = None
        if info is None:
            if drive_id is None:
                return True
            try:
                self.node.delete(slice_id, drive_id)
            except Exception as exc:  # its server away: the next pass tries again
                log.debug("slice %#x, whose commit did not happen, is not deleted yet: %s",
                            slice_id, exc)
                return False
            log.info("slice %#x: its commit did not happen; its bytes are deleted", slice_id)
            return True
        if info.state == SliceState.WRITING and info.refcount == 0 \
                and self.meta.discard_slices([slice_id]):
            log.info("slice %#x: its commit did not happen; queued for deletion", slice_id)
            self._wake()
        return True
