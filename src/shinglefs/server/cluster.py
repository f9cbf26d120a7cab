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

Placement and replication: a slice has as many copies as its replication goal
asks: the goal of its lifetime group's directory (``DirPolicy.replicas``,
inherited; ``MetaStore.replica_goals`` of the group's inode, remembered
``goal_ttl_s`` per group), else the ``replicas`` given, else 2 when two or
more servers are live and 1 otherwise; each copy whole on one drive of a
distinct server, on distinct ``rack`` labels where servers carry them (with
fewer live servers than the goal, one copy on each: repair adds the rest when
servers join). A drive taken offline (``MetaStore.set_drive_state``) leaves
placement at the next membership read; the servers drain it (server/repair.py).
The first piece of a slice places it: the first replica on the drive its
lifetime group used last while that drive keeps ``min_free_fraction`` of its
capacity free, else on a live drive with the most free bytes (its heartbeat's figure less what
this client submitted there since; one at random among those within
``SPREAD`` of the freest, so that clients placing at once spread out); each
further replica on such a drive of another server. Every piece goes to every replica at once (in parallel,
each over one connection per server: ``RemoteNode`` hashes the slice id, so a
server appends a slice's pieces in order); the server's write scheduler
merges what all clients send into its drives' zone runs. A slice with two or
more replicas is sent by one sender thread per server, in order, so a server
that holds back a piece (its memory bound) stalls no other replica: each
server's zone run gets its group's pieces as fast as that server takes them. A piece is done when
every replica stored it. A replica that fails (its server died, its drive is
full) is dropped from the slice with a warning and the slice goes on with the
others — the write completes; the commit records the replicas that hold the
slice (``SliceCommit.replicas``), so a reader never meets the partial copy.
So a slice commits with its goal met at placement, and a replica lost during
the write leaves it committed below its goal until the servers copy it again
(the rule and why: docs/cluster.md, "Replication goal").
Only when every replica failed does the piece fail; a flush that misses a
server (``PartialFlush``) leaves that server's replicas out of the commit the
same way. A server a request found gone (refused, connection lost, timed out)
is left out of placement until it heartbeats again, so new slices stop going
to it at once, not after the heartbeat timeout. Servers restore the replica
count of slices that lost one (server/repair.py).

Reads: a slice's drives are the ones this client placed it on, else the
replicas meta records for it (``get_slice``), remembered in a bounded memo. A
read tries them in turn: a replica whose server is unreachable, whose
connection breaks or times out, or that lacks the slice is skipped for the
next; when every remembered one failed, the replicas meta records now are
tried (a slice moves when its drive is drained or a replica is re-copied). A dead server costs a refused connection; a
hung one the connection's ``timeout``. Read-ahead across the network: the
client's read cache hints each run it reads ahead (``prefetch``), whose
READs go to the server at once and land in a bounded buffer that
``read_view`` takes them from (server/cluster_reads.py).

Space: ``reserve`` takes bytes against the live drives' last reported free
bytes less what this client sent them since (``SentBytes``; ``NodeFull``,
ENOSPC, when they do not fit), each byte as often as its file's goal asks,
on distinct servers: with unequal servers less than the free bytes over the
goal fits (server/space.py, ``replicated_room``). ``stats`` (statfs, df)
reports capacity and free bytes the same way, at the default goal.
Placement weighs each drive's reported free bytes less everything sent to it
since, the reserved pieces still in flight included (``SentBytes.headed_for``):
the holds say how much is coming, not to which drive.

Errors: a server's typed errors (``server.errors``: ``NodeFull``,
``SliceMissing``, ``ServerUnreachable``, ``ConnectionLost``,
``RequestTimeout``); ``no_servers``' error when no live server has a drive.

