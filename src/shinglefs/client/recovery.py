"""Recovery tools over a whole file system (metadata plus its drives).

- ``fsck``: the passes of ``shinglefs.meta.fsck`` with the drives' slice
  indexes as input; ``--repair`` refuses while a live session has the file
  system open (``FileSystemInUse``) unless forced. fsck and scrub check each
  drive's identity header against the metadata first, exactly as a mount
  does (``DriveIdentityError``): another file system's drive, or a swapped
  one, is never read as this one's.
- ``scrub``: ``shinglefs.store.scrub`` on every drive, damaged slices mapped
  to file paths through the chunk map; on a file system on storage servers
  each server scrubs its own drives when asked (server/scrubbing.py) and
  each damaged file is told lost, unverified or degraded by its slices'
  other copies.
- ``MetadataBackup``: a compressed dump of the metadata written to every
  drive's backup slots (``shinglefs.store.metabackup``); the client's
  maintenance thread calls ``maybe_write`` every pass, and it writes one
  every ``BACKUP_INTERVAL_S`` (the first ``FIRST_BACKUP_S`` after opening);
  a clean shutdown writes one more (``write_at_shutdown``).
- ``load_from_drives``: rebuild a lost metadata database from the newest
  valid backup on the drives, all of one file system.

A session is live when its heartbeat is younger than the client's session
timeout and, for a session of this host, its pid still runs.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shinglefs.client.config import ClientConfig
from shinglefs.errors import ShingleError, UsageError
from shinglefs.meta import open_meta
from shinglefs.meta.api import MetaStore, is_inline_slice
from shinglefs.meta.backend import Tx
from shinglefs.meta.check import CheckContext, paths_of
from shinglefs.meta.dump import backend_of, dump_backend, load_backend
from shinglefs.meta.fsck import FsckReport, run_fsck
from shinglefs.server.node import SliceNode, StorageNode
from shinglefs.server.scrubbing import (
    DEFAULT_STEP_S,
    MIN_RATE_BYTES,
    ServerScrub,
    scrub_server,
    scrub_state_path,
    scrub_timeout,
)
from shinglefs.store.metabackup import (
    BackupError,
    BackupSlot,
    backup_slots,
    newest_backup,
    read_backup,
    write_backup,
)
from shinglefs.store.scrub import ScrubState, scrub_drive
from shinglefs.store.slice_store import SliceStore
from shinglefs.zoned.drivespec import parse_drive_spec

log = logging.getLogger(__name__)

BACKUP_INTERVAL_S = 600.0
FIRST_BACKUP_S = 30.0
# A clean shutdown writes one more backup unless this process wrote one in the
# last FIRST_BACKUP_S, or the metadata is large enough that a dump would hold
# up the unmount (SHUTDOWN_BACKUP_MAX_S: what the last dump took).
SHUTDOWN_BACKUP_MAX_S = 5.0
SHUTDOWN_BACKUP_MAX_INODES = 200_000


class FileSystemInUse(ShingleError):
    """``fsck --repair`` while a live session has the file system open."""

    exit_code = 3


class NoMetadataBackup(ShingleError):
    """No drive holds a valid metadata backup."""

    exit_code = 3


def live_sessions(meta: MetaStore, timeout_s: float | None = None) -> frozenset[int]:
    """The sessions that count as alive (see the module docstring)."""
    timeout = ClientConfig().session_timeout if timeout_s is None else timeout_s
    now = time.time_ns()
    host = socket.gethostname()
    alive = set()
    for s in meta.list_sessions():
        if now - s.heartbeat_ns > timeout * 1e9:
            continue
        if s.info.host == host and s.info.pid and not _pid_runs(s.info.pid):
            continue
        alive.add(s.id)
    return frozenset(alive)


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _opened(meta_url: str, before_drives: Callable[[MetaStore], None] | None = None,
            ) -> tuple[MetaStore, StorageNode]:
    """The metadata and its recorded drives, opened; ``before_drives(meta)`` runs
    before the drives are opened (and locked)."""
    meta = open_meta(meta_url)
    try:
        specs = _identified_drives(meta)
        if before_drives is not None:
            before_drives(meta)
        node = _open_drives(specs, meta_url, recorded=True)
    except BaseException:
        meta.close()
        raise
    return meta, node


def _identified_drives(meta: MetaStore) -> list[str]:
    """The recorded drives' specs, after checking each drive's identity header
    against the metadata exactly as a mount does (``DriveIdentityError``, exit
    18: a drive missing, of another file system, or another drive of this
    one), before any drive is opened: fsck and scrub must never read another
    file system's slices as this one's, let alone "repair" by them."""
    from shinglefs.client.filesystem import identified_drives

    return [str(spec) for spec in identified_drives(meta, meta.format_info()).specs]


def _open_drives(specs: list[str], meta_url: str, *, recorded: bool) -> StorageNode:
    """``StorageNode.open`` for a recovery command, its refusals hinting at what
    to run: a drive held by a mount (``DriveInUse``, exit 3) and a drive whose
    size is not the one its spec gives (recorded in the metadata: the drive is
    not the one recorded, ``DriveIdentityError``, exit 18; typed by the user:
    ``DriveSpecError``, exit 2)."""
    from shinglefs.server.errors import DriveInUse
    from shinglefs.zoned.drivespec import DriveIdentityError, DriveSpecError

    try:
        return StorageNode.open(list(enumerate(specs)))
    except DriveInUse as exc:
        exc.hint = ("unmount the file system first (`shinglefs umount MOUNTPOINT`), then run "
                    "this command again")
        raise
    except DriveSpecError as exc:
        if recorded:
            raise DriveIdentityError(
                f"{exc}: the drive there is not the one the metadata recorded",
                hint="put this file system's own drive back at this path, then run "
                     f"`shinglefs fsck {meta_url}`; nothing was changed") from None
        raise DriveSpecError(
            str(exc), hint="give each drive as KIND:PATH, without a size: `shinglefs load "
                           f"--from-drives KIND:PATH... {meta_url}`") from None


def slice_inventory(node: StorageNode) -> dict[int, dict[int, int]]:
    """Per drive id: every slice it holds and its stored length."""
    held: dict[int, dict[int, int]] = {}
    for drive_id in node.drive_ids:
        store = node.store(drive_id)
        assert isinstance(store, SliceStore)
        held[drive_id] = {sid: store.length(sid) for sid in store.slice_ids()}
    return held


def fsck(meta_url: str, *, repair: bool = False, force: bool = False,
         progress: Callable[[str], None] | None = None) -> FsckReport:
    """Check (and with ``repair`` fix) the file system at ``meta_url``.

    Raises ``FileSystemInUse`` for ``repair`` while a live session exists and
    ``force`` is off; ``DriveInUse`` while a local process holds the drives;
    ``DriveIdentityError`` (before anything is read or changed) when a drive
    is missing, of another file system or another drive of this one.
    On a file system whose bytes are on storage servers only the metadata
    passes run; the report names the drive passes it skipped.
    """
    def refuse_if_in_use(meta: MetaStore) -> None:
        alive = live_sessions(meta)
        if repair and alive and not force:
            raise FileSystemInUse(
                f"{len(alive)} live session(s) have {meta_url} open (ids "
                f"{', '.join(map(str, sorted(alive)))})",
                hint="unmount it first (`shinglefs umount`), or pass --force if those "
                     "sessions are known dead")

    if _on_servers(meta_url):
        return _fsck_metadata(meta_url, repair=repair, force=force, progress=progress,
                              refuse_if_in_use=refuse_if_in_use)
    meta, node = _opened(meta_url, refuse_if_in_use)
    try:
        alive = live_sessions(meta)
        ctx = CheckContext(backend_of(meta), meta, meta.format_info().chunk_size,
                           live_sessions=frozenset() if force else alive,
                           held=slice_inventory(node), drop_slice=node.delete)
        report = run_fsck(ctx, repair=repair, progress=progress)
        if repair:
            node.flush()
        return report
    finally:
        try:
            node.close()
        finally:
            meta.close()


def _on_servers(meta_url: str) -> bool:
    """The file system keeps its bytes on storage servers (no drives of its own)."""
    meta = open_meta(meta_url)
    try:
        meta.format_info()
        return not meta.drive_records()
    finally:
        meta.close()


def _fsck_metadata(meta_url: str, *, repair: bool, force: bool,
                   progress: Callable[[str], None] | None,
                   refuse_if_in_use: Callable[[MetaStore], None]) -> FsckReport:
    """fsck of a file system on storage servers: the metadata passes only. The
    drive passes need every drive's slice inventory, which the servers hold;
    each server's orphan sweep deletes the copies no record names, and its
    repair pass restores the replication goal (docs/cluster.md)."""
    from shinglefs.meta.check import META_PASSES
    from shinglefs.meta.fsck import DRIVE_PASSES, SLICE_DRIVE_PASSES

    meta = open_meta(meta_url)
    try:
        refuse_if_in_use(meta)
        alive = live_sessions(meta)
        ctx = CheckContext(backend_of(meta), meta, meta.format_info().chunk_size,
                           live_sessions=frozenset() if force else alive)
        report = run_fsck(ctx, repair=repair, passes=META_PASSES, progress=progress)
        report.skipped = [f"{p.name}: the drives are on storage servers"
                          for p in DRIVE_PASSES + SLICE_DRIVE_PASSES]
        return report
    finally:
        meta.close()


@dataclass
class ScrubResult:
    """Per drive id its final scrub state; ``damaged_files`` maps a path to the
    slices of it that failed; ``unreferenced`` are damaged slices no file uses.

    A file system on storage servers: ``servers`` is each registered server's
    part (``ServerScrub``: its drives' last steps, or why it was not
    scrubbed), and ``file_health`` says of each damaged file whether it is
    ``lost`` (a slice of it has no undamaged copy left), ``unverified`` (a
    slice's other copies are on servers or drives not scrubbed) or
    ``degraded`` (each damaged slice has a copy this scrub verified: still
    readable)."""

    drives: dict[int, ScrubState] = field(default_factory=dict)
    damaged_files: dict[str, list[str]] = field(default_factory=dict)
    unreferenced: list[int] = field(default_factory=list)
    servers: dict[int, ServerScrub] = field(default_factory=dict)
    file_health: dict[str, str] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    """Slices files reference that no drive holds (drives of its own only):
    their files are in ``damaged_files`` too."""

    @property
    def finished(self) -> bool:
        return (all(s.finished for s in self.drives.values())
                and all(s.finished for s in self.servers.values()))

    @property
    def bytes_read(self) -> int:
        return (sum(s.bytes_read for s in self.drives.values())
                + sum(s.bytes_read for s in self.servers.values()))

    @property
    def drive_count(self) -> int:
        return len(self.drives) + sum(len(s.drives) for s in self.servers.values())


HEALTH_ORDER = ("degraded", "unverified", "lost")  # a file is as bad as its worst slice


def scrub(meta_url: str, *, rate_bytes: float | None = None,
          progress: Callable[[int], None] | None = None,
          stop: Callable[[], bool] | None = None) -> ScrubResult:
    """Verify every slice on every drive; map damaged slices to file paths. On
    drives of its own, a finished scrub also reports the files referencing a
    slice no drive holds (``ScrubResult.missing``; their reads fail with EIO).
    Refuses drives that are not the ones the metadata records, as a mount
    does (``DriveIdentityError``), before reading anything.

    On a file system on storage servers each live server scrubs its own
    drives, in turn, at ``rate_bytes`` per drive (server/scrubbing.py); a
    server down, stopped or unreachable is in ``servers`` with its reason and
    the result is not ``finished``; ``UsageError`` there for a rate below
    ``MIN_RATE_BYTES``. Raises ``DriveInUse`` while a local process holds the
    drives (drives of its own), the metadata's errors otherwise."""
    from shinglefs.client.filesystem import recorded_drives

    if _on_servers(meta_url):
        return _scrub_servers(meta_url, rate_bytes=rate_bytes, progress=progress, stop=stop)
    meta, node = _opened(meta_url)
    result = ScrubResult()
    try:
        specs = recorded_drives(meta)
        for drive_id in node.drive_ids:
            store = node.store(drive_id)
            assert isinstance(store, SliceStore)
            result.drives[drive_id] = scrub_drive(
                store, scrub_state_path(specs[drive_id]), rate_bytes=rate_bytes,
                progress=progress, stop=stop)
        damaged = {sid: why for s in result.drives.values() for sid, why in s.damaged.items()}
        result.damaged_files, result.unreferenced = _files_of(meta, damaged)
        if result.finished:  # a stopped scrub's report is about what it read
            result.missing = _unstored_slices(meta, slice_inventory(node))
            files, _unused = _paths_of(meta, result.missing)
            for path, sids in files.items():
                result.damaged_files.setdefault(path, []).extend(
                    f"slice {sid:#x}: on no drive (its bytes read as EIO; `shinglefs fsck "
                    f"{meta_url}` says more)" for sid in sids)
        return result
    finally:
        try:
            node.close()
        finally:
            meta.close()


def _scrub_servers(meta_url: str, *, rate_bytes: float | None,
                   progress: Callable[[int], None] | None,
                   stop: Callable[[], bool] | None) -> ScrubResult:
    """Every registered server's part (``scrub``), then the damage mapped to files."""
    from shinglefs.server.errors import ConnectionLost, WireError
    from shinglefs.server.process import cluster_key
    from shinglefs.server.remote import RemoteNode

    if rate_bytes and rate_bytes < MIN_RATE_BYTES:
        raise UsageError(f"a scrub of storage servers reads at least {MIN_RATE_BYTES >> 20} "
                         f"MiB/s per drive, not {rate_bytes / (1 << 20):g}",
                         hint="e.g. `shinglefs scrub META_URL --rate 50`, or "
                              "`shinglefs scrub META_URL` (no limit)")
    meta = open_meta(meta_url)
    result = ScrubResult()
    try:
        key = cluster_key(meta)
        now = time.time_ns()
        for record in meta.list_servers():
            outcome = result.servers[record.id] = ServerScrub(record.id, record.address)
            if not record.live:
                age = (now - record.heartbeat_ns) / 1e9
                outcome.error = ("stopped" if record.stopped_ns
                                 else f"down (no heartbeat for {age:.0f} s)")
                continue
            if stop is not None and stop():
                outcome.error = "not reached (the scrub was stopped)"
                continue
            try:
                with RemoteNode(record.address, key, connections=1,
                                timeout=scrub_timeout(DEFAULT_STEP_S)) as remote:
                    scrub_server(remote, outcome, progress=progress, stop=stop,
                                 rate_bytes=int(rate_bytes or 0))
            except WireError as exc:
                outcome.error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, ConnectionLost) and not outcome.drives:
                    outcome.error += " (a server older than this client closes at a SCRUB)"
        health = _slice_health(meta, result.servers)
        files, result.unreferenced = _paths_of(meta, list(health))
        for path, sids in files.items():
            result.damaged_files[path] = [f"slice {sid:#x}: {health[sid][1]}" for sid in sids]
            result.file_health[path] = max((health[sid][0] for sid in sids),
                                           key=HEALTH_ORDER.index)
        return result
    finally:
        meta.close()


