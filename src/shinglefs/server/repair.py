"""Re-replication and draining: storage servers bring every slice to its goal.

A slice's goal is its lifetime group's replication goal
(``MetaStore.replica_goals`` of the group's inode: the ``DirPolicy.replicas``
of the nearest directory above that sets one), the same figure clients place
by (``server.cluster``); with none set, two replicas while two or more
servers are present, else one. A replica is *present* while its server runs
and heartbeated within ``repair_after_s`` (default 300 s: a server that
restarts, or a host that reboots, is waited for rather than copied around);
a replica on a server gone longer is lost. A present replica on a drive taken
offline (``MetaStore.set_drive_state``) is *draining*: it still serves as a
source, but counts against no goal; the others are *healthy*.

Who copies: the server of a slice's first healthy replica, else of its first
draining one (replicas in the order meta lists them), so two servers never
copy one slice. While the slice has fewer healthy replicas than its goal, it
reads the slice from its own drive and writes it whole to the freest online
drive (of the slice's tier when one of them has room: docs/cluster.md,
"Tiers") of a server live now (heartbeat within the clients' timeout: a present
server may have died minutes ago) that holds no healthy replica of it
(another rack where servers carry ``rack`` labels), flushes it there, and
records the
slice's replicas as its present ones plus the new copy
(``MetaStore.set_slice_replicas``): lost ones leave the record, so readers
stop trying them. Then, once the slice has a healthy replica and either its
goal is met or no further drive can take a copy, its draining replicas leave
the record and are deleted from their drives: an offline drive is empty when
no record names it any more (``ReplicationHealth.draining`` counts the slices
still on offline drives). A draining replica that is a slice's only copy with
nowhere to go stays.

A slice with more healthy replicas than its goal (its directory's goal was
lowered) loses the extra ones the same way — the record first, then the
drives — keeping ``goal`` replicas on servers live now (the copier's own
first), and only when that many are live: a copy is never dropped in favour
of one on a server that may be dead.

A drive its own server finds failing is taken offline by that server at the
start of a pass, the same as an operator's ``shinglefs drive offline``:
failing means zones a failed head leaves behind (``OFFLINE`` or
``READ_ONLY`` in its store's zone report, ``failing_drives``). While it
keeps them, a pass takes it offline again after ``drive online``.

A copy left on a server that comes back after its replica was dropped from
the record, and the new copy of a slice deleted while it was being copied,
are named by no record: that server's orphan sweep deletes them after its
grace period (server/sweep.py). What is not handled: a slice with no
present replica is lost (counted in ``ReplicationHealth.lost``), nothing to
copy from. A server that will never return is taken out of the records
for good by ``shinglefs forget-server`` (docs/cluster.md, "Retiring a
server"): its replicas leave every record at once and this pass restores the
goals from the other copies.

Thread safety: one ``Repairer`` runs in one thread (``StorageServer``'s
repair thread); ``replication_health`` may run anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from shinglefs.errors import ShingleError
from shinglefs.meta.api import (
    LOCAL_SERVER,
    REPAIR_AFTER_S,
    MetaStore,
    Replica,
    ServerDrive,
    ServerRecord,
    SliceInfo,
)
from shinglefs.server.node import StorageNode
from shinglefs.server.remote import RemoteNode

log = logging.getLogger(__name__)

COPY_PIECE = 4 * 1024 * 1024
PAGE = 1000


def replica_goal(present_servers: int) -> int:
    """Replicas a slice should have with this many servers present, when no
    directory sets its goal."""
    return min(2, present_servers)


@dataclass(frozen=True, slots=True)
class ReplicationHealth:
    """Stored slices by replica count against each one's goal (``shinglefs status``)."""

    goal: int  # the default goal: for slices whose directories set none
    slices: int
    under_replicated: int  # fewer healthy replicas than its goal, at least one present
    lost: int  # no present replica
    draining: int = 0  # a replica on an offline drive still in the record


