"""SliceStore basics: bytes in, the same bytes out; typed errors for bad input."""

from __future__ import annotations

import errno
import os

import pytest
from storekit import MiB, payload, reopen

from shinglefs.errors import UsageError
from shinglefs.store import (
    MAX_SLICE_SIZE,
    SliceNotFound,
    SliceOrderError,
    SliceStore,
    StoreClosed,
)


def test_slice_written_in_pieces_reads_back_whole_and_by_range(store: SliceStore):
    data = payload(1, 5 * MiB + 123)
    pos = 0
    for n in (1, 4095, 300_000, 2 * MiB, 5 * MiB + 123):
        store.write(42, pos, data[pos:n], group=9)
        pos = n
    assert store.length(42) == len(data)
    assert store.read(42, 0, len(data)) == data
    for a, b in ((0, 1), (4095, 4097), (MiB - 3, MiB + 262_147), (len(data) - 10, len(data))):
        assert store.read(42, a, b - a) == data[a:b]
    # Reads past the end are short, never padded.
    assert store.read(42, len(data) - 5, 100) == data[-5:]
    assert store.read(42, len(data), 100) == b""
    buf = bytearray(3 * MiB)
    assert store.readinto(42, MiB, buf) == 3 * MiB
    assert buf == data[MiB : 4 * MiB]


def test_slice_spanning_zones_continues_in_another_zone(store: SliceStore):
    data = payload(2, 3 * MiB + 17)  # the test drive's zones are 1 MiB
    store.write(1, 0, data, group=1)
    assert store.read(1, 0, len(data)) == data
    zones = store.stats().live_bytes_per_zone
    assert len(zones) >= 4 and sum(zones.values()) == len(data)


def test_unknown_and_deleted_slices_raise_slice_not_found(store: SliceStore):
    with pytest.raises(SliceNotFound) as info:
        store.read(7, 0, 10)
    assert info.value.errno == errno.ENOENT and info.value.slice_id == 7
    store.write(7, 0, b"abc", group=0)
    store.delete(7)
    store.delete(7)  # idempotent
    assert not store.contains(7)
    for call in (lambda: store.read(7, 0, 3), lambda: store.length(7)):
        with pytest.raises(SliceNotFound):
            call()


def test_pieces_out_of_order_are_refused_and_nothing_is_written(store: SliceStore):
    store.write(5, 0, b"a" * 100, group=0)
    with pytest.raises(SliceOrderError) as info:
        store.write(5, 50, b"b" * 10, group=0)
    assert info.value.expected == 100 and info.value.errno == errno.EINVAL
    with pytest.raises(SliceOrderError):
        store.write(6, 10, b"x", group=0)
    with pytest.raises(SliceOrderError):
        store.write(5, 100, memoryview(bytearray(MAX_SLICE_SIZE)), group=0)
    assert store.read(5, 0, 1000) == b"a" * 100
    assert not store.contains(6)


def test_bad_ids_and_groups_are_usage_errors(store: SliceStore):
    with pytest.raises(UsageError):
        store.write(-1, 0, b"x", group=0)
    with pytest.raises(UsageError):
        store.write(1, 0, b"x", group=2**64)


def test_slices_counters_and_stats_survive_a_clean_restart(store: SliceStore):
    for sid in range(10):
        store.write(sid, 0, payload(sid, 100_000 + sid), group=sid % 3)
    store.delete(3)
    before = store.stats()
    assert before.slices == 9 and before.user_bytes_written == sum(
        100_000 + s for s in range(10))
    assert 1.0 < before.write_amplification < 1.1
    store = reopen(store)
    try:
        after = store.stats()
        assert sorted(store.slice_ids()) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
        assert after.user_bytes_written == before.user_bytes_written
        assert after.device_bytes_written == before.device_bytes_written
        assert after.live_bytes == before.live_bytes
        for sid in (0, 9):
            assert store.read(sid, 0, 200_000) == payload(sid, 100_000 + sid)
        assert store.recovery_report.records_replayed == 0
    finally:
        store.close()


def test_a_closed_store_refuses_calls(store: SliceStore):
    store.close()
    with pytest.raises(StoreClosed):
        store.write(1, 0, b"x", group=0)


def test_durable_write_is_flushed_before_its_future_completes(store: SliceStore):
    drive = store.drive
    drive.start_trace()
    store.write(1, 0, b"z" * 5000, group=0, durable=True)
    trace = drive.stop_trace()
    ops = [t.op for t in trace]
    assert "write" in ops and "flush" in ops[ops.index("write") :]


@pytest.mark.parametrize(("cause", "told"), [
    (errno.EPERM, errno.EIO),  # an image made immutable: not the application's rights
    (errno.EIO, errno.EIO),
    (errno.EROFS, errno.EIO),
    (errno.ENOSPC, errno.ENOSPC),  # the host file system under the image is full
    (errno.EDQUOT, errno.ENOSPC),
])
def test_a_drive_failure_reaches_the_application_as_eio_or_enospc(cause: int, told: int) -> None:
    from shinglefs.store.errors import StoreIOError

    error = StoreIOError("write failed", drive="d", cause=OSError(cause, os.strerror(cause)))
    assert error.errno == told