def _slice_health(meta: MetaStore, servers: dict[int, ServerScrub]) -> dict[int, tuple[str, str]]:
    """Each damaged slice: ``(lost | unverified | degraded, what failed where)``,
    from its damaged copies and the replicas meta records for it (a copy on a
    drive scrubbed to its end and not found damaged is verified)."""
    from shinglefs.meta.api import SLICE_RECORDS_BATCH

    bad: dict[int, dict[tuple[int, int], str]] = {}
    verified = set()
    for server in servers.values():
        for drive_id, step in server.drives.items():
            if step.complete:
                verified.add((server.server_id, drive_id))
            for sid, why in step.damaged.items():
                bad.setdefault(sid, {})[(server.server_id, drive_id)] = why
    ids = sorted(bad)
    records = {}
    for i in range(0, len(ids), SLICE_RECORDS_BATCH):
        records.update(meta.slice_records(ids[i:i + SLICE_RECORDS_BATCH]))
    health = {}
    for sid, copies in bad.items():
        info = records.get(sid)
        others = [] if info is None else [
            (int(r.server), int(r.drive)) for r in info.replicas
            if r.server.isdigit() and r.drive.isdigit()
            and (int(r.server), int(r.drive)) not in copies]
        good = [c for c in others if c in verified]
        where = "; ".join(f"server {s} drive {d}: {why}" for (s, d), why in sorted(copies.items()))
        if good:
            health[sid] = ("degraded", f"degraded, still readable from server {good[0][0]} "
                                       f"drive {good[0][1]} (verified): {where}")
        elif others:
            unseen = ", ".join(f"server {s} drive {d}" for s, d in others)
            health[sid] = ("unverified", f"no verified copy left ({unseen} not scrubbed): "
                                         f"{where}")
        else:
            health[sid] = ("lost", f"lost, every copy is damaged: {where}")
    return health


