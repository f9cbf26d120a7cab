"""The emulated HM-SMR drive: its own rules, persistence, crash model and failed heads."""

from __future__ import annotations

import errno
import os
import pickle
import random
from pathlib import Path

import pytest
from drivekit import CONVENTIONAL, MAX_OPEN, ZONE_COUNT, ZONE_SIZE, make_emulated

from shinglefs.errors import UsageError
from shinglefs.zoned.emulated import EmulatedZonedDrive, default_conventional_zones
from shinglefs.zoned.errors import (
    DriveClosedError,
    DriveFormatError,
    TooManyOpenZones,
    WritePointerViolation,
    ZoneError,
    ZoneFullError,
    ZoneOfflineError,
    ZoneReadOnlyError,
)
from shinglefs.zoned.model import ZoneCondition, ZoneType
from shinglefs.zoned.zonetable import HEADER_SIZE

BS = 4096
SEQ = CONVENTIONAL  # first sequential zone


def blocks(n: int, seed: int) -> bytes:
    return b"".join(bytes([(seed * 7 + i) % 251 + 1]) * BS for i in range(n))


def reopen(drive: EmulatedZonedDrive) -> EmulatedZonedDrive:
    return EmulatedZonedDrive.open(drive.path)


# -- creation -------------------------------------------------------------------------------


def test_create_defaults_follow_hc620_layout(tmp_path: Path) -> None:
    d = EmulatedZonedDrive.create(tmp_path / "d.img", zone_count=300)
    assert d.zone_size == 256 * 1024 * 1024
    assert d.max_open_zones == 128
    assert d.conventional_zones == 3 == default_conventional_zones(300)
    types = [z.type for z in d.report_zones(0, 4)]
    assert types == [ZoneType.CONVENTIONAL] * 3 + [ZoneType.SEQUENTIAL_WRITE_REQUIRED]
    assert os.stat(d.path).st_size == d.capacity
    assert os.stat(d.path).st_blocks * 512 < 1024 * 1024  # sparse
    d.close_drive()


def test_create_from_size_rounds_down_to_whole_zones(tmp_path: Path) -> None:
    d = EmulatedZonedDrive.create(tmp_path / "d.img", zone_size=ZONE_SIZE, size=5 * ZONE_SIZE + 7)
    assert d.zone_count == 5
    d.close_drive()


@pytest.mark.parametrize(
    "kw",
    [
        dict(zone_size=1000, zone_count=4),
        dict(zone_size=ZONE_SIZE, zone_count=0),
        dict(zone_size=ZONE_SIZE),
        dict(zone_size=ZONE_SIZE, zone_count=4, conventional_zones=5),
        dict(zone_size=ZONE_SIZE, zone_count=4, max_open_zones=-1),
    ],
)
def test_create_rejects_bad_geometry(tmp_path: Path, kw: dict) -> None:
    with pytest.raises(UsageError):
        EmulatedZonedDrive.create(tmp_path / "d.img", **kw)
    assert not (tmp_path / "d.img.zones").exists()


def test_create_in_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot create"):
        EmulatedZonedDrive.create(tmp_path / "nowhere" / "d.img", zone_size=ZONE_SIZE, zone_count=2)


def test_create_refuses_to_overwrite_an_existing_drive(tmp_path: Path) -> None:
    d = make_emulated(tmp_path)
    d.append(SEQ, blocks(1, 1))
    d.close_drive()
    with pytest.raises(UsageError) as exc:
        make_emulated(tmp_path)
    assert "exists" in str(exc.value) and exc.value.hint
    again = EmulatedZonedDrive.open(tmp_path / "drive.img")
    assert again.read(again.zone_start(SEQ), BS) == blocks(1, 1)
    again.close_drive()


# -- rules, one by one, with the errno and the context ------------------------------------


def test_error_carries_drive_zone_offset_and_survives_pickling(emulated: EmulatedZonedDrive) -> None:
    start = emulated.zone_start(SEQ)
    with pytest.raises(WritePointerViolation) as exc:
        emulated.write(SEQ, start + BS, blocks(1, 1))
    err = exc.value
    assert (err.drive, err.zone, err.offset, err.errno) == ("drive.img", SEQ, start + BS, errno.EIO)
    assert isinstance(err, ZoneError)
    assert f"zone {SEQ}" in str(err) and "drive.img" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.drive, copy.zone, copy.offset, copy.errno, str(copy)) == (
        err.drive, err.zone, err.offset, err.errno, str(err))


