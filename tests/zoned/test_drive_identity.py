"""A drive's identity lives in its own header, and a file system opens only its own drives.

Real emulated and conventional drives on files, a real SQLite metadata file;
the file systems are formatted and opened with the client's format/open.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import uuid
from pathlib import Path

import pytest

from shinglefs.client.filesystem import format_filesystem, open_filesystem, recorded_drives
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_CTX, ROOT_INO
from shinglefs.store.errors import DriveTooSmall
from shinglefs.zoned.drivespec import DriveIdentityError, read_identity, write_identity
from shinglefs.zoned.emulated import EmulatedZonedDrive
from shinglefs.zoned.errors import DriveFormatError
from shinglefs.zoned.zonetable import IDENTITY_OFFSET, DriveIdentity

MiB = 1024 * 1024
ZONE = 16 * MiB
SIZE = 16 * ZONE


def _format(data: Path, name: str = "fs") -> str:
    data.mkdir(parents=True, exist_ok=True)
    url = f"sqlite3://{data / 'meta.db'}"
    format_filesystem(url, [f"emulated:{data / 'smr0.img'}:{SIZE}",
                            f"conventional:{data / 'conv.img'}:{SIZE}"],
                      name=name, zone_size=ZONE)
    return url


def _copy_data_dir(src: Path, dst: Path) -> None:
    """Copy a data directory whose file system is closed: the WAL is folded into
    meta.db first, so the copy cannot race SQLite removing it."""
    with sqlite3.connect(src / "meta.db") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*-wal", "*-shm", "*.lock"))


def _write_file(url: str, name: bytes, data: bytes) -> None:
    vfs = open_filesystem(url)
    try:
        fh, _ = vfs.create(ROOT_INO, name, 0o644, os.O_RDWR | os.O_CREAT, ROOT_CTX)
        vfs.write(fh, 0, data)
        vfs.release(fh)
    finally:
        vfs.shutdown()


def _names(url: str) -> list[bytes]:
    vfs = open_filesystem(url)
    try:
        fh = vfs.opendir(ROOT_INO, ROOT_CTX)
        try:
            return sorted(e.name for e in vfs.readdir(fh, 0))
        finally:
            vfs.releasedir(fh)
    finally:
        vfs.shutdown()


def test_identity_round_trips_through_the_zone_table_header(tmp_path: Path) -> None:
    spec = f"emulated:{tmp_path / 'd.img'}:{SIZE}"
    EmulatedZonedDrive.create(tmp_path / "d.img", size=SIZE, zone_size=ZONE).close_drive()
    assert read_identity(spec) is None  # a drive never formatted carries none
    ident = DriveIdentity(str(uuid.uuid4()), str(uuid.uuid4()))
    assert write_identity(spec, ident)
    assert read_identity(spec) == ident
    drive = EmulatedZonedDrive.open(tmp_path / "d.img")  # the table still loads
    drive.close_drive()
    with open(tmp_path / "d.img.zones", "r+b") as f:  # a torn identity is never guessed
        f.seek(IDENTITY_OFFSET + 10)
        f.write(b"\xff\xff")
    with pytest.raises(DriveFormatError):
        read_identity(spec)
    assert read_identity("linux:/dev/nonexistent-zoned") is None  # no header of ours


def test_format_records_drives_beside_the_metadata_relative_with_their_uuids(
        tmp_path: Path) -> None:
    url = _format(tmp_path / "data")
    meta = open_meta(url)
    try:
        info = meta.format_info()
        records = meta.drive_records()
        specs = recorded_drives(meta)
    finally:
        meta.close()
    assert [r.spec.split(":")[1] for r in records] == ["smr0.img", "conv.img"]
    for record, spec in zip(records, specs, strict=True):
        assert read_identity(spec) == DriveIdentity(info.uuid, record.uuid)


def test_a_copied_data_dir_opens_its_own_drives_and_the_original_is_untouched(
        tmp_path: Path) -> None:
    url = _format(tmp_path / "a")
    _write_file(url, b"both", b"x" * 5000)
    _copy_data_dir(tmp_path / "a", tmp_path / "b")
    copy_url = f"sqlite3://{tmp_path / 'b' / 'meta.db'}"
    original = open_filesystem(url)  # both open at once: no shared drive (no DriveInUse)
    try:
        _write_file(copy_url, b"only-in-copy", b"y" * 5000)
    finally:
        original.shutdown()
    assert _names(url) == [b"both"]
    assert _names(copy_url) == [b"both", b"only-in-copy"]


def test_a_moved_data_dir_mounts(tmp_path: Path) -> None:
    url = _format(tmp_path / "a")
    _write_file(url, b"kept", b"k" * 5000)
    (tmp_path / "a").rename(tmp_path / "moved")
    assert _names(f"sqlite3://{tmp_path / 'moved' / 'meta.db'}") == [b"kept"]


def test_a_drive_of_another_file_system_or_position_is_refused_before_opening(
        tmp_path: Path) -> None:
    url = _format(tmp_path / "a")
    _format(tmp_path / "b")
    before = (tmp_path / "a" / "smr0.img.zones").read_bytes()
    shutil.copy(tmp_path / "b" / "smr0.img.zones", tmp_path / "a" / "smr0.img.zones")
    with pytest.raises(DriveIdentityError, match="belongs to another file system"):
        open_filesystem(url)
    (tmp_path / "a" / "smr0.img.zones").write_bytes(before)
    spec = f"emulated:{tmp_path / 'a' / 'smr0.img'}:{SIZE}"
    conv = read_identity(f"conventional:{tmp_path / 'a' / 'conv.img'}:{SIZE}")
    assert conv is not None
    write_identity(spec, conv)  # drive 0 now says it is drive 1
    with pytest.raises(DriveIdentityError, match="is drive 1 of file system 'fs', not drive 0"):
        open_filesystem(url)
    assert DriveIdentityError.exit_code == 18


def test_drives_recorded_before_identities_are_adopted_and_a_legacy_copy_opens_its_own(
        tmp_path: Path) -> None:
    url = _format(tmp_path / "a")
    _write_file(url, b"old", b"o" * 5000)
    # Make it look like a file system formatted before identities: absolute
    # paths, no uuids in meta, no identity block in the headers.
    meta = open_meta(url)
    specs = recorded_drives(meta)
    meta.set_drives(specs)
    meta.close()
    for spec in specs:
        table = spec.split(":")[1] + ".zones"
        with open(table, "r+b") as f:
            f.seek(IDENTITY_OFFSET)
            f.write(bytes(64))
        assert read_identity(spec) is None
    _copy_data_dir(tmp_path / "a", tmp_path / "b")
    copy_url = f"sqlite3://{tmp_path / 'b' / 'meta.db'}"
    _write_file(copy_url, b"copy", b"c" * 5000)  # opens b's drives, not a's
    assert _names(url) == [b"old"]
    meta = open_meta(url)
    try:
        records, info = meta.drive_records(), meta.format_info()
    finally:
        meta.close()
    assert all(r.uuid for r in records)  # adopted at first open
    assert [r.spec.split(":")[1] for r in records] == ["smr0.img", "conv.img"]
    assert read_identity(specs[0]) == DriveIdentity(info.uuid, records[0].uuid)


def test_format_refuses_a_drive_too_small_before_creating_anything(tmp_path: Path) -> None:
    url = f"sqlite3://{tmp_path / 'meta.db'}"
    with pytest.raises(DriveTooSmall, match=r"needs at least 5 .*2 reserved for GC"):
        format_filesystem(url, [f"emulated:{tmp_path / 'ok.img'}:{SIZE}",
                                f"emulated:{tmp_path / 'small.img'}:{5 * ZONE}"], zone_size=ZONE)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    format_filesystem(url, [f"emulated:{tmp_path / 'least.img'}:{6 * ZONE}"], zone_size=ZONE)
