"""The storage servers of a cluster, used by a client as one node (``ClusterNode``).

A file system formatted without drives of its own (``shinglefs format URL
--servers``) keeps its slices on storage servers (``shinglefs server``), which
register their drives in the metadata. A client of it (a mount, ``connect()``)
writes and reads through a ``ClusterNode``: the calls the client makes of an
in-process ``StorageNode`` (``submit``, ``flush``, ``read_view``, ``delete``,
``reserve``, ``stats`` …), served by the live servers over the slice protocol
(``RemoteNode``). The client's write path, ordered commits, deletions and
compaction are the same code in both cases.

Drive ids: a server's drive is known to the client as
``cluster_drive_id(server_id, drive_id)`` (``server_id << 16 | drive_id``),
so an id stays the same while servers come and go; local drives keep their
small ids. A slice's replica in meta is ``(str(server_id), str(drive_id))``
(``replica_for``), a local drive's ``("local", str(drive_id))``.

Membership: the live servers (``MetaStore.list_servers``: running, heartbeat
younger than ``server_timeout_s``), re-read at most every
``membership_ttl_s``. A server that stops heartbeating is left out of
placement at the next re-read; its connections stay open for reads of the
slices it holds.

Placement (one replica a slice; replication is not built yet): the first piece
of a slice places it on the drive its lifetime group used last while that
drive keeps ``min_free_fraction`` of its capacity free, else on the live drive
with the most free bytes (its heartbeat's figure less what this client
submitted there since). Every piece of a slice goes to that drive, over one
connection (``RemoteNode`` hashes the slice id), so the server appends them in
order; the server's write scheduler merges what all clients send into its
drives' zone runs.

Reads: a slice's drive is the one this client placed it on, else the replica
meta records for it (``get_slice``), remembered in a bounded memo (a slice
never moves between drives). A read waits at most the connection's
``timeout``.

Space: ``reserve`` takes bytes against the live drives' free bytes as their
servers last reported them (``NodeFull``, ENOSPC, when they do not fit).

Errors: a server's typed errors (``server.errors``: ``NodeFull``,
``SliceMissing``, ``ServerUnreachable``, ``ConnectionLost``,
``RequestTimeout``); ``NoServers`` when no live server has a drive.

Thread safety: every method may be called from any thread.
"""

from __future__ import annotations

import errno as E
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future

from shinglefs.client.commit import cluster_drive_id, drive_for, split_drive_id
from shinglefs.errors import ShingleError
from shinglefs.meta.api import MetaStore, ServerRecord
from shinglefs.meta.errors import FsError
from shinglefs.server.errors import NodeFull, SliceMissing
from shinglefs.server.node import DriveStats, NodeStats
from shinglefs.server.remote import RemoteNode
from shinglefs.store.api import Declined, PieceBytes, PieceFuture, StoreStats
from shinglefs.zoned.fileio import Payload

log = logging.getLogger(__name__)

class NoServers(ShingleError):
    """No live storage server with a drive: nothing can be written."""

    errno = E.ENOSPC