def test_open_of_a_full_zone_fails(emulated: EmulatedZonedDrive) -> None:
    emulated.finish(SEQ)
    with pytest.raises(ZoneFullError) as exc:
        emulated.open(SEQ)
    assert exc.value.errno == errno.EIO


def test_close_and_finish_of_settled_zones_change_nothing(emulated: EmulatedZonedDrive) -> None:
    emulated.close(SEQ)  # EMPTY stays EMPTY
    assert emulated.zone_info(SEQ).condition is ZoneCondition.EMPTY
    emulated.finish(SEQ)
    emulated.finish(SEQ)
    emulated.close(SEQ)
    assert emulated.zone_info(SEQ).condition is ZoneCondition.FULL
    emulated.reset(SEQ)
    emulated.reset(SEQ)
    assert emulated.zone_info(SEQ).condition is ZoneCondition.EMPTY


def test_finish_of_an_empty_zone_reads_zeros(emulated: EmulatedZonedDrive) -> None:
    emulated.finish(SEQ)
    assert emulated.read(emulated.zone_start(SEQ), ZONE_SIZE) == bytes(ZONE_SIZE)


def test_zero_length_write_at_the_pointer_changes_nothing(emulated: EmulatedZonedDrive) -> None:
    emulated.write(SEQ, emulated.zone_start(SEQ), b"")
    assert emulated.zone_info(SEQ).condition is ZoneCondition.EMPTY


