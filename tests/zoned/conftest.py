"""Drive fixtures: one shared suite runs on every backend (the fsspec pattern).

- ``drive``: every backend (emulated, conventional, linux when configured);
- ``zoned_drive``: backends with sequential zones (emulated, linux);
- ``emulated``: the emulated drive alone, for its own tests.

The Linux backend runs only when ``SHINGLEFS_TEST_ZONED_DEVICE`` names a zoned
block device (a real HM-SMR disk or a null_blk zoned device; see
docs/drives.md). THE SUITE RESETS EVERY SEQUENTIAL ZONE OF THAT DEVICE.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from drivekit import _build, make_emulated

from shinglefs.zoned.emulated import EmulatedZonedDrive
from shinglefs.zoned.model import ZonedDrive


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
