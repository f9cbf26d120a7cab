"""Crash recovery: checkpoints, replay, torn records, corruption, failed heads."""

from __future__ import annotations

import errno
import os

import pytest
from storekit import MiB, crash, payload, reopen

from shinglefs.store import ChecksumMismatch, SliceNotFound, SliceStore, StoreIOError
from shinglefs.store.checkpoint import CheckpointArea, decode_header
from shinglefs.zoned import EmulatedZonedDrive, ZoneCondition


def test_flushed_writes_and_deletes_survive_a_power_cut_and_unflushed_ones_may_not(store):
    store.write(1, 0, payload(1, 300_000), group=1)
    store.write(2, 0, payload(2, 200_000), group=2)
    store.flush()
    store.delete(2)
    store.write(3, 0, payload(3, 50_000), group=1, durable=True)  # flushes the delete too
    store.write(4, 0, payload(4, 70_000), group=1)  # never flushed
    store = crash(store)
    try:
        assert store.read(1, 0, 300_000) == payload(1, 300_000)
        assert store.read(3, 0, 50_000) == payload(3, 50_000)
        assert not store.contains(2)
        # Never flushed by the test: lost, unless a background flush (GC, an
        # index checkpoint) made it durable first; never half of it.
        if store.contains(4):
            assert store.read(4, 0, 70_000) == payload(4, 70_000)
        report = store.recovery_report
        assert report.records_replayed >= 3  # data 1, 2, 3 and the tombstone after the checkpoint
    finally:
        store.close()


def test_torn_last_write_is_discarded_and_reported(store):
    store.write(1, 0, payload(1, 100_000), group=1, durable=True)
    store.write(2, 0, payload(2, 600_000), group=1)  # last, unflushed write: torn
    store = crash(store, torn=True, keep_blocks=40)
    try:
        report = store.recovery_report
        assert len(report.discarded) == 1
        tail = report.discarded[0]
        assert tail.bytes == 40 * 4096 and "past the write pointer" in tail.reason
        assert report.discarded_per_zone == {tail.zone: 40 * 4096}
        assert store.read(1, 0, 100_000) == payload(1, 100_000)
        assert not store.contains(2)
        # The zone was finished: nothing is ever appended after garbage.
        info = store.drive.zone_info(tail.zone)
        assert info.condition == ZoneCondition.FULL
        store.write(5, 0, b"after", group=1, durable=True)
        assert store.read(5, 0, 5) == b"after"
    finally:
        store.close()


def test_corrupt_record_in_the_log_stops_replay_of_its_zone(store, tmp_path):
    store.write(1, 0, payload(1, 20_000), group=1, durable=True)
    store.write(2, 0, payload(2, 20_000), group=1, durable=True)
    z = next(iter(store.stats().live_bytes_per_zone))
    path = store.drive.path
    store.scheduler.close()
    store.collector.stop()
    store.drive.simulate_power_cut()
    store.mark_lost()
    # Slice 2's record follows slice 1's (4 KiB header + 20,000 bytes padded to 20 KiB).
    second = z * MiB + 6 * 4096
    with open(path, "r+b") as f:
        pos = second + 4096 + 100  # a payload byte
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0xFF]))
    store = SliceStore.open(EmulatedZonedDrive.open(path))
    try:
        report = store.recovery_report
        assert [d.zone for d in report.discarded] == [z]
        assert "payload crc" in report.discarded[0].reason
        assert report.discarded[0].offset == second
        assert store.read(1, 0, 20_000) == payload(1, 20_000)
        assert not store.contains(2)
    finally:
        store.close()
        store.drive.close_drive()