Thread safety: every method may be called from any thread.
"""

from __future__ import annotations

import errno as E
import functools
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from shinglefs.client.commit import cluster_drive_id, drive_for, split_drive_id
from shinglefs.errors import ShingleError
from shinglefs.meta.api import LOCAL_SERVER, MetaStore, Replica, ServerRecord
from shinglefs.meta.errors import FsError
from shinglefs.server.cluster_reads import (
    READAHEAD_BYTES,
    NetworkReadAhead,
    prefetch_first,
    read_replicas,
)
from shinglefs.server.errors import (
    NodeError,
    NodeFull,
    PartialFlush,
    SliceMissing,
    WireError,
    no_servers,
)
from shinglefs.server.node import DriveStats, NodeStats, TierSource
from shinglefs.server.remote import RemoteNode
from shinglefs.server.space import (
    ReplicatedHolds,
    SentBytes,
    default_copies,
    replicated_room,
    server_frees,
)
from shinglefs.server.tiers import TierLookup
from shinglefs.store.api import Declined, PieceBytes, PieceFuture, StoreStats
from shinglefs.zoned.fileio import Payload

log = logging.getLogger(__name__)

# Our own generator: drawing from the module's would change the sequence an
# application seeded (random.seed) for its shuffles.
_rng = random.SystemRandom()

SPREAD = 0.1
"""Drives within this fraction of the freest one's free bytes are equally good."""
GOAL_ENTRIES = 4096
GOAL_LOOKUP_BYTES = 1 << 20  # a smaller reservation takes a known goal, else the default
"""Lifetime groups whose replication goal a client remembers."""
FAILOVER_AFTER_S = 2.0
"""A read that has another replica to try waits this long for a server's answer
(a hung server: alive to TCP, answering nothing) before trying the next one."""


