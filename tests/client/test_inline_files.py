"""Inline files: a whole small file written at once is committed into meta with
its bytes, in one transaction, and never touches a drive (docs/client.md)."""

from __future__ import annotations

import os

from fsfixtures import FsFactory, MiB, create, pattern, read_all, write_file

from shinglefs.client.config import ClientConfig
from shinglefs.client.vfs import VFS, SetAttrChanges
from shinglefs.meta.api import ROOT_CTX, ROOT_INO, is_inline_slice


def _slice_ids(vfs: VFS, ino: int) -> list[int]:
    return [r.slice_id for r in vfs.meta.get_chunk(ino, 0).refs]


def _inline_rows(vfs: VFS) -> int:
    from shinglefs.meta.dump import backend_of

    return int(backend_of(vfs.meta).run(
        lambda tx: tx.one("SELECT COUNT(*) FROM inline_slices")[0], "read"))


def test_a_small_file_is_committed_inline_and_no_drive_is_written(vfs: VFS) -> None:
    before = vfs.node.stats().user_bytes_written
    data = pattern(1, 4096)
    ino = write_file(vfs, b"small", data)
    assert vfs.node.stats().user_bytes_written == before  # no byte reached a drive
    [sid] = _slice_ids(vfs, ino)
    assert is_inline_slice(sid)
    assert vfs.meta.getattr(ino).size == 4096
    assert read_all(vfs, ino) == data


def test_a_file_past_the_inline_bound_goes_to_a_drive(vfs: VFS) -> None:
    before = vfs.node.stats().user_bytes_written
    data = pattern(2, 4097)
    ino = write_file(vfs, b"bigger", data)
    assert vfs.node.stats().user_bytes_written - before == 4097
    assert not any(is_inline_slice(s) for s in _slice_ids(vfs, ino))
    assert read_all(vfs, ino) == data


def test_inline_files_are_off_when_the_bound_is_zero(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(ClientConfig(inline_max_bytes=0))
    ino = write_file(vfs, b"tiny", b"abc")
    assert not any(is_inline_slice(s) for s in _slice_ids(vfs, ino))
    assert read_all(vfs, ino) == b"abc"


def test_appending_to_an_inline_file_layers_a_drive_slice_over_it(vfs: VFS) -> None:
    head = pattern(3, 1000)
    ino = write_file(vfs, b"grows", head)
    tail = pattern(4, 3 * MiB)
    fh = vfs.open(ino, os.O_WRONLY | os.O_APPEND, ROOT_CTX)
    vfs.write(fh, len(head), tail)
    vfs.release(fh)
    sids = _slice_ids(vfs, ino)
    assert is_inline_slice(sids[0]) and not is_inline_slice(sids[-1])
    assert read_all(vfs, ino) == head + tail
    # A read that spans both, and one inside the inline part only.
    fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    assert vfs.read(fh, 500, 1000) == (head + tail)[500:1500]
    assert vfs.read(fh, 10, 20) == head[10:30]
    vfs.release(fh)


def test_overwriting_part_of_an_inline_file_keeps_the_rest(vfs: VFS) -> None:
    model = bytearray(pattern(5, 3000))
    ino = write_file(vfs, b"patched", bytes(model))
    fh = vfs.open(ino, os.O_WRONLY, ROOT_CTX)
    vfs.write(fh, 100, b"X" * 50)
    vfs.release(fh)
    model[100:150] = b"X" * 50
    assert read_all(vfs, ino) == bytes(model)


def test_truncate_and_unlink_free_inline_bytes(vfs: VFS) -> None:
    ino = write_file(vfs, b"gone", pattern(6, 2000))
    assert _inline_rows(vfs) == 1
    vfs.setattr(ino, SetAttrChanges(size=500))
    assert read_all(vfs, ino) == pattern(6, 2000)[:500]
    assert _inline_rows(vfs) == 1  # still holds the first 500 bytes
    vfs.setattr(ino, SetAttrChanges(size=0))
    assert _inline_rows(vfs) == 0
    write_file(vfs, b"also-gone", b"bytes")
    assert _inline_rows(vfs) == 1
    vfs.unlink(ROOT_INO, b"also-gone", ROOT_CTX)
    vfs.run_deletions()
    assert _inline_rows(vfs) == 0


def test_rewriting_a_file_with_o_trunc_replaces_its_inline_bytes(vfs: VFS) -> None:
    ino = write_file(vfs, b"config.json", b'{"lr": 0.1}')
    fh = vfs.open(ino, os.O_WRONLY | os.O_TRUNC, ROOT_CTX)
    vfs.write(fh, 0, b'{"lr": 0.01}')
    vfs.release(fh)
    assert read_all(vfs, ino) == b'{"lr": 0.01}'
    assert _inline_rows(vfs) == 1  # the old bytes were freed with their reference


def test_inline_files_survive_reopening_the_file_system(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs()
    files = {f"f{i}".encode(): pattern(100 + i, 1 + 37 * i) for i in range(50)}
    inos = {name: write_file(vfs, name, data) for name, data in files.items()}
    vfs.shutdown()
    again = fs_factory.vfs()
    for name, data in files.items():
        assert read_all(again, inos[name]) == data


def test_a_handle_written_through_in_pieces_is_inline_only_if_whole(vfs: VFS) -> None:
    fh, ino = create(vfs, b"pieces")
    for off in range(0, 4096, 512):
        vfs.write(fh, off, pattern(off, 512))
    vfs.release(fh)
    assert all(is_inline_slice(s) for s in _slice_ids(vfs, ino))
    assert read_all(vfs, ino) == b"".join(pattern(off, 512) for off in range(0, 4096, 512))


def test_fsck_reads_inline_files_as_present_and_repair_keeps_them(fs_factory: FsFactory) -> None:
    from shinglefs.client.recovery import fsck

    vfs = fs_factory.vfs()
    ino = write_file(vfs, b"small", b"kept in meta")
    write_file(vfs, b"large", pattern(7, 2 * MiB))
    vfs.shutdown()
    report = fsck(fs_factory.meta_url)
    assert report.clean, {k: [f.detail for f in v] for k, v in report.found.items() if v}
    fsck(fs_factory.meta_url, repair=True)
    again = fs_factory.vfs()
    assert read_all(again, ino) == b"kept in meta"
    assert again.meta.next_slice_id() < (1 << 62)  # the id counter never jumps to inline ids


def test_reading_many_inline_files_keeps_no_memory_per_file(vfs: VFS) -> None:
    import tracemalloc

    files = {write_file(vfs, f"s{i}".encode(), pattern(i, 4096)): i for i in range(1000)}
    for ino in list(files)[:10]:  # warm up the read path's one-time allocations
        read_all(vfs, ino)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for ino, i in files.items():
            fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
            assert vfs.read(fh, 0, 128 * 1024) == pattern(i, 4096)
            vfs.release(fh)
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # The per-inode memos (a few hundred bytes a file) but never the 4 KiB of a file.
    assert growth < 1000 * 1024, f"{growth / 1024:.0f} KiB kept for 1000 inline files"
