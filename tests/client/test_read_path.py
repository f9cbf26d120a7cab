"""The read path: shared extent cache, readahead, concurrent readers, compaction."""

from __future__ import annotations

import os
import random
import threading

from fsfixtures import FsFactory, MiB, create, pattern, read_all, write_file
from tests.support.polling import wait_until

from shinglefs.client.config import ClientConfig
from shinglefs.client.vfs import VFS
from shinglefs.meta.api import ROOT_CTX, ROOT_INO


def test_sequential_reader_reads_ahead_at_least_8mib(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(ClientConfig(readahead_bytes=16 * MiB, read_extent=4 * MiB))
    data = pattern(30, 40 * MiB)
    ino = write_file(vfs, b"shard.tar", data)
    fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    out = bytearray()
    pos = 0
    for _ in range(4):  # four 128 KiB kernel-sized reads
        out += vfs.read(fh, pos, 128 * 1024)
        pos += 128 * 1024
    # Only the first extent was asked for; the next 8+ MiB were requested in the background.
    slice_id = vfs.meta.get_chunk(ino, 0).refs[0].slice_id
    ahead = (pos + 8 * MiB) // (4 * MiB)
    for index in range(1, ahead + 1):
        pending = vfs.cache.extent_read(slice_id, index)
        assert pending is not None, f"extent {index} was not read ahead"
        pending.result(timeout=30)
    assert vfs.cache.drive_bytes >= 8 * MiB + pos
    while pos < len(data):
        out += vfs.read(fh, pos, MiB)
        pos += MiB
    vfs.release(fh)
    assert bytes(out) == data
    # Every extent of the file was read from the drive once.
    assert vfs.cache.drive_reads == 40 * MiB // (4 * MiB)


def test_concurrent_readers_share_drive_reads(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(ClientConfig(readahead_bytes=8 * MiB, read_extent=MiB))
    data = pattern(31, 16 * MiB)
    ino = write_file(vfs, b"dataset", data)
    results: list[bytes] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def reader() -> None:
        try:
            fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
            barrier.wait()
            chunks = [vfs.read(fh, off, 256 * 1024) for off in range(0, len(data), 256 * 1024)]
            vfs.release(fh)
            results.append(b"".join(chunks))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [data] * 4
    assert vfs.cache.drive_reads == 16  # each 1 MiB extent once, not once per reader


def test_random_reads_of_an_overlaid_file(vfs: VFS) -> None:
    model = bytearray(pattern(32, 3 * MiB))
    fh, _ino = create(vfs, b"rand")
    vfs.write(fh, 0, bytes(model))
    rng = random.Random(5)
    for i in range(30):
        off = rng.randrange(0, len(model) - 5000)
        chunk = pattern(100 + i, rng.randrange(1, 5000))
        vfs.write(fh, off, chunk)
        model[off : off + len(chunk)] = chunk
    vfs.flush(fh)
    for _ in range(50):
        off = rng.randrange(0, len(model))
        n = rng.randrange(1, 300_000)
        assert vfs.read(fh, off, n) == bytes(model[off : off + n])
    vfs.release(fh)


def test_compaction_rewrites_a_fragmented_chunk_preserving_bytes(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(ClientConfig(compaction=False), chunk_size=4 * MiB)
    model = bytearray(pattern(33, 6 * MiB))
    fh, ino = create(vfs, b"frag")
    vfs.write(fh, 0, bytes(model[: 2 * MiB]))
    vfs.write(fh, 3 * MiB, bytes(model[3 * MiB :]))  # [2, 3) MiB stays a hole
    model[2 * MiB : 3 * MiB] = bytes(MiB)
    rng = random.Random(6)
    for i in range(20):
        off = rng.randrange(0, 4 * MiB - 9000)
        if 2 * MiB - 9000 < off < 3 * MiB:
            continue
        chunk = pattern(200 + i, rng.randrange(1, 9000))
        vfs.write(fh, off, chunk)
        model[off : off + len(chunk)] = chunk
    vfs.release(fh)
    before = vfs.meta.get_chunk(ino, 0)
    old_slices = {r.slice_id for r in before.refs}
    assert len(before.refs) > 10
    assert vfs.compact_chunk(ino, 0)
    after = vfs.meta.get_chunk(ino, 0)
    assert len({r.slice_id for r in after.refs}) == 1
    assert len(after.refs) == 2  # the hole stays a hole: two runs of one new slice
    assert read_all(vfs, ino) == bytes(model)
    vfs.run_deletions()
    assert not any(vfs.node.contains(s) for s in old_slices)
    assert read_all(vfs, ino) == bytes(model)


def test_background_compaction_triggers_after_many_small_writes(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(ClientConfig(compact_threshold=8, deletion_interval=0.05))
    fh, ino = create(vfs, b"hot")
    model = bytearray(64 * 1024)
    vfs.write(fh, 0, bytes(model))
    for i in range(9):
        vfs.write(fh, i * 5000, b"%d" % i)
        model[i * 5000 : i * 5000 + 1] = b"%d" % i
        vfs.flush(fh)
    wait_until(lambda: vfs.stats()["compactions"] >= 1, "a background compaction", limit=10.0)
    assert len(vfs.meta.get_chunk(ino, 0).refs) < 9
    assert vfs.read(fh, 0, len(model)) == bytes(model)
    vfs.release(fh)


def test_a_log_fsynced_every_line_is_compacted_while_it_is_written(fs_factory: FsFactory) -> None:
    """An O_APPEND log fsynced after every line commits a slice a line. The
    background compaction must keep up while the writer never pauses (each
    swap used to lose to the writer's next commit, and the chunk kept every
    line as a reference), and must not rewrite the whole log each time."""
    vfs = fs_factory.vfs(ClientConfig(compact_threshold=8, deletion_interval=0.05))
    fh, ino = create(vfs, b"train.log", flags=os.O_RDWR | os.O_APPEND)
    model = bytearray()
    peak = 0
    for i in range(600):
        line = b"step %6d loss %.6f\n" % (i, 1.0 / (i + 1))
        vfs.write(fh, len(model), line)
        model += line
        vfs.fsync(fh)
        if i % 25 == 24:
            peak = max(peak, len(vfs.meta.get_chunk(ino, 0).refs))
    print("peak references", peak, vfs.stats())
    assert peak <= 64
    wait_until(lambda: len(vfs.meta.get_chunk(ino, 0).refs) <= 24, "the log compacted", limit=20.0)
    stats = vfs.stats()
    assert stats["compactions"] >= 600 // 8 // 2
    # Size-tiered: a byte is rewritten about log2(600) times at most, not once per compaction.
    assert stats["compacted_bytes"] <= 12 * len(model), stats
    assert vfs.read(fh, 0, len(model) + 10) == bytes(model)
    vfs.release(fh)
    assert read_all(vfs, ino) == bytes(model)


def test_lookup_of_missing_name_is_enoent(vfs: VFS) -> None:
    import errno

    import pytest

    from shinglefs.errors import ShingleError

    with pytest.raises(ShingleError) as exc:
        vfs.lookup(ROOT_INO, b"nope", ROOT_CTX)
    assert exc.value.errno == errno.ENOENT


def test_compact_fragmented_finds_chunks_through_meta(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(ClientConfig(compaction=False, compact_threshold=4))
    fh, ino = create(vfs, b"frag")
    model = bytearray(pattern(34, 300_000))
    vfs.write(fh, 0, bytes(model))
    for i in range(6):
        vfs.write(fh, i * 40_000, b"abc")
        model[i * 40_000 : i * 40_000 + 3] = b"abc"
        vfs.flush(fh)
    vfs.release(fh)
    assert len(vfs.meta.get_chunk(ino, 0).refs) == 7
    assert vfs.compact_fragmented() == 1
    assert len(vfs.meta.get_chunk(ino, 0).refs) == 1
    assert read_all(vfs, ino) == bytes(model)