@dataclass(frozen=True, slots=True)
class _Standing:
    """One slice's replicas as a pass sees them (module docstring)."""

    goal: int
    healthy: list[Replica]
    draining: list[Replica]

    @property
    def sources(self) -> list[Replica]:
        return self.healthy + self.draining


def _pages(meta: MetaStore) -> Iterator[list[SliceInfo]]:
    after = 0
    while page := meta.stored_slices(after, PAGE):
        yield page
        after = page[-1].id


def _present(meta: MetaStore, repair_after_s: float) -> list[ServerRecord]:
    return [s for s in meta.list_servers(timeout_s=repair_after_s) if s.live]


def _offline(meta: MetaStore) -> set[tuple[str, str]]:
    """The offline drives as replicas name them: ``(server, drive)``."""
    return {(str(s), str(d)) for (s, d), state in meta.drive_states().items()
            if state == "offline"}


FAILED_ZONES = ("OFFLINE", "READ_ONLY")
"""Zone conditions that make a drive failing (module docstring)."""


def failing_drives(node: StorageNode) -> dict[int, int]:
    """``{drive id: failed zones}`` of ``node``'s drives with any zone in
    ``FAILED_ZONES`` (from each store's zone report)."""
    out: dict[int, int] = {}
    for drive in node.stats().drives:
        failed = sum(drive.store.zones_by_condition.get(c, 0) for c in FAILED_ZONES)
        if failed:
            out[drive.drive_id] = failed
    return out


def _standings(meta: MetaStore, page: Sequence[SliceInfo], present: Collection[str],
               offline: Collection[tuple[str, str]], default: int) -> Iterator[
                   tuple[SliceInfo, _Standing]]:
    """Each slice of ``page`` with its goal and its healthy and draining replicas
    (one ``replica_goals`` query for the page's groups)."""
    goals = meta.replica_goals({info.group for info in page})
    for info in page:
        mine = [r for r in info.replicas if r.server in present]
        yield info, _Standing(goals.get(info.group, default),
                              [r for r in mine if (r.server, r.drive) not in offline],
                              [r for r in mine if (r.server, r.drive) in offline])


def replication_health(meta: MetaStore, repair_after_s: float = REPAIR_AFTER_S
                       ) -> ReplicationHealth:
    """Count stored slices against their goals (reads every slice record: a full scan).

    An embedded file system's drives (``LOCAL_SERVER`` in a replica, and its
    own registration, ``share.EMBEDDED_LABEL``) count as present whether or
    not a mount has them now: they are files on this host, not a server that
    went away (every slice of an embedded file system was counted lost).
    """
    from shinglefs.server.share import EMBEDDED_LABEL

    present = {str(s.id) for s in _present(meta, repair_after_s)}
    default = replica_goal(len(present))
    if meta.drives():  # embedded: slices name its drives as LOCAL_SERVER's
        own = {str(s.id) for s in meta.list_servers() if EMBEDDED_LABEL in s.labels}
        default = replica_goal(max(1, len(present - own)))  # its drives: one host
        present |= own | {LOCAL_SERVER}
    offline = _offline(meta)
    slices = under = lost = draining = 0
    for page in _pages(meta):
        for _, standing in _standings(meta, page, present, offline, default):
            slices += 1
            lost += not standing.sources
            under += bool(standing.sources) and len(standing.healthy) < standing.goal
            draining += bool(standing.draining)
    return ReplicationHealth(default, slices, under, lost, draining)


