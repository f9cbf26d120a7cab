"""A storage node: the drives of one process, each a slice store, and slice placement.

The node never talks to the metadata engine. It names every drive by the
small integer ``drive_id`` it was given (the client uses the position of the
drive in the list recorded at format time) and answers "where does a new slice
go" with :meth:`StorageNode.place`. The client records the answer in meta as
the slice's replica ``("local", drive_id)`` and passes it back on reads and
deletes; a node that is not told where a slice lives asks each drive.

Placement rule: all pieces of a slice live on one drive. A new slice goes to
the drive its lifetime group used last (so a group fills zones on one drive,
and deleting it resets zones there) unless that drive has less than
``min_free_fraction`` of its capacity free; otherwise to the drive with the
most free bytes. Tiers narrow the choice: when ``tier_of(group)`` (set by
whoever owns the node and can read the directory policies: the client of an
embedded file system, a storage server process) names a tier, only drives of
that tier (``drive_tier``: conventional drives are ``hot``, SMR drives
``cold``) are considered while one of them has room for the slice; when none
has, the slice goes to the other drives rather than fail (a full tier spills,
``stats`` shows where bytes are).

Concurrency: every method is thread-safe. The placement table has its own
lock; each slice store is thread-safe by contract.

Exclusivity: :meth:`StorageNode.open` takes a lock file per drive
(``flock``), so a second process (or a second node in this process) cannot
open the same drives; the lock names the holder's pid.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shinglefs.errors import PathError
from shinglefs.meta.api import LOCAL_SERVER, Replica
from shinglefs.server.errors import (
    DriveInUse,
    DriveNotPermitted,
    NodeClosed,
    NodeFull,
    SliceMissing,
    UnknownDrive,
)
from shinglefs.server.space import HostFileSystems, SpaceLedger
from shinglefs.store import SliceStore, StoreConfig
from shinglefs.store.api import MAX_SLICE_SIZE, PieceBytes, SliceStoreAPI, StoreSpace, StoreStats
from shinglefs.store.api import Declined as Declined  # re-exported: the node's contract
from shinglefs.store.api import PieceFuture as PieceFuture  # re-exported: the node's contract
from shinglefs.store.errors import SliceNotFound, StoreFull
from shinglefs.store.scheduler import WriteScheduler
from shinglefs.store.zonerun import WriteFigures
from shinglefs.zoned import ZonedDrive, create_drive, open_drive
from shinglefs.zoned.drivespec import DriveSpecError, parse_drive_spec
from shinglefs.zoned.fileio import Payload

log = logging.getLogger(__name__)

LOCK_DIR_FOR_DEVICES = Path("/run/shinglefs/locks")
# Read buffers this large are anonymous mappings rather than malloc'd: freed,
# they go back to the kernel at once. glibc keeps freed heap memory, and
# raises its own mmap threshold after the first large free, so extent-sized
# reads came from a heap fragmented by small ones. Peak daemon RSS reading
# 20,000 small files then streaming 2 GiB (cache 256 MiB): 588 MiB malloc'd,
# 487 MiB mapped, 414 MiB mapped plus the read cache's heap trim.
MAPPED_READ_BYTES = 128 * 1024


@dataclass(frozen=True, slots=True)
class DriveStats:
    """One drive of the node: its id, spec and store counters. ``runs``: the
    ``(group, bytes)`` of the drive's last write-scheduler runs, oldest first
    (up to 4096; empty for a store without a scheduler) — each one append of
    one group, so ``bench cluster`` measures the drive's sequential runs.
    ``writes``: its write scheduler's figures since the store opened and its
    queue now (``WriteFigures``; all 0 without a scheduler); a ``dict`` when
    it came over the wire (``RemoteNode.stats``) as asdict made it."""

    drive_id: int
    spec: str
    capacity_bytes: int
    free_bytes: int
    store: StoreStats
    runs: list[tuple[int, int]] = field(default_factory=list)
    writes: WriteFigures = field(default_factory=WriteFigures)

    def __post_init__(self) -> None:
        if isinstance(self.writes, dict):  # from a STATS answer (asdict of this class)
            object.__setattr__(self, "writes", WriteFigures(**self.writes))


@dataclass(frozen=True, slots=True)
class NodeStats:
    """The node's drives summed up (statfs comes from here)."""

    capacity_bytes: int
    free_bytes: int
    live_bytes: int
    user_bytes_written: int
    device_bytes_written: int
    drives: list[DriveStats] = field(default_factory=list)