def _paths_of(meta: MetaStore, sids: list[int]) -> tuple[dict[str, list[int]], list[int]]:
    """slice -> chunk map -> inode -> path: each path's slices among ``sids``, and
    the slices no file uses (the chunk map is read once: it has no index by slice)."""
    if not sids:
        return {}, []
    wanted = set(sids)

    def txn(tx: Tx) -> tuple[dict[str, list[int]], list[int]]:
        users: dict[int, set[int]] = {}
        for sid, ino in tx.all("SELECT DISTINCT slice_id, ino FROM chunk_refs"):
            if sid in wanted:
                users.setdefault(sid, set()).add(ino)
        paths = paths_of(tx, sorted({ino for inos in users.values() for ino in inos}))
        files: dict[str, list[int]] = {}
        for sid in sorted(wanted):
            for ino in sorted(users.get(sid, ())):
                files.setdefault(paths[ino], []).append(sid)
        return files, sorted(wanted - set(users))

    result: tuple[dict[str, list[int]], list[int]] = backend_of(meta).run(txn, "read")
    return result


def _unstored_slices(meta: MetaStore, held: dict[int, dict[int, int]]) -> list[int]:
    """The slices files reference that no drive holds (inline slices live in meta):
    reading their bytes fails with EIO."""
    on_drives = set().union(*held.values()) if held else set()

    def txn(tx: Tx) -> list[int]:
        return [int(r[0]) for r in tx.all("SELECT DISTINCT slice_id FROM chunk_refs")
                if not is_inline_slice(r[0]) and r[0] not in on_drives]

    result: list[int] = backend_of(meta).run(txn, "read")
    return sorted(result)


