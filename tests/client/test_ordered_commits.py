"""Ordered commits (client/commit.py): meta points only at flushed bytes; group commit."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest
from fsfixtures import FsFactory, create, pattern, read_all
from tests.support.polling import wait_until

from shinglefs.client.commit import FinishedSlice, OrderedCommits
from shinglefs.client.vfs import VFS
from shinglefs.meta.api import ROOT_INO
from shinglefs.meta.errors import FsError
from shinglefs.store import StoreIOError


def stored_slice(vfs: VFS, name: bytes, data: bytes) -> FinishedSlice:
    """A slice written to drive 0 (not flushed, not committed) of a new file."""
    _fh, ino = create(vfs, name)
    sid = vfs.meta.next_slice_id()
    vfs.node.write(sid, 0, data, ino, drive_id=0)
    return FinishedSlice(ino, 0, 0, sid, len(data), 0, ino, registered=False)


class RecordingFlush:
    """The node's real flush, noting what meta held when each flush ran."""

    def __init__(self, vfs: VFS, fail: BaseException | None = None) -> None:
        self.vfs = vfs
        self.fail = fail
        self.calls: list[tuple[list[int], int]] = []
        self.lock = threading.Lock()

    def __call__(self, drive_ids: Iterable[int]) -> None:
        ids = list(drive_ids)
        with self.lock:
            self.calls.append((ids, self.vfs.meta.statfs().used_bytes))
        if self.fail is not None:
            raise self.fail
        self.vfs.node.flush(ids)