class DriveLock:
    """An exclusive ``flock`` on a lock file next to a drive, holding our pid.

    Lock files live at ``PATH.lock`` for drives on files, and under
    ``/run/shinglefs/locks`` for block devices. The lock dies with the process,
    so a crash never leaves a drive locked.
    """

    def __init__(self, spec: str, path: str) -> None:
        self.spec = spec
        self.path = self.lock_path_for(path)
        self._fd: int | None = None

    @staticmethod
    def lock_path_for(path: str) -> str:
        if path.startswith("/dev/"):
            LOCK_DIR_FOR_DEVICES.mkdir(parents=True, exist_ok=True)
            return str(LOCK_DIR_FOR_DEVICES / (path.strip("/").replace("/", "_") + ".lock"))
        return path.rstrip("/") + ".lock"

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:
            try:
                owner: int | None = os.stat(self.path).st_uid
            except OSError:
                owner = None
            raise DriveNotPermitted(self.spec, self.path, owner) from None
        except OSError as exc:  # a directory that takes no new file (/proc, read-only)
            raise PathError(f"cannot create the lock file {self.path} of drive {self.spec}: "
                            f"{exc.strerror}",
                            hint="put the drive in a directory this user can create files in"
                            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = int(os.pread(fd, 32, 0).split()[0])
            except (ValueError, IndexError, OSError):
                holder = None
            os.close(fd)
            raise DriveInUse(self.spec, self.path, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


TIER_OF_KIND = {"emulated": "cold", "linux": "cold", "conventional": "hot"}
"""The tier (``meta.records.TIERS``) of a drive by its spec's kind."""


def drive_tier(spec: str) -> str | None:
    """The tier of the drive ``spec`` (``KIND:PATH[:SIZE]``, aliases included);
    None for a spec that names no kind (a store built directly, in tests)."""
    try:
        return TIER_OF_KIND.get(parse_drive_spec(spec).kind)
    except DriveSpecError:
        return None


def drive_path(spec: str) -> str:
    """The PATH of a ``KIND:PATH[:SIZE]`` drive spec (for lock files)."""
    parts = spec.split(":")
    if len(parts) < 2:
        return spec
    return parts[1]


class TierSource(Protocol):
    """Where a node learns a lifetime group's tier (``server.tiers.TierLookup``)."""

    def __call__(self, group: int) -> str | None: ...

    def known(self, group: int) -> bool:
        """Whether the call would answer without blocking."""
        ...

    def forget(self, group: int) -> None:
        """The next call for ``group`` reads afresh."""
        ...


class SliceNode(Protocol):
    """What a client needs of the drives it writes to: ``StorageNode`` (drives of
    this process) or ``server.cluster.ClusterNode`` (drives of storage servers).
    Each method's contract is ``StorageNode``'s."""

    @property
    def drive_ids(self) -> list[int]: ...

    def reserve(self, nbytes: int, ino: int | None = None) -> None: ...

    def unreserve(self, nbytes: int, ino: int | None = None) -> None: ...

    def has_room(self, drive_id: int | None, nbytes: int) -> bool: ...

    def placement_known(self, group: int) -> bool:
        """Whether a new slice of ``group`` is placed without reading meta (its
        tier remembered or not needed): a caller that may not block asks."""
        ...

    def tier_of_drive(self, drive_id: int) -> str | None:
        """The tier of a drive of this node (None: unknown, or a drive gone)."""
        ...

    def tiers_offered(self) -> set[str]:
        """The tiers of the drives new slices may go to now."""
        ...

    def forget_tier(self, group: int) -> None:
        """Read ``group``'s tier afresh at its next placement (it was just set)."""
        ...

    def submit(self, slice_id: int, offset: int, data: PieceBytes, group: int, *,
               drive_id: int | None = None, durable: bool = False, urgent: bool = False,
               wait: bool = True, reserved: bool = False) -> tuple[int, PieceFuture]: ...

    def write(self, slice_id: int, offset: int, data: PieceBytes, group: int, *,
              drive_id: int | None = None, durable: bool = False) -> int: ...

    def forget(self, slice_id: int) -> None: ...

    def replicas_of(self, slice_id: int, drive_id: int) -> tuple[int, ...]: ...

    def drive_of_replica(self, replica: Replica) -> int | None: ...

    def delete(self, slice_id: int, drive_id: int | None = None) -> None: ...

    def flush(self, drive_ids: Iterable[int] | None = None) -> None: ...

    def read_view(self, slice_id: int, offset: int, length: int,
                  drive_id: int | None = None) -> memoryview: ...

    def prefetch(self, slice_id: int, offset: int, length: int) -> None: ...

    def stats(self) -> NodeStats: ...

    def close(self) -> None: ...

    def abandon(self) -> None: ...


class StorageNode:
    """The slice stores of one process, addressed by drive id.

    Build one with :meth:`open` (opens and locks drives by spec) or directly
    from already-open stores (tests, benchmarks).
    """

    def __init__(
        self,
        stores: dict[int, SliceStoreAPI],
        *,
        specs: dict[int, str] | None = None,
        locks: Sequence[DriveLock] = (),
        drives: Sequence[ZonedDrive] = (),
        min_free_fraction: float = 0.02,
        stats_ttl: float = 0.5,
        affinity_capacity: int = 4096,
    ) -> None:
        if not stores:
            raise ValueError("a storage node needs at least one drive")
        self._stores = dict(stores)
        self._specs = dict(specs or {i: f"drive{i}" for i in stores})
        self._locks = list(locks)
        self._drives = list(drives)  # opened by ``open``: closed after their stores
        self._min_free_fraction = min_free_fraction
        self._lock = threading.Lock()
        self._affinity: OrderedDict[int, int] = OrderedDict()  # group -> drive
        self._affinity_capacity = affinity_capacity
        self._placed: dict[int, int] = {}  # slice -> drive, for slices written by this node
        self._space = SpaceLedger(self._stores, stats_ttl=stats_ttl, host=HostFileSystems(
            {d: drive_path(spec) for d, spec in self._specs.items()}))
        for drive_id, store in self._stores.items():
            queue = store.scheduler if store.abilities.scheduler else None
            if isinstance(queue, WriteScheduler):  # tells when a run is in the drive's figure
                queue.tally.on_written = functools.partial(self._space.written, drive_id)
        self._claims: dict[int, int] = {}  # slice -> bytes it claims on its drive (``place``)
        self._claimed: dict[int, int] = dict.fromkeys(stores, 0)  # drive -> claimed bytes
        self.server_id: int | None = None  # set while shared as a server (server.share)
        self._tiers = {d: drive_tier(spec) for d, spec in self._specs.items()}
        # The tier a lifetime group's new slices go to (None: any drive); set by
        # the node's owner, who can read directory policies (module docstring).
        self.tier_of: TierSource | None = None
        self._closed = False

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        drives: Iterable[tuple[int, str]],
        *,
        create: bool = False,
        zone_size: int | None = None,
        store_config: StoreConfig | None = None,
        **kwargs: Any,
    ) -> StorageNode:
        """Open (``create``: format) each ``(drive_id, spec)`` as a slice store.

        ``zone_size`` applies when creating emulated drives (default 256 MiB).
        ``store_config`` tunes every slice store (default: ``StoreConfig()``).

        Takes each drive's lock file first; raises ``DriveInUse`` naming the
        holder pid when another process has it. On any failure the drives
        already opened are closed and their locks released.
        """
        stores: dict[int, SliceStoreAPI] = {}
        specs: dict[int, str] = {}
        locks: list[DriveLock] = []
        opened: list[ZonedDrive] = []
        tunables = asdict(store_config) if store_config is not None else {}
        try:
            for drive_id, spec in drives:
                lock = DriveLock(spec, drive_path(spec))
                lock.acquire()
                locks.append(lock)
                if create:
                    drive = (
                        create_drive(spec)
                        if zone_size is None
                        else create_drive(spec, zone_size=zone_size)
                    )
                    opened.append(drive)
                    stores[drive_id] = SliceStore.format(drive, **tunables)
                else:
                    opened.append(drive := open_drive(spec))
                    stores[drive_id] = SliceStore.open(drive, **tunables)
                specs[drive_id] = spec
        except BaseException:
            for store in stores.values():
                try:
                    store.close()
                except Exception:  # pragma: no cover - best effort on the error path
                    log.exception("closing a store after a failed node open")
            for opened_drive in opened:
                try:
                    opened_drive.close_drive()
                except Exception:  # pragma: no cover - best effort on the error path
                    log.exception("closing a drive after a failed node open")
            for lock in locks:
                lock.release()
            raise
        return cls(stores, specs=specs, locks=locks, drives=opened, **kwargs)

    # ------------------------------------------------------------------ placement
    @property
    def drive_ids(self) -> list[int]:
        return sorted(self._stores)

    def highest_slice_id(self) -> int:
        """The highest slice id any drive of this node holds or held (0: none)."""
        return max((self._store(d).highest_slice_id() for d in self.drive_ids), default=0)

    def _store(self, drive_id: int) -> SliceStoreAPI:
        if self._closed:
            raise NodeClosed("the storage node is closed")
        try:
            return self._stores[drive_id]
        except KeyError:
            raise UnknownDrive(drive_id, self.drive_ids) from None

    def _store_stats(self, drive_id: int) -> StoreSpace:
        """A drive's space figures, cached for ``stats_ttl`` (``SliceStore.space``:
        cheap, but reserve and placement ask on every write)."""
        return self._space.figure(drive_id)

    def pending_bytes(self, drive_id: int) -> int:
        """Bytes submitted to ``drive_id`` whose futures have not completed yet."""
        return self._space.pending(drive_id)

    def estimated_free_bytes(self, drive_id: int) -> int:
        """What placement believes ``drive_id`` can still take: its (cached) writable
        bytes less what was stored since they were read and what is in flight."""
        return self._estimated_free(drive_id)[0]

    def refresh_stats(self) -> None:
        """Forget the cached per-drive stats: the next placement reads fresh figures."""
        self._space.forget_figures()

    def _estimated_free(self, drive_id: int) -> tuple[int, StoreSpace]:
        return self._space.estimated_free(drive_id)

    @staticmethod
    def _free_bytes(stats: StoreSpace | StoreStats) -> int:
        """What can still be written (not capacity - live: the GC reserve and
        zone granularity are not writable; ``StoreStats.writable_bytes``)."""
        return stats.writable_bytes

    # Room for a record header and block alignment (a 3-byte file takes 8 KiB).
    RESERVE_SLACK = 8192
    # How long a reservation waits for zones GC is collecting before ENOSPC.
    RESERVE_WAIT_S = 10.0

    def reserve(self, nbytes: int, ino: int | None = None) -> None:
        """Take ``nbytes`` of the drives' writable space for bytes a writer has
        accepted but not stored yet, or raise ``NodeFull`` (ENOSPC) with nothing
        taken: what lets ``write(2)`` itself report a full file system instead
        of the ``close`` that would store the bytes. ``unreserve`` gives it back
        once the bytes are stored (then the drives' own counters hold them) or
        dropped; a piece of them submitted with ``reserved=True`` is counted in
        the reservation alone until then. ``ino`` (the file whose replication
        goal the bytes take; ``ClusterNode``) is not used: one copy here.

        Admits ``nbytes`` iff ``nbytes + RESERVE_SLACK`` fit the room of
        server/space.py's invariant (each byte not in the drives' figures
        counted once); a refusal is decided on figures read afresh, so it comes
        early by at most one write batch per drive. While a drive's GC is
        collecting a zone (its room is not lent meanwhile) the call waits for
        it, up to ``RESERVE_WAIT_S``, before saying ENOSPC."""
        need = nbytes + self.RESERVE_SLACK
        deadline = time.monotonic() + self.RESERVE_WAIT_S
        while True:
            if self._closed:
                raise NodeClosed("the storage node is closed")
            taken, room, collecting = self._space.take(nbytes, need, self.drive_ids)
            if taken:
                return
            if not collecting or time.monotonic() >= deadline:
                raise NodeFull(0, None, f"{nbytes} bytes do not fit: {max(0, room)} "
                                        "bytes are writable")
            time.sleep(0.02)

    def unreserve(self, nbytes: int, ino: int | None = None) -> None:
        """Give back what ``reserve`` took (the bytes were stored or dropped)."""
        self._space.give_back(nbytes)

    @property
    def reserved_bytes(self) -> int:
        return self._space.reserved

    def reservable_bytes(self, *, fresh: bool = False) -> int:
        """What ``reserve`` would admit now, plus its ``RESERVE_SLACK`` (as of the
        cached figures; ``fresh``: read now)."""
        return self._space.room(self.drive_ids, fresh=fresh)[0]

    def place(self, slice_id: int, group: int, size_hint: int = 0, *, wait: bool = True) -> int:
        """Choose the drive of a new slice (see the module docstring); remembers it.
        ``wait`` False: ``Declined`` instead of reading a group's tier from meta.

        A slice stays whole on its drive and may grow to ``MAX_SLICE_SIZE``: each
        placed slice *claims* that much of its drive until ``forget``, less
        what was submitted of it (counted as queued or written from then on),
        and a drive's free bytes count less the claims of the slices being
        written there, so that slices written at once are not all placed on a
        drive that can hold only one of them."""
        with self._lock:
            if slice_id in self._placed:
                return self._placed[slice_id]
        tier = self._tier_wanted(group, wait)  # may ask meta: not under the lock
        with self._lock:
            if slice_id in self._placed:
                return self._placed[slice_id]
            chosen: int | None = None
            preferred = self._affinity.get(group)
            if preferred is not None and (tier is None or self._tiers[preferred] == tier) \
                    and self._room_for(preferred, size_hint):
                chosen = preferred
            if chosen is None and tier is not None:
                # The tier's drives with room; else the others with room (a full
                # tier spills); else the freest of all, as without a tier.
                ids = self.drive_ids
                for pool in ([d for d in ids if self._tiers[d] == tier],
                             [d for d in ids if self._tiers[d] != tier]):
                    chosen = self._most_free([d for d in pool if self._room_for(d, size_hint)])
                    if chosen is not None:
                        break
            if chosen is None:
                chosen = self._most_free(self.drive_ids)
            assert chosen is not None
            self._affinity[group] = chosen
            self._affinity.move_to_end(group)
            while len(self._affinity) > self._affinity_capacity:
                self._affinity.popitem(last=False)
            self._placed[slice_id] = chosen
            # A small drive (tests) is not claimed whole by one slice.
            capacity = self._store_stats(chosen).capacity_bytes
            claim = max(size_hint, min(MAX_SLICE_SIZE, capacity // 16))
            self._claims[slice_id] = claim
            self._claimed[chosen] += claim
            return chosen

    def _tier_wanted(self, group: int, wait: bool = True) -> str | None:
        """``tier_of(group)`` when some drive here has that tier and another has
        not (else there is no choice to make); None when the lookup fails (a
        slice is placed anyway: the tier is a preference). ``wait`` False (the
        caller may not block, e.g. the FUSE event loop): ``Declined`` rather
        than read meta, when the answer is not remembered."""
        lookup = self.tier_of
        if lookup is None or len(set(self._tiers.values())) < 2:
            return None
        if not wait and not lookup.known(group):
            raise Declined(f"the tier of group {group} is not known without asking meta")
        return self._lookup_tier(lookup, group)

    def tier_of_drive(self, drive_id: int) -> str | None:
        return self._tiers.get(drive_id)

    def tiers_offered(self) -> set[str]:
        return {t for t in self._tiers.values() if t is not None}

    def forget_tier(self, group: int) -> None:
        if self.tier_of is not None:
            self.tier_of.forget(group)

    def placement_known(self, group: int) -> bool:
        """``SliceNode.placement_known``: no tier to read, or it is remembered."""
        lookup = self.tier_of
        return lookup is None or len(set(self._tiers.values())) < 2 or lookup.known(group)

    def _lookup_tier(self, lookup: TierSource, group: int) -> str | None:
        """``lookup(group)`` if it is a tier of these drives; None when it is not
        or the lookup fails (logged)."""
        try:
            tier = lookup(group)
        except Exception:
            log.warning("the tier of group %d could not be read; placing anywhere", group,
                        exc_info=True)
            return None
        return tier if tier in self._tiers.values() else None

    def _room_for(self, drive_id: int, size_hint: int) -> bool:
        """Whether ``drive_id`` keeps ``min_free_fraction`` free after ``size_hint``
        more bytes, its claims counted (caller holds the lock)."""
        free, stats = self._estimated_free(drive_id)
        free -= self._claimed[drive_id]
        return free - size_hint >= self._min_free_fraction * stats.capacity_bytes

    def _most_free(self, drive_ids: Sequence[int]) -> int | None:
        """The drive of ``drive_ids`` with the most free bytes less its claims."""
        best, best_free = None, None
        for drive_id in drive_ids:
            free = self._estimated_free(drive_id)[0] - self._claimed[drive_id]
            if best_free is None or free > best_free:
                best, best_free = drive_id, free
        return best

    def replicas_of(self, slice_id: int, drive_id: int) -> tuple[int, ...]:
        """The drives holding ``slice_id``, which went to ``drive_id``: one replica here."""
        return (drive_id,)

    def drive_of_replica(self, replica: Replica) -> int | None:
        """The drive of this node a recorded replica names: ``("local", id)``, or
        ``(server_id, id)`` once the node is shared as that server
        (``server.share``); None for a replica elsewhere."""
        if replica.server != LOCAL_SERVER and (
                self.server_id is None or replica.server != str(self.server_id)):
            return None
        try:
            drive = int(replica.drive)
        except ValueError:
            return None
        return drive if drive in self._stores else None

    def drive_of(self, slice_id: int) -> int | None:
        """The drive this node placed ``slice_id`` on, if it did."""
        with self._lock:
            return self._placed.get(slice_id)

    def forget(self, slice_id: int) -> None:
        """Drop the placement record of a finished slice (its drive is in meta now)."""
        with self._lock:
            drive_id = self._placed.pop(slice_id, None)
            claim = self._claims.pop(slice_id, 0)
            if drive_id is not None:
                self._claimed[drive_id] -= claim

    # ------------------------------------------------------------------ slice I/O
    def submit(
        self,
        slice_id: int,
        offset: int,
        data: PieceBytes,
        group: int,
        *,
        drive_id: int | None = None,
        durable: bool = False,
        urgent: bool = False,
        wait: bool = True,
        reserved: bool = False,
    ) -> tuple[int, PieceFuture]:
        """Hand a piece of ``slice_id`` at ``offset`` to its drive's store; returns
        ``(drive_id, future)``. ``SliceStoreAPI.submit`` is the contract (the flags
        ``durable``, ``urgent``, ``wait``; ``Declined`` with nothing queued or
        placed-and-counted when ``wait`` is False and the store cannot take it).

        The first piece of a slice places it (unless ``drive_id`` is given);
        later pieces go to the same drive. Store errors surface through the
        future (``StoreFull`` becomes ``NodeFull`` in :meth:`write`).

        ``reserved``: the caller's ``reserve`` holds the piece's bytes until its
        future completes (a writer gives them back in a done callback): the
        node then counts them there alone, not again as in flight.
        """
        payload = Payload(data)
        size = payload.nbytes
        if drive_id is None:
            drive_id = self.place(slice_id, group, size, wait=wait)
        store = self._store(drive_id)
        piece = self._space.submitted(drive_id, slice_id, offset, size, reserved=reserved)
        try:
            future = store.submit(slice_id, offset, payload, group,
                                  durable=durable, urgent=urgent, wait=wait)
        except BaseException:
            self._space.withdrawn(piece)
            raise
        self._space.settle_when_done(future, piece)
        self._use_claim(slice_id, drive_id, size)
        return drive_id, future

    def _use_claim(self, slice_id: int, drive_id: int, size: int) -> None:
        """``size`` bytes of a placed slice were submitted: the space ledger counts
        them now, so its claim shrinks by as much (placement counts them once)."""
        with self._lock:
            claim = self._claims.get(slice_id, 0)
            if claim and self._placed.get(slice_id) == drive_id:
                used = min(claim, size)
                self._claims[slice_id] = claim - used
                self._claimed[drive_id] -= used

    def write(
        self,
        slice_id: int,
        offset: int,
        data: PieceBytes,
        group: int,
        *,
        drive_id: int | None = None,
        durable: bool = False,
    ) -> int:
        """``submit`` (urgent: the caller waits) and wait; returns the drive id.
        Raises ``NodeFull`` when out of space."""
        drive_id, future = self.submit(
            slice_id, offset, data, group, drive_id=drive_id, durable=durable, urgent=True
        )
        wait_piece(future, slice_id, drive_id)
        return drive_id

    def has_room(self, drive_id: int | None, nbytes: int) -> bool:
        """Would ``submit(wait=False)`` of ``nbytes`` to this drive (None: whichever
        drive a new slice is placed on) be taken (``SliceStoreAPI.has_room``)? A
        hint: other submitters may take the room first."""
        drives = [drive_id] if drive_id is not None else self.drive_ids
        return all(self._store(drive).has_room(nbytes) for drive in drives)

    def read(self, slice_id: int, offset: int, length: int, drive_id: int | None = None) -> bytes:
        """Bytes ``[offset, offset+length)`` of a slice (short at its end).

        Raises ``SliceMissing`` when the slice is on no drive (deleted).
        """
        if drive_id is None:
            drive_id = self.locate(slice_id)
        try:
            return self._store(drive_id).read(slice_id, offset, length)
        except SliceNotFound:
            raise SliceMissing(slice_id, drive_id) from None

    def prefetch(self, slice_id: int, offset: int, length: int) -> None:
        """Hint the drive holding a slice that a range of it is read soon (never raises
        for a slice that is gone: a hint is best effort)."""
        try:
            self._store(self.locate(slice_id)).prefetch(slice_id, offset, length)
        except (SliceMissing, SliceNotFound):
            pass

    def read_view(self, slice_id: int, offset: int, length: int,
                  drive_id: int | None = None) -> memoryview:
        """``read`` into a fresh buffer, returned as a read-only view (no copy to bytes).

        The buffer is as long as the bytes the slice has in the range, not as
        ``length``: a reader asking for a whole extent of a 4 KiB slice gets
        (and keeps alive) 4 KiB, not an extent-sized buffer.
        """
        if drive_id is None:
            drive_id = self.locate(slice_id)
        store = self._store(drive_id)
        try:
            stored = store.length(slice_id) - offset
            buf = _read_buffer(max(0, min(length, stored, MAX_SLICE_SIZE)))
            n = store.readinto(slice_id, offset, buf)
        except SliceNotFound:
            raise SliceMissing(slice_id, drive_id) from None
        return memoryview(buf)[:n].toreadonly()

    def length(self, slice_id: int, drive_id: int | None = None) -> int:
        """Bytes written so far to a slice."""
        if drive_id is None:
            drive_id = self.locate(slice_id)
        try:
            return self._store(drive_id).length(slice_id)
        except SliceNotFound:
            raise SliceMissing(slice_id, drive_id) from None

    def locate(self, slice_id: int) -> int:
        """The drive holding ``slice_id`` (asks each drive when it was not placed here)."""
        placed = self.drive_of(slice_id)
        if placed is not None:
            return placed
        for drive_id in self.drive_ids:
            if self._store(drive_id).contains(slice_id):
                return drive_id
        raise SliceMissing(slice_id, None)

    def contains(self, slice_id: int, drive_id: int | None = None) -> bool:
        if drive_id is not None:
            return self._store(drive_id).contains(slice_id)
        return any(self._store(d).contains(slice_id) for d in self.drive_ids)

    def delete(self, slice_id: int, drive_id: int | None = None) -> None:
        """Delete a slice (idempotent: a slice on no drive is already gone)."""
        targets = [drive_id] if drive_id is not None else self.drive_ids
        for target in targets:
            store = self._store(target)
            if drive_id is not None or store.contains(slice_id):
                store.delete(slice_id)
        self.forget(slice_id)

    def flush(self, drive_ids: Iterable[int] | None = None) -> None:
        """Make every completed write and delete durable on the given drives (default all)."""
        for drive_id in drive_ids if drive_ids is not None else self.drive_ids:
            self._store(drive_id).flush()

    def stats(self) -> NodeStats:
        """Capacity and free space (a host file system's drives: at most its free) summed."""
        drives = []
        for drive_id in self.drive_ids:
            store = self._store(drive_id)
            stats = store.stats()
            queue = store.scheduler if store.abilities.scheduler else None
            drives.append(
                DriveStats(
                    drive_id=drive_id,
                    spec=self._specs.get(drive_id, ""),
                    capacity_bytes=stats.capacity_bytes,
                    free_bytes=self._free_bytes(stats),
                    store=stats,
                    runs=list(queue.runs_written) if isinstance(queue, WriteScheduler) else [],
                    writes=(queue.figures() if isinstance(queue, WriteScheduler)
                            else WriteFigures()),
                )
            )
        return NodeStats(
            capacity_bytes=sum(d.capacity_bytes for d in drives),
            free_bytes=self._space.host_capped({d.drive_id: d.free_bytes for d in drives}),
            live_bytes=sum(d.store.live_bytes for d in drives),
            user_bytes_written=sum(d.store.user_bytes_written for d in drives),
            device_bytes_written=sum(d.store.device_bytes_written for d in drives),
            drives=drives,
        )

    def store(self, drive_id: int) -> SliceStoreAPI:
        """The slice store of one drive (benchmarks and tests read its stats/trace)."""
        return self._store(drive_id)

    def close(self) -> None:
        """Flush and close every store, close the drives ``open`` opened (their
        descriptors), then release the drive locks. Idempotent; raises the first
        error met, after trying every store and drive."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for close in [s.close for s in self._stores.values()] + [
                d.close_drive for d in self._drives]:
            try:
                close()
            except Exception as exc:
                log.exception("closing a slice store or its drive")
                errors.append(exc)
        for lock in self._locks:
            lock.release()
        if errors:
            raise errors[0]

    def abandon(self) -> None:
        """Release the drive locks WITHOUT flushing or closing the stores.

        Simulates the death of the process for crash tests: whatever was not
        made durable is left to the drive's power-cut semantics.
        """
        self._closed = True
        for lock in self._locks:
            lock.release()

    def __enter__(self) -> StorageNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Private and populated in the mmap call: a shared anonymous mapping is
# faulted in page by page as the read fills it (measured with 8 readers of a
# mount: 2.8-3.0 ms of daemon CPU per MiB read, 2.1-2.4 with this).
_READ_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


def _read_buffer(size: int) -> bytearray | mmap.mmap:
    """A zeroed buffer for a read: an anonymous mapping from ``MAPPED_READ_BYTES`` on
    (returned to the kernel when the last view of it goes, unlike heap memory)."""
    if size >= MAPPED_READ_BYTES:
        return mmap.mmap(-1, size, flags=_READ_MAP_FLAGS)
    return bytearray(size)


def wait_piece(future: Future[None], slice_id: int, drive_id: int) -> None:
    """Wait for a submitted piece; translate a full store into ``NodeFull``."""
    try:
        future.result()
    except StoreFull as exc:
        raise NodeFull(slice_id, drive_id, str(exc)) from exc
