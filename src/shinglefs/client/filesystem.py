"""Formatting and opening a file system: the metadata engine plus the drives recorded at format time.

The drives of a file system are recorded in its metadata at format time
(meta's drives table, ``MetaStore.set_drives``), so ``open_filesystem(meta_url)``
needs nothing else. A drive's id is its position in that list; slice replicas
in meta name it as ``("local", "<id>")``.

Where a drive is: a drive that lives in the directory of a SQLite metadata
file (or below it) is recorded with a path relative to that directory, so a
copied data directory opens its own copies and a moved one still mounts.
Other drives keep their absolute path. Relative paths given to ``format``
are relative to the working directory.

Which drive it is: ``format`` writes into each drive's own header the file
system's uuid and a fresh drive uuid (``zoned.drivespec.write_identity``) and
records the drive uuid in meta. ``open_filesystem`` reads every header before
opening anything and refuses, with ``DriveIdentityError``, a drive of another
file system or another position. A drive recorded before identities existed
(uuid NULL) is given one at its first open, under the node's drive locks.
A zoned block device has no header of ours yet and is known by path alone.

What ``format`` checks before creating anything: every spec parses, no drive
is named twice, each drive file's directory exists and is writable and no
file is there yet (``PathError``), and each drive is large enough for a slice
store (``DriveTooSmall``). So a refused format leaves no file behind.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import stat
import time
import uuid as _uuid
from collections.abc import Collection
from pathlib import Path

from shinglefs.client.config import CLUSTER_FILE_BUFFER, LOCAL_FILE_BUFFER, ClientConfig
from shinglefs.client.errors import NotAFileSystem
from shinglefs.client.groups import GroupPolicy
from shinglefs.client.vfs import VFS
from shinglefs.errors import PathError, ShingleError, UsageError
from shinglefs.meta import check_chunk_size, open_meta
from shinglefs.meta.api import BLOCK_SIZE, CHUNK_SIZE, DriveRecord, FormatInfo, MetaStore
from shinglefs.meta.backend import SQLITE_SCHEMES, split_meta_url
from shinglefs.meta.errors import AlreadyFormatted, NotFormatted
from shinglefs.server.errors import DriveInUse
from shinglefs.server.node import StorageNode
from shinglefs.server.tiers import TierLookup
from shinglefs.store.config import StoreConfig
from shinglefs.store.log import check_drive_size
from shinglefs.zoned.drivespec import (
    DriveIdentityError,
    DriveSpec,
    header_path,
    missing_size,
    open_drive,
    parse_drive_spec,
    read_identity,
    write_identity,
)
from shinglefs.zoned.errors import DriveFormatError
from shinglefs.zoned.model import DEFAULT_ZONE_SIZE
from shinglefs.zoned.zonetable import DriveIdentity

log = logging.getLogger(__name__)


# -- where the metadata and the drives are ---------------------------------------------


def sqlite_file(meta_url: str) -> Path | None:
    """The database file of a ``sqlite3:///PATH`` URL; None for any other backend.
    ``MetaURLError`` for a URL that does not parse (``split_meta_url``)."""
    parts = split_meta_url(meta_url)
    if parts.scheme.lower() not in SQLITE_SCHEMES or not parts.path:
        return None
    return Path(parts.path)


def absolute_meta_url(meta_url: str) -> str:
    """``meta_url`` with a relative SQLite path made absolute against the working
    directory: ``sqlite:data/meta.db`` and ``sqlite://data/meta.db`` become
    ``sqlite:///<cwd>/data/meta.db``, ``sqlite:/abs/meta.db`` becomes
    ``sqlite:///abs/meta.db`` (query kept). Other URLs come back unchanged;
    ``MetaURLError`` for one that does not parse (``split_meta_url``)."""
    parts = split_meta_url(meta_url)
    if parts.scheme.lower() not in SQLITE_SCHEMES:
        return meta_url
    if parts.netloc:
        relative = f"{parts.netloc}{parts.path}"
    elif parts.path and not parts.path.startswith("/"):
        relative = parts.path
    elif parts.path.startswith("/") and not meta_url.startswith(f"{parts.scheme}://"):
        relative = parts.path  # sqlite3:/abs/meta.db: one slash, an absolute path
    else:
        return meta_url
    absolute = os.path.abspath(os.path.expanduser(relative))
    return f"{parts.scheme}://{absolute}" + (f"?{parts.query}" if parts.query else "")


def _drive_base(where: str) -> Path | None:
    """The directory relative drive paths hang from: the SQLite file's, else none."""
    path = sqlite_file(where)
    return None if path is None else Path(os.path.realpath(path)).parent


