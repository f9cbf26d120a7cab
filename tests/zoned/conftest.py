"""Drive fixtures: one shared suite runs on every backend (the fsspec pattern).

- ``drive``: every backend (emulated, conventional, linux when configured);
- ``zoned_drive``: backends with sequential zones (emulated, linux);
- ``emulated``: the emulated drive alone, for its own tests.

The Linux backend runs only when ``SHINGLEFS_TEST_ZONED_DEVICE`` names a zoned
block device (a real HM-SMR disk or a null_blk zoned device; see
docs/drives.md). THE SUITE RESETS EVERY SEQUENTIAL ZONE OF THAT DEVICE.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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


@pytest.fixture(params=["emulated", "conventional", "linux"])
def drive(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ZonedDrive]:
    d = _build(request.param, tmp_path)
    yield d
    try:
        d.close_drive()
    except Exception:
        pass


@pytest.fixture(params=["emulated", "linux"])
def zoned_drive(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ZonedDrive]:
    d = _build(request.param, tmp_path)
    yield d
    try:
        d.close_drive()
    except Exception:
        pass


@pytest.fixture
def emulated(tmp_path: Path) -> Iterator[EmulatedZonedDrive]:
    d = make_emulated(tmp_path)
    yield d
    try:
        d.close_drive()
    except Exception:
        pass