def test_checksum_mismatch_on_read_names_drive_zone_and_offset(store):
    data = payload(9, 3 * 256 * 1024)
    store.write(9, 0, data, group=0)
    store.flush()
    dev = store.slice_log.index.extents(9)[0][2]
    with open(store.drive.path, "r+b") as f:
        f.seek(dev + 4096 + 256 * 1024 + 7)
        f.write(b"\x00\x01\x02")
    with pytest.raises(ChecksumMismatch) as info:
        store.read(9, 0, len(data))
    err = info.value
    assert err.zone == dev // MiB and err.offset == dev + 4096 + 256 * 1024
    assert err.drive == store.name and err.errno == errno.EIO and str(dev // MiB) in str(err)
    buf = bytearray(b"\xee" * 1000)
    with pytest.raises(ChecksumMismatch):
        store.readinto(9, 256 * 1024, buf)
    assert buf == bytes(1000)  # never the wrong bytes
    # A range that touches only intact blocks is still served (and verified).
    assert store.read(9, 0, 1000) == data[:1000]
    assert store.read(9, 2 * 256 * 1024, 5000) == data[2 * 256 * 1024 : 2 * 256 * 1024 + 5000]


def test_failed_head_zone_gives_a_typed_error_on_read(store):
    store.write(1, 0, payload(1, 100_000), group=0, durable=True)
    dev = store.slice_log.index.extents(1)[0][2]
    store.drive.fail_zone(dev // MiB, ZoneCondition.OFFLINE)
    with pytest.raises(StoreIOError) as info:
        store.read(1, 0, 10)
    assert info.value.zone == dev // MiB and info.value.errno == errno.EIO
    with pytest.raises(SliceNotFound):
        store.read(2, 0, 10)


def test_torn_checkpoint_falls_back_to_the_previous_one(store):
    store.write(1, 0, b"one" * 1000, group=0)
    store.checkpoint()
    good = store.slice_log.ckpt_number
    store.write(2, 0, b"two" * 1000, group=0)
    store.flush()
    # Start the next checkpoint, then cut power during its write: keep 1 block of it.
    log = store.slice_log
    drive = store.drive
    path = drive.path
    store.scheduler.close()
    store.collector.stop()
    real_sync = log.area.sync
    log.area.sync = lambda: None  # the checkpoint write is the last, unflushed one
    log.checkpoint()
    log.area.sync = real_sync
    drive.simulate_power_cut(torn=True, keep_blocks=1)
    store.mark_lost()
    drive = EmulatedZonedDrive.open(path)
    area = CheckpointArea(drive, drive.zone_count)
    header = decode_header(area.read_slot((good + 1) % 2, 4096))
    assert header is not None and header[0] == good + 1  # its header survived, its body did not
    store = SliceStore.open(drive)
    try:
        report = store.recovery_report
        assert report.checkpoint_number == good
        assert any("payload crc mismatch" in n for n in report.notes)
        assert store.read(1, 0, 3000) == b"one" * 1000
        assert store.read(2, 0, 3000) == b"two" * 1000  # replayed from the log
    finally:
        store.close()
        store.drive.close_drive()


def test_open_of_a_drive_without_a_store_is_a_format_error(drive_factory):
    from shinglefs.store import StoreFormatError

    drive = drive_factory()
    with pytest.raises(StoreFormatError):
        SliceStore.open(drive)


def test_checkpoint_on_a_file_path(drive_factory, tmp_path):
    drive = drive_factory(conventional_zones=0)
    ck = str(tmp_path / "index.ckpt")
    store = SliceStore.format(drive, checkpoint_path=ck)
    store.write(1, 0, b"x" * 10_000, group=0, durable=True)
    store = crash(store, checkpoint_path=ck)
    try:
        assert store.read(1, 0, 10_000) == b"x" * 10_000
        assert os.path.getsize(ck) > 0
    finally:
        store.close()


def test_store_on_a_conventional_drive_keeps_its_own_write_pointers(tmp_path):
    from shinglefs.zoned import ConventionalDrive

    path = tmp_path / "flash.img"
    drive = ConventionalDrive.create(str(path), size=64 * MiB, zone_size=MiB)
    store = SliceStore.format(drive)
    for sid in range(6):
        store.write(sid, 0, payload(sid, 700_000), group=sid % 2)
    store.delete_group(1)
    store.write(10, 0, payload(10, 100_000), group=0, durable=True)
    # No clean close: the next open recovers from the checkpoint and the log.
    store.scheduler.close()
    store.collector.stop()
    ends = dict(store.slice_log.live_extents(z)[-1][3:4] and (z, int(store.slice_log.z_wp[z]))
                for z in store.stats().live_bytes_per_zone)
    zone, end = max(ends.items())
    drive.close_drive()
    with open(path, "r+b") as f:  # a torn record after the log's end
        f.seek(end)
        f.write(b"SHRC" + bytes(60) + b"garbage" * 100)
    drive = ConventionalDrive.open(str(path))
    store = SliceStore.open(drive)
    try:
        assert sorted(store.slice_ids()) == [0, 2, 4, 10]
        for sid in (0, 2, 4):
            assert store.read(sid, 0, 700_000) == payload(sid, 700_000)
        assert [(d.zone, d.offset) for d in store.recovery_report.discarded] == [(zone, end)]
        store.write(11, 0, payload(11, 300_000), group=0, durable=True)
        assert store.read(11, 0, 300_000) == payload(11, 300_000)
        stats = store.stats()
        assert stats.zones_by_condition["NOT_WP"] == 1
        assert stats.zone_resets >= 1  # group 1's zones were reset (discarded)
    finally:
        store.close()
        drive.close_drive()
    store = SliceStore.open(ConventionalDrive.open(str(path)))
    try:
        assert store.read(11, 0, 300_000) == payload(11, 300_000)
        assert store.recovery_report.clean
    finally:
        store.close()
        store.drive.close_drive()


def test_a_slice_whose_zone_was_collected_survives_a_power_cut(drive_factory):
    """Recovery adopts GC copies whose originals were collected since the last
    checkpoint (before: the copies only relocated extents the index already
    knew, so a slice written and collected between checkpoints was lost)."""
    store = SliceStore.format(drive_factory(), gc_background=False)
    store.write(1, 0, payload(1, 300_000), group=1)
    store.write(2, 0, payload(2, 300_000), group=1)
    store.write(3, 0, payload(3, 1_500_000), group=1)  # spans zones: several extents
    store.delete(2)
    store.flush()
    zones = sorted({dev // MiB for sid in (1, 3) for _o, _n, dev in
                    store.slice_log.index.extents(sid)})
    for zone in zones[:-1]:
        assert store.collector.collect(zone)
    store.flush()
    store = crash(store, gc_background=False)
    try:
        assert store.read(1, 0, 300_000) == payload(1, 300_000)
        assert store.read(3, 0, 1_500_000) == payload(3, 1_500_000)
        assert not store.contains(2)
    finally:
        store.close()


@pytest.mark.parametrize("clean", [False, True])
def test_a_zone_finished_with_room_left_recovers_without_a_discarded_tail(store, clean):
    """A zone sealed with less room than a record takes is finished: its write
    pointer is the zone's end and the blocks after its last record read as
    zeros. That is the zone's clean end, not a damaged tail: recovery reports
    nothing discarded (it warned of one after clean unmounts)."""
    block = 4096
    store.write(1, 0, payload(1, MiB - 2 * block), group=1, durable=True)  # one block left
    store.write(2, 0, payload(2, 100_000), group=1, durable=True)  # goes to the next zone
    full = [z for z in store.stats().live_bytes_per_zone
            if store.drive.zone_info(z).condition == ZoneCondition.FULL]
    assert full, "the first zone was sealed and finished with a block left"
    store = reopen(store) if clean else crash(store)
    try:
        assert store.recovery_report.discarded == []
        assert store.read(1, 0, MiB - 2 * block) == payload(1, MiB - 2 * block)
        assert store.read(2, 0, 100_000) == payload(2, 100_000)
    finally:
        store.close()