class ClusterNode:
    """The live storage servers of a file system as one node (module docstring)."""

    def __init__(self, meta: MetaStore, secret: bytes, *, connections: int = 4,
                 timeout: float = 60.0, membership_ttl_s: float = 2.0,
                 server_timeout_s: float | None = None, min_free_fraction: float = 0.02,
                 memo_entries: int = 1 << 16) -> None:
        self._meta = meta
        self._secret = secret
        self._connections = connections
        self._timeout = timeout
        self._ttl = membership_ttl_s
        self._server_timeout = server_timeout_s
        self._min_free_fraction = min_free_fraction
        self._memo_entries = memo_entries
        self._lock = threading.Lock()
        self._remotes: dict[int, RemoteNode] = {}
        self._servers: dict[int, ServerRecord] = {}  # every registered server, live or not
        self._live: dict[int, tuple[int, int]] = {}  # drive -> (capacity, free) of live servers
        self._read_at = -1e9
        self._since: dict[int, int] = {}  # drive -> bytes submitted since the last re-read
        self._reserved = 0
        self._placed: dict[int, int] = {}  # slice -> drive, slices this client writes
        self._located: OrderedDict[int, int] = OrderedDict()  # slice -> drive (memo)
        self._affinity: dict[int, int] = {}  # group -> drive
        self._closed = False

    # ------------------------------------------------------------------ membership
    def _refresh(self, force: bool = False) -> None:
        """Re-read the servers from meta when the last read is older than the ttl."""
        now = time.monotonic()
        if not force and now - self._read_at < self._ttl:
            return
        records = (self._meta.list_servers() if self._server_timeout is None
                   else self._meta.list_servers(timeout_s=self._server_timeout))
        live: dict[int, tuple[int, int]] = {}
        for record in records:
            if record.live:
                for d in record.drives:
                    live[cluster_drive_id(record.id, d.drive_id)] = (d.capacity_bytes,
                                                                     d.free_bytes)
        self._servers = {r.id: r for r in records}
        self._live = live
        self._since = dict.fromkeys(live, 0)
        self._read_at = now

    def _remote(self, server_id: int) -> RemoteNode:
        with self._lock:
            if self._closed:
                raise FsError(E.EIO, "the cluster node is closed")
            remote = self._remotes.get(server_id)
            if remote is not None:
                return remote
            record = self._servers.get(server_id)
            if record is None:
                self._refresh(force=True)
                record = self._servers.get(server_id)
            if record is None:
                raise SliceMissing(0, cluster_drive_id(server_id, 0))
            remote = RemoteNode(record.address, self._secret, connections=self._connections,
                                timeout=self._timeout)
            self._remotes[server_id] = remote
            return remote

    @property
    def drive_ids(self) -> list[int]:
        """The drives of the live servers (cluster drive ids)."""
        with self._lock:
            self._refresh()
            return sorted(self._live)

    def servers(self) -> list[ServerRecord]:
        """Every registered server as last read (live or not)."""
        with self._lock:
            self._refresh()
            return list(self._servers.values())

    # ------------------------------------------------------------------ space and placement
    def _free(self, drive_id: int) -> int:
        free = self._live.get(drive_id, (0, 0))[1]
        return free - self._since.get(drive_id, 0)

    def reserve(self, nbytes: int) -> None:
        """Take ``nbytes`` of the live drives' free bytes for accepted writes, or
        raise ``NodeFull`` (ENOSPC) with nothing taken."""
        with self._lock:
            self._refresh()
            room = sum(self._free(d) for d in self._live) - self._reserved
            if room < nbytes:
                self._refresh(force=True)
                room = sum(self._free(d) for d in self._live) - self._reserved
            if room < nbytes:
                raise NodeFull(0, None, f"{nbytes} bytes do not fit: {max(0, room)} bytes "
                                        "are free on the live storage servers")
            self._reserved += nbytes

    def unreserve(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes

    def has_room(self, drive_id: int | None, nbytes: int) -> bool:
        with self._lock:
            if drive_id is not None:
                return self._free(drive_id) >= nbytes
            return any(self._free(d) >= nbytes for d in self._live)

    def place(self, slice_id: int, group: int, size_hint: int = 0) -> int:
        """Choose the drive of a new slice (module docstring); remembers it."""
        with self._lock:
            placed = self._placed.get(slice_id)
            if placed is not None:
                return placed
            self._refresh()
            if not self._live:
                self._refresh(force=True)
            if not self._live:
                raise NoServers("no live storage server has a drive",
                                hint="start one: `shinglefs server META_URL --drive ... "
                                     "--listen HOST:PORT`; `shinglefs status --servers`")
            chosen = self._affinity.get(group)
            if chosen is not None and (
                    chosen not in self._live
                    or self._free(chosen) - size_hint
                    < self._min_free_fraction * self._live[chosen][0]):
                chosen = None
            if chosen is None:
                chosen = max(self._live, key=self._free)
            self._affinity[group] = chosen
            self._placed[slice_id] = chosen
            return chosen

    def forget(self, slice_id: int) -> None:
        """The client is done writing ``slice_id``: drop its placement."""
        with self._lock:
            drive = self._placed.pop(slice_id, None)
            if drive is not None:
                self._remember(slice_id, drive)

    def _remember(self, slice_id: int, drive_id: int) -> None:
        self._located[slice_id] = drive_id
        self._located.move_to_end(slice_id)
        while len(self._located) > self._memo_entries:
            self._located.popitem(last=False)

    # ------------------------------------------------------------------ writes
    def submit(self, slice_id: int, offset: int, data: PieceBytes, group: int, *,
               drive_id: int | None = None, durable: bool = False, urgent: bool = False,
               wait: bool = True) -> tuple[int, PieceFuture]:
        """Send a piece of ``slice_id`` at ``offset`` to its server; returns
        ``(drive_id, future)``, the future done once the server stored it (durable
        on its drive with ``durable``). ``wait=False``: ``Declined`` (a send may
        block on the network), nothing sent."""
        if not wait:
            raise Declined()
        if drive_id is None:
            drive_id = self.place(slice_id, group, Payload(data).nbytes)
        server, local = split_drive_id(drive_id)
        views = Payload(data).views
        body = views[0] if len(views) == 1 else b"".join(views)
        with self._lock:
            self._since[drive_id] = self._since.get(drive_id, 0) + len(body)
        sent = self._remote(server).submit_write(slice_id, offset, body, group,
                                                 drive_id=local, durable=durable)
        return drive_id, _piece_future(sent)

    def write(self, slice_id: int, offset: int, data: PieceBytes, group: int, *,
              drive_id: int | None = None, durable: bool = False) -> int:
        """``submit`` and wait; returns the drive id."""
        drive_id, future = self.submit(slice_id, offset, data, group, drive_id=drive_id,
                                       durable=durable, urgent=True)
        future.result()
        return drive_id

    def flush(self, drive_ids: Iterable[int] | None = None) -> None:
        """Make every write already answered durable on those drives (default: every
        drive of the servers this client talked to)."""
        by_server: dict[int, list[int]] = {}
        if drive_ids is None:
            with self._lock:
                servers = list(self._remotes)
            for server in servers:
                self._remote(server).flush()
            return
        for drive_id in drive_ids:
            server, local = split_drive_id(drive_id)
            by_server.setdefault(server, []).append(local)
        for server, locals_ in by_server.items():
            self._remote(server).flush(locals_)

    def delete(self, slice_id: int, drive_id: int | None = None) -> None:
        """Delete a slice (idempotent); without ``drive_id``, on every live drive
        that may hold it."""
        targets = [drive_id] if drive_id is not None else self._drives_of(slice_id)
        for target in targets:
            server, local = split_drive_id(target)
            self._remote(server).delete(slice_id, local)
        with self._lock:
            self._placed.pop(slice_id, None)
            self._located.pop(slice_id, None)

    # ------------------------------------------------------------------ reads
    def _drives_of(self, slice_id: int) -> list[int]:
        """Where ``slice_id`` is: placed here, memoised, recorded in meta, or (none
        recorded) every live drive."""
        located = self._locate(slice_id)
        return [located] if located is not None else self.drive_ids

    def _locate(self, slice_id: int) -> int | None:
        with self._lock:
            drive = self._placed.get(slice_id)
            if drive is None:
                drive = self._located.get(slice_id)
            if drive is not None:
                return drive
        try:
            replicas = self._meta.get_slice(slice_id).replicas
        except FsError:
            return None
        for replica in replicas:
            found = drive_for(replica)
            if found is not None:
                with self._lock:
                    self._remember(slice_id, found)
                return found
        return None

    def locate(self, slice_id: int) -> int:
        """The drive holding ``slice_id``; ``SliceMissing`` when meta knows none."""
        drive = self._locate(slice_id)
        if drive is None:
            raise SliceMissing(slice_id, None)
        return drive

    def read_view(self, slice_id: int, offset: int, length: int,
                  drive_id: int | None = None) -> memoryview:
        """Bytes ``[offset, offset+length)`` of a slice (short at its end), as a
        read-only view of a buffer as long as what came."""
        if drive_id is None:
            drive_id = self.locate(slice_id)
        server, local = split_drive_id(drive_id)
        data = self._remote(server).read(slice_id, offset, length, local)
        return memoryview(data).toreadonly()

    def read(self, slice_id: int, offset: int, length: int, drive_id: int | None = None) -> bytes:
        return bytes(self.read_view(slice_id, offset, length, drive_id))

    def prefetch(self, slice_id: int, offset: int, length: int) -> None:
        """A read-ahead hint: the servers read ahead on their own; nothing to do."""

    # ------------------------------------------------------------------ stats and closing
    def stats(self) -> NodeStats:
        """Capacity and free bytes of the live servers' drives, as they last
        reported them (no round trip)."""
        with self._lock:
            self._refresh()
            drives = []
            for drive_id, (capacity, free) in sorted(self._live.items()):
                server, local = split_drive_id(drive_id)
                record = self._servers[server]
                spec = next((d.spec for d in record.drives if d.drive_id == local), "")
                store = StoreStats(0, 0, 1.0, 0, 0, 0, 0, capacity - free, 0,
                                   capacity_bytes=capacity, writable_bytes=free)
                drives.append(DriveStats(drive_id, f"{record.address}:{spec}", capacity,
                                         max(0, free), store))
        return NodeStats(
            capacity_bytes=sum(d.capacity_bytes for d in drives),
            free_bytes=sum(d.free_bytes for d in drives),
            live_bytes=sum(d.store.live_bytes for d in drives),
            user_bytes_written=0, device_bytes_written=0, drives=drives)

    def close(self) -> None:
        """Close every connection (writes answered are on the servers; nothing to flush
        here: the servers flush their drives)."""
        with self._lock:
            self._closed = True
            remotes, self._remotes = list(self._remotes.values()), {}
        for remote in remotes:
            remote.close()

    def abandon(self) -> None:
        """Drop everything at once (a crashed client): same as ``close``."""
        self.close()


def _piece_future(sent: Future[int]) -> PieceFuture:
    """A ``PieceFuture`` done when the server answered ``sent``."""
    out = PieceFuture()

    def _done(f: Future[int]) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(None)

    sent.add_done_callback(_done)
    return out
