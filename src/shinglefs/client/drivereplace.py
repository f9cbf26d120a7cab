"""Replacing a lost drive of an embedded file system (``shinglefs drive replace``).

A file system whose drives are files or devices of this host refuses to open
while one of them is missing (``DriveIdentityError``, exit 18): a mount, fsck
and scrub would otherwise read the others as if nothing were lost. When the
drive is gone for good (a dead disk, a deleted image), the files whose bytes
were on the other drives must still be reachable. ``replace_drive``:

1. checks that nobody has the file system open (live sessions, then the other
   drives' locks) and that every other drive is this file system's own;
2. refuses while the recorded drive is still there and is this file system's
   (nothing is lost), and never overwrites anything at the new path;
3. formats an empty drive of the same kind at the recorded path (or at
   ``to``), with the zone size of a surviving drive of that kind, writes its
   identity into its header and records it in the metadata (the commit point);
4. runs ``fsck --repair``: each file that had bytes on the lost drive is cut
   to its first byte that no drive holds (its path printed), slices'
   replica records are pointed at the drives that hold them, counters are
   recomputed. A slice with a copy on another drive loses nothing.

Interrupted between 3's format and its record, a second run finds the empty
drive it formatted (this file system's, a drive uuid no record names, no
slice stored) and adopts it. Nothing else already at the path is touched.
"""

from __future__ import annotations

import dataclasses
import os
import uuid as _uuid

from shinglefs.client.filesystem import (
    _drive_base,
    _recorded_spec,
    absolute_meta_url,
    identified_drives,
    require_metadata_file,
)
from shinglefs.client.recovery import FileSystemInUse, fsck, live_sessions
from shinglefs.errors import ShingleError, UsageError
from shinglefs.meta import open_meta
from shinglefs.meta.api import MetaStore
from shinglefs.meta.fsck import FsckReport
from shinglefs.meta.records import FormatInfo
from shinglefs.server.node import StorageNode
from shinglefs.store.slice_store import SliceStore
from shinglefs.zoned.drivespec import (
    DriveIdentity,
    DriveSpec,
    parse_drive_spec,
    read_identity,
    write_identity,
)
from shinglefs.zoned.errors import DriveFormatError
from shinglefs.zoned.model import DEFAULT_ZONE_SIZE


class DriveNotLost(ShingleError):
    """``drive replace`` of a drive that is present and this file system's own."""

    exit_code = 1


@dataclasses.dataclass(frozen=True, slots=True)
class ReplacedDrive:
    """What ``replace_drive`` did: the drive now at ``spec`` and fsck's report."""

    drive_id: int
    spec: str
    adopted: bool  # an empty drive left by an interrupted replace was taken as it is
    report: FsckReport


def replace_drive(meta_url: str, drive_id: int, *, to: str | None = None,
                  force: bool = False) -> ReplacedDrive:
    """Put an empty drive in place of lost drive ``drive_id``, then repair (module docstring).

    ``to``: ``KIND:PATH[:SIZE]`` of the new drive (default: the recorded spec;
    the kind must be the lost drive's, the size defaults to its recorded one).
    ``force``: go on although sessions look alive (known dead).
    Raises ``UsageError`` (no such drive, another kind, a file system on
    storage servers), ``FileSystemInUse`` (exit 3) or ``DriveInUse`` while the
    file system is open, ``DriveIdentityError`` (exit 18) when another drive
    is missing or not this file system's, ``DriveNotLost`` when the drive is
    there, ``PathError`` (exit 20) when something else is at the new path.
    """
    meta_url = absolute_meta_url(meta_url)
    require_metadata_file(meta_url)
    meta = open_meta(meta_url)
    try:
        info = meta.format_info()
        records = meta.drive_records()
        if not records:
            raise UsageError(f"{meta_url} keeps its bytes on storage servers: it has no "
                             "drives of its own to replace",
                             hint="`shinglefs drive offline URL SERVER:DRIVE` drains a "
                                  "server's drive; `shinglefs forget-server` a lost server")
        if not 0 <= drive_id < len(records):
            raise UsageError(f"{meta_url} has no drive {drive_id} (drives 0-{len(records) - 1})",
                             hint=f"`shinglefs status {meta_url}` lists them")
        alive = live_sessions(meta)
        if alive and not force:
            raise FileSystemInUse(
                f"{len(alive)} live session(s) have {meta_url} open", hint="unmount it "
                "first (`shinglefs umount`), or pass --force if those sessions are known dead")
        drives = identified_drives(meta, info, lost=drive_id)
        old = drives.specs[drive_id]
        new = _new_spec(old, to)
        adopted = _leftover(new, info, {r.uuid for r in records})
        if adopted is None:
            _refuse_present(new, old, info, drive_id, records[drive_id].uuid)
        _format(meta, meta_url, drives.specs, drive_id, new, info, adopted)
    finally:
        meta.close()
    report = fsck(meta_url, repair=True, force=force)
    return ReplacedDrive(drive_id, str(new), adopted is not None, report)


