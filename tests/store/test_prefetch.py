"""Read hints: ``SliceStore.prefetch`` asks the drive for the records' spans."""

from __future__ import annotations

from pathlib import Path

from tests.store.storekit import MiB, make_drive, payload

from shinglefs.store import SliceStore
from shinglefs.store.record import BLOCK, HEADER_BLOCK
from shinglefs.zoned import EmulatedZonedDrive


class HintedDrive(EmulatedZonedDrive):
    """The real emulated drive, remembering the read hints it was given (read
    buffered: a drive reading around the page cache takes no hints)."""

    DIRECT_READS = False
    hints: list[tuple[int, int]]

    def prefetch(self, offset: int, length: int) -> None:
        self.hints.append((offset, length))
        super().prefetch(offset, length)


def _store(tmp_path: Path) -> tuple[SliceStore, HintedDrive]:
    path = tmp_path / "d.img"
    make_drive(path, zone_size=4 * MiB).close_drive()
    drive = HintedDrive.open(str(path))
    drive.hints = []
    return SliceStore.format(drive), drive


def test_a_hint_covers_the_asked_range_of_each_record_in_whole_blocks(tmp_path: Path) -> None:
    store, drive = _store(tmp_path)
    try:
        data = payload(1, 3 * MiB)
        store.write(7, 0, data, group=1)
        store.write(7, 3 * MiB, payload(2, MiB), group=1)
        store.flush()
        [(e_off, e_len, dev)] = [e for e in store.slice_log.index.extents(7) if e[0] == 0]
        assert (e_off, e_len) == (0, 3 * MiB)
        drive.hints.clear()
        store.prefetch(7, 0, 100)  # the head of the first record: header block included
        assert drive.hints == [(dev, HEADER_BLOCK + BLOCK)]
        drive.hints.clear()
        store.prefetch(7, MiB + 10, MiB)  # inside the record: payload blocks only
        start = dev + HEADER_BLOCK + MiB  # MiB + 10 rounded down to a block
        assert drive.hints == [(start, MiB + BLOCK)]  # up to 2 MiB + 10, block-aligned
        drive.hints.clear()
        store.prefetch(7, 2 * MiB, 2 * MiB)  # spans several records: one hint each
        spanned = [e for e in store.slice_log.index.extents(7) if e[0] < 4 * MiB and e[0] + e[1] > 2 * MiB]
        assert len(spanned) >= 2 and len(drive.hints) == len(spanned)
        assert sorted(drive.hints)[0][0] == dev + HEADER_BLOCK + 2 * MiB
        assert store.read(7, 0, 3 * MiB) == data  # hints change nothing
    finally:
        store.close()
        drive.close_drive()


def test_hints_for_unknown_slices_or_empty_ranges_do_nothing(tmp_path: Path) -> None:
    store, drive = _store(tmp_path)
    try:
        store.prefetch(12345, 0, MiB)
        store.prefetch(12345, 0, 0)
        assert drive.hints == []
    finally:
        store.close()
        drive.close_drive()
