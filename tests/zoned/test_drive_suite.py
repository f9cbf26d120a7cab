"""The shared drive suite: every backend must pass it (see conftest for the fixtures).

Tests are written against the ``ZonedDrive`` interface only and use the
drive's own geometry, so a real zoned device runs them unchanged.
"""

from __future__ import annotations

import errno

import pytest

from shinglefs.zoned.errors import (
    DriveClosedError,
    OutOfRangeError,
    TooManyOpenZones,
    UnalignedIOError,
    WritePointerViolation,
    ZoneBoundaryError,
    ZoneFullError,
    ZoneTypeError,
)
from shinglefs.zoned.model import ZoneCondition, ZonedDrive, ZoneType

BS = 4096


def pattern(n_blocks: int, seed: int) -> bytes:
    """Distinct bytes per block so misplaced blocks are caught."""
    return b"".join(bytes([(seed + i) % 251 + 1]) * BS for i in range(n_blocks))


def writable_zone(drive: ZonedDrive) -> int:
    """A zone the test may write from its start: first sequential zone, or zone 1 on flash."""
    return drive.first_sequential_zone if drive.is_zoned else 1


# -- every backend -------------------------------------------------------------------------


def test_report_zones_covers_the_drive_in_order(drive: ZonedDrive) -> None:
    zones = drive.report_zones()
    assert len(zones) == drive.zone_count
    assert [z.index for z in zones] == list(range(drive.zone_count))
    assert all(z.start == z.index * drive.zone_size and z.size == drive.zone_size for z in zones)
    assert drive.capacity == drive.zone_size * drive.zone_count
    conventional = [z for z in zones if z.type is ZoneType.CONVENTIONAL]
    assert len(conventional) == drive.conventional_zones
    assert all(z.index < drive.first_sequential_zone for z in conventional)


def test_report_zones_window_matches_full_report(drive: ZonedDrive) -> None:
    full = drive.report_zones()
    assert drive.report_zones(1, 2) == full[1:3]
    assert drive.zone_info(drive.zone_count - 1) == full[-1]


