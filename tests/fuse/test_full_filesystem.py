"""A full file system through a real mount: honest df, ENOSPC from write(2), nothing lost."""

from __future__ import annotations

import errno
import os
import random
import subprocess
from pathlib import Path

import pytest

from shinglefs.fuse.harness import MountedFileSystem, default_drives

MiB = 1024 * 1024

pytestmark = pytest.mark.fuse


# Incompressible content that is cheap to slice at any position: the fill's
# byte at position p is PATTERN[p % 7 MiB] (7 MiB: not a multiple of any chunk).
PATTERN = random.Random(7).randbytes(7 * MiB)
PATTERN2 = memoryview(PATTERN + PATTERN[:MiB])


def chunk(position: int, size: int) -> bytes:
    """The fill's next ``size`` (at most a MiB) bytes of content, from ``position``."""
    start = position % len(PATTERN)
    return bytes(PATTERN2[start:start + size])


def test_filling_the_file_system_fails_at_write_as_df_said_and_loses_nothing(
    tmp_path: Path,
) -> None:
    fs = MountedFileSystem(tmp_path / "data", tmp_path / "mnt",
                           drives=default_drives(tmp_path / "data", smr_bytes=1536 * MiB,
                                                  conventional_bytes=1536 * MiB))
    fs.format()
    fs.start()
    mnt = fs.mountpoint
    try:
        (mnt / "before.txt").write_bytes(b"written before the fill\n")
        st = os.statvfs(mnt)
        available = st.f_bavail * st.f_frsize
        assert available > 512 * MiB

        # A writer that keeps going until write(2) itself says ENOSPC: in MiBs,
        # then in ever smaller writes, so that not one byte of room is left (if
        # room shows up again, the writes grow again: the fill stays quick).
        content = bytearray()
        accepted = None
        fd = os.open(mnt / "fill.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            size, streak = MiB, 0
            while True:
                data = chunk(len(content), size)
                try:
                    # A write(2) the kernel sends as several requests returns
                    # what the ones before an ENOSPC stored (a short count).
                    data = data[:os.write(fd, data)]
                except OSError as full:
                    assert full.errno == errno.ENOSPC
                    accepted = len(content) if accepted is None else accepted
                    if size == 1:
                        break
                    size, streak = max(1, size // 8), 0
                    continue
                content += data
                streak += 1
                if streak == 64 and size < MiB:
                    size, streak = size * 8, 0
        finally:
            os.close(fd)  # what write() accepted is stored: close succeeds
        print(f"fill: df said {available / MiB:.1f} MiB available, write() accepted "
              f"{accepted / MiB:.1f} MiB ({accepted / available:.3f} of it) before ENOSPC")
        assert abs(accepted - available) <= 0.1 * available, (accepted, available)
        assert len(content) <= 1.1 * available, (len(content), available)
        assert os.statvfs(mnt).f_bavail * st.f_frsize < 0.05 * available

        shell = subprocess.run(["sh", "-c", f"echo hi > {mnt / 'echo.txt'}"],
                               capture_output=True, text=True)
        assert shell.returncode != 0  # dash reports any write error as "I/O error"
        dd = subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'dd.bin'}", "bs=1M",
                             "count=64"], capture_output=True, text=True)
        assert dd.returncode != 0 and "No space left" in dd.stderr
    finally:
        fs.stop()

    fs.start()  # everything written before the disk filled is intact
    try:
        assert (mnt / "before.txt").read_bytes() == b"written before the fill\n"
        assert (mnt / "fill.bin").read_bytes() == content
        assert not (mnt / "echo.txt").exists() or (mnt / "echo.txt").read_bytes() == b""
        os.unlink(mnt / "fill.bin")  # and deleting makes room again
        (mnt / "after.txt").write_bytes(b"room again\n")
        assert (mnt / "after.txt").read_bytes() == b"room again\n"
    finally:
        fs.stop()
