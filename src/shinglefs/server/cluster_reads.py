"""Read-ahead across the network for a client of storage servers (``ClusterNode``).

The client's read cache (client/reader.py) reads ahead in *runs* of
consecutive extents, one pool thread per run, and first hints the node of the
whole run (``node.prefetch``). On its own drives that hint starts the drive
reading; for a client of storage servers, :class:`NetworkReadAhead` sends the
run's READs to the server at once (pipelined on the ``RemoteNode``
connections, each received straight into its own buffer), so the server holds
the whole run and its read scheduler (server/reads.py) serves it as one
sequential run, while the client's thread takes the extents one after another
as they land (``take``), instead of asking for each only once the previous
one came back.

Reads started ahead are kept by ``(slice id, offset)`` in pieces of
``piece`` bytes (aligned to ``piece`` within the slice: the client's read
extent) until a read of the node takes them; a read that finds none reads
as before.

Memory: every buffer of a read started ahead, in flight or landed and not
taken yet, counts its full length against ``capacity``; a prefetch that
does not fit first drops landed reads no one took (oldest first), then
starts only what fits (the rest is read on demand). A taken read's buffer
belongs to its taker (the client's read cache counts it from then on).
``held_bytes`` is what is counted now.

Validity: slices are immutable once committed, and a read started ahead is
only ever served for the same slice, offset and at most its length; a
deleted slice's reads are dropped (``drop_slice``), those being started at
that moment included (they are not kept once their ``start`` returns); a
client never reads ahead a slice it is still writing (its caller's rule:
``ClusterNode``).

Once: a piece is started at most once at a time. A piece being started is
noted (``_starting``, under the lock, with a token of its starter) before its
``start`` is called, so a concurrent ``prefetch`` of it skips it; only the
starter whose token is still noted keeps its read (``drop_slice`` and
``clear`` forget the tokens).

Failures: a read started ahead that failed, or that does not answer within
the wait its taker allows, is not served: the taker reads the range as any
read does (replica after replica), so a dying server costs a read ahead
nothing but the wait.

Thread safety: every method may be called from any thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shinglefs.client.commit import split_drive_id
from shinglefs.meta.errors import FsError
from shinglefs.server.errors import NodeError, WireError

if TYPE_CHECKING:
    from shinglefs.server.remote import RemoteNode

__all__ = ["PIECE", "READAHEAD_BYTES", "NetworkReadAhead", "prefetch_first", "read_replicas"]

log = logging.getLogger("shinglefs.server.cluster")

PIECE = 4 * 1024 * 1024
"""A read started ahead: ``ClientConfig.read_extent``'s default, so a hinted run
splits into the very reads the client's cache then makes."""
READAHEAD_BYTES = 64 * 1024 * 1024
"""Buffers of reads started ahead and not taken, at most (``ClusterNode``)."""

StartRead = Callable[[int, int, bytearray], Future[int]]
"""``start(slice_id, offset, buffer)``: a READ of ``len(buffer)`` bytes sent now,
received straight into ``buffer``; its future gives how many came."""


@dataclass(slots=True)
class _Ahead:
    buffer: bytearray
    future: Future[int]


