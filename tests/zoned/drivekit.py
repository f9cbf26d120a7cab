"""Drive builders shared by the zoned tests (imported by conftest.py and the tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shinglefs.zoned.emulated import EmulatedZonedDrive
from shinglefs.zoned.model import ZonedDrive

ZONE_SIZE = 1 << 20  # 256 blocks of 4 KiB: small enough to fill in a test
ZONE_COUNT = 16
CONVENTIONAL = 2
MAX_OPEN = 4

DEVICE_ENV = "SHINGLEFS_TEST_ZONED_DEVICE"


def make_emulated(tmp_path: Path, **kw: int) -> EmulatedZonedDrive:
    args = dict(
        zone_size=ZONE_SIZE, zone_count=ZONE_COUNT, conventional_zones=CONVENTIONAL,
        max_open_zones=MAX_OPEN,
    )
    args.update(kw)
    return EmulatedZonedDrive.create(tmp_path / "drive.img", **args)


def make_conventional(tmp_path: Path) -> ZonedDrive:
    from shinglefs.zoned.conventional import ConventionalDrive

    return ConventionalDrive.create(tmp_path / "flash.img", size=ZONE_SIZE * ZONE_COUNT,
                                    zone_size=ZONE_SIZE)


def make_linux() -> ZonedDrive:
    device = os.environ.get(DEVICE_ENV)
    if not device:
        pytest.skip(
            f"no zoned block device: set {DEVICE_ENV}=/dev/nullb0 (see docs/drives.md) "
            "to run the shared suite on real zoned hardware"
        )
    from shinglefs.zoned.linux import LinuxZonedDrive

    drive = LinuxZonedDrive.open(device)
    for zone in range(drive.first_sequential_zone, drive.zone_count):
        drive.reset(zone)
    return drive


def _build(kind: str, tmp_path: Path) -> ZonedDrive:
    if kind == "emulated":
        return make_emulated(tmp_path)
    if kind == "conventional":
        return make_conventional(tmp_path)
    return make_linux()