def test_writes_accept_numpy_and_non_byte_memoryviews(emulated: EmulatedZonedDrive) -> None:
    import numpy as np

    arr = np.arange(BS // 4 * 2, dtype=np.float32)
    emulated.append(SEQ, memoryview(arr))
    assert emulated.read(emulated.zone_start(SEQ), 2 * BS) == arr.tobytes()


# -- open-zone limit: ZBC implicit close ---------------------------------------------------


def test_implicit_close_picks_the_least_recently_written_zone(emulated: EmulatedZonedDrive) -> None:
    zones = list(range(SEQ, SEQ + MAX_OPEN))
    for z in zones:
        emulated.append(z, blocks(1, z))
    emulated.append(zones[0], blocks(1, 50))  # zones[1] is now the least recently written
    emulated.append(SEQ + MAX_OPEN, blocks(1, 60))
    assert emulated.zone_info(zones[1]).condition is ZoneCondition.CLOSED
    assert emulated.zone_info(zones[0]).condition is ZoneCondition.IMPLICIT_OPEN
    assert emulated.open_zone_count() == (MAX_OPEN, 0)


def test_explicit_open_at_the_limit_closes_an_implicit_zone(emulated: EmulatedZonedDrive) -> None:
    for z in range(SEQ, SEQ + MAX_OPEN):
        emulated.append(z, blocks(1, z))
    emulated.open(SEQ + MAX_OPEN)
    assert emulated.open_zone_count() == (MAX_OPEN - 1, 1)
    assert emulated.zone_info(SEQ).condition is ZoneCondition.CLOSED


def test_explicit_zones_are_never_implicitly_closed(emulated: EmulatedZonedDrive) -> None:
    for z in range(SEQ, SEQ + MAX_OPEN - 1):
        emulated.open(z)
    emulated.append(SEQ + MAX_OPEN - 1, blocks(1, 1))  # the one implicit zone
    emulated.append(SEQ + MAX_OPEN, blocks(1, 2))  # closes it, not an explicit one
    assert emulated.zone_info(SEQ + MAX_OPEN - 1).condition is ZoneCondition.CLOSED
    assert all(
        emulated.zone_info(z).condition is ZoneCondition.EXPLICIT_OPEN
        for z in range(SEQ, SEQ + MAX_OPEN - 1)
    )
    emulated.open(SEQ + MAX_OPEN)  # IMPLICIT -> EXPLICIT needs no new resource
    with pytest.raises(TooManyOpenZones) as exc:
        emulated.append(SEQ + MAX_OPEN + 1, blocks(1, 3))
    assert exc.value.errno == errno.ETOOMANYREFS and exc.value.zone == SEQ + MAX_OPEN + 1


def test_full_and_reset_zones_release_their_open_resource(emulated: EmulatedZonedDrive) -> None:
    for z in range(SEQ, SEQ + MAX_OPEN):
        emulated.open(z)
    emulated.append(SEQ, bytes(ZONE_SIZE))  # becomes FULL
    emulated.reset(SEQ + 1)
    assert emulated.open_zone_count() == (0, MAX_OPEN - 2)
    emulated.open(SEQ + MAX_OPEN)
    emulated.open(SEQ + MAX_OPEN + 1)


def test_zero_max_open_zones_means_unlimited(tmp_path: Path) -> None:
    d = make_emulated(tmp_path, max_open_zones=0)
    for z in range(SEQ, ZONE_COUNT):
        d.open(z)
    assert d.open_zone_count() == (0, ZONE_COUNT - SEQ)
    d.close_drive()


# -- persistence across reopen ----------------------------------------------------------


def test_reopen_restores_geometry_pointers_and_data(emulated: EmulatedZonedDrive) -> None:
    emulated.append(SEQ, blocks(3, 1))
    emulated.append(SEQ + 1, bytes(ZONE_SIZE))
    emulated.write(0, 5 * BS, blocks(1, 9))
    emulated.close_drive()
    d = reopen(emulated)
    assert (d.zone_size, d.zone_count, d.conventional_zones, d.max_open_zones) == (
        ZONE_SIZE, ZONE_COUNT, CONVENTIONAL, MAX_OPEN)
    a, b = d.report_zones(SEQ, 2)
    assert (a.condition, a.written) == (ZoneCondition.CLOSED, 3 * BS)  # open zones come back CLOSED
    assert (b.condition, b.written) == (ZoneCondition.FULL, ZONE_SIZE)
    assert d.read(d.zone_start(SEQ), 3 * BS) == blocks(3, 1)
    assert d.read(5 * BS, BS) == blocks(1, 9)
    assert d.append(SEQ, blocks(1, 4)) == d.zone_start(SEQ) + 3 * BS
    d.close_drive()


def test_flush_alternates_table_slots_and_a_torn_slot_falls_back(
    emulated: EmulatedZonedDrive,
) -> None:
    emulated.append(SEQ, blocks(1, 1))
    emulated.flush()
    emulated.append(SEQ, blocks(1, 2))
    emulated.flush()
    newest = emulated.zone_table.generation % 2
    slot_size = (os.path.getsize(emulated.path + ".zones") - HEADER_SIZE) // 2
    emulated.simulate_process_crash()  # no further flush
    with open(emulated.path + ".zones", "r+b") as f:  # tear the newest slot
        f.seek(HEADER_SIZE + newest * slot_size + 20)
        f.write(b"\xff" * 8)
    d = reopen(emulated)
    assert d.zone_info(SEQ).written == BS  # the previous durable table
    assert d.read(d.zone_start(SEQ), 2 * BS) == blocks(1, 1) + bytes(BS)
    d.close_drive()


def test_corrupt_zone_table_header_is_refused(emulated: EmulatedZonedDrive) -> None:
    emulated.close_drive()
    with open(emulated.path + ".zones", "r+b") as f:
        f.seek(12)
        f.write(b"\x01")
    with pytest.raises(DriveFormatError) as exc:
        reopen(emulated)
    assert "checksum" in str(exc.value) and exc.value.errno == errno.EIO


def test_missing_zone_table_or_short_data_file_is_refused(emulated: EmulatedZonedDrive) -> None:
    emulated.close_drive()
    os.truncate(emulated.path, ZONE_SIZE)
    with pytest.raises(DriveFormatError, match="zone table says"):
        reopen(emulated)
    os.unlink(emulated.path + ".zones")
    with pytest.raises(DriveFormatError, match="not found") as exc:
        reopen(emulated)
    assert exc.value.hint


def test_open_rejects_a_file_that_is_not_a_zone_table(tmp_path: Path) -> None:
    (tmp_path / "x.img").write_bytes(b"")
    (tmp_path / "x.img.zones").write_bytes(b"hello" * 2000)
    with pytest.raises(DriveFormatError, match="not a ShingleFS zone table"):
        EmulatedZonedDrive.open(tmp_path / "x.img")


# -- crash model: power cuts ---------------------------------------------------------------


def test_power_cut_drops_unflushed_writes_and_rolls_back_pointers(
    emulated: EmulatedZonedDrive,
) -> None:
    start = emulated.zone_start(SEQ)
    emulated.append(SEQ, blocks(2, 1))
    emulated.flush()
    emulated.append(SEQ, blocks(3, 2))  # lost
    emulated.append(SEQ + 1, blocks(1, 3))  # lost
    emulated.finish(SEQ + 2)  # lost
    assert emulated.simulate_power_cut() is None
    with pytest.raises(DriveClosedError):
        emulated.read(0, BS)
    d = reopen(emulated)
    a, b, c = d.report_zones(SEQ, 3)
    assert (a.condition, a.written) == (ZoneCondition.CLOSED, 2 * BS)
    assert (b.condition, b.written) == (ZoneCondition.EMPTY, 0)
    assert c.condition is ZoneCondition.EMPTY
    assert d.read(start, 5 * BS) == blocks(2, 1) + bytes(3 * BS)
    # the dropped bytes are gone from the file itself, not only hidden
    with open(d.path, "rb") as f:
        f.seek(start + 2 * BS)
        assert f.read(3 * BS) == bytes(3 * BS)
    assert d.append(SEQ, blocks(1, 7)) == start + 2 * BS
    d.close_drive()


def test_power_cut_zeroes_unflushed_conventional_writes(emulated: EmulatedZonedDrive) -> None:
    emulated.write(0, 0, blocks(2, 1))
    emulated.flush()
    emulated.write(0, 4 * BS, blocks(1, 2))
    emulated.simulate_power_cut()
    d = reopen(emulated)
    assert d.read(0, 5 * BS) == blocks(2, 1) + bytes(3 * BS)
    d.close_drive()


def test_reset_is_durable_without_flush(emulated: EmulatedZonedDrive) -> None:
    start = emulated.zone_start(SEQ)
    emulated.append(SEQ, blocks(4, 1))
    emulated.flush()
    emulated.reset(SEQ)
    emulated.append(SEQ, blocks(1, 2))  # unflushed, lost
    emulated.simulate_power_cut()
    d = reopen(emulated)
    info = d.zone_info(SEQ)
    assert (info.condition, info.written) == (ZoneCondition.EMPTY, 0)
    assert d.read(start, 4 * BS) == bytes(4 * BS)  # old data never comes back
    d.close_drive()


@pytest.mark.parametrize("keep", [0, 1, 3, 4])
def test_torn_power_cut_keeps_a_block_prefix_of_the_last_write(
    emulated: EmulatedZonedDrive, keep: int
) -> None:
    start = emulated.zone_start(SEQ)
    emulated.append(SEQ, blocks(1, 1))
    emulated.flush()
    emulated.append(SEQ + 1, blocks(2, 8))  # unflushed, other zone: lost
    emulated.append(SEQ, blocks(2, 2))  # unflushed, same zone, before the last: survives
    emulated.append(SEQ, blocks(4, 3))  # the last write: torn after `keep` blocks
    assert emulated.simulate_power_cut(torn=True, keep_blocks=keep) == (
        SEQ, start + (3 + keep) * BS)
    d = reopen(emulated)
    info = d.zone_info(SEQ)
    assert info.written == (3 + keep) * BS
    assert d.read(start, 7 * BS) == (
        blocks(1, 1) + blocks(2, 2) + blocks(4, 3)[: keep * BS] + bytes((4 - keep) * BS)
    )
    assert d.zone_info(SEQ + 1).written == 0
    d.close_drive()


def test_torn_power_cut_with_rng_never_reports_past_the_last_write(tmp_path: Path) -> None:
    rng = random.Random(7)
    seen = set()
    for i in range(12):
        (tmp_path / str(i)).mkdir()
        d = make_emulated(tmp_path / str(i))
        start = d.zone_start(SEQ)
        d.append(SEQ, blocks(2, 1))
        d.flush()
        d.append(SEQ, blocks(5, 2))
        _, wp = d.simulate_power_cut(torn=True, rng=rng)
        d = reopen(d)
        written = d.zone_info(SEQ).written
        assert wp == start + written and 2 * BS <= written <= 7 * BS
        assert d.read(start, written) == (blocks(2, 1) + blocks(5, 2))[:written]
        seen.add(written)
        d.close_drive()
    assert len(seen) > 2  # the rng really varies the torn prefix


def test_torn_power_cut_after_flush_changes_nothing(emulated: EmulatedZonedDrive) -> None:
    emulated.append(SEQ, blocks(2, 1))
    emulated.flush()
    assert emulated.simulate_power_cut(torn=True) is None
    d = reopen(emulated)
    assert d.zone_info(SEQ).written == 2 * BS
    d.close_drive()


def test_bytes_past_the_pointer_after_a_crash_read_as_zeros(emulated: EmulatedZonedDrive) -> None:
    """A process crash leaves unflushed bytes in the file; the drive never shows them."""
    start = emulated.zone_start(SEQ)
    emulated.append(SEQ, blocks(1, 1))
    emulated.flush()
    emulated.append(SEQ, blocks(2, 2))
    emulated.simulate_process_crash()  # no flush; the bytes reach the file
    with open(emulated.path, "rb") as f:  # the bytes are in the file...
        f.seek(start + BS)
        assert f.read(2 * BS) == blocks(2, 2)
    d = reopen(emulated)  # ...but the drive never shows them
    assert d.zone_info(SEQ).written == BS
    assert d.read(start, 3 * BS) == blocks(1, 1) + bytes(2 * BS)
    d.finish(SEQ)  # FINISH exposes the range: it must read as zeros too
    assert d.read(start, 3 * BS) == blocks(1, 1) + bytes(2 * BS)
    d.close_drive()


# -- failed heads ---------------------------------------------------------------------------


def test_read_only_zone_serves_reads_and_refuses_writes_persistently(
    emulated: EmulatedZonedDrive,
) -> None:
    start = emulated.zone_start(SEQ)
    emulated.append(SEQ, blocks(2, 1))
    emulated.flush()
    emulated.fail_zone(SEQ, ZoneCondition.READ_ONLY)
    for d in (emulated, None):
        if d is None:
            emulated.simulate_power_cut()
            d = reopen(emulated)
        assert d.zone_info(SEQ).condition is ZoneCondition.READ_ONLY
        assert d.read(start, 2 * BS) == blocks(2, 1)
        calls = [(d.append, (SEQ, blocks(1, 1))), (d.reset, (SEQ,)), (d.open, (SEQ,)),
                 (d.finish, (SEQ,))]
        for op, args in calls:
            with pytest.raises(ZoneReadOnlyError) as exc:
                op(*args)
            assert exc.value.errno == errno.EIO and exc.value.zone == SEQ
    d.close_drive()


def test_offline_zone_refuses_reads_and_writes_persistently(emulated: EmulatedZonedDrive) -> None:
    start = emulated.zone_start(SEQ)
    emulated.append(SEQ, blocks(1, 1))
    emulated.open(SEQ + 1)
    emulated.fail_zone(SEQ, ZoneCondition.OFFLINE)
    emulated.fail_zone(0, ZoneCondition.OFFLINE)  # a conventional zone on the same head
    assert emulated.open_zone_count() == (0, 1)
    emulated.close_drive()
    d = reopen(emulated)
    assert [d.zone_info(z).condition for z in (0, SEQ)] == [ZoneCondition.OFFLINE] * 2
    for offset in (start, 0):
        with pytest.raises(ZoneOfflineError) as exc:
            d.read(offset, BS)
        assert exc.value.errno == errno.EIO
    with pytest.raises(ZoneOfflineError):
        d.read(start - BS, 2 * BS)  # a read spanning into it
    with pytest.raises(ZoneOfflineError):
        d.append(SEQ, blocks(1, 1))
    with pytest.raises(ZoneOfflineError):
        d.reset(SEQ)
    d.append(SEQ + 1, blocks(1, 2))  # other zones are unaffected
    d.close_drive()


def test_fail_zone_takes_only_terminal_conditions(emulated: EmulatedZonedDrive) -> None:
    with pytest.raises(UsageError):
        emulated.fail_zone(SEQ, ZoneCondition.FULL)


# -- tracing ----------------------------------------------------------------------------------


def test_trace_records_zone_management_operations(emulated: EmulatedZonedDrive) -> None:
    assert emulated.stop_trace() == []  # off by default
    emulated.start_trace()
    emulated.open(SEQ)
    emulated.append(SEQ, blocks(1, 1))
    emulated.close(SEQ)
    emulated.finish(SEQ)
    emulated.reset(SEQ)
    ops = [(r.op, r.zone) for r in emulated.stop_trace()]
    assert ops == [("open", SEQ), ("write", SEQ), ("close", SEQ), ("finish", SEQ), ("reset", SEQ)]


# -- concurrency ------------------------------------------------------------------------------


def test_concurrent_appends_to_one_zone_land_whole_at_distinct_offsets(
    emulated: EmulatedZonedDrive,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def job(seed: int) -> list[tuple[int, int]]:
        return [(emulated.append(SEQ, blocks(2, seed * 40 + i)), seed * 40 + i) for i in range(16)]

    with ThreadPoolExecutor(4) as pool:
        results = [r for rs in pool.map(job, range(4)) for r in rs]
    offsets = sorted(o for o, _ in results)
    start = emulated.zone_start(SEQ)
    assert offsets == [start + i * 2 * BS for i in range(64)]
    assert emulated.zone_info(SEQ).written == 128 * BS
    for offset, seed in results:
        assert emulated.read(offset, 2 * BS) == blocks(2, seed)


def test_reads_and_flushes_run_beside_appends(emulated: EmulatedZonedDrive) -> None:
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                for z in range(SEQ, SEQ + 3):
                    info = emulated.zone_info(z)
                    data = emulated.read(info.start, info.written) if info.written else b""
                    # whatever was reported written is exactly the appended pattern
                    assert data == b"".join(blocks(1, i) for i in range(info.written // BS))
                emulated.flush()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    for i in range(100):
        for z in range(SEQ, SEQ + 3):
            emulated.append(z, blocks(1, i))
    stop.set()
    t.join()
    assert not errors
    for z in range(SEQ, SEQ + 3):
        assert emulated.read(emulated.zone_start(z), 100 * BS) == b"".join(
            blocks(1, i) for i in range(100))


# -- on a raw block device ------------------------------------------------------------------


@pytest.fixture
def loop_device(tmp_path: Path):  # type: ignore[no-untyped-def]
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("needs root and losetup to attach a loop device")
    backing = tmp_path / "backing.img"
    with open(backing, "wb") as f:
        f.write(b"\xee" * (4 * ZONE_SIZE))  # old contents a fresh drive must not show
    try:
        device = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True,
                                capture_output=True, text=True).stdout.strip()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"losetup failed: {exc.stderr.strip()}")
    yield device
    subprocess.run(["losetup", "-d", device], check=False)


def test_emulated_drive_on_a_block_device_keeps_its_table_elsewhere(
    loop_device: str, tmp_path: Path
) -> None:
    table = str(tmp_path / "loop.zones")
    d = EmulatedZonedDrive.create(loop_device, zone_size=ZONE_SIZE, zone_count=4,
                                  conventional_zones=1, table_path=table)
    assert d.read(d.zone_start(1), BS) == bytes(BS)  # old device bytes are not data
    d.append(1, blocks(3, 1))
    d.close_drive()
    d = EmulatedZonedDrive.open(loop_device, table_path=table)
    assert d.zone_info(1).written == 3 * BS
    assert d.read(d.zone_start(1), 4 * BS) == blocks(3, 1) + bytes(BS)
    d.close_drive()
    with pytest.raises(UsageError, match="less than"):
        EmulatedZonedDrive.create(loop_device, zone_size=ZONE_SIZE, zone_count=5,
                                  table_path=str(tmp_path / "other.zones"))


def test_trace_holds_only_io_that_passed_the_rules(emulated: EmulatedZonedDrive) -> None:
    emulated.start_trace()
    with pytest.raises(WritePointerViolation):
        emulated.write(SEQ, emulated.zone_start(SEQ) + BS, blocks(1, 1))
    emulated.fail_zone(SEQ + 1, ZoneCondition.OFFLINE)
    with pytest.raises(ZoneOfflineError):
        emulated.reset(SEQ + 1)
    emulated.write(0, 3 * BS, blocks(1, 2))
    assert [(r.op, r.zone, r.offset) for r in emulated.stop_trace()] == [("write", 0, 3 * BS)]
