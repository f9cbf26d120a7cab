"""The conventional (flash/CMR) drive: random writes, reopen, discard, no zone commands."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from drivekit import ZONE_SIZE, make_emulated

from shinglefs.errors import UsageError
from shinglefs.zoned.conventional import ConventionalDrive
from shinglefs.zoned.errors import DriveFormatError, ZoneTypeError
from shinglefs.zoned.model import ZoneCondition, ZoneType

BS = 4096


def test_every_zone_is_conventional_and_not_zoned(tmp_path: Path) -> None:
    d = ConventionalDrive.create(tmp_path / "f.img", size=4 * ZONE_SIZE, zone_size=ZONE_SIZE)
    assert not d.is_zoned and d.conventional_zones == d.zone_count == 4
    assert d.first_sequential_zone == 4
    assert {(z.type, z.condition) for z in d.report_zones()} == {
        (ZoneType.CONVENTIONAL, ZoneCondition.NOT_WP)}
    d.close_drive()


def test_random_overwrites_and_reopen_keep_the_last_bytes(tmp_path: Path) -> None:
    d = ConventionalDrive.create(tmp_path / "f.img", zone_count=3, zone_size=ZONE_SIZE)
    d.write(2, 2 * ZONE_SIZE + 9 * BS, b"a" * BS)
    d.write(0, 0, b"b" * 2 * BS)
    d.write(0, BS, b"c" * BS)
    d.close_drive()
    d = ConventionalDrive.open(tmp_path / "f.img")
    assert (d.zone_size, d.zone_count) == (ZONE_SIZE, 3)
    assert d.read(0, 2 * BS) == b"b" * BS + b"c" * BS
    assert d.read(2 * ZONE_SIZE + 9 * BS, BS) == b"a" * BS
    d.close_drive()


def test_a_directory_path_holds_the_drive_file(tmp_path: Path) -> None:
    d = ConventionalDrive.create(tmp_path, zone_count=2, zone_size=ZONE_SIZE)
    assert Path(d.path) == tmp_path / "drive.img"
    d.write(1, ZONE_SIZE, b"z" * BS)
    d.close_drive()
    d = ConventionalDrive.open(tmp_path)
    assert d.read(ZONE_SIZE, BS) == b"z" * BS
    d.close_drive()


def test_discard_makes_a_range_read_as_zeros(tmp_path: Path) -> None:
    d = ConventionalDrive.create(tmp_path / "f.img", zone_count=2, zone_size=ZONE_SIZE)
    d.write(0, 0, b"q" * 4 * BS)
    d.discard(BS, 2 * BS)
    assert d.read(0, 4 * BS) == b"q" * BS + bytes(2 * BS) + b"q" * BS
    d.close_drive()


def test_zone_commands_are_refused_with_einval(tmp_path: Path) -> None:
    d = ConventionalDrive.create(tmp_path / "f.img", zone_count=2, zone_size=ZONE_SIZE)
    for op in (d.reset, d.open, d.close, d.finish):
        with pytest.raises(ZoneTypeError) as exc:
            op(1)
        assert exc.value.errno == errno.EINVAL and exc.value.zone == 1
    with pytest.raises(ZoneTypeError):
        d.append(1, b"x" * BS)
    d.close_drive()


def test_an_emulated_smr_drive_is_not_opened_as_conventional(tmp_path: Path) -> None:
    make_emulated(tmp_path).close_drive()
    with pytest.raises(DriveFormatError, match="zoned drive"):
        ConventionalDrive.open(tmp_path / "drive.img")


def test_create_needs_a_size_and_refuses_existing_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        ConventionalDrive.create(tmp_path / "f.img", zone_size=ZONE_SIZE)
    with pytest.raises(UsageError):
        ConventionalDrive.create(tmp_path / "f.img", size=ZONE_SIZE - BS, zone_size=ZONE_SIZE)
    ConventionalDrive.create(tmp_path / "f.img", zone_count=1, zone_size=ZONE_SIZE).close_drive()
    with pytest.raises(UsageError, match="exists"):
        ConventionalDrive.create(tmp_path / "f.img", zone_count=1, zone_size=ZONE_SIZE)
