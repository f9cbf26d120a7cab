"""The storage server as a process (``shinglefs server``): its drives, served over
the slice protocol, and its membership in the metadata database.

``StorageServer.start`` does, in this order, and undoes what it did when a
step fails:

1. opens the metadata (``MetaUnavailable`` when unreachable; ``NotFormatted``)
   and reads the file system's uuid and the cluster secret
   (``MetaStore.cluster_secret``; ``ClusterSecretError`` when shorter than
   ``auth.MIN_SECRET_BYTES``);
2. checks that the listen address is free (``AddressInUse``) before touching
   a drive;
3. opens its drives as one ``StorageNode``: a drive whose header does not
   exist yet is new and is formatted (its size is required, its directory
   must exist, no file may be at its path: ``PathError``; ``DriveTooSmall``),
   and given a drive identity (the file system's uuid and a fresh drive
   uuid) in its header; an existing drive is recovered as ``SliceStore.open``
   recovers it, after its identity is checked (``DriveIdentityError`` for a
   drive of another file system), with the server's defaults where the
   configuration leaves them to the role (``server_store_config``: zone runs
   of ``SERVER_SWITCH_BYTES`` across the clients' groups). ``DriveInUse``
   when another process holds a drive, found before any new drive is
   created. A zoned block device has no header of ours: it is always opened
   as an existing slice store;
4. serves the node with ``SliceServer`` on the listen address, holding at
   most a write queue's bytes (``max_queue_bytes``) of PUTs not yet stored;
5. registers in meta (``MetaStore.register_server``; a restart with the
   same drives rejoins under its old id) and heartbeats every
   ``heartbeat_s`` from a thread, with the drives' free bytes. A heartbeat
   that finds the registration stopped or removed registers again; one that
   cannot reach meta logs a warning and tries at the next beat (clients then
   see the server stale, and it keeps serving those that already use it).

Once registered, it runs re-replication passes (server/repair.py) every
``repair_interval_s``, orphan sweep passes (server/sweep.py: copies no
record names, deleted after ``orphan_grace_s``) every ``sweep_interval_s``
and deletion passes (server/deletions.py: its copies of the slices queued
for deletion freed, with or without a client mounted) every
``deletion_interval_s``, each in a thread of its own; 0 turns any off.

Drive ids: a drive keeps the id meta recorded for its uuid in an earlier
registration, so reordering ``--drive`` flags does not renumber drives; a
new drive takes the next id free on this server.

``stop`` unregisters first (placement leaves the server out at once), then
stops serving, then closes the node (every completed write flushed) and the
metadata. After a crash (SIGKILL) nothing is unregistered: the server goes
stale when its heartbeat ages past the readers' timeout, and a restart
recovers its drives and rejoins.
"""

from __future__ import annotations

import dataclasses
import errno as _errno
import logging
import os
import signal
import socket
import threading
import time
import uuid as _uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

from shinglefs.errors import PathError, ShingleError, UsageError
from shinglefs.meta import open_meta
from shinglefs.meta.api import REPAIR_AFTER_S, SERVER_HEARTBEAT_S, MetaStore, ServerDrive
from shinglefs.server.auth import MIN_SECRET_BYTES
from shinglefs.server.deletions import DELETION_INTERVAL_S, ServerDeletions
from shinglefs.server.errors import AddressInUse, ClusterSecretError
from shinglefs.server.membership import Membership, server_drives
from shinglefs.server.node import DriveLock, StorageNode
from shinglefs.server.repair import Repairer
from shinglefs.server.service import SliceServer
from shinglefs.server.sweep import ORPHAN_GRACE_S, SWEEP_INTERVAL_S, Sweeper
from shinglefs.server.tiers import TierLookup
from shinglefs.store.config import SERVER_SWITCH_BYTES, StoreConfig
from shinglefs.store.log import check_drive_size
from shinglefs.zoned.drivespec import (
    DriveIdentityError,
    DriveSpec,
    header_path,
    missing_size,
    parse_drive_spec,
    read_identity,
    write_identity,
)
from shinglefs.zoned.model import DEFAULT_ZONE_SIZE
from shinglefs.zoned.zonetable import DriveIdentity