def _files_of(meta: MetaStore, damaged: dict[int, str]) -> tuple[dict[str, list[str]], list[int]]:
    """slice -> chunk map -> inode -> path, for the damaged slices: each path's
    ``slice ID: what failed`` lines, and the damaged slices no file uses."""
    files, orphans = _paths_of(meta, list(damaged))
    return ({path: [f"slice {sid:#x}: {damaged[sid]}" for sid in sids]
             for path, sids in files.items()}, orphans)


# ---- metadata backups on the drives --------------------------------------------------------


class MetadataBackup:
    """Writes a compressed metadata dump to every drive's backup slots, periodically.

    ``maybe_write`` is cheap when no backup is due; a failure is logged and
    retried at the next interval (a backup never stops the caller's work).
    """

    def __init__(self, meta: MetaStore, node: SliceNode, *,
                 interval_s: float = BACKUP_INTERVAL_S, first_s: float = FIRST_BACKUP_S) -> None:
        self.meta = meta
        self.node = node
        self.interval_s = interval_s
        self.next_due = time.monotonic() + first_s
        self.written = 0
        self.last_written: float | None = None  # monotonic time of the last one
        self.last_took_s = 0.0  # how long it took

    def maybe_write(self) -> None:
        if not self.interval_s or time.monotonic() < self.next_due or not self._logs():
            return
        self.next_due = time.monotonic() + self.interval_s
        try:
            self.write()
        except BackupError as exc:  # expected (outgrown slots): one line, no traceback
            log.warning("metadata backup to the drives failed: %s; retrying in %.0f s (%s)",
                        exc, self.interval_s, exc.hint)
        except (ShingleError, OSError):
            log.exception("metadata backup to the drives failed; retrying in %.0f s",
                          self.interval_s)

    def write_at_shutdown(self) -> None:
        """One more backup as the client closes cleanly, so that the drives hold the
        metadata as it was left (a file system used for less than
        ``FIRST_BACKUP_S`` had none at all). Skipped when this process wrote one
        in the last ``FIRST_BACKUP_S``, or when a dump would hold up the unmount
        (the last took over ``SHUTDOWN_BACKUP_MAX_S``; or none was written yet and
        the file system has over ``SHUTDOWN_BACKUP_MAX_INODES`` inodes). Never
        raises: a failure is logged and the shutdown goes on."""
        if not self.interval_s or not self._logs():
            return
        now = time.monotonic()
        if self.last_written is not None and (now - self.last_written < FIRST_BACKUP_S
                                              or self.last_took_s > SHUTDOWN_BACKUP_MAX_S):
            return
        try:
            if (self.last_written is None
                    and self.meta.statfs().inodes > SHUTDOWN_BACKUP_MAX_INODES):
                return
            self.write()
        except (ShingleError, OSError) as exc:
            log.warning("metadata backup at shutdown not written: %s", exc)

    def newest(self) -> dict[str, int] | None:
        """The newest valid backup on this process's drives (``number``,
        ``created_ns``, ``bytes``, on how many ``drives``; number 0: none yet),
        None when the drives are storage servers' (``shinglefs status``)."""
        logs = self._logs()
        if not logs:
            return None
        found = newest_backup(s.slice_log for s in logs)
        if not found:
            return {"number": 0, "created_ns": 0, "bytes": 0, "drives": 0}
        head = found[0][1]
        return {"number": head.number, "created_ns": head.created_ns, "bytes": head.length,
                "drives": sum(1 for _log, slot in found if slot.number == head.number)}

    def _logs(self) -> list[SliceStore]:
        if not isinstance(self.node, StorageNode):  # a cluster: the servers hold the drives
            return []
        stores = [self.node.store(d) for d in self.node.drive_ids]
        return [s for s in stores if isinstance(s, SliceStore)]

    def write(self) -> list[BackupSlot]:
        """Dump the metadata (one consistent snapshot), compress it and write it to
        every drive. Returns the slots written; raises ``BackupError`` if none took it."""
        started = time.monotonic()
        stores = self._logs()
        label = self.meta.format_info().uuid
        number = 1 + max((b.number for _, b in newest_backup(s.slice_log for s in stores)),
                         default=0)
        written: list[BackupSlot] = []
        with tempfile.TemporaryFile() as plain, tempfile.TemporaryFile() as packed:
            dump_backend(backend_of(self.meta), plain)
            plain.seek(0)
            with gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=6) as gz:
                shutil.copyfileobj(plain, gz, 1 << 20)
            for store in stores:
                try:
                    written.append(write_backup(store.slice_log, packed, number=number,
                                                created_ns=time.time_ns(), label=label))
                except BackupError as exc:
                    log.warning("metadata backup not written: %s", exc)
        if not written:
            newest = newest_backup(s.slice_log for s in stores)
            kept = (f"the newest backup left on the drives is number {newest[0][1].number} "
                    f"of {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(newest[0][1].created_ns / 1e9))}"
                    if newest else "no backup is on the drives")
            raise BackupError(f"no drive could take the metadata backup ({kept})",
                              drive="(all)",
                              hint="keep dumps with `shinglefs dump META_URL FILE` (e.g. from "
                                   "cron), or give the drives larger conventional zones")
        self.written += 1
        self.last_written = time.monotonic()
        self.last_took_s = self.last_written - started
        log.info("metadata backup %d written to %d drive(s), %d bytes in %.1f s", number,
                 len(written), written[0].length, self.last_took_s)
        return written