class Repairer:
    """Copies the slices this server is the first source of to their goal, and
    drains offline drives (module docstring)."""

    def __init__(self, meta: MetaStore, node: StorageNode, server_id: int, key: bytes, *,
                 repair_after_s: float = REPAIR_AFTER_S, timeout: float = 60.0) -> None:
        self.meta = meta
        self.node = node
        self.server_id = server_id
        self.key = key
        self.repair_after_s = repair_after_s
        self.timeout = timeout
        self.copied = 0  # slices copied (statistics)
        self.copied_bytes = 0
        self.drained = 0  # replicas dropped from offline drives
        self.trimmed = 0  # copies dropped above a lowered goal

    def run_once(self) -> int:
        """One pass over every stored slice; returns the copies made. A copy that
        fails is logged and tried again at the next pass."""
        servers = _present(self.meta, self.repair_after_s)
        present = {str(s.id): s for s in servers}
        # Copies go to servers live now: a present one may be dead for minutes yet.
        live = [s for s in servers if s.id in {r.id for r in self.meta.list_servers() if r.live}]
        offline = _offline(self.meta)
        self._take_failing_offline(offline)
        default = replica_goal(len(present))
        me = str(self.server_id)
        made = 0
        remotes: dict[int, RemoteNode] = {}
        try:
            for page in _pages(self.meta):
                for info, standing in _standings(self.meta, page, present, offline, default):
                    sources = standing.sources
                    if not sources or sources[0].server != me or (
                            len(standing.healthy) == standing.goal and not standing.draining):
                        continue
                    try:
                        made += self._repair(info, standing, servers, live, offline,
                                             remotes)
                    except (ShingleError, OSError) as exc:
                        log.warning("re-replicating slice %#x failed: %s; trying again at the "
                                    "next pass", info.id, exc)
        finally:
            for remote in remotes.values():
                remote.close()
        return made

    def _take_failing_offline(self, offline: set[tuple[str, str]]) -> None:
        """Record this server's failing drives offline (adding them to ``offline``)."""
        try:
            failing = failing_drives(self.node)
        except (ShingleError, OSError) as exc:
            log.warning("reading the zone reports of server %d failed: %s", self.server_id, exc)
            return
        for drive, zones in failing.items():
            if (str(self.server_id), str(drive)) in offline:
                continue
            self.meta.set_drive_state(self.server_id, drive, "offline")
            offline.add((str(self.server_id), str(drive)))
            log.warning("drive %d of server %d has %d failed zone(s): taken offline, its "
                        "slices are copied to other drives", drive, self.server_id, zones)

    def _remote(self, server: ServerRecord, remotes: dict[int, RemoteNode]) -> RemoteNode:
        remote = remotes.get(server.id)
        if remote is None:
            remote = remotes[server.id] = RemoteNode(server.address, self.key,
                                                     timeout=self.timeout)
        return remote

    def _repair(self, info: SliceInfo, standing: _Standing, servers: Sequence[ServerRecord],
                live: Sequence[ServerRecord], offline: Collection[tuple[str, str]],
                remotes: dict[int, RemoteNode]) -> int:
        """Copy ``info`` until its goal is met or no drive can take it, then drop
        its draining replicas when a healthy one holds it, or its copies above
        its goal; returns the copies made."""
        healthy, draining = list(standing.healthy), standing.draining
        source = standing.sources[0]
        made = 0
        tier = self._tier(info.group) if len(healthy) < standing.goal else None
        while len(healthy) < standing.goal:
            target = _target(healthy, servers, live, offline, tier, info.length)
            if target is None:
                break
            healthy.append(self._copy(info, int(source.drive), target, remotes))
            self.meta.set_slice_replicas(info.id, [*healthy, *draining])
            made += 1
        if healthy and draining:
            self.meta.set_slice_replicas(info.id, healthy)
            self._drop(info.id, draining, servers, remotes, "offline drive")
            self.drained += len(draining)
        elif len(healthy) > standing.goal:
            self._trim(info.id, healthy, standing.goal, source, servers, live, remotes)
        return made

    def _tier(self, group: int) -> str | None:
        """The tier ``group``'s new copies go to (its directory's, as placement
        reads it: ``StorageNode.tier_of``), None when unknown or unreadable."""
        lookup = self.node.tier_of
        if lookup is None:
            return None
        try:
            return lookup(group)
        except Exception as exc:  # meta unreachable: copy anywhere rather than not at all
            log.warning("the tier of group %d is unknown (%s): its copy goes anywhere", group,
                        exc)
            return None

    def _trim(self, slice_id: int, healthy: Sequence[Replica], goal: int, source: Replica,
              servers: Sequence[ServerRecord], live: Sequence[ServerRecord],
              remotes: dict[int, RemoteNode]) -> None:
        """Drop the copies of a slice above its goal (a lowered goal), keeping
        ``goal`` replicas on servers live now (this server's first): none is
        dropped unless that many are."""
        live_ids = {str(s.id) for s in live}
        ranked = sorted(healthy, key=lambda r: (r.server not in live_ids, r != source))
        keep, extra = ranked[:goal], ranked[goal:]
        if not all(r.server in live_ids for r in keep):
            return
        self.meta.set_slice_replicas(slice_id, keep)
        self._drop(slice_id, extra, servers, remotes, "copy above its goal")
        self.trimmed += len(extra)

    def _drop(self, slice_id: int, replicas: Sequence[Replica], servers: Sequence[ServerRecord],
              remotes: dict[int, RemoteNode], why: str) -> None:
        """Delete ``replicas`` of a slice, which its record no longer names, from
        their drives (a failure leaves unreferenced bytes: space, not data)."""
        by_id = {str(s.id): s for s in servers}
        for replica in replicas:
            try:
                if replica.server == str(self.server_id):
                    self.node.delete(slice_id, int(replica.drive))
                else:
                    self._remote(by_id[replica.server], remotes).delete(slice_id,
                                                                        int(replica.drive))
            except (ShingleError, OSError) as exc:
                log.warning("deleting slice %#x (%s) from drive %s of server %s failed: %s",
                            slice_id, why, replica.drive, replica.server, exc)
        log.info("slice %#x: %s dropped from %s", slice_id, why,
                 ", ".join(f"{r.server}:{r.drive}" for r in replicas))

    def _copy(self, info: SliceInfo, source: int, target: tuple[ServerRecord, int],
              remotes: dict[int, RemoteNode]) -> Replica:
        """Write slice ``info`` from this server's drive ``source`` whole to
        ``target`` and flush it there; returns the new replica (not yet recorded)."""
        server, drive = target
        remote = self._remote(server, remotes)
        length = self.node.length(info.id, source)
        remote.delete(info.id, drive)  # a partial copy of an earlier attempt
        offset = 0
        while offset < length:
            data = self.node.read_view(info.id, offset, min(COPY_PIECE, length - offset),
                                       source)
            remote.write(info.id, offset, data, info.group, drive_id=drive)
            offset += len(data)
        remote.flush([drive])
        self.copied += 1
        self.copied_bytes += length
        log.info("slice %#x (%d bytes) copied to server %d drive %d", info.id, length,
                 server.id, drive)
        return Replica(str(server.id), str(drive))