log = logging.getLogger(__name__)

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def parse_address(text: str, what: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as ``(host, port)``; UsageError otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"{what} {text!r} is not HOST:PORT",
                         hint=f"e.g. {what} 0.0.0.0:7070 (port 0: any free port)")
    return host, int(port)


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    """``["rack=a", "zone=eu"]`` as a dict; UsageError for an item without ``KEY=``."""
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"label {item!r} is not KEY=VALUE", hint="e.g. --label rack=a")
        labels[key.strip()] = value.strip()
    return labels


def cluster_key(meta: MetaStore) -> bytes:
    """The key a server and its clients authenticate with: the cluster secret in
    meta (created if the file system has none yet), as bytes.
    ``ClusterSecretError`` when it is too short."""
    key = meta.cluster_secret().encode()
    if len(key) < MIN_SECRET_BYTES:
        raise ClusterSecretError(
            f"the cluster secret in {meta.url_where} has {len(key)} bytes; a storage server "
            f"needs at least {MIN_SECRET_BYTES}",
            hint="format the file system with `shinglefs format` (it creates a secret)")
    return key


def check_address_free(host: str, port: int) -> None:
    """``AddressInUse`` when ``(host, port)`` cannot be bound now (port 0 always can)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == _errno.EADDRINUSE:
                raise AddressInUse(f"{host}:{port}") from None
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}",
                             hint="give --listen an address of this host") from None


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What ``shinglefs server`` is given. ``advertise``: the ``host:port``
    registered for clients (default: the listen address, with this host's
    name for a wildcard host)."""

    meta_url: str
    drives: tuple[str, ...]
    listen: tuple[str, int] = ("0.0.0.0", 7070)
    advertise: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    heartbeat_s: float = SERVER_HEARTBEAT_S
    zone_size: int | None = None
    store_config: StoreConfig | None = None
    repair_after_s: float = REPAIR_AFTER_S  # server/repair.py
    repair_interval_s: float = 30.0  # between re-replication passes; 0: none
    orphan_grace_s: float = ORPHAN_GRACE_S  # server/sweep.py
    sweep_interval_s: float = SWEEP_INTERVAL_S  # between orphan sweep passes; 0: none
    deletion_interval_s: float = DELETION_INTERVAL_S  # server/deletions.py; 0: none


# ---- drives ---------------------------------------------------------------------------


def server_store_config(config: StoreConfig | None) -> StoreConfig:
    """The slice stores' tunables on a storage server: ``config`` with the
    server's defaults where it leaves the role to decide (``switch_bytes``
    None: ``SERVER_SWITCH_BYTES``, zone runs across the clients' groups)."""
    config = config or StoreConfig()
    if config.switch_bytes is None:
        config = dataclasses.replace(config, switch_bytes=SERVER_SWITCH_BYTES)
    return config


def _is_new(spec: DriveSpec) -> bool:
    header = header_path(spec)
    return header is not None and not os.path.lexists(header)


def _check_new(spec: DriveSpec, zone_size: int) -> None:
    """What must hold before a new drive is created: a size, a writable directory,
    no file at its path, room for a slice store."""
    if spec.size is None:
        raise missing_size(spec)
    parent = os.path.dirname(spec.path) or "."
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise PathError(f"cannot create drive {spec.path}: {parent} is not a writable directory",
                        hint="create the directory or choose another path")
    if os.path.isfile(spec.path):
        raise PathError(f"{spec.path} exists but is not a ShingleFS drive (it has no zone table)",
                        hint="choose a new path; a server never overwrites a file")
    zone_count = spec.size // zone_size
    conventional = zone_count
    if spec.kind == "emulated":
        from shinglefs.zoned.emulated import default_conventional_zones

        conventional = default_conventional_zones(zone_count)
    check_drive_size(spec.path, zone_size=zone_size, zone_count=zone_count,
                     conventional_zones=conventional)


def _parse_drives(drives: Sequence[str]) -> list[DriveSpec]:
    specs: list[DriveSpec] = []
    seen: set[str] = set()
    for text in drives:
        spec = parse_drive_spec(text)
        if spec.kind != "linux":
            spec = DriveSpec(spec.kind, os.path.abspath(spec.path), spec.size)
        real = os.path.realpath(spec.path)
        if real in seen:
            raise UsageError(f"drive {spec.path} is given twice", hint="name each drive once")
        seen.add(real)
        specs.append(spec)
    if not specs:
        raise UsageError("a storage server needs at least one drive",
                         hint="e.g. --drive smr:/data/d0.img:64G")
    return specs