@dataclass(frozen=True, slots=True)
class LoadedBackup:
    """What ``load_from_drives`` restored: the backup and the rows per table."""

    backup: BackupSlot
    rows: dict[str, int]
    next_slice_id: int


def load_from_drives(drive_specs: list[str], meta_url: str) -> LoadedBackup:
    """Rebuild the metadata at ``meta_url`` (an empty database) from the newest valid
    backup on the drives; its slice id counter is raised past every slice the
    drives hold. Raises ``NoMetadataBackup`` when no drive holds a valid one, and
    ``DriveIdentityError`` (exit 18) when the drives belong to different file
    systems (by their identity headers, checked before any drive is opened,
    and by their backups' labels), before the database is touched.
    """
    identities = _drive_file_systems(drive_specs)
    _refuse_mixed(identities)
    _refuse_owned(drive_specs, meta_url, identities)
    node = _open_drives(drive_specs, meta_url, recorded=False)
    try:
        stores = [node.store(d) for d in node.drive_ids]
        logs = [s.slice_log for s in stores if isinstance(s, SliceStore)]
        for drive_id, store in zip(node.drive_ids, stores, strict=True):
            if isinstance(store, SliceStore):
                path = parse_drive_spec(drive_specs[drive_id]).path
                identities[path] |= {b.label for b in backup_slots(store.slice_log) if b.label}
        _refuse_mixed(identities)
        with tempfile.TemporaryFile() as packed:
            chosen = None
            for slice_log, slot in newest_backup(logs):
                packed.seek(0)
                packed.truncate()
                try:
                    read_backup(slice_log, slot, packed)
                except BackupError as exc:
                    log.warning("skipping a damaged backup: %s", exc)
                    continue
                chosen = slot
                break
            if chosen is None:
                raise NoMetadataBackup(
                    f"none of the {len(drive_specs)} drive(s) holds a valid metadata backup",
                    hint="pass every drive of the file system to `shinglefs load --from-drives`, "
                         "or load a dump with `shinglefs load FILE META_URL`")
            packed.seek(0)
            meta = open_meta(meta_url)
            try:
                with gzip.GzipFile(fileobj=packed, mode="rb") as source:
                    rows = load_backend(source, backend_of(meta))  # type: ignore[arg-type]
                top = max((max(d, default=0) for d in slice_inventory(node).values()), default=0)
                next_id = _raise_slice_ids(meta, top + 1)
            finally:
                meta.close()
        return LoadedBackup(chosen, rows, next_id)
    finally:
        node.close()


