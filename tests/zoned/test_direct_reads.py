"""The emulated drive reads page-aligned buffers around the page cache (O_DIRECT):
the bytes are the same as a buffered read's, bytes past a write pointer still
read as zeros, other buffers are read buffered, and a direct read leaves none
of the drive's image in the page cache (checked with ``mincore``)."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.store import SliceStore
from shinglefs.store.scrub import scrub_drive
from shinglefs.zoned import EmulatedZonedDrive

MiB = 1024 * 1024
ZONE = 8 * MiB


class BufferedReadsDrive(EmulatedZonedDrive):
    DIRECT_READS = False


def aligned(nbytes: int) -> memoryview:
    """A page-aligned buffer (an anonymous mapping)."""
    return memoryview(mmap.mmap(-1, nbytes))


def unaligned(nbytes: int) -> memoryview:
    """A buffer whose address is 8 bytes past a page boundary."""
    return aligned(nbytes + mmap.PAGESIZE)[8 : 8 + nbytes]


def resident_pages(path: Path, offset: int, length: int) -> int:
    """Pages of ``path``'s ``[offset, offset + length)`` in the page cache (``mincore``,
    which looks without faulting a page in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = -(-length // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), length, offset=offset) as m:
        anchor = ctypes.c_char.from_buffer(m)
        try:
            if libc.mincore(ctypes.addressof(anchor), length, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del anchor  # before the mapping closes
    return sum(b & 1 for b in vec)


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def written(tmp_path: Path) -> Iterator[tuple[EmulatedZonedDrive, bytes]]:
    """A drive whose zone 0 holds 3 MiB (flushed) and whose zone 1 holds 64 KiB."""
    drive = EmulatedZonedDrive.create(tmp_path / "d.img", zone_size=ZONE, zone_count=4,
                                      conventional_zones=0, max_open_zones=2)
    data = os.urandom(3 * MiB)
    drive.append(0, data)
    drive.append(1, data[: 64 * 1024])
    drive.flush()
    yield drive, data
    drive.close_drive()


def test_aligned_and_unaligned_buffers_read_the_same_bytes(
        written: tuple[EmulatedZonedDrive, bytes]) -> None:
    drive, data = written
    assert drive.reads_direct  # ext4 under /tmp takes O_DIRECT
    for make in (aligned, unaligned):
        one = make(2 * MiB)
        assert drive.readv(4096, [one]) == 2 * MiB
        assert one.tobytes() == data[4096 : 4096 + 2 * MiB]
        head, body = make(4096), make(MiB)
        drive.readv(MiB, [head, body])  # a header block and a payload in one read
        assert head.tobytes() + body.tobytes() == data[MiB : 2 * MiB + 4096]


def test_bytes_past_a_write_pointer_read_as_zeros_when_read_direct(
        written: tuple[EmulatedZonedDrive, bytes]) -> None:
    drive, data = written
    span = aligned(MiB)
    span[:] = b"\xff" * MiB
    drive.readv(ZONE, [span])  # zone 1: 64 KiB written, the rest past its pointer
    assert span.tobytes() == data[: 64 * 1024] + bytes(MiB - 64 * 1024)


def test_a_direct_read_leaves_the_image_out_of_the_page_cache(
        tmp_path: Path, written: tuple[EmulatedZonedDrive, bytes]) -> None:
    drive, _data = written
    path = tmp_path / "d.img"
    drop_cache(path)
    assert resident_pages(path, 0, 3 * MiB) == 0
    drive.readv(0, [aligned(3 * MiB)])
    assert resident_pages(path, 0, 3 * MiB) == 0  # around the page cache
    drive.readv(0, [unaligned(3 * MiB)])
    assert resident_pages(path, 0, 3 * MiB) > 0  # buffered: cached


def test_direct_reads_turned_off_read_buffered_and_keep_read_ahead_hints(
        tmp_path: Path) -> None:
    drive = BufferedReadsDrive.create(tmp_path / "b.img", zone_size=ZONE, zone_count=4,
                                      conventional_zones=0, max_open_zones=2)
    try:
        assert not drive.reads_direct and drive.abilities.prefetch
        data = os.urandom(MiB)
        drive.append(0, data)
        drive.flush()
        drop_cache(tmp_path / "b.img")
        drive.readv(0, [aligned(MiB)])
        assert resident_pages(tmp_path / "b.img", 0, MiB) > 0
    finally:
        drive.close_drive()
    direct = EmulatedZonedDrive.open(str(tmp_path / "b.img"))
    try:
        assert direct.reads_direct and not direct.abilities.prefetch
    finally:
        direct.close_drive()


def test_a_store_reads_its_records_around_the_page_cache(tmp_path: Path) -> None:
    """The slice store's verified read of a whole record (its header block into
    the scratch buffer, its payload into the caller's) takes the direct path."""
    path = tmp_path / "s.img"
    drive = EmulatedZonedDrive.create(path, zone_size=ZONE, zone_count=8,
                                      conventional_zones=1, max_open_zones=4)
    store = SliceStore.format(drive)
    try:
        data = os.urandom(3 * MiB + 4096)
        store.write(7, 0, data, group=1)
        store.flush()
        drop_cache(path)
        whole = aligned(len(data))  # a whole record, as the read-ahead reads them
        assert store.readinto(7, 0, whole) == len(data) and whole.tobytes() == data
        assert resident_pages(path, 0, 4 * ZONE) == 0
        # From the middle: the edges through the (aligned) scratch buffer, direct;
        # the whole crc blocks land at an unaligned place of ``part``: buffered.
        part = aligned(MiB)
        assert store.readinto(7, 12345, part) == MiB
        assert part.tobytes() == data[12345:12345 + MiB]
    finally:
        store.close()


def test_a_scrub_reads_the_medium_not_the_page_cache(tmp_path: Path) -> None:
    """Every extent a scrub verifies is read direct: a scrub of a whole drive
    checks what the disk holds and leaves the page cache as it found it."""
    path = tmp_path / "s.img"
    drive = EmulatedZonedDrive.create(path, zone_size=ZONE, zone_count=8,
                                      conventional_zones=1, max_open_zones=4)
    store = SliceStore.format(drive)
    try:
        for sid in range(1, 6):
            store.write(sid, 0, os.urandom(MiB + sid * 4096), group=sid)
        store.flush()
        drop_cache(path)
        state = scrub_drive(store, tmp_path / "scrub.json")
        assert state.finished and not state.damaged and state.bytes_read >= 5 * MiB
        assert resident_pages(path, ZONE, 7 * ZONE) == 0
    finally:
        store.close()


def test_gc_copies_read_the_victim_around_the_page_cache(tmp_path: Path) -> None:
    """A GC pass copies a victim's live extents without caching them: moving
    cold bytes must not fill the page cache (and evict hot data) with what is
    about to be dead. (The copies were read into a ``bytearray``, buffered: the
    scrub test above failed under load whenever background GC ran meanwhile.)"""
    path = tmp_path / "g.img"
    drive = EmulatedZonedDrive.create(path, zone_size=ZONE, zone_count=8,
                                      conventional_zones=1, max_open_zones=4)
    # every zone short: a pass collects the best victim
    store = SliceStore.format(drive, gc_background=False, gc_free_zones=7)
    try:
        for sid in range(1, 9):  # two groups share zones 1 and 2, one MiB a slice
            store.write(sid, 0, os.urandom(MiB), group=sid % 2)
        store.flush()
        store.delete_many([sid for sid in range(1, 9) if sid % 4 == 0])  # half a group dead
        store.flush()
        drop_cache(path)
        before = store.stats().gc_bytes_copied
        store.collect_garbage()
        assert store.stats().gc_bytes_copied > before  # a victim was copied
        assert resident_pages(path, ZONE, 7 * ZONE) == 0
    finally:
        store.close()