def _identity(spec: DriveSpec, fs_uuid: str) -> str | None:
    """The drive uuid in an existing drive's header (None: none yet);
    ``DriveIdentityError`` for a drive of another file system."""
    ident = read_identity(spec)
    if ident is not None and ident.filesystem != fs_uuid:
        raise DriveIdentityError(
            f"drive {spec.path} belongs to another file system ({ident.filesystem}), "
            f"not to {fs_uuid}", hint="give this server drives of its own file system")
    return ident.drive if ident is not None else None


def _check_not_in_use(specs: Sequence[DriveSpec]) -> None:
    """``DriveInUse`` for a drive another process holds, before a new drive is
    created (the node takes the locks for good when it opens the drives)."""
    locks: list[DriveLock] = []
    try:
        for spec in specs:
            lock = DriveLock(str(spec), spec.path)
            lock.acquire()
            locks.append(lock)
    finally:
        for lock in locks:
            lock.release()


def _drive_ids(uuids: Sequence[str | None], known: Mapping[str, int]) -> list[int]:
    """Each drive's id: the one meta recorded for its uuid (unless an earlier drive
    took it: drives of two former servers), else the lowest id still free."""
    ids: list[int | None] = []
    for drive_uuid in uuids:
        known_id = known.get(drive_uuid) if drive_uuid is not None else None
        ids.append(known_id if known_id not in ids else None)
    taken = {i for i in ids if i is not None}
    free = (i for i in range(len(ids) + len(taken)) if i not in taken)
    return [i if i is not None else next(free) for i in ids]


def open_drives(config: ServerConfig, fs_uuid: str,
                known: Mapping[str, int]) -> tuple[StorageNode, dict[int, str | None]]:
    """The node over the server's drives (module docstring, step 3) and each
    drive id's uuid. New drives are formatted, identified, closed, then all
    are opened together."""
    specs = _parse_drives(config.drives)
    zone_size = config.zone_size or DEFAULT_ZONE_SIZE
    uuids = [None if _is_new(s) else _identity(s, fs_uuid) for s in specs]
    new = [i for i, s in enumerate(specs) if _is_new(s)]
    for i in new:
        _check_new(specs[i], zone_size)
    _check_not_in_use([s for i, s in enumerate(specs) if i not in new])
    if new:
        StorageNode.open([(i, str(specs[i])) for i in new], create=True,
                         zone_size=config.zone_size, store_config=config.store_config).close()
        for i in new:
            uuids[i] = drive_uuid = str(_uuid.uuid4())
            write_identity(specs[i], DriveIdentity(fs_uuid, drive_uuid))
            log.info("formatted new drive %s", specs[i])
    ids = _drive_ids(uuids, known)
    node = StorageNode.open(list(zip(ids, map(str, specs), strict=True)),
                            store_config=server_store_config(config.store_config))
    for i, spec in enumerate(specs):
        if uuids[i] is None and header_path(spec) is not None:  # formatted before identities
            uuids[i] = drive_uuid = str(_uuid.uuid4())
            write_identity(spec, DriveIdentity(fs_uuid, drive_uuid))
    return node, dict(zip(ids, uuids, strict=True))


# ---- the process ----------------------------------------------------------------------