def _drive_file_systems(drive_specs: list[str]) -> dict[str, set[str]]:
    """Each drive's path -> the file system uuid its identity header names (an
    empty set: a drive formatted before identities, or whose header cannot be
    read; opening it says why). Reads only the headers."""
    from shinglefs.zoned.drivespec import read_identity
    from shinglefs.zoned.errors import DriveFormatError

    found: dict[str, set[str]] = {}
    for spec in drive_specs:
        path = parse_drive_spec(spec).path
        try:
            ident = read_identity(spec)
        except DriveFormatError:
            ident = None
        found[path] = {ident.filesystem} if ident is not None else set()
    return found


def _refuse_owned(drive_specs: list[str], meta_url: str,
                  identities: dict[str, set[str]]) -> None:
    """``UsageError`` when a metadata database beside the drives holds their file
    system: the drives have their database, and a second one loaded from their
    backup would diverge from it (files deleted through one lose their bytes
    under the other). Checked before anything is opened or written."""
    from shinglefs.client.filesystem import metadata_files_in, sqlite_file

    theirs = set().union(*identities.values())
    if not theirs:
        return
    target = sqlite_file(meta_url)
    target = target.resolve() if target is not None else None
    dirs = {Path(parse_drive_spec(s).path).resolve().parent for s in drive_specs}
    for directory in sorted(dirs):
        for path, fs_uuid in metadata_files_in(directory).items():
            if fs_uuid in theirs and path.resolve() != target:
                raise UsageError(
                    f"the drives' file system {fs_uuid} has its metadata database at {path}; "
                    "nothing was loaded",
                    hint=f"use sqlite3://{path} (`shinglefs status sqlite3://{path}`); load "
                         "from the drives only when that database is lost or damaged "
                         "(then move it out of the drives' directory first)")


def _refuse_mixed(identities: dict[str, set[str]]) -> None:
    """``DriveIdentityError`` naming each drive and its file system when the
    drives do not all belong to one file system."""
    from shinglefs.zoned.drivespec import DriveIdentityError

    if len(set().union(*identities.values())) <= 1:
        return
    named = ", ".join(f"{path} ({'/'.join(sorted(fs)) or 'unknown'})"
                      for path, fs in sorted(identities.items()))
    raise DriveIdentityError(
        f"the drives belong to different file systems: {named}; nothing was loaded",
        hint="give the drives of one file system only: `shinglefs load --from-drives "
             "DRIVE... META_URL`")


def _raise_slice_ids(meta: MetaStore, at_least: int) -> int:
    def txn(tx: Tx) -> int:
        tx.run("UPDATE ids SET next_id = ? WHERE name = 'slice' AND next_id < ?",
               (at_least, at_least))
        return int(tx.one("SELECT next_id FROM ids WHERE name = 'slice'")[0])

    result: int = backend_of(meta).run(txn, "write")
    return result