def _new_spec(old: DriveSpec, to: str | None) -> DriveSpec:
    if to is None:
        return old
    spec = parse_drive_spec(to)
    if spec.kind != old.kind:
        raise UsageError(f"drive {old.path} is a {old.kind} drive; a replacement must be "
                         f"one too, not {spec.kind}",
                         hint=f"give {old.kind}:PATH[:SIZE]")
    return DriveSpec(spec.kind, os.path.abspath(spec.path),
                     spec.size if spec.size is not None else old.size)


def _leftover(spec: DriveSpec, info: FormatInfo, recorded: set[str | None]) -> str | None:
    """The drive uuid of an empty drive an interrupted replace formatted at
    ``spec`` (this file system's, unrecorded, holding no slice); else None."""
    if spec.kind == "linux" or not os.path.exists(spec.path):
        return None
    try:
        ident = read_identity(spec)
    except DriveFormatError:
        return None
    if ident is None or ident.filesystem != info.uuid or ident.drive in recorded:
        return None
    node = StorageNode.open([(0, str(spec))])
    try:
        store = node.store(0)
        assert isinstance(store, SliceStore)
        return ident.drive if not list(store.slice_ids()) else None
    finally:
        node.close()


def _refuse_present(new: DriveSpec, old: DriveSpec, info: FormatInfo, drive_id: int,
                    recorded: str | None) -> None:
    """``DriveNotLost`` when the recorded drive is there and is this one;
    ``PathError`` when anything else is at the new drive's path."""
    from shinglefs.client.filesystem import _check_new_drive_path

    if old.kind == "linux" or os.path.exists(old.path):
        try:
            ident = read_identity(old)
        except DriveFormatError:
            ident = None
        if ident is not None and ident.filesystem == info.uuid and ident.drive == recorded:
            raise DriveNotLost(
                f"drive {drive_id} of file system {info.name!r} is at {old.path}: nothing "
                "to replace",
                hint="if it is damaged, move it aside first (its files stay unreadable "
                     "until it is back); `shinglefs scrub` tells which files it damages")
    if new.kind != "linux":
        _check_new_drive_path(new)


def _zone_size(node: StorageNode, others: list[DriveSpec], kind: str) -> int:
    """The zone size of a surviving drive of ``kind`` (``node`` opened ``others``
    as drives 0, 1, ...; the default if none is of that kind)."""
    for k, spec in enumerate(others):
        if spec.kind == kind:
            store = node.store(k)
            assert isinstance(store, SliceStore)
            return store.drive.zone_size
    return DEFAULT_ZONE_SIZE


def _format(meta: MetaStore, meta_url: str, specs: list[DriveSpec], lost: int,
            new: DriveSpec, info: FormatInfo, adopted: str | None) -> None:
    """Format (unless ``adopted``) and record the new drive, holding every other
    drive's lock meanwhile (``DriveInUse`` while a mount has them)."""
    from shinglefs.client.recovery import _open_drives

    others = [s for i, s in enumerate(specs) if i != lost]
    node = _open_drives([str(s) for s in others], meta_url, recorded=True) if others else None
    try:
        drive_uuid = adopted
        if drive_uuid is None:
            zone_size = (_zone_size(node, others, new.kind) if node is not None
                         else DEFAULT_ZONE_SIZE)
            StorageNode.open([(lost, str(new))], create=True, zone_size=zone_size).close()
            drive_uuid = str(_uuid.uuid4())
            if not write_identity(new, DriveIdentity(info.uuid, drive_uuid)):
                drive_uuid = None
        records = meta.drive_records()
        recorded = [r.spec for r in records]
        recorded[lost] = _recorded_spec(new, _drive_base(meta.url_where))
        uuids = [r.uuid for r in records]
        uuids[lost] = drive_uuid
        meta.set_drives(recorded, uuids)
    finally:
        if node is not None:
            node.close()