def _target(healthy: Sequence[Replica], servers: Sequence[ServerRecord],
            live: Sequence[ServerRecord], offline: Collection[tuple[str, str]],
            tier: str | None = None, length: int = 0) -> tuple[ServerRecord, int] | None:
    """The freest online drive of a ``live`` server holding no healthy replica
    (on a rack the present ``servers`` holding one do not use, when one is
    left), or None. Racks first, then ``tier`` as placement chooses: among
    those servers a drive of ``tier`` with ``length`` bytes free when one has,
    else any (the tier spills)."""
    used = {r.server for r in healthy}
    racks = {s.labels.get("rack") for s in servers if str(s.id) in used} - {None}

    def drives(s: ServerRecord) -> list[ServerDrive]:
        return [d for d in s.drives if (str(s.id), str(d.drive_id)) not in offline]

    others = [s for s in live if str(s.id) not in used and drives(s)]
    elsewhere = [s for s in others if s.labels.get("rack") not in racks] or others
    candidates = [(d.free_bytes, s.id, d.drive_id, s) for s in elsewhere for d in drives(s)
                  if tier is None or (d.tier == tier and d.free_bytes >= max(length, 1))]
    if not candidates:  # no drive of the tier with room: the tier spills
        candidates = [(d.free_bytes, s.id, d.drive_id, s) for s in elsewhere for d in drives(s)]
    best = max(candidates, default=None, key=lambda t: (t[0], -t[1], -t[2]))
    return (best[3], best[2]) if best is not None and best[0] > 0 else None
