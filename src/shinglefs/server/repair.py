"""Re-replication: storage servers restore the replica count of slices that lost one.

The goal is what clients place (``server.cluster``): two replicas while two or
more servers are present, else one. A replica is *present* while its server
runs and heartbeated within ``repair_after_s`` (default 300 s: a server that
restarts, or a host that reboots, is waited for rather than copied around);
a replica on a server gone longer is lost.

Who copies: the server of a slice's first present replica (replicas in the
order meta lists them), so two servers never copy one slice. It reads the
slice from its own drive and writes it whole to the freest drive of a present
server that holds no replica of it (another rack where servers carry
``rack`` labels), flushes it there, then records the slice's replicas as its
present ones plus the new copy (``MetaStore.set_slice_replicas``): the lost
ones leave the record, so readers stop trying them.

What is not handled yet: a copy left on a server that comes back after its
replica was dropped from the record stays on its drive unreferenced (no
server-side orphan sweep yet); a slice deleted while it is being copied
leaves the new copy unreferenced the same way; a slice with no present
replica is lost (counted in ``ReplicationHealth.lost``), nothing to copy from.

Thread safety: one ``Repairer`` runs in one thread (``StorageServer``'s
repair thread); ``replication_health`` may run anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from shinglefs.errors import ShingleError
from shinglefs.meta.api import REPAIR_AFTER_S, MetaStore, Replica, ServerRecord, SliceInfo
from shinglefs.server.node import StorageNode
from shinglefs.server.remote import RemoteNode

log = logging.getLogger(__name__)

COPY_PIECE = 4 * 1024 * 1024
PAGE = 1000


def replica_goal(present_servers: int) -> int:
    """Replicas a slice should have with this many servers present."""
    return min(2, present_servers)


@dataclass(frozen=True, slots=True)
class ReplicationHealth:
    """Stored slices by replica count against the goal (``shinglefs status``)."""

    goal: int
    slices: int
    under_replicated: int  # fewer present replicas than the goal, at least one
    lost: int  # no present replica


def _pages(meta: MetaStore) -> Iterator[list[SliceInfo]]:
    after = 0
    while page := meta.stored_slices(after, PAGE):
        yield page
        after = page[-1].id


def _present(meta: MetaStore, repair_after_s: float) -> list[ServerRecord]:
    return [s for s in meta.list_servers(timeout_s=repair_after_s) if s.live]


def replication_health(meta: MetaStore, repair_after_s: float = REPAIR_AFTER_S
                       ) -> ReplicationHealth:
    """Count stored slices against the goal (reads every slice record: a full scan)."""
    present = {str(s.id) for s in _present(meta, repair_after_s)}
    goal = replica_goal(len(present))
    slices = under = lost = 0
    for page in _pages(meta):
        for info in page:
            have = sum(r.server in present for r in info.replicas)
            slices += 1
            lost += have == 0
            under += 0 < have < goal
    return ReplicationHealth(goal, slices, under, lost)


class Repairer:
    """Copies under-replicated slices this server is first present replica of."""

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

    def run_once(self) -> int:
        """One pass over every stored slice; returns the copies made. A copy that
        fails is logged and tried again at the next pass."""
        servers = _present(self.meta, self.repair_after_s)
        present = {str(s.id): s for s in servers}
        goal = replica_goal(len(present))
        me = str(self.server_id)
        made = 0
        remotes: dict[int, RemoteNode] = {}
        try:
            for page in _pages(self.meta):
                for info in page:
                    have = [r for r in info.replicas if r.server in present]
                    if not have or len(have) >= goal or have[0].server != me:
                        continue
                    try:
                        self._copy(info, have, servers, remotes)
                        made += 1
                    except (ShingleError, OSError) as exc:
                        log.warning("re-replicating slice %#x failed: %s; trying again at the "
                                    "next pass", info.id, exc)
        finally:
            for remote in remotes.values():
                remote.close()
        return made

    def _target(self, have: Sequence[Replica],
                servers: Sequence[ServerRecord]) -> tuple[ServerRecord, int] | None:
        used = {r.server for r in have}
        racks = {s.labels.get("rack") for s in servers if str(s.id) in used} - {None}
        others = [s for s in servers if str(s.id) not in used and s.drives]
        elsewhere = [s for s in others if s.labels.get("rack") not in racks] or others
        best = max(((d.free_bytes, s.id, d.drive_id, s) for s in elsewhere for d in s.drives),
                   default=None, key=lambda t: (t[0], -t[1], -t[2]))
        return (best[3], best[2]) if best is not None and best[0] > 0 else None

    def _copy(self, info: SliceInfo, have: Sequence[Replica], servers: Sequence[ServerRecord],
              remotes: dict[int, RemoteNode]) -> None:
        target = self._target(have, servers)
        if target is None:
            return
        server, drive = target
        remote = remotes.get(server.id)
        if remote is None:
            remote = remotes[server.id] = RemoteNode(server.address, self.key,
                                                     timeout=self.timeout)
        source = int(have[0].drive)
        length = self.node.length(info.id, source)
        remote.delete(info.id, drive)  # a partial copy of an earlier attempt
        offset = 0
        while offset < length:
            data = self.node.read_view(info.id, offset, min(COPY_PIECE, length - offset),
                                       source)
            remote.write(info.id, offset, data, info.group, drive_id=drive)
            offset += len(data)
        remote.flush([drive])
        self.meta.set_slice_replicas(info.id, [*have, Replica(str(server.id), str(drive))])
        self.copied += 1
        self.copied_bytes += length
        log.info("slice %#x (%d bytes) copied to server %d drive %d", info.id, length,
                 server.id, drive)
