"""The write path: streamed pieces, one slice per chunk, overlays, bounded memory, groups."""

from __future__ import annotations

import errno
import os

import pytest
from fsfixtures import FsFactory, MiB, create, pattern, read_all, write_file

from shinglefs.client.config import ClientConfig
from shinglefs.client.vfs import VFS, SetAttrChanges
from shinglefs.errors import ShingleError
from shinglefs.meta.api import ROOT_CTX, ROOT_INO, SliceState
from shinglefs.meta.errors import FsError
from shinglefs.server.errors import SliceMissing


def test_sequential_write_is_streamed_in_4mib_pieces_before_close(vfs: VFS) -> None:
    fh, ino = create(vfs, b"big")
    data = pattern(1, 20 * MiB)
    drive = vfs.node.store(0).drive
    before = vfs.node.stats().user_bytes_written
    drive.start_trace()
    for off in range(0, len(data), MiB):
        vfs.write(fh, off, data[off : off + MiB])
    vfs.node.flush()  # let the store finish what it was given; the file stays open
    trace = drive.stop_trace()
    # Still open, never flushed by the application: 20 MiB reached the store as five
    # 4 MiB pieces, and the drive saw them written as zone appends.
    streamed = vfs.node.stats().user_bytes_written - before
    writer = vfs.inodes.writer(ino)
    assert streamed == 20 * MiB
    assert writer.pieces_submitted == 5
    assert writer.slices_committed == 0
    assert sum(t.length for t in trace if t.op == "write") >= 20 * MiB
    vfs.release(fh)
    assert read_all(vfs, ino) == data