class NetworkReadAhead:
    """Reads of slices started ahead of their readers (module docstring)."""

    def __init__(self, *, capacity: int = READAHEAD_BYTES, piece: int = PIECE) -> None:
        if piece < 1 or capacity < 0:
            raise ValueError("read-ahead needs piece >= 1 and capacity >= 0")
        self.capacity = capacity
        self.piece = piece
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, int], _Ahead] = OrderedDict()
        # pieces whose start() is being called -> their starter's token
        self._starting: dict[tuple[int, int], object] = {}
        self._bytes = 0
        self.started = 0  # reads started ahead
        self.taken = 0  # of them served to a reader

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers of reads started ahead and not taken."""
        with self._lock:
            return self._bytes

    def prefetch(self, slice_id: int, offset: int, length: int, start: StartRead) -> int:
        """Start reads of ``slice_id``'s ``[offset, offset + length)`` in pieces of
        ``piece`` (whole pieces; one already started, or being started by
        another caller, is not started again), as many as fit ``capacity``;
        returns how many were started and kept (a piece whose slice was
        dropped or cleared while it was started is cancelled, not kept).
        ``start``'s errors propagate (nothing is kept of the piece it failed for)."""
        first = offset // self.piece
        last = (offset + max(length, 1) - 1) // self.piece
        started = 0
        for index in range(first, last + 1):
            key = (slice_id, index * self.piece)
            token = object()
            with self._lock:
                if (key in self._entries or key in self._starting
                        or not self._room_locked(self.piece)):
                    continue
                self._starting[key] = token
                self._bytes += self.piece
            buffer = bytearray(self.piece)
            try:
                future = start(slice_id, key[1], buffer)
            except BaseException:
                with self._lock:
                    self._forget_start_locked(key, token)
                raise
            with self._lock:
                kept = self._starting.get(key) is token
                if kept:
                    del self._starting[key]
                    self._entries[key] = _Ahead(buffer, future)
                    self.started += 1
            if not kept:  # dropped meanwhile: its bytes no longer counted, its buffer no one's
                future.cancel()
                continue
            started += 1
        return started

    def _forget_start_locked(self, key: tuple[int, int], token: object) -> None:
        """Un-note a piece being started, and its bytes, if ``token`` still holds it."""
        if self._starting.get(key) is token:
            del self._starting[key]
            self._bytes -= self.piece

    def _room_locked(self, nbytes: int) -> bool:
        """Is there room for ``nbytes`` more, after dropping landed reads no one took?"""
        if self._bytes + nbytes <= self.capacity:
            return True
        for key in [k for k, e in self._entries.items() if e.future.done()]:
            self._bytes -= len(self._entries.pop(key).buffer)
            if self._bytes + nbytes <= self.capacity:
                return True
        return False

    def take(self, slice_id: int, offset: int, length: int,
             wait: float | None) -> memoryview | None:
        """The bytes of ``[offset, offset + length)`` of a slice from a read started
        ahead at exactly ``offset`` (at most ``length`` of them: short only where
        the slice ends), waiting at most ``wait`` seconds for it to land (None:
        as long as it takes); None when there is none, it failed, or it did not
        land in time (the caller then reads as usual). The entry is gone either
        way: its buffer belongs to the caller."""
        with self._lock:
            entry = self._entries.pop((slice_id, offset), None)
            if entry is None:
                return None
            self._bytes -= len(entry.buffer)
        if length > len(entry.buffer):
            return None
        try:
            n = entry.future.result(wait)
        except (concurrent.futures.TimeoutError, Exception):
            return None
        with self._lock:
            self.taken += 1
        return memoryview(entry.buffer)[: min(n, length)].toreadonly()

    def drop_slice(self, slice_id: int) -> None:
        """Forget the reads started ahead of a slice (deleted), those being
        started now included (not kept when their ``start`` returns). Reads in
        flight finish into buffers no one keeps."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == slice_id]:
                self._bytes -= len(self._entries.pop(key).buffer)
            for key in [k for k in self._starting if k[0] == slice_id]:
                self._forget_start_locked(key, self._starting[key])

    def clear(self) -> None:
        """Forget every read started ahead (the node closes), those being started
        now included."""
        with self._lock:
            self._entries.clear()
            self._starting.clear()
            self._bytes = 0


READ_FAILURE_LOG_S = 30.0  # one warning per server this often; the rest at debug
_read_failures_logged: dict[int, float] = {}


def _log_read_failure(server: int, message: str, *args: object) -> None:
    """Warn of a failed read once per server every ``READ_FAILURE_LOG_S``: a
    reader while a server is away fails every slice it asks for, and an
    application's stderr would get one line each (hundreds)."""
    now = time.monotonic()
    if now - _read_failures_logged.get(server, -READ_FAILURE_LOG_S) >= READ_FAILURE_LOG_S:
        _read_failures_logged[server] = now
        log.warning(message + " (more from this server within %.0f s: debug log)", *args,
                    READ_FAILURE_LOG_S)
    else:
        log.debug(message, *args)


def read_replicas(drives: tuple[int, ...], slice_id: int, offset: int, length: int,
                  remote: Callable[[int], RemoteNode],
                  suspect: Callable[[int, BaseException], None],
                  failover_after: float) -> memoryview:
    """Bytes ``[offset, offset+length)`` of a slice from the first of ``drives``
    (cluster drive ids, in the order to try) that answers, as a read-only view.
    Each but the last gets ``failover_after`` seconds (a hung server is passed
    over in bounded time and ``suspect``-ed), the last its connection's full
    timeout. Raises the last replica's ``NodeError`` when none answers."""
    failure: BaseException | None = None
    for drive in drives:
        server, local = split_drive_id(drive)
        last = drive == drives[-1]
        try:
            data = remote(server).read(slice_id, offset, length, local,
                                       give_up_after=None if last else failover_after)
        except NodeError as exc:  # unreachable, broken, timed out, or no such slice
            _log_read_failure(server, "reading slice %#x from server %d failed (%s)%s",
                              slice_id, server, exc, "" if last else "; trying another replica")
            if isinstance(exc, WireError):
                suspect(server, exc)
            failure = exc
            continue
        return memoryview(data).toreadonly()
    assert failure is not None
    raise failure


def prefetch_first(ahead: NetworkReadAhead, drives: tuple[int, ...], slice_id: int,
                   offset: int, length: int, remote: Callable[[int], RemoteNode]) -> None:
    """Start reading ``[offset, offset+length)`` ahead from the first of ``drives``
    (the replica a read tries first). Never raises: without a replica or a
    connection, the range is read on demand."""
    if not drives:
        return
    server, local = split_drive_id(drives[0])
    try:
        node = remote(server)
        ahead.prefetch(slice_id, offset, length,
                       lambda sid, off, buf: node.submit_readinto(sid, off, buf, local))
    except (NodeError, FsError) as exc:
        log.debug("no read-ahead of slice %#x from server %d: %s", slice_id, server, exc)
