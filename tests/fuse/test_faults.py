"""Drive faults seen through the mount: the application gets EIO, the mount stays
usable, and nothing hangs (every read runs in a child with a timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shinglefs.fuse.harness import MountedFileSystem, default_drives, drop_caches
from shinglefs.zoned import ZoneCondition, ZoneType
from shinglefs.zoned.drivespec import open_drive

pytestmark = pytest.mark.fuse

GiB = 1024**3
MiB = 1024**2

READER = """
import errno, sys
try:
    with open(sys.argv[1], "rb") as f:
        data = f.read()
except OSError as exc:
    print("error", errno.errorcode[exc.errno])
else:
    print("ok", len(data))
"""


def read_in_child(path: Path, timeout: float = 60) -> str:
    """``"ok <n>"`` or ``"error <ERRNO>"``; a hang fails the test by timeout."""
    out = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True,
                         text=True, timeout=timeout, check=True)
    return out.stdout.strip()


@pytest.fixture
def fs(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    with MountedFileSystem(data, tmp_path / "mnt", drives=default_drives(
            data, smr_drives=1, smr_bytes=4 * GiB, conventional_bytes=0)) as fs:
        yield fs


def pattern(tag: bytes, size: int) -> bytes:
    unit = tag.ljust(64, b".")
    return unit * (size // len(unit))


def find_in_sparse_file(path: Path, needle: bytes) -> int:
    """Offset of ``needle`` in a sparse file, skipping holes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        offset = 0
        while offset < size:
            try:
                offset = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:
                break
            end = os.lseek(fd, offset, os.SEEK_HOLE)
            while offset < end:
                block = os.pread(fd, min(64 * MiB, end - offset) + len(needle), offset)
                hit = block.find(needle)
                if hit >= 0:
                    return offset + hit
                offset += 64 * MiB
    finally:
        os.close(fd)
    raise AssertionError(f"{needle[:20]!r} not found in {path}")


def test_corrupted_bytes_under_a_running_mount_give_eio_and_the_mount_stays_usable(
    fs: MountedFileSystem,
) -> None:
    victim = fs.mountpoint / "victim"
    victim.write_bytes(pattern(b"VICTIM-RECORD", 8 * MiB))
    (fs.mountpoint / "healthy").write_bytes(pattern(b"HEALTHY", 1 * MiB))
    image = fs.data_dir / "smr0.img"
    offset = find_in_sparse_file(image, pattern(b"VICTIM-RECORD", 4096))
    with open(image, "r+b") as f:  # flip bytes in the middle of the victim's data
        f.seek(offset + 3 * MiB)
        f.write(b"\xff" * 4096)
    # A fresh mount has a cold read cache; the kernel's page cache is dropped.
    assert fs.stop() == 0
    drop_caches()
    fs.start()
    assert read_in_child(fs.mountpoint / "victim") == "error EIO"
    assert read_in_child(fs.mountpoint / "healthy") == f"ok {1 * MiB}"
    (fs.mountpoint / "after").write_bytes(b"still writable")
    assert (fs.mountpoint / "after").read_bytes() == b"still writable"
    assert "victim" in os.listdir(fs.mountpoint)


def test_offline_zones_give_eio_on_read_and_new_writes_still_land(fs: MountedFileSystem) -> None:
    (fs.mountpoint / "lost").write_bytes(pattern(b"LOST", 4 * MiB))
    assert fs.stop() == 0
    drive = open_drive(f"emulated:{fs.data_dir / 'smr0.img'}")
    failed = []
    try:
        for zone in drive.report_zones():
            if zone.type != ZoneType.CONVENTIONAL and zone.written > 0:
                drive.fail_zone(zone.index, ZoneCondition.OFFLINE)
                failed.append(zone.index)
    finally:
        drive.close_drive()
    assert failed, "the file's data should occupy at least one sequential zone"
    drop_caches()
    fs.start()
    assert read_in_child(fs.mountpoint / "lost") == "error EIO"
    (fs.mountpoint / "new").write_bytes(pattern(b"NEW", 2 * MiB))
    drop_caches()
    assert read_in_child(fs.mountpoint / "new") == f"ok {2 * MiB}"
    assert sorted(os.listdir(fs.mountpoint)) == ["lost", "new"]