class ClusterNode:
    """The live storage servers of a file system as one node (module docstring)."""

    def __init__(self, meta: MetaStore, secret: bytes, *, connections: int = 4,
                 timeout: float = 60.0, membership_ttl_s: float = 2.0,
                 server_timeout_s: float | None = None, min_free_fraction: float = 0.02,
                 memo_entries: int = 1 << 16, replicas: int | None = None,
                 local_server: int | None = None, goal_ttl_s: float = 10.0,
                 failover_after_s: float = FAILOVER_AFTER_S,
                 readahead_bytes: int = READAHEAD_BYTES) -> None:
        self._meta = meta
        self._ahead = NetworkReadAhead(capacity=readahead_bytes)  # server/cluster_reads.py
        self._failover_after = failover_after_s
        self._secret = secret
        self._connections = connections
        self._timeout = timeout
        self._ttl = membership_ttl_s
        self._server_timeout = server_timeout_s
        self._min_free_fraction = min_free_fraction
        self._memo_entries = memo_entries
        self._replicas = replicas
        self._local_server = local_server
        self._goal_ttl = goal_ttl_s
        self._goals: OrderedDict[int, tuple[int | None, float]] = OrderedDict()  # group -> goal
        self._lock = threading.Lock()
        self._remotes: dict[int, RemoteNode] = {}
        self._servers: dict[int, ServerRecord] = {}  # every registered server, live or not
        self._live: dict[int, tuple[int, int]] = {}  # drive -> (capacity, free) of live servers
        self._tiers: dict[int, str] = {}  # live drive -> its tier
        self.tier_of: TierSource = TierLookup(meta)  # group -> tier wanted
        self._read_at = -1e9
        self._sent = SentBytes()  # bytes the drives' last figures may not hold
        self._holds = ReplicatedHolds()  # accepted bytes not stored yet, by goal
        self._placed: dict[int, list[int]] = {}  # slice -> its drives, slices written here
        self._located: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # slice -> drives
        self._affinity: dict[int, int] = {}  # group -> drive
        self._suspects: dict[int, int] = {}  # server -> when a request to it failed (ns)
        self._senders: dict[int, ThreadPoolExecutor] = {}  # server -> its pieces' sender
        self._closed = False

    # ------------------------------------------------------------------ membership
    def _refresh(self, force: bool = False) -> None:
        """Re-read the servers from meta when the last read is older than the ttl."""
        now = time.monotonic()
        if not force and now - self._read_at < self._ttl:
            return
        records = (self._meta.list_servers() if self._server_timeout is None
                   else self._meta.list_servers(timeout_s=self._server_timeout))
        offline = self._meta.drive_states()
        live: dict[int, tuple[int, int]] = {}
        tiers: dict[int, str] = {}
        heartbeats: dict[int, int] = {}  # drive -> its server's heartbeat (ns)
        for record in records:
            failed_at = self._suspects.get(record.id)
            if failed_at is not None and record.heartbeat_ns > failed_at:
                del self._suspects[record.id]  # it heartbeated since: back in placement
            elif failed_at is not None:
                continue
            if record.live:
                for d in record.drives:
                    if (record.id, d.drive_id) not in offline:  # drained: no new slices
                        drive = cluster_drive_id(record.id, d.drive_id)
                        live[drive] = (d.capacity_bytes, d.free_bytes)
                        tiers[drive] = d.tier
                        heartbeats[drive] = record.heartbeat_ns
        for record in records:  # a server that came back elsewhere (a new port, a new host)
            remote = self._remotes.get(record.id)
            known = self._servers.get(record.id)
            if remote is not None and known is not None and known.address != record.address:
                del self._remotes[record.id]
                # Not under our lock: closing fails its requests, whose callbacks take it.
                threading.Thread(target=remote.close, name="remote-close", daemon=True).start()
        self._servers = {r.id: r for r in records}
        self._live = live
        self._tiers = tiers
        self._sent.figures_read(heartbeats)
        self._read_at = now

    def _suspect(self, server_id: int, exc: BaseException) -> None:
        """A request to ``server_id`` found it gone (unreachable, connection lost):
        leave it out of placement until it heartbeats again (module docstring)."""
        with self._lock:
            if server_id not in self._suspects:
                log.warning("storage server %d left out of placement: %s", server_id, exc)
            self._suspects[server_id] = time.time_ns()
            for drive in [d for d in self._live if split_drive_id(d)[0] == server_id]:
                del self._live[drive]
                self._tiers.pop(drive, None)
            for drives in self._placed.values():
                if len(drives) > 1:
                    drives[:] = [d for d in drives if split_drive_id(d)[0] != server_id] or drives

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
        """What admission counts ``drive_id`` able to take: its figure less what was
        sent since that no hold counts (``reserve`` counts the holds itself)."""
        free = self._live.get(drive_id, (0, 0))[1]
        return free - self._sent.since(drive_id)

    def _unclaimed(self, drive_id: int) -> int:
        """What placement counts ``drive_id`` able to take: its figure less
        everything sent to it since, reserved pieces in flight included. (With
        ``_free``, pieces in flight under a hold were on no drive for placement:
        a fill of small servers at goal 2 put slice after slice on the one that
        looked freest until it refused copies the admission had counted.)"""
        free = self._live.get(drive_id, (0, 0))[1]
        return free - self._sent.headed_for(drive_id)

    def reserve(self, nbytes: int, ino: int | None = None) -> None:
        """Take room for ``nbytes`` of accepted writes, or raise ``NodeFull`` (ENOSPC)
        with nothing taken. ``ino``: the file whose goal the bytes take (``goal_of``;
        under ``GOAL_LOOKUP_BYTES`` only a goal known already: a small file reads
        none), else the default goal. Admitted iff every byte held and these, each
        as many times as its goal asks, fit the live servers' free bytes with each
        copy on a distinct server (``space.fits_replicated``); refused only on a
        fresh membership read."""
        goal = None if ino is None else self.goal_of(ino, lookup=nbytes >= GOAL_LOOKUP_BYTES)
        with self._lock:
            for force in (False, True):
                self._refresh(force=force)
                frees = server_frees(self._live, self._free)
                if self._holds.take(frees, self._copies, nbytes, ino, goal):
                    return
            if not self._live:
                raise no_servers(self._local_server)  # no server at all: EIO, not full
            copies = self._copies(goal)
            raise NodeFull(0, None, f"{nbytes} bytes ({copies} copies) do not fit: "
                                    f"{replicated_room(frees, copies)} bytes can be written "
                                    f"{copies} times on the live storage servers, "
                                    f"{self._holds.held} accepted are not stored yet")

    def _copies(self, goal: int | None) -> int:
        return default_copies(self._live, goal or self._replicas)

    def unreserve(self, nbytes: int, ino: int | None = None) -> None:
        """Give back what ``reserve(nbytes, ino)`` took (stored or dropped)."""
        with self._lock:
            self._holds.give_back(nbytes, ino)

    def has_room(self, drive_id: int | None, nbytes: int) -> bool:
        with self._lock:
            if drive_id is not None:
                return self._unclaimed(drive_id) >= nbytes
            return any(self._unclaimed(d) >= nbytes for d in self._live)

    def goal_of(self, group: int, lookup: bool = True) -> int | None:
        """The replication goal of lifetime group ``group`` (an inode: a file, or the
        directory of small files) as its directories set it, None when none does;
        read from meta at most every ``goal_ttl_s`` (without ``lookup``: never)."""
        now = time.monotonic()
        with self._lock:
            cached = self._goals.get(group)
            if (cached is not None and now - cached[1] < self._goal_ttl) or not lookup:
                return cached[0] if cached is not None else None
        goal = self._meta.replica_goals([group]).get(group)  # not under our lock
        with self._lock:
            self._goals[group] = (goal, now)
            self._goals.move_to_end(group)
            while len(self._goals) > GOAL_ENTRIES:
                self._goals.popitem(last=False)
        return goal

    def place(self, slice_id: int, group: int, size_hint: int = 0) -> int:
        """Choose and remember the drives of a new slice (module docstring): on as many
        servers as its goal asks (``goal_of``, else ``default_copies``); the first."""
        with self._lock:
            placed = self._placed.get(slice_id)
            if placed:
                return placed[0]
        wanted = self.goal_of(group) or self._replicas
        tier = self._tier_wanted(group)
        with self._lock:
            placed = self._placed.get(slice_id)
            if placed:
                return placed[0]
            self._refresh()
            if not self._live:
                self._refresh(force=True)
            if not self._live:
                raise no_servers(self._local_server)
            chosen = self._affinity.get(group)
            if chosen is not None and (
                    chosen not in self._live or not self._room_for(chosen, size_hint)
                    or (tier is not None and self._tiers.get(chosen) != tier)):
                chosen = None
            if chosen is None and tier is not None:
                # The tier's drives with room; else the others with room (a full
                # tier spills); else the freest of all, as without a tier.
                roomy = [d for d in self._live if self._room_for(d, size_hint)]
                pool = ([d for d in roomy if self._tiers.get(d) == tier]
                        or [d for d in roomy if self._tiers.get(d) != tier])
                chosen = _freest(self._unclaimed, pool) if pool else None
            if chosen is None:
                chosen = _freest(self._unclaimed, list(self._live))
            self._affinity[group] = chosen
            drives = [chosen]
            servers = {split_drive_id(d)[0] for d in self._live}
            goal = wanted or min(2, len(servers))
            while len(drives) < goal:
                more = self._next_replica(drives, tier, size_hint)
                if more is None:
                    break
                drives.append(more)
            self._placed[slice_id] = drives
            return chosen

    def _tier_wanted(self, group: int) -> str | None:
        """The tier ``group``'s directory sets (``tier_of``), when the live drives
        offer a choice of tiers; None when they do not or the lookup fails (the
        slice is placed anyway: the tier is a preference)."""
        with self._lock:
            self._refresh()
            offered = set(self._tiers.values())
        if len(offered) < 2:
            return None
        try:
            tier = self.tier_of(group)
        except Exception:
            log.warning("the tier of group %d could not be read; placing anywhere", group,
                        exc_info=True)
            return None
        return tier if tier in offered else None

    def tier_of_drive(self, drive_id: int) -> str | None:
        """``SliceNode.tier_of_drive``: of a live drive (as its server reported)."""
        with self._lock:
            self._refresh()
            return self._tiers.get(drive_id)

    def tiers_offered(self) -> set[str]:
        with self._lock:
            self._refresh()
            return set(self._tiers.values())

    def forget_tier(self, group: int) -> None:
        self.tier_of.forget(group)

    def placement_known(self, group: int) -> bool:
        """``SliceNode.placement_known``: the live drives offer one tier, or
        ``group``'s is remembered (its replication goal may still be read)."""
        with self._lock:
            single = len(set(self._tiers.values())) < 2
        known = getattr(self.tier_of, "known", None)
        return single or (known is not None and bool(known(group)))

    def _room_for(self, drive: int, size_hint: int) -> bool:
        """``drive`` keeps ``min_free_fraction`` free after ``size_hint`` more bytes."""
        return (self._unclaimed(drive) - size_hint
                >= self._min_free_fraction * self._live[drive][0])

    def _next_replica(self, drives: list[int], tier: str | None = None,
                      size_hint: int = 0) -> int | None:
        """The freest live drive on a server ``drives`` do not use, on a rack
        they do not use when there is one (racks first: a copy's purpose), of
        ``tier`` with room when there is such a one there."""
        used = {split_drive_id(d)[0] for d in drives}
        racks = {self._rack(s) for s in used} - {None}
        others = [d for d in self._live if split_drive_id(d)[0] not in used]
        elsewhere = [d for d in others if self._rack(split_drive_id(d)[0]) not in racks]
        for pool in (elsewhere, others):
            if tier is not None:
                tiered = [d for d in pool
                          if self._tiers.get(d) == tier and self._room_for(d, size_hint)]
                if tiered:
                    return _freest(self._unclaimed, tiered)
            if pool:
                return _freest(self._unclaimed, pool)
        return None

    def _rack(self, server_id: int) -> str | None:
        record = self._servers.get(server_id)
        return record.labels.get("rack") if record is not None else None

    def replicas_of(self, slice_id: int, drive_id: int) -> tuple[int, ...]:
        """The drives holding ``slice_id`` now (its replicas that have not failed)."""
        with self._lock:
            placed = self._placed.get(slice_id)
            return tuple(placed) if placed else (drive_id,)

    def forget(self, slice_id: int) -> None:
        """The client is done writing ``slice_id``: drop its placement."""
        with self._lock:
            drives = self._placed.pop(slice_id, None)
            if drives:
                self._remember(slice_id, tuple(drives))

    def _remember(self, slice_id: int, drives: tuple[int, ...]) -> None:
        self._located[slice_id] = drives
        self._located.move_to_end(slice_id)
        while len(self._located) > self._memo_entries:
            self._located.popitem(last=False)

    # ------------------------------------------------------------------ writes
    def submit(self, slice_id: int, offset: int, data: PieceBytes, group: int, *,
               drive_id: int | None = None, durable: bool = False, urgent: bool = False,
               wait: bool = True, reserved: bool = False) -> tuple[int, PieceFuture]:
        """Send a piece of ``slice_id`` at ``offset`` to each of its replicas; returns
        ``(first drive, future)``, the future done once every replica stored it
        (durable on its drive with ``durable``) or failed, failing only when all
        failed (module docstring). ``wait=False``: ``Declined`` (a send may block
        on the network), nothing sent. ``reserved`` (``StorageNode.submit``): its
        writer's hold counts the piece until it is answered (``SentBytes``)."""
        if not wait:
            raise Declined()
        body = Payload(data)  # sent view by view, never joined
        if drive_id is None:
            drive_id = self.place(slice_id, group, body.nbytes)
        with self._lock:
            drives = list(self._placed.get(slice_id) or [drive_id])
        for d in drives:
            self._sent.sent(d, body.nbytes, reserved)
        sends = []
        for d in drives:
            # Every piece through its server's one sender thread, in submission
            # order: a server that stalls holds up no other replica, and a slice
            # that lost a replica mid-write (now one drive) still reaches the
            # other in order behind its pieces already queued there.
            server, local = split_drive_id(d)
            sent: Future[int] = Future()
            try:
                self._sender(server).submit(self._send_into, sent, server, slice_id, offset,
                                            body, group, local, durable)
            except (FsError, RuntimeError) as exc:  # the node closed: a failed replica
                sent.set_exception(exc)
            sent.add_done_callback(functools.partial(self._sent.done, d, body.nbytes, reserved))
            sends.append((d, sent))
        failed = functools.partial(self._replica_failed, slice_id, len(sends) > 1)
        return drive_id, _all_replicas(sends, failed)

    def _send(self, server: int, slice_id: int, offset: int, body: Payload, group: int,
              local: int, durable: bool) -> Future[int]:
        """Send one piece to one server now (the caller's thread): its answer's future."""
        try:
            return self._remote(server).submit_write(slice_id, offset, body, group,
                                                     drive_id=local, durable=durable)
        except Exception as exc:  # unreachable: a failed replica like any other
            failed: Future[int] = Future()
            failed.set_exception(exc)
            return failed

    def _send_into(self, out: Future[int], server: int, slice_id: int, offset: int,
                   body: Payload, group: int, local: int, durable: bool) -> None:
        """A sender thread: send one piece, and complete ``out`` with its answer."""
        self._send(server, slice_id, offset, body, group, local,
                   durable).add_done_callback(functools.partial(_settle_into, out))

    def _sender(self, server: int) -> ThreadPoolExecutor:
        """The thread that sends a server its replicas' pieces, in submission order."""
        with self._lock:
            sender = self._senders.get(server)
            if sender is None:
                if self._closed:
                    raise FsError(E.EIO, "the cluster node is closed")
                sender = self._senders[server] = ThreadPoolExecutor(
                    1, thread_name_prefix=f"send-{server}")
            return sender

    def _replica_failed(self, slice_id: int, several: bool, drive: int,
                        exc: BaseException) -> None:
        """A replica's send failed: suspect a gone server; drop the replica of a
        slice that has others (``_drop_replica``)."""
        if isinstance(exc, WireError):
            self._suspect(split_drive_id(drive)[0], exc)
        if several:
            self._drop_replica(slice_id, drive, exc)

    def _drop_replica(self, slice_id: int, drive_id: int, exc: BaseException) -> None:
        with self._lock:
            drives = self._placed.get(slice_id)
            if not drives or drive_id not in drives or len(drives) == 1:
                return
            drives.remove(drive_id)
            left = len(drives)
        log.warning("replica of slice %#x on server %d failed (%s); the slice goes on "
                    "with %d replica(s)", slice_id, split_drive_id(drive_id)[0], exc, left)

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
        by_server: dict[int, list[int] | None] = {}
        if drive_ids is None:
            with self._lock:
                by_server = dict.fromkeys(self._remotes)
        for drive_id in drive_ids or ():
            server, local = split_drive_id(drive_id)
            listed = by_server.setdefault(server, [])
            assert listed is not None
            listed.append(local)
        failed: list[int] = []
        cause: BaseException | None = None
        for server, locals_ in by_server.items():
            try:
                self._remote(server).flush(locals_)
            except WireError as exc:  # the server is gone: its drives are not flushed
                self._suspect(server, exc)
                cause = exc
                failed += [cluster_drive_id(server, d) for d in locals_ or ()]
        if cause is not None:
            raise PartialFlush(failed, cause)

    def delete(self, slice_id: int, drive_id: int | None = None) -> None:
        """Delete a slice (idempotent) on ``drive_id``, on every replica when this
        client is writing it, and without ``drive_id`` on every drive that may hold it."""
        with self._lock:
            placed = list(self._placed.pop(slice_id, None) or ())
            self._located.pop(slice_id, None)
        self._ahead.drop_slice(slice_id)
        if placed:
            targets = placed
        elif drive_id is not None:
            targets = [drive_id]
        else:
            targets = list(self._drives_of(slice_id)) or self.drive_ids
        for target in targets:
            server, local = split_drive_id(target)
            with self._lock:
                sender = self._senders.get(server)
            if sender is not None:  # after the pieces of it still waiting to be sent
                sender.submit(lambda: None).result()
            self._remote(server).delete(slice_id, local)

    # ------------------------------------------------------------------ reads
    def _drives_of(self, slice_id: int) -> tuple[int, ...]:
        """Where ``slice_id`` is: placed here, memoised, or recorded in meta (maybe none)."""
        with self._lock:
            drives = self._placed.get(slice_id) or self._located.get(slice_id)
            if drives:
                return tuple(drives)
        try:
            replicas = self._meta.get_slice(slice_id).replicas
        except FsError:
            return ()
        found = tuple(d for d in (self.drive_of_replica(r) for r in replicas) if d is not None)
        if found:
            with self._lock:
                self._remember(slice_id, found)
        return found

    def drive_of_replica(self, replica: Replica) -> int | None:
        """A recorded replica's cluster drive id (``LOCAL_SERVER``: ``local_server``'s)."""
        if replica.server == LOCAL_SERVER:
            if self._local_server is None:
                return None
            try:
                return cluster_drive_id(self._local_server, int(replica.drive))
            except ValueError:
                return None
        return drive_for(replica)

    def locate(self, slice_id: int) -> int:
        """A drive holding ``slice_id``; ``SliceMissing`` when meta knows none."""
        drives = self._drives_of(slice_id)
        if not drives:
            raise SliceMissing(slice_id, None)
        return drives[0]

    def read_view(self, slice_id: int, offset: int, length: int,
                  drive_id: int | None = None) -> memoryview:
        """Bytes ``[offset, offset+length)`` of a slice (short at its end), as a
        read-only view of a buffer as long as what came; replica after replica
        until one answers (module docstring)."""
        drives = (drive_id,) if drive_id is not None else self._drives_of(slice_id)
        if not drives:
            raise SliceMissing(slice_id, None)
        if drive_id is None:  # read ahead (prefetch)? Not landed in time: read as usual
            wait = self._failover_after if len(drives) > 1 else self._timeout
            ahead = self._ahead.take(slice_id, offset, length, wait)
            if ahead is not None:
                return ahead
        try:
            return read_replicas(self._read_order(drives), slice_id, offset, length,
                                 self._remote, self._suspect, self._failover_after)
        except NodeError:
            if drive_id is not None:
                raise
            servers = {split_drive_id(d)[0] for d in drives}
            with self._lock:  # the memo may name drives the slice has left since
                self._located.pop(slice_id, None)
                # A server that came back (a restarted `up`, a new port) is found
                # by the servers' records, which reads alone never re-read: a
                # reader would fail against the old address for good.
                before = {s: r.address for s, r in self._servers.items() if s in servers}
                self._refresh()
                readdressed = any(s in self._servers and self._servers[s].address != a
                                  for s, a in before.items())
            moved = tuple(d for d in self._drives_of(slice_id) if d not in drives)
            retry = moved or (drives if readdressed else ())
            if not retry:
                raise
            return read_replicas(self._read_order(retry), slice_id, offset, length,
                                 self._remote, self._suspect, self._failover_after)

    def _read_order(self, drives: tuple[int, ...]) -> tuple[int, ...]:
        """``drives`` in the order a read tries them: servers under suspicion last."""
        with self._lock:
            suspects = set(self._suspects)
        return tuple(sorted(drives, key=lambda d: split_drive_id(d)[0] in suspects))

    def read(self, slice_id: int, offset: int, length: int, drive_id: int | None = None) -> bytes:
        return bytes(self.read_view(slice_id, offset, length, drive_id))

    def prefetch(self, slice_id: int, offset: int, length: int) -> None:
        """Read ahead across the network: send the READs of the range to the replica
        a read tries first, now (``NetworkReadAhead``, server/cluster_reads.py);
        ``read_view`` takes them. Best effort: never raises; a slice this client
        is still writing is not read ahead (its length still grows)."""
        with self._lock:
            if slice_id in self._placed or self._closed:
                return
        prefetch_first(self._ahead, self._read_order(self._drives_of(slice_id)), slice_id,
                       offset, length, self._remote)

    @property
    def readahead_bytes(self) -> int:
        """Memory held now by reads started ahead and not taken (``NetworkReadAhead``)."""
        return self._ahead.held_bytes

    # ------------------------------------------------------------------ stats and closing
    def stats(self) -> NodeStats:
        """The live servers' drives as last reported (no round trip): ``drives`` their
        raw figures; ``capacity_bytes`` and ``free_bytes`` what can be written at the
        default goal (``default_copies``), each copy on a distinct server
        (``space.replicated_room``), free less what this client sent since (as
        ``reserve`` counts) -- what ``statfs`` (df) shows; ``live_bytes`` raw."""
        with self._lock:
            self._refresh()
            return _reported_stats(self._live, self._servers, self._copies(None), self._free)

    def stats_asked(self, timeout_s: float) -> tuple[NodeStats, dict[int, str]]:
        """``stats`` with each live server's own drive figures (live bytes,
        slices, zones, write amplification, write-scheduler figures) asked over
        the slice protocol (STATS) instead of the heartbeat's capacity and free
        bytes alone: what ``shinglefs status META_URL`` shows. Totals stay
        ``stats``'s (at the default goal). A server that does not answer within
        ``timeout_s`` keeps its reported figures; returns them with
        ``{server id: why}`` for those."""
        reported = self.stats()
        by_server: dict[int, list[DriveStats]] = {}
        for drive in reported.drives:
            by_server.setdefault(split_drive_id(drive.drive_id)[0], []).append(drive)
        with self._lock:
            addresses = {sid: self._servers[sid].address for sid in by_server
                         if sid in self._servers}
        drives: list[DriveStats] = []
        failed: dict[int, str] = {}
        user = device = 0
        for server_id, known in sorted(by_server.items()):
            try:
                with RemoteNode(addresses[server_id], self._secret, connections=1,
                                timeout=timeout_s, connect_timeout=timeout_s) as remote:
                    answer = remote.stats()
            except (ShingleError, OSError, KeyError) as exc:
                failed[server_id] = str(exc)
                drives.extend(known)
                continue
            user += answer.user_bytes_written
            device += answer.device_bytes_written
            for d in answer.drives:
                drives.append(DriveStats(cluster_drive_id(server_id, d.drive_id),
                                         f"{addresses[server_id]}:{d.spec}", d.capacity_bytes,
                                         d.free_bytes, d.store, d.runs, d.writes))
        asked = NodeStats(capacity_bytes=reported.capacity_bytes,
                          free_bytes=reported.free_bytes,
                          live_bytes=sum(d.store.live_bytes for d in drives),
                          user_bytes_written=user, device_bytes_written=device,
                          drives=sorted(drives, key=lambda d: d.drive_id))
        return asked, failed

    def close(self) -> None:
        """Close every connection (writes answered are on the servers; nothing to flush
        here: the servers flush their drives)."""
        with self._lock:
            self._closed = True
            remotes, self._remotes = list(self._remotes.values()), {}
            senders, self._senders = list(self._senders.values()), {}
        self._ahead.clear()
        for sender in senders:  # pieces still waiting fail: the node is closed
            sender.shutdown(wait=False)
        for remote in remotes:
            remote.close()

    def abandon(self) -> None:
        """Drop everything at once (a crashed client): same as ``close``."""
        self.close()