def test_a_reference_reaches_meta_only_after_its_drive_was_flushed(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs()
    flush = RecordingFlush(vfs)
    commits = OrderedCommits(vfs.meta, flush)
    finished = stored_slice(vfs, b"f", b"x" * 5000)
    attr = commits.commit(finished, 5000)
    assert attr.size == 5000
    assert flush.calls == [([0], 0)]  # flushed while meta still held nothing
    assert vfs.meta.statfs().used_bytes == 5000
    assert read_all(vfs, finished.ino) == b"x" * 5000


def test_a_slice_the_store_already_flushed_is_committed_without_another_flush(
    fs_factory: FsFactory,
) -> None:
    vfs = fs_factory.vfs()
    flush = RecordingFlush(vfs)
    finished = stored_slice(vfs, b"f", b"y" * 100)
    vfs.node.flush([0])
    OrderedCommits(vfs.meta, flush).commit(
        FinishedSlice(**{**_fields(finished), "durable": True}), 100)
    assert flush.calls == []


def _fields(f: FinishedSlice) -> dict[str, object]:
    return {name: getattr(f, name) for name in FinishedSlice.__slots__}


def test_a_failed_flush_commits_nothing_and_raises(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs()
    error = StoreIOError("flush failed (test)", drive="drive0")
    commits = OrderedCommits(vfs.meta, RecordingFlush(vfs, fail=error))
    finished = stored_slice(vfs, b"f", b"z" * 100)
    with pytest.raises(StoreIOError):
        commits.commit(finished, 100)
    assert vfs.meta.getattr(finished.ino).size == 0
    assert vfs.meta.statfs().used_bytes == 0


def test_concurrent_commits_share_flushes_and_transactions(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs()
    flush = RecordingFlush(vfs)
    commits = OrderedCommits(vfs.meta, flush)
    slices = [stored_slice(vfs, f"f{i}".encode(), pattern(i, 3000)) for i in range(32)]
    gate = threading.Barrier(len(slices))
    errors: list[BaseException] = []

    def close(f: FinishedSlice) -> None:
        gate.wait()
        try:
            commits.commit(f, f.length)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=close, args=(f,)) for f in slices]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert commits.commits == 32
    assert commits.batches < 32  # at least two closes shared a transaction
    assert len(flush.calls) == commits.batches
    for i, f in enumerate(slices):
        assert read_all(vfs, f.ino) == pattern(i, 3000)


def test_one_failing_commit_does_not_fail_the_rest_of_its_batch(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs()
    flush = RecordingFlush(vfs)
    held = threading.Event()
    release = threading.Event()
    real = flush.__call__

    def first_flush_waits(drive_ids: Iterable[int]) -> None:
        if not held.is_set():
            held.set()
            release.wait(30)
        real(drive_ids)

    commits = OrderedCommits(vfs.meta, first_flush_waits)
    first = stored_slice(vfs, b"first", b"f" * 10)
    good = stored_slice(vfs, b"good", b"g" * 10)
    gone_ino = vfs.meta.create(ROOT_INO, b"gone", 0o644).ino
    vfs.meta.unlink(ROOT_INO, b"gone")  # never opened: freed, its commit fails with ENOENT
    sid = vfs.meta.next_slice_id()
    vfs.node.write(sid, 0, b"h" * 10, gone_ino, drive_id=0)
    gone = FinishedSlice(gone_ino, 0, 0, sid, 10, 0, gone_ino, registered=False)
    outcome: dict[str, BaseException | None] = {}

    def commit(name: str, f: FinishedSlice) -> None:
        try:
            commits.commit(f, 10)
            outcome[name] = None
        except BaseException as exc:
            outcome[name] = exc

    leader = threading.Thread(target=commit, args=("first", first))
    leader.start()
    assert held.wait(30)
    # Both queue behind the held batch and form the next one together.
    others = [threading.Thread(target=commit, args=(n, f)) for n, f in
              (("good", good), ("gone", gone))]
    for t in others:
        t.start()
    wait_until(lambda: commits.waiting >= 2, "both commits queue behind the held batch")
    assert commits.waiting == 2
    release.set()
    for t in [leader, *others]:
        t.join(60)
    assert outcome["first"] is None and outcome["good"] is None
    assert isinstance(outcome["gone"], FsError)
    assert read_all(vfs, good.ino) == b"g" * 10
    assert commits.batches == 3  # the pair's transaction failed; each was retried alone


def test_a_batch_whose_commit_is_in_doubt_is_not_retried_one_at_a_time(
    fs_factory: FsFactory,
) -> None:
    # The metadata answered "unavailable" after the batch had committed (a
    # PostgreSQL connection lost with COMMIT in flight). Retried one at a
    # time, the older of two slices of one file committed again on top of
    # the newer one, and the newer one's failed retry deleted its bytes.
    from shinglefs.meta.errors import MetaUnavailable

    vfs = fs_factory.vfs()
    held, release = threading.Event(), threading.Event()
    real_commit = vfs.meta.commit_slices

    class LostAfterCommit:
        """The real metadata, whose batch of two answers as a lost connection does."""

        def __getattr__(self, name: str) -> object:
            return getattr(vfs.meta, name)

        def commit_slices(self, commits: list) -> list:
            attrs = real_commit(commits)
            if len(commits) > 1:
                raise MetaUnavailable("connection lost with COMMIT in flight")
            return attrs

    def first_flush_waits(drive_ids: Iterable[int]) -> None:
        if not held.is_set():
            held.set()
            release.wait(30)
        vfs.node.flush(list(drive_ids))

    commits = OrderedCommits(LostAfterCommit(), first_flush_waits)  # type: ignore[arg-type]
    blocker = stored_slice(vfs, b"blocker", b"b" * 10)
    _fh, ino = create(vfs, b"f")
    older, newer = [], []
    for data, into in ((b"o" * 4096, older), (b"n" * 4096, newer)):
        sid = vfs.meta.next_slice_id()
        vfs.node.write(sid, 0, data, ino, drive_id=0)
        into.append(FinishedSlice(ino, 0, 0, sid, 4096, 0, ino, registered=False))
    outcome: dict[str, BaseException | None] = {}

    def commit(name: str, f: FinishedSlice) -> None:
        try:
            commits.commit(f, 4096)
            outcome[name] = None
        except BaseException as exc:
            outcome[name] = exc

    leader = threading.Thread(target=commit, args=("blocker", blocker))
    leader.start()
    assert held.wait(30)
    first = threading.Thread(target=commit, args=("older", older[0]))
    first.start()
    wait_until(lambda: commits.waiting >= 1, "the older slice queues first")
    second = threading.Thread(target=commit, args=("newer", newer[0]))
    second.start()
    wait_until(lambda: commits.waiting >= 2, "then the newer one")
    release.set()
    for t in (leader, first, second):
        t.join(60)
    assert isinstance(outcome["older"], MetaUnavailable)
    assert isinstance(outcome["newer"], MetaUnavailable)
    assert read_all(vfs, ino) == b"n" * 4096  # the batch did commit, in order: newer on top