def test_write_then_read_returns_the_same_bytes(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    start = drive.zone_start(zone)
    data = pattern(8, seed=3)
    drive.write(zone, start, data)
    assert drive.read(start, len(data)) == data


def test_vectored_write_lands_buffers_back_to_back(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    start = drive.zone_start(zone)
    parts = [pattern(1, 1), bytearray(pattern(3, 2)), memoryview(pattern(2, 7))]
    drive.write(zone, start, parts)
    assert drive.read(start, 6 * BS) == b"".join(bytes(p) for p in parts)


def test_readv_fills_buffers_back_to_back_whatever_the_readv_ability(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    start = drive.zone_start(zone)
    data = pattern(5, seed=11)
    drive.write(zone, start, data)
    head, rest = bytearray(BS), bytearray(4 * BS)
    assert drive.readv(start, [memoryview(head), memoryview(rest)]) == 5 * BS
    assert bytes(head) + bytes(rest) == data


def test_prefetch_never_fails_and_changes_nothing(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    start = drive.zone_start(zone)
    data = pattern(2, seed=12)
    drive.write(zone, start, data)
    drive.prefetch(start, 2 * BS)
    drive.prefetch(start, 0)
    assert drive.read(start, 2 * BS) == data


def test_discard_zeroes_a_range_or_is_declared_missing(drive: ZonedDrive) -> None:
    zone = drive.zone_count - 1
    start = drive.zone_start(zone)
    if not drive.abilities.discard:
        with pytest.raises(ZoneTypeError):
            drive.discard(start, BS)
        return
    drive.write(zone, start, pattern(2, seed=13))
    drive.discard(start, BS)
    assert drive.read(start, BS) == bytes(BS)


def test_readinto_fills_a_caller_buffer(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    start = drive.zone_start(zone)
    data = pattern(4, 9)
    drive.write(zone, start, data)
    buf = bytearray(len(data))
    assert drive.readinto(start, memoryview(buf)) == len(data)
    assert bytes(buf) == data


def test_write_of_a_whole_zone_round_trips(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    data = bytes(range(256)) * (drive.zone_size // 256)
    drive.write(zone, drive.zone_start(zone), memoryview(data))
    assert drive.read(drive.zone_start(zone), drive.zone_size) == data


def test_unaligned_write_fails_with_einval(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    start = drive.zone_start(zone)
    with pytest.raises(UnalignedIOError) as exc:
        drive.write(zone, start, b"x" * 100)
    assert exc.value.errno == errno.EINVAL
    assert exc.value.drive == drive.name and exc.value.zone == zone
    with pytest.raises(UnalignedIOError):
        drive.write(zone, start + 512, b"x" * BS)


def test_unaligned_read_fails_with_einval(drive: ZonedDrive) -> None:
    with pytest.raises(UnalignedIOError) as exc:
        drive.read(512, BS)
    assert exc.value.errno == errno.EINVAL
    with pytest.raises(UnalignedIOError):
        drive.read(0, 100)


def test_read_past_the_end_fails_with_einval(drive: ZonedDrive) -> None:
    with pytest.raises(OutOfRangeError) as exc:
        drive.read(drive.capacity - BS, 2 * BS)
    assert exc.value.errno == errno.EINVAL


def test_write_to_a_zone_past_the_end_fails(drive: ZonedDrive) -> None:
    with pytest.raises(OutOfRangeError):
        drive.write(drive.zone_count, drive.capacity, b"x" * BS)


def test_write_crossing_the_zone_end_fails_and_writes_nothing(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    start = drive.zone_start(zone)
    data = pattern(2, 5)
    offset = start + drive.zone_size - BS
    if drive.is_zoned:  # bring the write pointer to one block before the end
        drive.write(zone, start, bytes(drive.zone_size - BS))
    with pytest.raises(ZoneBoundaryError) as exc:
        drive.write(zone, offset, data)
    assert exc.value.errno == errno.EIO
    assert drive.read(offset, BS) == bytes(BS)


def test_write_with_offset_outside_its_zone_fails(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    for offset in (drive.zone_start(zone) - BS, drive.zone_start(zone + 1) + BS):
        with pytest.raises(ZoneBoundaryError) as exc:
            drive.write(zone, offset, b"x" * BS)
        assert exc.value.offset == offset


def test_flush_keeps_data_readable(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    data = pattern(3, 11)
    drive.write(zone, drive.zone_start(zone), data)
    drive.flush()
    assert drive.read(drive.zone_start(zone), len(data)) == data


def test_trace_records_each_operation_while_on(drive: ZonedDrive) -> None:
    zone = writable_zone(drive)
    start = drive.zone_start(zone)
    drive.write(zone, start, pattern(1, 1))  # not traced
    drive.start_trace()
    drive.write(zone, start + BS, pattern(2, 2))
    drive.read(start, BS)
    drive.flush()
    records = drive.stop_trace()
    assert [(r.op, r.zone, r.offset, r.length) for r in records[:2]] == [
        ("write", zone, start + BS, 2 * BS),
        ("read", zone, start, BS),
    ]
    assert records[2].op == "flush"
    assert records[0].time <= records[1].time <= records[2].time
    drive.read(start, BS)
    assert drive.stop_trace() == []


def test_calls_after_close_drive_fail(drive: ZonedDrive) -> None:
    drive.close_drive()
    with pytest.raises(DriveClosedError) as exc:
        drive.read(0, BS)
    assert exc.value.errno == errno.EIO
    with pytest.raises(DriveClosedError):
        drive.write(writable_zone(drive), drive.zone_start(writable_zone(drive)), b"x" * BS)
    drive.close_drive()  # idempotent


# -- backends with sequential zones ---------------------------------------------------------


def test_fresh_sequential_zone_is_empty_with_pointer_at_start(zoned_drive: ZonedDrive) -> None:
    z = zoned_drive.zone_info(zoned_drive.first_sequential_zone)
    assert z.type is ZoneType.SEQUENTIAL_WRITE_REQUIRED
    assert z.condition is ZoneCondition.EMPTY
    assert z.write_pointer == z.start and z.written == 0 and z.remaining == z.capacity


def test_append_returns_consecutive_offsets(zoned_drive: ZonedDrive) -> None:
    zone = zoned_drive.first_sequential_zone
    start = zoned_drive.zone_start(zone)
    a, b = pattern(2, 1), pattern(3, 2)
    assert zoned_drive.append(zone, a) == start
    assert zoned_drive.append(zone, [b[:BS], b[BS:]]) == start + 2 * BS
    assert zoned_drive.zone_info(zone).write_pointer == start + 5 * BS
    assert zoned_drive.read(start, 5 * BS) == a + b


def test_write_off_the_write_pointer_fails_with_eio(zoned_drive: ZonedDrive) -> None:
    zone = zoned_drive.first_sequential_zone
    start = zoned_drive.zone_start(zone)
    zoned_drive.append(zone, pattern(2, 1))
    for offset in (start, start + BS, start + 3 * BS):
        with pytest.raises(WritePointerViolation) as exc:
            zoned_drive.write(zone, offset, pattern(1, 9))
        assert exc.value.errno == errno.EIO
        assert (exc.value.zone, exc.value.offset) == (zone, offset)
    assert zoned_drive.zone_info(zone).write_pointer == start + 2 * BS
    assert zoned_drive.read(start, 2 * BS) == pattern(2, 1)


def test_first_write_opens_the_zone_implicitly(zoned_drive: ZonedDrive) -> None:
    zone = zoned_drive.first_sequential_zone
    zoned_drive.append(zone, pattern(1, 1))
    assert zoned_drive.zone_info(zone).condition is ZoneCondition.IMPLICIT_OPEN


def test_writing_to_the_end_makes_the_zone_full_and_further_writes_fail(
    zoned_drive: ZonedDrive,
) -> None:
    zone = zoned_drive.first_sequential_zone
    zoned_drive.append(zone, bytes(zoned_drive.zone_size))
    info = zoned_drive.zone_info(zone)
    assert info.condition is ZoneCondition.FULL and info.remaining == 0
    with pytest.raises(ZoneFullError) as exc:
        zoned_drive.append(zone, pattern(1, 1))
    assert exc.value.errno == errno.EIO


def test_reset_empties_the_zone_and_its_bytes_read_as_zeros(zoned_drive: ZonedDrive) -> None:
    zone = zoned_drive.first_sequential_zone
    start = zoned_drive.zone_start(zone)
    zoned_drive.append(zone, pattern(4, 1))
    zoned_drive.reset(zone)
    info = zoned_drive.zone_info(zone)
    assert info.condition is ZoneCondition.EMPTY and info.write_pointer == start
    assert zoned_drive.read(start, 4 * BS) == bytes(4 * BS)
    assert zoned_drive.append(zone, pattern(1, 5)) == start


def test_explicit_open_close_and_finish_follow_zbc(zoned_drive: ZonedDrive) -> None:
    zone = zoned_drive.first_sequential_zone
    zoned_drive.open(zone)
    assert zoned_drive.zone_info(zone).condition is ZoneCondition.EXPLICIT_OPEN
    zoned_drive.close(zone)  # nothing written: back to EMPTY
    assert zoned_drive.zone_info(zone).condition is ZoneCondition.EMPTY
    zoned_drive.append(zone, pattern(1, 1))
    zoned_drive.open(zone)  # IMPLICIT_OPEN -> EXPLICIT_OPEN
    assert zoned_drive.zone_info(zone).condition is ZoneCondition.EXPLICIT_OPEN
    zoned_drive.close(zone)
    assert zoned_drive.zone_info(zone).condition is ZoneCondition.CLOSED
    zoned_drive.append(zone, pattern(1, 2))  # CLOSED -> IMPLICIT_OPEN
    assert zoned_drive.zone_info(zone).condition is ZoneCondition.IMPLICIT_OPEN
    zoned_drive.finish(zone)
    info = zoned_drive.zone_info(zone)
    assert info.condition is ZoneCondition.FULL
    assert info.write_pointer == info.start + info.capacity
    assert zoned_drive.read(info.start, 2 * BS) == pattern(1, 1) + pattern(1, 2)


def test_read_past_the_write_pointer_returns_zeros(zoned_drive: ZonedDrive) -> None:
    zone = zoned_drive.first_sequential_zone
    start = zoned_drive.zone_start(zone)
    zoned_drive.append(zone, pattern(1, 1))
    assert zoned_drive.read(start, 3 * BS) == pattern(1, 1) + bytes(2 * BS)


def test_zone_operations_on_a_conventional_zone_fail(zoned_drive: ZonedDrive) -> None:
    if zoned_drive.conventional_zones == 0:
        pytest.skip("this drive has no conventional zones")
    for op in (zoned_drive.reset, zoned_drive.open, zoned_drive.close, zoned_drive.finish):
        with pytest.raises(ZoneTypeError) as exc:
            op(0)
        assert exc.value.errno == errno.EINVAL
    with pytest.raises(ZoneTypeError):
        zoned_drive.append(0, pattern(1, 1))


def test_conventional_zones_take_random_aligned_writes(zoned_drive: ZonedDrive) -> None:
    if zoned_drive.conventional_zones == 0:
        pytest.skip("this drive has no conventional zones")
    zoned_drive.write(0, 8 * BS, pattern(1, 1))
    zoned_drive.write(0, 2 * BS, pattern(1, 2))
    zoned_drive.write(0, 8 * BS, pattern(1, 3))  # overwrite in place
    assert zoned_drive.read(2 * BS, BS) == pattern(1, 2)
    assert zoned_drive.read(8 * BS, BS) == pattern(1, 3)


def test_opening_past_the_limit_closes_an_implicitly_open_zone(zoned_drive: ZonedDrive) -> None:
    limit = zoned_drive.max_open_zones
    first = zoned_drive.first_sequential_zone
    if limit == 0 or first + limit + 1 > zoned_drive.zone_count:
        pytest.skip("open-zone limit is absent or above the zones available")
    for zone in range(first, first + limit):
        zoned_drive.append(zone, pattern(1, zone))
    zoned_drive.append(first + limit, pattern(1, 99))
    conds = [z.condition for z in zoned_drive.report_zones(first, limit + 1)]
    assert conds.count(ZoneCondition.IMPLICIT_OPEN) == limit
    assert conds.count(ZoneCondition.CLOSED) == 1
    for zone in range(first, first + limit + 1):  # no data was lost by the implicit close
        expected = pattern(1, 99 if zone == first + limit else zone)
        assert zoned_drive.read(zoned_drive.zone_start(zone), BS) == expected


def test_opening_past_the_limit_fails_when_all_are_explicitly_open(
    zoned_drive: ZonedDrive,
) -> None:
    limit = zoned_drive.max_open_zones
    first = zoned_drive.first_sequential_zone
    if limit == 0 or first + limit + 1 > zoned_drive.zone_count:
        pytest.skip("open-zone limit is absent or above the zones available")
    for zone in range(first, first + limit):
        zoned_drive.open(zone)
    extra = first + limit
    with pytest.raises(TooManyOpenZones) as exc:
        zoned_drive.append(extra, pattern(1, 1))
    assert exc.value.errno == errno.ETOOMANYREFS
    with pytest.raises(TooManyOpenZones):
        zoned_drive.open(extra)
    assert zoned_drive.zone_info(extra).condition is ZoneCondition.EMPTY
    zoned_drive.close(first)
    zoned_drive.append(extra, pattern(1, 1))
    assert zoned_drive.zone_info(extra).condition is ZoneCondition.IMPLICIT_OPEN