def test_a_sequential_chunk_becomes_one_slice(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(chunk_size=8 * MiB)
    fh, ino = create(vfs, b"seq")
    data = pattern(2, 20 * MiB)
    for off in range(0, len(data), 3 * MiB):
        vfs.write(fh, off, data[off : off + 3 * MiB])
    vfs.release(fh)
    for chunk_index, expected in [(0, 8 * MiB), (1, 8 * MiB), (2, 4 * MiB)]:
        chunk = vfs.meta.get_chunk(ino, chunk_index)
        assert len(chunk.refs) == 1
        assert chunk.refs[0].length == expected
    assert read_all(vfs, ino) == data


def test_getattr_size_includes_buffered_writes(vfs: VFS) -> None:
    fh, ino = create(vfs, b"buffered")
    vfs.write(fh, 0, b"x" * 1000)
    assert vfs.meta.getattr(ino).size == 0  # nothing committed yet
    assert vfs.getattr(ino).size == 1000
    vfs.flush(fh)
    assert vfs.meta.getattr(ino).size == 1000
    vfs.release(fh)


def test_overwrites_become_overlays_that_read_back_exact(vfs: VFS) -> None:
    fh, ino = create(vfs, b"overlay")
    model = bytearray(pattern(3, 6 * MiB))
    vfs.write(fh, 0, bytes(model))
    for i, (off, n) in enumerate([(100, 10), (4 * MiB - 5, 20), (5, 3 * MiB), (6 * MiB - 1, 1)]):
        chunk = pattern(10 + i, n)
        vfs.write(fh, off, chunk)
        model[off : off + n] = chunk
    # Read before close: sees this client's own buffered writes.
    assert vfs.read(fh, 0, len(model) + 100) == bytes(model)
    vfs.release(fh)
    assert read_all(vfs, ino) == bytes(model)


def test_scattered_overlapping_small_writes_commit_in_write_order(vfs: VFS) -> None:
    # Each non-sequential write ends a slice; their settles queue their commits
    # one after the other and share batches (one transaction for several), so
    # a later write to the same bytes must still overlay an earlier one.
    import random

    fh, ino = create(vfs, b"scatter")
    size = 2 * MiB
    model = bytearray(pattern(40, size))
    vfs.write(fh, 0, bytes(model))
    vfs.flush(fh)
    rng = random.Random(41)
    before = vfs.writes.commits.commits
    for i in range(600):
        offset = rng.randrange(0, size - 8192) & ~511  # few distinct spots: overlaps
        offset %= 64 * 4096
        data = bytes([i % 251]) * rng.choice((512, 4096, 8192))
        vfs.write(fh, offset, data)
        model[offset:offset + len(data)] = data
    vfs.flush(fh)
    assert vfs.writes.commits.commits - before >= 300  # many slices: the settles did run
    vfs.release(fh)
    assert read_all(vfs, ino) == bytes(model)


def test_writes_past_eof_leave_holes_that_read_as_zeros(vfs: VFS) -> None:
    fh, ino = create(vfs, b"holes")
    vfs.write(fh, 10 * MiB, b"tail")
    vfs.write(fh, 100, b"head")
    vfs.release(fh)
    data = read_all(vfs, ino)
    assert len(data) == 10 * MiB + 4
    assert data[100:104] == b"head" and data[-4:] == b"tail"
    assert data[:100] == bytes(100) and data[104 : 10 * MiB] == bytes(10 * MiB - 104)


def test_truncate_down_then_up_reads_zeros_in_the_regrown_part(vfs: VFS) -> None:
    fh, ino = create(vfs, b"trunc")
    data = pattern(4, 5 * MiB)
    vfs.write(fh, 0, data)
    vfs.setattr(ino, SetAttrChanges(size=MiB + 7), fh, ROOT_CTX)
    assert vfs.getattr(ino).size == MiB + 7
    assert vfs.read(fh, 0, 10 * MiB) == data[: MiB + 7]
    vfs.setattr(ino, SetAttrChanges(size=3 * MiB), fh, ROOT_CTX)
    assert vfs.read(fh, 0, 10 * MiB) == data[: MiB + 7] + bytes(3 * MiB - MiB - 7)
    vfs.release(fh)


def test_ftruncate_extend_then_fill_like_safetensors(vfs: VFS) -> None:
    fh, ino = create(vfs, b"st.tmp")
    vfs.setattr(ino, SetAttrChanges(size=9 * MiB), fh, ROOT_CTX)
    data = pattern(5, 9 * MiB)
    for off in range(0, len(data), MiB):
        vfs.write(fh, off, data[off : off + MiB])
    vfs.release(fh)
    assert vfs.getattr(ino).size == 9 * MiB
    assert read_all(vfs, ino) == data


def test_o_append_writes_at_the_end(vfs: VFS) -> None:
    fh, ino = create(vfs, b"log")
    vfs.write(fh, 0, b"first\n")
    vfs.release(fh)
    fh = vfs.open(ino, os.O_WRONLY | os.O_APPEND, ROOT_CTX)
    vfs.write(fh, 0, b"second\n")  # offset ignored under O_APPEND
    vfs.write(fh, 0, b"third\n")
    vfs.release(fh)
    assert read_all(vfs, ino) == b"first\nsecond\nthird\n"


def test_o_trunc_on_open_empties_the_file(vfs: VFS) -> None:
    fh, ino = create(vfs, b"t")
    vfs.write(fh, 0, b"old contents")
    vfs.release(fh)
    fh = vfs.open(ino, os.O_WRONLY | os.O_TRUNC, ROOT_CTX)
    vfs.write(fh, 0, b"new")
    vfs.release(fh)
    assert read_all(vfs, ino) == b"new"


def test_buffered_bytes_stay_under_the_client_budget(fs_factory: FsFactory) -> None:
    config = ClientConfig(total_buffer_bytes=8 * MiB, file_buffer_bytes=8 * MiB)
    vfs = fs_factory.vfs(config)
    handles = [create(vfs, f"f{i}".encode()) for i in range(3)]
    block = pattern(6, MiB)
    peak = 0
    for step in range(12):
        for fh, _ino in handles:
            vfs.write(fh, step * MiB, block)
            peak = max(peak, vfs.stats()["buffered_bytes"])
    assert peak <= 8 * MiB + MiB  # one write may be admitted alone past a drained budget
    for fh, ino in handles:
        vfs.release(fh)
        assert read_all(vfs, ino) == block * 12


def test_large_file_is_its_own_group_and_small_file_joins_its_directory(vfs: VFS) -> None:
    d = vfs.mkdir(ROOT_INO, b"dir", 0o755, ROOT_CTX)
    fh, small = create(vfs, b"small.json", d.ino)
    vfs.write(fh, 0, b"{" * 10000 + b"}")  # past inline_max_bytes: it goes to a drive
    vfs.release(fh)
    fh, large = create(vfs, b"large.bin", d.ino)
    vfs.write(fh, 0, pattern(7, 5 * MiB))
    vfs.release(fh)
    small_slice = vfs.meta.get_chunk(small, 0).refs[0].slice_id
    large_slice = vfs.meta.get_chunk(large, 0).refs[0].slice_id
    assert vfs.meta.get_slice(small_slice).group == d.ino
    assert vfs.meta.get_slice(large_slice).group == large
    replicas = vfs.meta.get_slice(large_slice).replicas
    assert [(r.server, r.drive) for r in replicas] == [("local", "0")]


def test_a_group_policy_hook_chooses_the_group(fs_factory: FsFactory) -> None:
    from shinglefs.client.filesystem import open_filesystem
    from shinglefs.client.groups import GroupPolicy

    class StepGroups(GroupPolicy):  # e.g. a retention directory's child
        def group_for(self, ino: int, parent: int | None, small: bool) -> int:
            return 4242

    fs_factory.format()
    vfs = open_filesystem(fs_factory.meta_url, groups=StepGroups())
    fs_factory.opened.append(vfs)
    ino = write_file(vfs, b"x", pattern(8, 5 * MiB))
    slice_id = vfs.meta.get_chunk(ino, 0).refs[0].slice_id
    assert vfs.meta.get_slice(slice_id).group == 4242


def test_two_large_files_land_on_two_drives_and_each_slice_stays_whole(
    fs_factory: FsFactory,
) -> None:
    vfs = fs_factory.vfs(drives=2)
    first = write_file(vfs, b"a.bin", pattern(9, 12 * MiB))
    second = write_file(vfs, b"b.bin", pattern(10, 12 * MiB))
    drives = []
    for ino in (first, second):
        slice_id = vfs.meta.get_chunk(ino, 0).refs[0].slice_id
        (replica,) = vfs.meta.get_slice(slice_id).replicas
        drive = int(replica.drive)
        assert vfs.node.store(drive).length(slice_id) == 12 * MiB  # all pieces on one drive
        assert not vfs.node.store(1 - drive).contains(slice_id)
        drives.append(drive)
    assert sorted(drives) == [0, 1]  # the second file's group went to the freer drive
    assert read_all(vfs, first) == pattern(9, 12 * MiB)


def test_a_small_file_costs_one_commit_that_records_its_replica(vfs: VFS) -> None:
    """A file written in one piece is not registered separately: its commit
    records the slice's replica, the slice is committed, and it reads back."""
    fh, ino = create(vfs, b"small")
    data = b"hello small file" * 1000  # past inline_max_bytes: it goes to a drive
    vfs.write(fh, 0, data)
    vfs.flush(fh)
    vfs.release(fh)
    pieces = vfs.meta.read_map(ino, 0, 100)
    assert len(pieces) == 1 and pieces[0].slice_id is not None
    info = vfs.meta.get_slice(pieces[0].slice_id)
    assert info.state == SliceState.COMMITTED
    assert [(r.server, r.drive) for r in info.replicas] == [("local", "0")]
    assert read_all(vfs, ino) == data
    vfs.unlink(ROOT_INO, b"small")
    vfs.run_deletions()
    with pytest.raises(SliceMissing):
        vfs.node.read(pieces[0].slice_id, 0, 1)


@pytest.mark.parametrize("in_doubt", [False, True])
def test_bytes_whose_commit_failed_fail_every_later_write_past_them(
        fs_factory: FsFactory, in_doubt: bool) -> None:
    """An fsync whose commit failed (a constraint, or the metadata unreachable
    with the commit in doubt: a PostgreSQL stopped mid-write) reports it once;
    the bytes it covered are lost as a failed piece's are, so every later write
    past them fails too, until they are written again. Before, the next writes,
    fsyncs and the close succeeded over a hole of zeros (a review saw 16 MiB of
    zeros in a 400 MiB file whose close returned 0)."""
    from shinglefs.meta.errors import MetaUnavailable

    vfs = fs_factory.vfs()
    fh, ino = create(vfs, b"f")
    blocks = [bytes([65 + i]) * MiB for i in range(4)]
    vfs.write(fh, 0, blocks[0])
    vfs.fsync(fh)
    real = vfs.meta.commit_slices
    failure = MetaUnavailable("connection lost") if in_doubt else FsError(errno.EIO, "refused")

    def fails_once(commits: list) -> list:
        vfs.meta.commit_slices = real  # type: ignore[method-assign]
        raise failure

    vfs.meta.commit_slices = fails_once  # type: ignore[method-assign]
    vfs.write(fh, MiB, blocks[1])
    with pytest.raises(ShingleError) as first:
        vfs.fsync(fh)
    assert first.value.errno == errno.EIO
    for _ in range(2):  # sticky: past the lost MiB nothing is taken
        with pytest.raises(ShingleError) as later:
            vfs.write(fh, 2 * MiB, blocks[2])
        assert later.value.errno == errno.EIO
        assert "offset 1048576" in str(later.value)
    vfs.write(fh, MiB, blocks[1])  # the lost bytes written again: whole again
    vfs.write(fh, 2 * MiB, blocks[2])
    vfs.fsync(fh)
    vfs.release(fh)
    assert read_all(vfs, ino) == b"".join(blocks[:3])


@pytest.mark.parametrize("case", ["not committed", "not committed, registered", "committed"])
def test_a_slice_whose_commit_was_in_doubt_is_settled_once_meta_answers(
        fs_factory: FsFactory, case: str) -> None:
    """A commit that failed with the metadata unreachable may have happened:
    the slice's bytes are kept, and once meta answers they are deleted if it
    did not (registered: queued through meta; never recorded: deleted on the
    drive), kept if it did. Before, they stayed for good and fsck said
    "damaged" (unknown slices) after every metadata outage during a write."""
    from shinglefs.client.recovery import fsck
    from shinglefs.meta.errors import MetaUnavailable

    vfs = fs_factory.vfs()
    vfs.jobs.in_doubt.grace_s = 0
    fh, ino = create(vfs, b"f")
    vfs.write(fh, 0, b"a" * MiB)
    vfs.fsync(fh)
    real = vfs.meta.commit_slices

    def unavailable(commits: list) -> list:
        vfs.meta.commit_slices = real  # type: ignore[method-assign]
        if case == "committed":
            real(commits)
        raise MetaUnavailable("connection lost with COMMIT in flight")

    vfs.meta.commit_slices = unavailable  # type: ignore[method-assign]
    second = b"b" * (6 * MiB if case.endswith("registered") else MiB)
    for off in range(0, len(second), MiB):  # pieces of 4 MiB go while writing: registered
        vfs.write(fh, MiB + off, second[off:off + MiB])
    with pytest.raises(MetaUnavailable):
        vfs.fsync(fh)
    assert len(vfs.jobs.in_doubt) == 1
    assert vfs.jobs.in_doubt.resolve() == 1
    assert len(vfs.jobs.in_doubt) == 0
    vfs.release(fh)
    vfs.run_deletions()
    want = b"a" * MiB + (second if case == "committed" else b"")
    assert read_all(vfs, ino) == want
    vfs.shutdown()
    report = fsck(fs_factory.meta_url)
    assert report.clean, report
