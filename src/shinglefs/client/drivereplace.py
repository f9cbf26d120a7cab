"""Replacing lost drives of an embedded file system (``shinglefs drive replace``).

A file system whose drives are files or devices of this host refuses to open
while one of them is missing (``DriveIdentityError``, exit 18): a mount, fsck
and scrub would otherwise read the others as if nothing were lost. When
drives are gone for good (a dead disk, a deleted image), the files whose
bytes are on the other drives must still be reachable. ``replace_drives``:

1. checks that nobody has the file system open (live sessions, then the other
   drives' locks) and that every drive not being replaced is this file
   system's own (a missing one not named is exit 18: name every lost drive);
2. for each drive named, looks at what is at its path (``_Found``): nothing,
   or only the lost drive's zone table (an image deleted alone: the table is
   moved aside to ``*.lost``, never deleted) -> format; an empty drive a
   replace formatted before it was interrupted -> adopt it; the recorded
   drive itself, empty -> it was replaced already, only the repair is left;
   the recorded drive holding slices -> ``DriveNotLost``; anything else ->
   ``PathError`` (nothing is overwritten);
3. formats an empty drive of the same kind at the recorded path (or at
   ``to``), with the zone size of a surviving drive of that kind, writes its
   identity into its header and records every new drive (the commit point);
4. runs ``fsck --repair``: each file that had bytes on a lost drive is cut at
   its first byte no drive holds (its path printed), slice replica records
   are pointed at the drives that hold them, counters are recomputed. A slice
   with a copy on another drive loses nothing.

Interrupted anywhere, running it again finishes the job (step 2's adopt and
repair-only cases).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import uuid as _uuid
from collections.abc import Sequence

from shinglefs.client.filesystem import (
    _check_new_drive_path,
    _drive_base,
    _recorded_spec,
    absolute_meta_url,
    identified_drives,
    require_metadata_file,
)
from shinglefs.client.recovery import FileSystemInUse, _open_drives, fsck, live_sessions
from shinglefs.errors import ShingleError, UsageError
from shinglefs.meta import open_meta
from shinglefs.meta.api import MetaStore
from shinglefs.meta.fsck import FsckReport
from shinglefs.meta.records import DriveRecord, FormatInfo
from shinglefs.server.node import StorageNode
from shinglefs.store.slice_store import SliceStore
from shinglefs.zoned.drivespec import (
    DriveIdentity,
    DriveSpec,
    header_path,
    parse_drive_spec,
    read_identity,
    write_identity,
)
from shinglefs.zoned.errors import DriveFormatError
from shinglefs.zoned.model import DEFAULT_ZONE_SIZE


class DriveNotLost(ShingleError):
    """``drive replace`` of a drive that is present, this file system's, with slices."""

    exit_code = 1


class _Found(enum.Enum):
    NOTHING = "nothing"  # format a new drive
    TABLE_ONLY = "table"  # the lost drive's zone table alone: moved aside, then format
    LEFTOVER = "leftover"  # an empty drive an interrupted replace formatted: adopt it
    REPLACED = "replaced"  # the recorded drive, empty: replaced already, repair only


@dataclasses.dataclass(frozen=True, slots=True)
class ReplacedDrive:
    """One drive ``replace_drives`` put in place: where, and how."""

    drive_id: int
    spec: str
    how: str  # "formatted", "adopted" (an interrupted replace's) or "already replaced"
    moved_aside: str | None = None  # the lost drive's zone table, moved here


@dataclasses.dataclass(frozen=True, slots=True)
class Replacement:
    """What ``replace_drives`` did: the drives and fsck's repair report."""

    drives: list[ReplacedDrive]
    report: FsckReport


def replace_drives(meta_url: str, drive_ids: Sequence[int], *, to: str | None = None,
                   force: bool = False) -> Replacement:
    """Put an empty drive in place of each lost drive, then repair (module docstring).

    ``to``: ``KIND:PATH[:SIZE]`` of the new drive when one drive is named
    (default: the recorded spec; the kind must be the lost drive's, the size
    defaults to its recorded one). ``force``: go on although sessions look
    alive (known dead). Raises ``UsageError`` (no such drive, another kind,
    ``to`` with several drives, a file system on storage servers),
    ``FileSystemInUse`` (exit 3) or ``DriveInUse`` while the file system is
    open, ``DriveIdentityError`` (exit 18) when a drive not named is missing
    or not this file system's, ``DriveNotLost`` when a named drive is there
    with slices, ``PathError`` (exit 20) when something else is at a path.
    """
    meta_url = absolute_meta_url(meta_url)
    require_metadata_file(meta_url)
    ids = sorted(set(drive_ids))
    meta = open_meta(meta_url)
    try:
        info = meta.format_info()
        records = meta.drive_records()
        _check_request(meta_url, records, ids, to)
        alive = live_sessions(meta)
        if alive and not force:
            raise FileSystemInUse(
                f"{len(alive)} live session(s) have {meta_url} open", hint="unmount it "
                "first (`shinglefs umount`), or pass --force if those sessions are known dead")
        specs = identified_drives(meta, info, lost=set(ids)).specs
        new = {i: _new_spec(specs[i], to) for i in ids}
        done = _replace(meta, meta_url, info, records, specs, new)
    finally:
        meta.close()
    return Replacement(done, fsck(meta_url, repair=True, force=force))


