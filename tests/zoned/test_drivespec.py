"""Drive specs ``KIND:PATH[:SIZE]``: parsing, errors with hints, create and open round trips."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from shinglefs.errors import UsageError
from shinglefs.zoned.conventional import ConventionalDrive
from shinglefs.zoned.drivespec import (
    DriveSpec,
    DriveSpecError,
    create_drive,
    open_drive,
    parse_drive_spec,
    parse_size,
)
from shinglefs.zoned.emulated import EmulatedZonedDrive
from shinglefs.zoned.errors import DriveFormatError

MIB = 1 << 20


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("512M", 512 * MIB), ("64G", 64 << 30), ("2t", 2 << 40), ("16GiB", 16 << 30),
     ("1KB", 1024)],
)
def test_sizes_use_binary_units(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "G", "12X", "-5G", "1.5G", "0"])
def test_bad_sizes_are_usage_errors_with_a_hint(text: str) -> None:
    with pytest.raises(DriveSpecError) as exc:
        parse_size(text)
    assert exc.value.hint and exc.value.errno == errno.EINVAL and exc.value.exit_code == 2


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("smr:/data/d0.img:16G", DriveSpec("emulated", "/data/d0.img", 16 << 30)),
        ("emulated:/data/d0.img", DriveSpec("emulated", "/data/d0.img", None)),
        ("zoned:/dev/sdb", DriveSpec("linux", "/dev/sdb", None)),
        ("linux:/dev/nullb0", DriveSpec("linux", "/dev/nullb0", None)),
        ("flash:/ssd/hot:64G", DriveSpec("conventional", "/ssd/hot", 64 << 30)),
        ("CONVENTIONAL:rel/path.img:512M", DriveSpec("conventional", "rel/path.img", 512 * MIB)),
        ("smr:/odd:name/d.img:1G", DriveSpec("emulated", "/odd:name/d.img", 1 << 30)),
    ],
)
def test_specs_parse_to_kind_path_and_size(spec: str, parsed: DriveSpec) -> None:
    assert parse_drive_spec(spec) == parsed


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("/data/d0.img", "no kind"),
        ("tape:/dev/st0", "unknown drive kind"),
        ("smr:", "no path"),
        ("smr::16G", "no path"),
        ("smr:/data/d0.img:16X", "not a size"),
        ("zoned:/dev/sdb:16G", "fixed size"),
    ],
)
def test_bad_specs_are_usage_errors_with_a_hint(spec: str, message: str) -> None:
    with pytest.raises(DriveSpecError, match=message) as exc:
        parse_drive_spec(spec)
    assert isinstance(exc.value, UsageError) and exc.value.hint


def test_create_then_open_an_emulated_drive_by_spec(tmp_path: Path) -> None:
    spec = f"smr:{tmp_path}/d0.img:{8 * 256}M"
    d = create_drive(spec, conventional_zones=1, max_open_zones=16)
    assert isinstance(d, EmulatedZonedDrive)
    assert (d.zone_count, d.conventional_zones, d.max_open_zones) == (8, 1, 16)
    d.append(1, b"s" * 4096)
    d.close_drive()
    again = open_drive(f"smr:{tmp_path}/d0.img")
    assert again.read(again.zone_start(1), 4096) == b"s" * 4096
    again.close_drive()
    open_drive(spec).close_drive()  # the same size is accepted


def test_open_with_a_different_size_is_refused(tmp_path: Path) -> None:
    create_drive(f"smr:{tmp_path}/d0.img:4M", zone_size=MIB).close_drive()
    with pytest.raises(DriveSpecError, match="holds 4194304 bytes"):
        open_drive(f"smr:{tmp_path}/d0.img:8M")


def test_create_needs_a_size_and_creates_nothing_without_one(tmp_path: Path) -> None:
    with pytest.raises(DriveSpecError, match="needs a size") as exc:
        create_drive(f"smr:{tmp_path}/d0.img")
    assert ":16G" in (exc.value.hint or "")
    assert list(tmp_path.iterdir()) == []


def test_create_a_flash_drive_in_a_directory(tmp_path: Path) -> None:
    d = create_drive(f"flash:{tmp_path}:4M", zone_size=MIB)
    assert isinstance(d, ConventionalDrive) and d.zone_count == 4
    d.close_drive()
    again = open_drive(f"conventional:{tmp_path}")
    assert isinstance(again, ConventionalDrive)
    again.close_drive()


def test_opening_a_missing_drive_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(DriveFormatError) as exc:
        open_drive(f"smr:{tmp_path}/nope.img")
    assert "not found" in str(exc.value) and exc.value.hint


def test_a_field_after_the_size_is_named_not_taken_for_a_path_without_size(
        tmp_path: Path) -> None:
    """``smr:PATH:2G:extra`` said "needs a size" and hinted ``PATH:2G:extra:16G``."""
    with pytest.raises(DriveSpecError, match="has 'extra' after its size 2G") as exc:
        create_drive(f"smr:{tmp_path}/d0.img:2G:extra")
    assert exc.value.hint == f"write KIND:PATH[:SIZE], e.g. emulated:{tmp_path}/d0.img:2G"
    assert list(tmp_path.iterdir()) == []
