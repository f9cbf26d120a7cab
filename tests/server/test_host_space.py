"""Drives emulated on files take the host file system's blocks as they are
written: what can be written is at most what that file system has free.

A small tmpfs holds a file system whose emulated drive is far larger than the
tmpfs (a sparse image). ``statfs`` must report the tmpfs's room, not the
drive's, and ``write`` must say ENOSPC when that room is gone: before, df
showed the drive's room and the drive's own writes failed on the full host
file system. Needs root (mounts a tmpfs).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.client.fsfixtures import FsFactory, create, pattern, read_all

from shinglefs.client.filesystem import format_filesystem
from shinglefs.errors import ShingleError
from shinglefs.server.space import HOST_MARGIN

MiB = 1024 * 1024
HOST_BYTES = 320 * MiB
DRIVE_BYTES = 2048 * MiB  # sparse: six times the tmpfs


@pytest.fixture
def small_host(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs: needs root")
    host = tmp_path / "host"
    host.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={HOST_BYTES}", "tmpfs", str(host)],
                   check=True)
    try:
        yield host
    finally:
        subprocess.run(["umount", "-l", str(host)], check=False)


def test_statfs_and_write_stop_at_the_host_file_system_s_room(small_host: Path) -> None:
    factory = FsFactory(small_host)
    format_filesystem(factory.meta_url, [f"emulated:{small_host}/drive0.img:{DRIVE_BYTES}"],
                      zone_size=64 * MiB)
    factory.formatted = True
    vfs = factory.vfs()
    try:
        host_free = os.statvfs(small_host).f_bavail * os.statvfs(small_host).f_frsize
        free = vfs.statfs().free_bytes
        assert free <= host_free - HOST_MARGIN < DRIVE_BYTES // 2, (free, host_free)
        assert free >= (host_free - HOST_MARGIN) * 0.9

        written: list[tuple[bytes, bytes]] = []
        refused = None
        for i in range(100):
            name, data = b"f%03d" % i, pattern(i, 16 * MiB)
            fh, _ino = create(vfs, name)
            try:
                for off in range(0, len(data), MiB):
                    vfs.write(fh, off, data[off:off + MiB])
            except ShingleError as exc:
                refused = exc
                vfs.release(fh)
                break
            vfs.release(fh)
            written.append((name, data))
        assert refused is not None and refused.errno == errno.ENOSPC, refused
        stored = len(written) * 16 * MiB
        assert stored >= free * 0.8, (stored, free)
        for name, data in written:  # nothing written before is damaged
            assert read_all(vfs, vfs.lookup(1, name).ino) == data
    finally:
        vfs.shutdown()