def _check_request(meta_url: str, records: list[DriveRecord], ids: list[int],
                   to: str | None) -> None:
    if not records:
        raise UsageError(f"{meta_url} keeps its bytes on storage servers: it has no "
                         "drives of its own to replace",
                         hint="`shinglefs drive offline URL SERVER:DRIVE` drains a "
                              "server's drive; `shinglefs forget-server` a lost server")
    unknown = [i for i in ids if not 0 <= i < len(records)]
    if unknown or not ids:
        raise UsageError(f"{meta_url} has no drive {', '.join(map(str, unknown)) or '(none named)'}"
                         f" (drives 0-{len(records) - 1})",
                         hint=f"`shinglefs status {meta_url}` lists them")
    if to is not None and len(ids) > 1:
        raise UsageError("--to names the new place of one drive, not of several",
                         hint="replace the drives one command each when they move")


def _new_spec(old: DriveSpec, to: str | None) -> DriveSpec:
    if to is None:
        return old
    spec = parse_drive_spec(to)
    if spec.kind != old.kind:
        raise UsageError(f"drive {old.path} is of kind {old.kind}; a replacement must be "
                         f"too, not {spec.kind}",
                         hint=f"give {old.kind}:PATH[:SIZE]")
    return DriveSpec(spec.kind, os.path.abspath(spec.path),
                     spec.size if spec.size is not None else old.size)


def _replace(meta: MetaStore, meta_url: str, info: FormatInfo, records: list[DriveRecord],
             specs: list[DriveSpec], new: dict[int, DriveSpec]) -> list[ReplacedDrive]:
    """Steps 2 and 3 of the module docstring, holding every other drive's lock."""
    others = [s for i, s in enumerate(specs) if i not in new]
    node = _open_drives([str(s) for s in others], meta_url, recorded=True) if others else None
    try:
        found = {i: _found(spec, info, records[i].uuid, {r.uuid for r in records}, i)
                 for i, spec in new.items()}
        done: list[ReplacedDrive] = []
        uuids = [r.uuid for r in records]
        recorded = [r.spec for r in records]
        base = _drive_base(meta.url_where)
        for i, spec in new.items():
            what, ident = found[i]
            aside = _move_table_aside(spec) if what is _Found.TABLE_ONLY else None
            if what in (_Found.NOTHING, _Found.TABLE_ONLY):
                zone_size = _zone_size(node, others, spec.kind) if node else DEFAULT_ZONE_SIZE
                StorageNode.open([(i, str(spec))], create=True, zone_size=zone_size).close()
                ident = None
            if what is not _Found.REPLACED:
                drive_uuid: str | None = ident.drive if ident is not None else str(_uuid.uuid4())
                if ident is None and not write_identity(spec, DriveIdentity(info.uuid,
                                                                            str(drive_uuid))):
                    drive_uuid = None  # a device without a header of ours
                uuids[i] = drive_uuid
                recorded[i] = _recorded_spec(spec, base)
            how = {_Found.LEFTOVER: "adopted", _Found.REPLACED: "already replaced"}.get(
                what, "formatted")
            done.append(ReplacedDrive(i, str(spec), how, aside))
        meta.set_drives(recorded, uuids)
        return done
    finally:
        if node is not None:
            node.close()


def _found(spec: DriveSpec, info: FormatInfo, recorded_uuid: str | None,
           recorded: set[str | None], drive_id: int) -> tuple[_Found, DriveIdentity | None]:
    """What is at ``spec``'s path now (``_Found``), with the identity in its
    header; raises ``DriveNotLost`` / ``PathError`` for what is never touched."""
    table = header_path(spec)
    image = spec.kind == "linux" or os.path.exists(spec.path)
    if not image and (table is None or not os.path.exists(table)):
        _check_new_drive_path(spec)
        return _Found.NOTHING, None
    try:
        ident = read_identity(spec)
    except DriveFormatError:
        ident = None
        ours = False
    else:
        ours = ident is None or ident.filesystem == info.uuid
    if not image and ident is not None and ident.filesystem == info.uuid \
            and ident.drive == recorded_uuid:
        return _Found.TABLE_ONLY, ident  # the image was deleted, its zone table left behind
    if image and ours and (ident is None or ident.drive not in recorded
                           or ident.drive == recorded_uuid) and _empty(spec):
        if ident is not None and ident.drive == recorded_uuid:
            return _Found.REPLACED, ident
        return _Found.LEFTOVER, ident
    if image and ident is not None and ident.filesystem == info.uuid \
            and ident.drive == recorded_uuid:
        raise DriveNotLost(
            f"drive {drive_id} of file system {info.name!r} is at {spec.path} and holds "
            "slices: nothing to replace",
            hint="a replace interrupted after it recorded the new drive, which took writes "
                 "since: `shinglefs fsck META_URL --repair` finishes it; a drive damaged for "
                 f"good: move {spec.path} aside first (`shinglefs scrub` names the files it "
                 "damages)")
    _check_new_drive_path(spec)  # PathError: something else is there
    return _Found.NOTHING, None


def _empty(spec: DriveSpec) -> bool:
    """Does the drive at ``spec`` open and hold no slice? (False if it does not open.)"""
    try:
        node = StorageNode.open([(0, str(spec))])
    except ShingleError:
        return False
    try:
        store = node.store(0)
        assert isinstance(store, SliceStore)
        return not any(True for _ in store.slice_ids())
    finally:
        node.close()


def _move_table_aside(spec: DriveSpec) -> str:
    """Move the lost drive's zone table out of the way (never deleted)."""
    table = header_path(spec)
    assert table is not None
    aside, n = f"{table}.lost", 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{table}.lost{n}"
    os.rename(table, aside)
    return aside


def _zone_size(node: StorageNode, others: list[DriveSpec], kind: str) -> int:
    """The zone size of a surviving drive of ``kind`` (``node`` opened ``others``
    as drives 0, 1, ...; the default if none is of that kind)."""
    for k, spec in enumerate(others):
        if spec.kind == kind:
            store = node.store(k)
            assert isinstance(store, SliceStore)
            return store.drive.zone_size
    return DEFAULT_ZONE_SIZE
