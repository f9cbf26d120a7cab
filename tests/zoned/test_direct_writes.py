"""The emulated drive writes around the page cache (O_DIRECT) where the file allows it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shinglefs.zoned import EmulatedZonedDrive
from shinglefs.zoned.emulated import BOUNCE_BYTES

MiB = 1024 * 1024


class BufferedDrive(EmulatedZonedDrive):
    DIRECT_WRITES = False


@pytest.mark.parametrize("cls", [EmulatedZonedDrive, BufferedDrive])
def test_unaligned_buffers_larger_than_the_bounce_buffer_land_intact(
    tmp_path: Path, cls: type[EmulatedZonedDrive]
) -> None:
    drive = cls.create(tmp_path / "d.img", zone_size=32 * MiB, zone_count=4,
                       conventional_zones=0, max_open_zones=2)
    try:
        if cls is EmulatedZonedDrive:
            assert drive.writes_direct  # ext4 under /tmp takes O_DIRECT
        else:
            assert not drive.writes_direct
        # Pieces whose sizes and addresses are not block-aligned, together
        # block-aligned and longer than one bounce round.
        parts = [os.urandom(n) for n in (4095, 1, 3 * MiB + 17, BOUNCE_BYTES, MiB - 17)]
        total = sum(len(p) for p in parts)
        assert total % drive.block_size == 0 and total > BOUNCE_BYTES
        offset = drive.append(0, [memoryview(p) for p in parts])
        assert offset == 0
        drive.flush()
        assert drive.read(0, total) == b"".join(parts)
    finally:
        drive.close_drive()
    again = EmulatedZonedDrive.open(str(tmp_path / "d.img"))
    try:
        assert again.read(0, total) == b"".join(parts)
    finally:
        again.close_drive()
