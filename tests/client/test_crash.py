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


def test_fsync_of_one_file_makes_files_closed_earlier_durable_too(fs_factory: FsFactory) -> None:
    from shinglefs.client.config import ClientConfig

    vfs = fs_factory.vfs(ClientConfig(writeback_interval=3600.0))
    closed = pattern(60, 4096)
    ino_a = write_small(vfs, b"closed-only", closed)  # close: readable, not flushed
    fh, ino_b = create(vfs, b"synced")
    vfs.write(fh, 0, b"synced bytes")
    vfs.fsync(fh, False)
    power_cut(vfs)

    again = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(again)
    assert read_all(again, ino_a) == closed
    assert read_all(again, ino_b) == b"synced bytes"


def test_writeback_makes_closed_files_durable_without_fsync(fs_factory: FsFactory) -> None:
    import time

    from shinglefs.client.config import ClientConfig

    vfs = fs_factory.vfs(ClientConfig(writeback_interval=0.05, deletion_interval=0.02))
    data = pattern(61, 10_000)
    ino = write_small(vfs, b"closed", data)
    deadline = time.monotonic() + 5
    while vfs._unflushed and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # the flush that emptied the set has returned
    power_cut(vfs)

    again = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(again)
    assert read_all(again, ino) == data


def write_small(vfs, name: bytes, data: bytes) -> int:  # type: ignore[no-untyped-def]
    fh, ino = create(vfs, name)
    vfs.write(fh, 0, data)
    vfs.flush(fh)
    vfs.release(fh)
    return ino
