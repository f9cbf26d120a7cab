"""Crash model: fsynced bytes survive process death plus a drive power cut."""

from __future__ import annotations

import os

from fsfixtures import FsFactory, MiB, create, pattern, read_all

from shinglefs.client.filesystem import open_filesystem
from shinglefs.meta.api import ROOT_CTX, ROOT_INO


def power_cut(vfs) -> None:  # type: ignore[no-untyped-def]
    drives = [vfs.node.store(d).drive for d in vfs.node.drive_ids]
    vfs.abandon()
    for drive in drives:
        drive.simulate_power_cut()


def test_fsynced_bytes_survive_process_death_and_power_cut(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs()
    durable = pattern(50, 6 * MiB + 123)
    fh, ino = create(vfs, b"ckpt.distcp")
    vfs.write(fh, 0, durable)
    vfs.fsync(fh, True)
    vfs.write(fh, len(durable), pattern(51, 3 * MiB))  # never fsynced
    fh2, ino2 = create(vfs, b"unsynced")
    vfs.write(fh2, 0, pattern(52, 100))
    power_cut(vfs)

    again = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(again)
    data = read_all(again, ino)
    assert data[: len(durable)] == durable
    assert again.lookup(ROOT_INO, b"ckpt.distcp", ROOT_CTX).ino == ino
    # Bytes written after the fsync were never committed: the file ends at the fsync.
    assert len(data) == len(durable)
    assert again.getattr(ino2).size == 0
    fh = again.open(ino, os.O_WRONLY | os.O_APPEND, ROOT_CTX)
    again.write(fh, 0, b"after restart")
    again.release(fh)
    assert read_all(again, ino)[len(durable):] == b"after restart"


def test_closed_files_survive_a_power_cut_without_fsync(fs_factory: FsFactory) -> None:
    """Ordered commits: meta points only at flushed bytes, so a power cut right
    after close loses nothing that meta references (here SQLite keeps the
    commit; if it lost it, the file would be empty, never unreadable)."""
    vfs = fs_factory.vfs()
    closed = pattern(60, 4096)
    ino_a = write_small(vfs, b"closed-only", closed)
    fh, ino_b = create(vfs, b"large")
    big = pattern(61, 9 * MiB + 5)  # a streamed slice and a tail piece
    vfs.write(fh, 0, big)
    vfs.flush(fh)
    power_cut(vfs)

    again = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(again)
    assert read_all(again, ino_a) == closed
    assert read_all(again, ino_b) == big


def write_small(vfs, name: bytes, data: bytes) -> int:  # type: ignore[no-untyped-def]
    fh, ino = create(vfs, name)
    vfs.write(fh, 0, data)
    vfs.flush(fh)
    vfs.release(fh)
    return ino


def test_janitor_deletes_slices_a_crashed_client_left_writing(fs_factory: FsFactory) -> None:
    import pytest

    from shinglefs.meta.errors import FsError
    from shinglefs.server.errors import SliceMissing

    crashed = fs_factory.vfs()
    fh, _ino = create(crashed, b"half-written")
    crashed.write(fh, 0, pattern(70, 5 * MiB))  # the first 4 MiB piece is stored + registered
    crashed.node.flush()
    power_cut(crashed)  # loses nothing flushed; the dead process's drives are closed

    janitor = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(janitor)
    left = [s.id for s in janitor.meta.abandoned_slices(0.0)]
    assert len(left) == 1
    assert len(janitor.node.read(left[0], 0, MiB)) == MiB  # its bytes hold drive space
    # A slice this client is writing right now is not touched.
    fh2, ino2 = create(janitor, b"in-progress")
    janitor.write(fh2, 0, pattern(71, 5 * MiB))
    assert janitor.jobs.janitor.run(older_than_s=0.0) == 1
    janitor.run_deletions()
    with pytest.raises(SliceMissing):
        janitor.node.read(left[0], 0, 1)
    with pytest.raises(FsError):
        janitor.meta.get_slice(left[0])
    janitor.release(fh2)
    assert read_all(janitor, ino2) == pattern(71, 5 * MiB)
