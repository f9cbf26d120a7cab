"""Failure and concurrency behaviour: a full drive, shutdown with open files, parallel writers."""

from __future__ import annotations

import errno
import threading

import pytest
from fsfixtures import FsFactory, MiB, pattern

from shinglefs.client.api import ShingleFS, connect
from shinglefs.client.config import ClientConfig
from shinglefs.client.filesystem import format_filesystem


def test_a_full_drive_is_enospc_and_space_comes_back_after_unlink(fs_factory: FsFactory) -> None:
    root = fs_factory.root
    format_filesystem(fs_factory.meta_url, [f"emulated:{root}/small.img:256M"], zone_size=16 * MiB)
    block = pattern(60, MiB)
    with connect(fs_factory.meta_url) as fs:
        # The error may come from a write or from close: both are inside the block.
        with pytest.raises(OSError) as exc, fs.open("/big", "wb") as f:
            for _ in range(400):
                f.write(block)
        assert exc.value.errno == errno.ENOSPC
        committed = fs.stat("/big").st_size
        assert committed % MiB == 0 and committed >= 64 * MiB
        with fs.open("/big", "rb") as f:  # what was committed reads back intact
            assert f.read(MiB) == block
        fs.unlink("/big")
        fs.vfs.run_deletions()
        fs.write_bytes("/again", block * 50)
        assert fs.read_bytes("/again") == block * 50


def test_close_commits_files_the_application_left_open(fs_factory: FsFactory) -> None:
    fs = ShingleFS(fs_factory.vfs())
    f = fs.open("/left-open.bin", "wb")
    f.write(b"buffered only")
    fs.close()
    with connect(fs_factory.meta_url) as again:
        assert again.read_bytes("/left-open.bin") == b"buffered only"


def test_parallel_writers_and_readers_under_a_small_budget(fs_factory: FsFactory) -> None:
    config = ClientConfig(total_buffer_bytes=12 * MiB, file_buffer_bytes=8 * MiB)
    fs = ShingleFS(fs_factory.vfs(config))
    fs.makedirs("/ckpt/step-1")
    payloads = {f"/ckpt/step-1/rank{i}.distcp": pattern(70 + i, 13 * MiB + i) for i in range(4)}
    errors: list[BaseException] = []

    def save(path: str, data: bytes) -> None:
        try:
            with fs.open(path, "wb") as f:
                for off in range(0, len(data), 3 * MiB):
                    f.write(data[off : off + 3 * MiB])
                f.raw.fsync()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save, args=item) for item in payloads.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert fs.vfs.stats()["buffered_bytes"] == 0
    readers = [
        threading.Thread(target=lambda p=p, d=d: errors.append(None) if fs.read_bytes(p) == d
                         else errors.append(AssertionError(p)))
        for p, d in payloads.items()
    ]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    assert errors == [None] * 4
    fs.close()


def test_writes_fail_once_the_drive_image_is_deleted_under_the_client(
        fs_factory: FsFactory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # The image's file lived on unlinked: writes kept succeeding into it and
    # every acknowledged byte vanished when the drive closed.
    import contextlib
    import os

    from fsfixtures import create, read_all, write_file

    from shinglefs.errors import ShingleError
    from shinglefs.zoned.emulated_zones import EmulatedZones

    monkeypatch.setattr(EmulatedZones, "IMAGE_CHECK_S", 0.0)
    vfs = fs_factory.vfs()
    kept = pattern(7, 3 * MiB)
    ino = write_file(vfs, b"kept", kept)
    os.unlink(fs_factory.root / "drive0.img")
    fh, _ = create(vfs, b"after")
    with pytest.raises(ShingleError) as failed:  # not acknowledged
        vfs.write(fh, 0, pattern(8, 3 * MiB))
        vfs.flush(fh)
    assert failed.value.errno == errno.EIO
    assert any("was deleted while in use" in r.getMessage() for r in caplog.records)
    assert read_all(vfs, ino) == kept  # what it holds stays readable: copy it off now
    with contextlib.suppress(ShingleError):
        vfs.release(fh)
    with contextlib.suppress(ShingleError):  # its last checkpoint cannot be written
        vfs.shutdown()
    assert vfs.closed


def test_a_shutdown_with_the_metadata_unreachable_asks_it_once_and_frees_the_drives(
        fs_factory: FsFactory) -> None:
    """With the metadata down every step of a shutdown that needs it waited for
    it in turn (30 s each on PostgreSQL: an unmount took minutes). Once it is
    found unreachable, the rest of those steps is skipped; the drives are
    still closed, and what was committed before is intact."""
    from fsfixtures import create, read_all, write_file

    from shinglefs.meta.errors import MetaUnavailable

    vfs = fs_factory.vfs()
    kept = write_file(vfs, b"kept", b"k" * 10_000)
    for i in range(3):  # open, written, not committed
        fh, _ino = create(vfs, b"open%d" % i)
        vfs.write(fh, 0, b"x" * 5000)
    asked: list[str] = []
    backend = vfs.meta._b  # type: ignore[attr-defined]

    def down(fn: object, mode: str) -> object:
        if threading.current_thread().name != "shinglefs-maintenance":
            asked.append(mode)
        raise MetaUnavailable("the database is down")

    backend.run = down
    with pytest.raises(MetaUnavailable):
        vfs.shutdown()
    assert len(asked) == 1, asked
    again = fs_factory.vfs()  # the drives were released
    assert read_all(again, kept) == b"k" * 10_000