class StorageServer:
    """One storage server: drives, the slice protocol, membership (module docstring).

    ``start`` raises the typed errors of the module docstring with nothing
    left open; ``stop`` is idempotent. Thread-safe: the heartbeat thread and
    the caller share only the metadata store (thread-safe by contract)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.server_id: int | None = None
        self.address = ""
        self._meta: MetaStore | None = None
        self._node: StorageNode | None = None
        self._uuids: dict[int, str | None] = {}
        self._slices: SliceServer | None = None
        self._stop = threading.Event()
        self._membership: Membership | None = None
        self._threads: list[threading.Thread] = []
        self.repairer: Repairer | None = None
        self.sweeper: Sweeper | None = None
        self.deletions: ServerDeletions | None = None

    def start(self) -> StorageServer:
        self._meta = open_meta(self.config.meta_url)
        try:
            fs_uuid = self._meta.format_info().uuid
            key = cluster_key(self._meta)
            host, port = self.config.listen
            check_address_free(host, port)
            known = {d.uuid: d.drive_id for s in self._meta.list_servers()
                     for d in s.drives if d.uuid is not None}
            self._node, self._uuids = open_drives(self.config, fs_uuid, known)
            self._node.tier_of = TierLookup(self._meta)
            # Clients number new slices from meta's counter: keep it past
            # every id these drives hold (metadata restored from a dump).
            top = self._node.highest_slice_id()
            if top and self._meta.raise_slice_ids(top):
                log.warning("drives hold slice ids up to %d, past the metadata's counter: "
                            "raised it", top)
            try:
                stores = server_store_config(self.config.store_config)
                self._slices = SliceServer(self._node, key, host=host, port=port,
                                           held_bytes=stores.max_queue_bytes,
                                           zone_run_bytes=stores.switch_bytes or 0).start()
            except OSError as exc:
                if exc.errno == _errno.EADDRINUSE:
                    raise AddressInUse(f"{host}:{port}") from None
                raise
            self.address = self._advertised()
            self._membership = Membership(self._meta, self._node, self._uuids,
                                          self.config.labels, self.config.heartbeat_s)
            self.server_id = self._membership.register(self.address)
        except BaseException:
            self._close_all()
            raise
        self._membership.start()
        assert self._node is not None and self.server_id is not None
        if self.config.repair_interval_s > 0:
            self.repairer = Repairer(self._meta, self._node, self.server_id, key,
                                     repair_after_s=self.config.repair_after_s)
            self._every("repair", "re-replication", self.config.repair_interval_s,
                        self._repair_pass)
        if self.config.sweep_interval_s > 0:
            self.sweeper = Sweeper(self._meta, self._node, self.server_id,
                                   grace_s=self.config.orphan_grace_s)
            self._every("sweep", "orphan sweep", self.config.sweep_interval_s,
                        self.sweeper.run_once)
        if self.config.deletion_interval_s > 0:
            self.deletions = ServerDeletions(self._meta, self._node, self.server_id)
            self._every("deletions", "deletion", self.config.deletion_interval_s,
                        self.deletions.run_once)
        return self

    def _every(self, name: str, what: str, interval_s: float,
               one_pass: Callable[[], object]) -> None:
        """Run ``one_pass`` every ``interval_s`` in a thread of its own until
        ``stop``; a failed pass is logged and the next one tries again."""

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    one_pass()
                except ShingleError as exc:
                    log.warning("%s pass of server %s failed: %s", what, self.server_id, exc)
                except Exception:
                    log.exception("%s pass of server %s failed", what, self.server_id)

        thread = threading.Thread(target=loop, name=f"server-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _repair_pass(self) -> None:
        assert self.repairer is not None
        made = self.repairer.run_once()
        if made:
            log.info("re-replication pass: %d slice(s) copied", made)

    def _advertised(self) -> str:
        if self.config.advertise:
            return self.config.advertise
        assert self._slices is not None
        host, port = self._slices.address
        if host in WILDCARD_HOSTS:
            host = socket.getfqdn()
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def node(self) -> StorageNode:
        """The server's drives, while it runs (AssertionError otherwise)."""
        assert self._node is not None, "the server is not running"
        return self._node

    def drive_records(self) -> list[ServerDrive]:
        """The server's drives as meta records them, with free bytes as of now."""
        assert self._node is not None
        return server_drives(self._node, self._uuids)

    def stop(self) -> None:
        """Unregister, stop serving, close the drives and the metadata. Idempotent."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        if self._membership is not None:
            self._membership.stop()
            self._membership = None
        self._close_all()

    def _close_all(self) -> None:
        slices, node, meta = self._slices, self._node, self._meta
        self._slices = self._node = self._meta = None
        if slices is not None:
            slices.close()
        try:
            if node is not None:
                node.close()
        finally:
            if meta is not None:
                meta.close()

    def __enter__(self) -> StorageServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_server(config: ServerConfig,
               ready: Callable[[StorageServer], None] | None = None) -> None:
    """Run a storage server until SIGTERM or SIGINT, then stop it cleanly.

    ``ready`` is called once it serves and is registered. Returns after a
    clean stop; raises what ``StorageServer.start`` raises."""
    # A plain flag, not an Event: a handler taking the Event's lock could find
    # it held by the very wait it interrupted.
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with StorageServer(config).start() as server:
            if ready is not None:
                ready(server)
            while not stopping:
                time.sleep(0.1)
            log.info("signal %d: stopping", stopping[0])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