SQLITE_MAGIC = b"SQLite format 3\x00"


def metadata_files_in(directory: Path) -> dict[Path, str]:
    """The SQLite files in ``directory`` that hold a ShingleFS file system: path
    -> its uuid. Read only: each regular file's first bytes are read, and a
    SQLite one is opened read-only and asked for its format record; a file
    that is not one, or cannot be read, is left out. (Anything else is never
    opened: a FIFO there held the command for good.)"""
    import sqlite3

    from shinglefs.meta.schema import SEL_FORMAT

    found: dict[Path, str] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            if not entry.is_file():
                continue
            fd = os.open(entry, os.O_RDONLY | os.O_NONBLOCK)
            try:
                if os.read(fd, len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                    continue
            finally:
                os.close(fd)
            conn = sqlite3.connect(f"{entry.resolve().as_uri()}?mode=ro", uri=True, timeout=1)
            try:
                row = conn.execute(SEL_FORMAT).fetchone()
            finally:
                conn.close()
        except (OSError, sqlite3.Error):
            continue
        if row is not None:
            found[entry] = str(row[1])
    return found


def require_metadata_file(meta_url: str) -> None:
    """Raise NotFormatted when ``meta_url`` names a SQLite file that does not exist
    or is empty (opening it would create an empty database, or write one into
    it). When a metadata database of a
    file system lies beside it, the message names that one (a typo in the name,
    not a lost database: rebuilding from the drives would give them a second,
    diverging database)."""
    path = sqlite_file(meta_url)
    if path is not None and path.is_absolute() and path.is_file() \
            and path.stat().st_size == 0:  # SQLite would write a database into it
        raise NotFormatted(f"{path} is an empty file, not a metadata database",
                           hint="check the path; `shinglefs format URL --drive ...` creates "
                                "a file system")
    if path is not None and path.is_absolute() and not path.exists():
        beside = metadata_files_in(path.parent) if path.parent.is_dir() else {}
        if beside:
            named = " or ".join(f"sqlite3://{p}" for p in beside)
            raise NotFormatted(
                f"no metadata database at {path}: the file does not exist, and {named} "
                "beside it holds a file system",
                hint=f"did you mean {named}? (a second database for the same drives "
                "would lose files)",
            )
        drives = sorted(p.name for p in path.parent.glob("*.zones")) if path.parent.is_dir() \
            else []
        if drives:  # a data directory whose meta.db is gone: the drives keep a backup
            shown = " ".join(_drive_spec_of_table(path.parent / d) for d in drives)
            raise NotFormatted(
                f"no metadata database at {path}, but drives of a file system are beside "
                "where it was",
                hint=f"rebuild it from their newest backup: `shinglefs load --from-drives "
                f"{shown} sqlite3://{path}`, then `shinglefs fsck --repair sqlite3://{path}` "
                "(docs/metadata.md, \"Losing meta.db\")",
            )
        raise NotFormatted(
            f"no metadata database at {path}: the file does not exist",
            hint="check the path; `shinglefs format URL --drive ...` or "
            "`shinglefs up DATA_DIR MOUNTPOINT` creates one",
        )


def _drive_spec_of_table(table: Path) -> str:
    """``KIND:PATH`` of the drive whose zone table is ``table`` (``PATH.zones``):
    conventional when every zone is, else smr (``KIND`` if unreadable)."""
    from shinglefs.zoned.zonetable import ZoneTable

    data = str(table).removesuffix(".zones")
    try:
        loaded, _, _ = ZoneTable.load(str(table), table.name)
    except ShingleError:
        return f"KIND:{data}"
    geometry = loaded.geometry
    loaded.close()
    conventional = geometry.conventional_zones == geometry.zone_count
    return f"{'conventional' if conventional else 'smr'}:{data}"


def _recorded_spec(spec: DriveSpec, base: Path | None) -> str:
    """The spec as recorded: relative to ``base`` when the drive lives under it."""
    path = Path(os.path.realpath(spec.path))
    if base is not None and path.is_relative_to(base):
        return str(DriveSpec(spec.kind, str(path.relative_to(base)), spec.size))
    return str(spec)


def _opened_spec(record: DriveRecord, base: Path | None) -> DriveSpec:
    """Where a recorded drive is now (absolute).

    A drive recorded before identities existed has an absolute path; when a
    drive of that name lies beside the metadata file in another directory,
    this is a copied or moved data directory and the drive beside it is meant.
    """
    spec = parse_drive_spec(record.spec)
    path = spec.path
    if not os.path.isabs(path):
        if base is None:
            raise NotAFileSystem(f"drive {record.spec!r} is recorded with a relative path, "
                                 "but the metadata is not a SQLite file",
                                 hint="record the drives with absolute paths")
        path = str(base / path)
    elif record.uuid is None and base is not None and Path(path).parent != base:
        beside = base / Path(path).name
        beside_spec = DriveSpec(spec.kind, str(beside), spec.size)
        marker = header_path(beside_spec)
        if marker is not None and os.path.exists(marker):
            log.warning("drive %s is recorded at %s; using the copy beside the metadata, %s",
                        Path(path).name, path, beside)
            path = str(beside)
    return DriveSpec(spec.kind, path, spec.size)


def recorded_drives(meta: MetaStore) -> list[str]:
    """The drive specs recorded at format time (position = drive id), with
    absolute paths as they are now (see the module docstring)."""
    base = _drive_base(meta.url_where)
    return [str(_opened_spec(r, base)) for r in _records(meta)]


@dataclasses.dataclass(frozen=True, slots=True)
class IdentifiedDrives:
    """The recorded drives as they are now, each checked against its header."""

    records: list[DriveRecord]
    specs: list[DriveSpec]  # absolute paths as they are now (position = drive id)
    found: list[DriveIdentity | None]  # each drive's header identity, None: none written


def identified_drives(meta: MetaStore, info: FormatInfo, *,
                      lost: Collection[int] = ()) -> IdentifiedDrives:
    """The recorded drives, each drive's identity header checked against the
    metadata before any drive is opened: ``DriveIdentityError`` (exit 18) for a
    drive missing, of another file system, or another drive of this one. What
    every command that opens a file system's drives (a mount, fsck, scrub)
    does first, so that none reads another file system's slices as its own.
    ``lost``: drive ids not checked (``drive replace`` of those drives); their
    ``found`` is None."""
    records = _records(meta)
    base = _drive_base(meta.url_where)
    specs = [_opened_spec(r, base) for r in records]
    return IdentifiedDrives(records, specs,
                           _check_identities(info, records, specs, lost, meta.url_where))


def _records(meta: MetaStore) -> list[DriveRecord]:
    records = meta.drive_records()
    if not records:
        raise NotAFileSystem(
            "the metadata names no drives", hint="format it with `shinglefs format`"
        )
    return records


# -- format ------------------------------------------------------------------------------


def _absolute(spec: str) -> DriveSpec:
    s = parse_drive_spec(spec)
    return DriveSpec(s.kind, os.path.abspath(s.path), s.size)


def _data_file(spec: DriveSpec) -> str:
    if spec.kind == "conventional" and os.path.isdir(spec.path):
        from shinglefs.zoned.conventional import DIRECTORY_DATA_FILE

        return os.path.join(spec.path, DIRECTORY_DATA_FILE)
    return spec.path


def _check_new_drive_path(spec: DriveSpec) -> None:
    """The drive file can be created: its directory exists and is writable, and
    neither it nor its zone table exists (a block device for ``emulated`` may)."""
    data = _data_file(spec)
    parent = os.path.dirname(data)
    if not os.path.isdir(parent):
        raise PathError(f"directory {parent} of drive {data} does not exist",
                        hint=f"create it first (mkdir -p {parent}) or choose another path")
    if not os.access(parent, os.W_OK):
        raise PathError(f"cannot create drive {data}: directory {parent} is not writable",
                        hint="choose a directory you can write to")
    is_device = os.path.exists(data) and stat.S_ISBLK(os.stat(data).st_mode)
    for existing in ([] if is_device else [data]) + [data + ".zones"]:
        if os.path.lexists(existing):
            raise PathError(f"{existing} already exists; format never overwrites a drive",
                            hint="choose a new path for the drive; to use the file system "
                            "already on it, mount its metadata URL")


def _check_new_drives(specs: list[DriveSpec], zone_size: int) -> None:
    """Everything ``format`` can check before it creates a file (module docstring)."""
    seen: set[str] = set()
    for spec in specs:
        real = os.path.realpath(spec.path)
        if real in seen:
            raise UsageError(f"drive {spec.path} is given twice", hint="name each drive once")
        seen.add(real)
        if spec.kind == "linux":
            drive = open_drive(spec)
            try:
                check_drive_size(spec.path, zone_size=drive.zone_size, zone_count=drive.zone_count,
                                 conventional_zones=drive.conventional_zones)
            finally:
                drive.close_drive()
            continue
        if spec.size is None:
            raise missing_size(spec)
        _check_new_drive_path(spec)
        zone_count = spec.size // zone_size
        if spec.kind == "emulated":
            from shinglefs.zoned.emulated import default_conventional_zones

            conventional = default_conventional_zones(zone_count)
        else:
            conventional = zone_count
        check_drive_size(spec.path, zone_size=zone_size, zone_count=zone_count,
                         conventional_zones=conventional)


def format_filesystem(
    meta_url: str,
    drives: list[str],
    name: str = "shinglefs",
    *,
    chunk_size: int = CHUNK_SIZE,
    zone_size: int | None = None,
    store_config: StoreConfig | None = None,
    secret: str | None = None,
    servers: bool = False,
) -> None:
    """Format each drive (``KIND:PATH[:SIZE]``) as a slice store and create the metadata.

    ``servers``: a file system whose drives belong to storage servers
    (``shinglefs server``): no drive here (``drives`` must be empty), the
    metadata records none, and clients reach the servers that register
    (``server.cluster.ClusterNode``).

    ``chunk_size`` (default 64 MiB) is the file-offset unit of the chunk map;
    a slice never crosses a chunk. Smaller values are for tests only.
    ``zone_size`` applies to emulated drives created here (default 256 MiB).
    ``store_config`` tunes the slice stores formatted (default ``StoreConfig()``).
    ``secret``: the cluster secret storage servers and clients authenticate
    with (docs/network.md); default a random one (``secrets.token_hex(32)``),
    recorded in the format record (``MetaStore.cluster_secret``).
    Relative drive paths are relative to the working directory.

    Refuses (``AlreadyFormatted``) before touching any drive when the metadata
    already holds a file system, and before creating any file when a drive
    cannot be made (``PathError``, ``DriveTooSmall``, ``DriveSpecError``; see
    the module docstring). Raises ``DriveInUse`` if a drive is locked by a
    running process, ``UsageError`` for an empty drive list.
    """
    if servers and drives:
        raise UsageError("a file system on storage servers has no drives of its own",
                         hint="give either --servers or --drive, not both")
    if not drives and not servers:
        raise UsageError("format needs at least one drive, or --servers",
                         hint="e.g. --drive emulated:/data/d0.img:64G")
    if servers:
        _format_meta(meta_url, name, chunk_size, secret)
        return
    specs = [_absolute(d) for d in drives]
    check_chunk_size(chunk_size, BLOCK_SIZE)  # before any drive file is created
    _check_new_drives(specs, zone_size or DEFAULT_ZONE_SIZE)
    made = _FormatUndo(meta_url, specs)
    try:
        _format_drives_and_meta(meta_url, specs, name, chunk_size, zone_size, store_config,
                                secret)
    except BaseException:
        made.undo()
        raise


class _FormatUndo:
    """What a ``format`` about to run would leave behind if it failed part-way (a
    drive too large for its host file system, a lock file that cannot be made):
    the files it creates, noted by what does not exist yet. ``undo`` removes
    those, so that running the same command again after fixing its input does
    not meet "already exists" for a file system that never was."""

    def __init__(self, meta_url: str, specs: list[DriveSpec]) -> None:
        from shinglefs.server.node import DriveLock

        candidates = []
        for spec in specs:
            data = _data_file(spec)
            if not data.startswith("/dev/"):
                candidates += [data, data + ".zones", DriveLock.lock_path_for(spec.path)]
        db = sqlite_file(meta_url)
        if db is not None and db.is_absolute():
            candidates += [str(db), f"{db}-wal", f"{db}-shm", f"{db}-journal"]
        self.new = [c for c in candidates if not os.path.lexists(c)]

    def undo(self) -> None:
        for path in self.new:
            try:
                os.unlink(path)
            except OSError:
                pass


def _format_drives_and_meta(meta_url: str, specs: list[DriveSpec], name: str, chunk_size: int,
                            zone_size: int | None, store_config: StoreConfig | None,
                            secret: str | None) -> None:
    """``format_filesystem``'s work once its checks passed: the drives, then the
    metadata that records them."""
    meta = open_meta(meta_url)
    try:
        _refuse_formatted(meta, meta_url)
        node = StorageNode.open([(i, str(s)) for i, s in enumerate(specs)], create=True,
                                zone_size=zone_size, store_config=store_config)
        try:
            capacity = node.stats().capacity_bytes
        finally:
            node.close()
        fs_uuid = str(_uuid.uuid4())
        uuids: list[str | None] = []
        for spec in specs:
            drive_uuid = str(_uuid.uuid4())
            uuids.append(drive_uuid if write_identity(spec, DriveIdentity(fs_uuid, drive_uuid))
                         else None)
        meta.format(name, fs_uuid, chunk_size=chunk_size, capacity_bytes=capacity,
                    secret=secret if secret is not None else secrets.token_hex(32))
        meta.set_capacity(capacity)
        base = _drive_base(meta_url)
        meta.set_drives([_recorded_spec(s, base) for s in specs], uuids)
    finally:
        meta.close()


def _refuse_formatted(meta: MetaStore, meta_url: str) -> None:
    """``AlreadyFormatted`` when ``meta`` already holds a file system."""
    try:
        info = meta.format_info()
    except NotFormatted:
        return
    raise AlreadyFormatted(
        f"{meta_url} already holds file system {info.name!r} ({info.uuid})",
        hint="format a new metadata URL, or mount the file system already there")


def _format_meta(meta_url: str, name: str, chunk_size: int, secret: str | None) -> None:
    """The metadata of a file system on storage servers: no drives, capacity 0
    (the servers report theirs)."""
    check_chunk_size(chunk_size, BLOCK_SIZE)
    meta = open_meta(meta_url)
    try:
        _refuse_formatted(meta, meta_url)
        meta.format(name, str(_uuid.uuid4()), chunk_size=chunk_size, capacity_bytes=0,
                    secret=secret if secret is not None else secrets.token_hex(32))
    finally:
        meta.close()


# -- open --------------------------------------------------------------------------------


def _identity_of(i: int, spec: DriveSpec, info: FormatInfo) -> DriveIdentity | None:
    """The identity in drive ``i``'s header; DriveIdentityError when it is not there."""
    try:
        return read_identity(spec)
    except DriveFormatError as exc:
        raise DriveIdentityError(
            f"drive {i} of file system {info.name!r} is not at {spec.path} ({exc})",
            hint="if the drive files were moved, put them back, or keep them in the "
            "metadata file's directory; nothing was opened",
        ) from None


def _check_identities(info: FormatInfo, records: list[DriveRecord], specs: list[DriveSpec],
                      lost: Collection[int] = (), url: str = "META_URL",
                      ) -> list[DriveIdentity | None]:
    """Read every drive's header but ``lost``'s and compare it with the metadata
    (nothing is opened); ``url`` names the metadata in hints."""
    found: list[DriveIdentity | None] = []
    for i, (record, spec) in enumerate(zip(records, specs, strict=True)):
        if i in lost:
            found.append(None)
            continue
        if spec.kind != "linux" and not os.path.exists(spec.path):
            gone = sorted(set(lost) | {k for k, other in enumerate(specs) if k not in lost
                                       and other.kind != "linux"
                                       and not os.path.exists(other.path)})
            raise DriveIdentityError(
                f"drive {i} of file system {info.name!r} is missing: nothing at {spec.path}",
                hint="put the drive file back at this path (or the data directory back "
                "together); if it is lost for good, `shinglefs drive replace "
                f"{url} {' '.join(map(str, gone))}` puts an empty drive in its place and "
                "cuts the files that had bytes on it (docs/cli.md); nothing was opened",
            )
        ident = _identity_of(i, spec, info)
        found.append(ident)
        if ident is None:
            if record.uuid is not None and header_path(spec) is not None:
                raise DriveIdentityError(
                    f"{spec.path} carries no drive identity; drive {i} of file system "
                    f"{info.name!r} was formatted with one",
                    hint="the file there is not that drive: put the drive formatted for this "
                    "file system back at this path; nothing was opened",
                )
            continue
        if ident.filesystem != info.uuid:
            raise DriveIdentityError(
                f"{spec.path} belongs to another file system ({ident.filesystem}), not to "
                f"{info.name!r} ({info.uuid})",
                hint="put this file system's own drive back at this path; nothing was opened",
            )
        if record.uuid is not None and ident.drive != record.uuid:
            other = [j for j, r in enumerate(records) if r.uuid == ident.drive]
            which = f"drive {other[0]}" if other else "a drive no longer recorded"
            raise DriveIdentityError(
                f"{spec.path} is {which} of file system {info.name!r}, not drive {i}",
                hint="the drive files were swapped or renamed: give each back its own path; "
                "nothing was opened",
            )
    return found


def _adopt_unidentified(meta: MetaStore, info: FormatInfo, records: list[DriveRecord],
                        specs: list[DriveSpec], found: list[DriveIdentity | None]) -> None:
    """Give each drive recorded before identities existed its identity, and record
    every drive as it is now (relative paths beside the metadata)."""
    if all(r.uuid is not None for r in records):
        return
    uuids: list[str | None] = []
    for record, spec, ident in zip(records, specs, found, strict=True):
        if record.uuid is not None:
            uuids.append(record.uuid)
            continue
        drive_uuid = ident.drive if ident is not None else str(_uuid.uuid4())
        written = ident is not None or write_identity(spec, DriveIdentity(info.uuid, drive_uuid))
        uuids.append(drive_uuid if written else None)
    base = _drive_base(meta.url_where)
    meta.set_drives([_recorded_spec(s, base) for s in specs], uuids)
    log.info("recorded the identities of %d drive(s) of %s", len(specs), info.name)


def open_filesystem(
    meta_url: str,
    *,
    config: ClientConfig | None = None,
    mountpoint: str = "",
    groups: GroupPolicy | None = None,
    store_config: StoreConfig | None = None,
    serve: bool = False,
    join: bool = False,
) -> VFS:
    """Open the metadata, the recorded drives as an in-process node, register a session.

    A file system formatted with ``servers=True`` (no drives recorded) is opened
    on its storage servers instead (``server.cluster.ClusterNode``): nothing is
    opened locally; ``ClusterSecretError`` when meta holds no usable secret.

    Sharing an embedded file system between processes (``server.share``):
    ``serve``: this process, if it opens the drives, also serves them to
    other processes on this host (a mount and ``connect()`` do; a command
    that opens the file system for a moment does not). ``join``: if another
    process holds the drives, open the file system through the server it
    shares them with (waiting up to ``OWNER_WAIT_S`` for it to register)
    instead of raising ``DriveInUse``.

    ``config`` tunes the client, ``store_config`` every drive's slice store.
    ``groups`` replaces the default lifetime-group rule (docs/client.md).
    Raises ``MetaURLError``/``MetaUnavailable`` (bad or unreachable URL),
    ``NotFormatted`` (also for a SQLite file that does not exist: nothing is
    created), ``DriveIdentityError`` (a
    drive missing, of another file system or swapped; checked before any
    drive is opened), ``DriveInUse`` (a drive's lock is held by another
    process, named by pid), and the drives' own errors; nothing stays open on
    failure.
    """
    require_metadata_file(meta_url)
    meta = open_meta(meta_url)
    try:
        info = meta.format_info()
        if not meta.drive_records():
            return _open_on_servers(meta, config, mountpoint, groups)
        drives = identified_drives(meta, info)
        records, specs, found = drives.records, drives.specs, drives.found
        try:
            node = StorageNode.open([(i, str(s)) for i, s in enumerate(specs)],
                                    store_config=store_config)
        except DriveInUse:
            owner = _owner(meta) if join else None
            if owner is None:
                raise
            return _open_on_servers(meta, config, mountpoint, groups, local_server=owner)
        node.tier_of = TierLookup(meta)
        try:
            _adopt_unidentified(meta, info, records, specs, found)
            _ids_past_the_drives(meta, node)
            vfs = VFS(meta, node, config, mountpoint=mountpoint, groups=groups)
        except BaseException:
            node.close()
            raise
    except BaseException:
        meta.close()
        raise
    if serve:
        _share(vfs, meta, node)
    return vfs


def _ids_past_the_drives(meta: MetaStore, node: StorageNode) -> None:
    """Raise meta's slice id counter past every id the drives hold: metadata
    loaded from an older dump (or restored from a copy) would otherwise hand
    out ids of slices still on the drives, and the first new files would fail
    on close (EINVAL) and stay empty."""
    top = node.highest_slice_id()
    if top and meta.raise_slice_ids(top):
        log.warning("the drives hold slice ids up to %d, past the metadata's counter (metadata "
                    "restored from an older copy?): new slices now take higher ids; "
                    "`shinglefs fsck` checks the rest", top)


OWNER_WAIT_S = 5.0
"""How long a process that finds the drives held waits for their owner to
share them (it registers right after opening them)."""


def _owner(meta: MetaStore) -> int | None:
    """The server id of the process sharing this embedded file system's drives."""
    from shinglefs.server.share import owner_of

    deadline = time.monotonic() + OWNER_WAIT_S
    while True:
        owner = owner_of(meta)
        if owner is not None or time.monotonic() > deadline:
            return owner.id if owner is not None else None
        time.sleep(0.05)


def _share(vfs: VFS, meta: MetaStore, node: StorageNode) -> None:
    """Serve this process's drives to other processes (server/share.py); a file
    system that cannot be shared still works here, with a warning."""
    from shinglefs.server.process import cluster_key
    from shinglefs.server.share import DriveSharing

    try:
        sharing = DriveSharing(meta, node, cluster_key(meta)).start()
    except (ShingleError, OSError) as exc:
        log.warning("the drives are not shared with other processes: %s", exc)
        return
    vfs.before_close.append(sharing.stop)


def _open_on_servers(meta: MetaStore, config: ClientConfig | None, mountpoint: str,
                     groups: GroupPolicy | None, local_server: int | None = None) -> VFS:
    """A client of a file system whose drives belong to storage servers, or (with
    ``local_server``) of an embedded one another process shares (server/share.py)."""
    from shinglefs.server.cluster import ClusterNode  # the wire code, only when needed
    from shinglefs.server.process import cluster_key

    node = ClusterNode(meta, cluster_key(meta), local_server=local_server)
    config = config or ClientConfig()
    if config.file_buffer_bytes == LOCAL_FILE_BUFFER:  # the default: a server's zone run
        config = dataclasses.replace(config, file_buffer_bytes=CLUSTER_FILE_BUFFER)
    try:
        return VFS(meta, node, config, mountpoint=mountpoint, groups=groups)
    except BaseException:
        node.close()
        raise