def _all_replicas(sends: list[tuple[int, Future[int]]],
                  failed: Callable[[int, BaseException], None]) -> PieceFuture:
    """Done when every send ``(drive, future)`` is: ok if one succeeded; ``failed``
    is told each one that failed, before the result is set."""
    out = PieceFuture()
    left = [len(sends)]
    errors: list[BaseException] = []
    guard = threading.Lock()

    def _done(drive: int, f: Future[int]) -> None:
        exc = f.exception()
        with guard:
            if exc is not None:
                errors.append(exc)
            left[0] -= 1
            last = left[0] == 0
        if exc is not None:
            failed(drive, exc)
        if last:
            if len(errors) == len(sends):
                out.set_exception(errors[0])
            else:
                out.set_result(None)

    for drive, sent in sends:
        sent.add_done_callback(functools.partial(_done, drive))
    return out


def _settle_into(out: Future[int], sent: Future[int]) -> None:
    """Complete ``out`` as ``sent`` completed."""
    exc = sent.exception()
    if exc is not None:
        out.set_exception(exc)
    else:
        out.set_result(sent.result())


def _reported_stats(live: dict[int, tuple[int, int]], servers: dict[int, ServerRecord],
                    copies: int, free_of: Callable[[int], int]) -> NodeStats:
    """``NodeStats`` of the live drives ``{cluster drive id: (capacity, free)}`` as
    their servers reported them, totals at ``copies``, free by ``free_of`` (``stats``)."""
    drives = []
    for drive_id, (capacity, free) in sorted(live.items()):
        server, local = split_drive_id(drive_id)
        record = servers[server]
        spec = next((d.spec for d in record.drives if d.drive_id == local), "")
        store = StoreStats(0, 0, 1.0, 0, 0, 0, 0, capacity - free, 0,
                           capacity_bytes=capacity, writable_bytes=free)
        drives.append(DriveStats(drive_id, f"{record.address}:{spec}", capacity,
                                 max(0, free), store))
    return NodeStats(
        capacity_bytes=replicated_room(server_frees(live, lambda d: live[d][0]), copies),
        free_bytes=replicated_room(server_frees(live, free_of), copies),
        live_bytes=sum(d.store.live_bytes for d in drives),
        user_bytes_written=0, device_bytes_written=0, drives=drives)


def _freest(free: Callable[[int], int], drives: list[int]) -> int:
    """One of the drives with the most ``free`` bytes: a random one among those
    within ``SPREAD`` of the freest, so that clients placing at once (each
    seeing the same heartbeats) do not all pick the same drive."""
    top = max(free(d) for d in drives)
    near = [d for d in drives if free(d) >= top - abs(top) * SPREAD]  # top < 0: overdrawn
    return _rng.choice(near)
