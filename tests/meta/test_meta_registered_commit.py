"""The commit of a registered slice needs its record, on every backend.

A writer registers a slice (``add_slice``, WRITING) before its bytes reach a
drive. If the writer goes silent past the abandoned age, a janitor discards
the slice and the deletion consumer deletes its bytes, then acks: the record
is gone. The writer's late commit (``SliceCommit.registered``) must then be
refused -- ESTALE, as while the record is still queued (to_delete) -- and
never record the slice anew: a file would point at deleted bytes (EIO on
read). An unregistered slice (stored in one piece, or inline) is still
registered by its commit.
"""

from __future__ import annotations

import errno as E

import pytest

from shinglefs.meta.api import (
    INLINE_SLICE_BIT,
    LOCAL_SERVER,
    ROOT_INO,
    Replica,
    SliceCommit,
    SliceInfo,
    SliceRef,
    SliceState,
)
from shinglefs.meta.errors import FsError, SliceStateError

LENGTH = 4096
REPLICA = Replica(LOCAL_SERVER, "0")


def registered(meta, name: bytes) -> tuple[int, int]:
    """A new file and a slice registered WRITING for it: ``(ino, slice_id)``."""
    ino = meta.create(ROOT_INO, name, 0o644).ino
    sid = meta.next_slice_id()
    meta.add_slice(SliceInfo(sid, 0, replicas=(REPLICA,)))
    return ino, sid


def commit_of(ino: int, sid: int, *, is_registered: bool = True) -> SliceCommit:
    return SliceCommit(ino, 0, SliceRef(sid, 0, LENGTH, 0), LENGTH, slice_length=LENGTH,
                       replicas=(REPLICA,), registered=is_registered)


def delete_as_the_consumer_would(meta, sid: int) -> None:
    """The janitor discards ``sid``; the deletion consumer pops it, deletes its
    bytes and acks: the slice record is removed."""
    assert meta.discard_slices([sid]) == [sid]
    assert sid in {s.id for s in meta.pop_deletions()}
    meta.ack_deletions([sid])
    with pytest.raises(FsError) as gone:
        meta.get_slice(sid)
    assert gone.value.errno == E.ENOENT


def test_a_registered_slice_deleted_meanwhile_is_refused_not_recreated(meta, check) -> None:
    ino, sid = registered(meta, b"late")
    delete_as_the_consumer_would(meta, sid)
    with pytest.raises(SliceStateError) as refused:
        meta.commit_slices([commit_of(ino, sid)])
    assert refused.value.errno == E.ESTALE
    assert refused.value.state == "gone"
    with pytest.raises(FsError) as still_gone:
        meta.get_slice(sid)
    assert still_gone.value.errno == E.ENOENT
    assert meta.getattr(ino).size == 0
    assert meta.read_map(ino, 0, LENGTH) == []
    check()


def test_a_registered_slice_still_queued_is_refused(meta, check) -> None:
    ino, sid = registered(meta, b"queued")
    assert meta.discard_slices([sid]) == [sid]
    with pytest.raises(SliceStateError) as refused:
        meta.commit_slices([commit_of(ino, sid)])
    assert refused.value.errno == E.ESTALE
    assert refused.value.state == SliceState.TO_DELETE.value
    assert meta.get_slice(sid).state is SliceState.TO_DELETE
    assert meta.getattr(ino).size == 0
    check()


def test_a_batch_with_one_deleted_registered_slice_commits_nothing(meta, check) -> None:
    kept_ino, kept = registered(meta, b"kept")
    late_ino, late = registered(meta, b"late")
    delete_as_the_consumer_would(meta, late)
    with pytest.raises(SliceStateError):
        meta.commit_slices([commit_of(kept_ino, kept), commit_of(late_ino, late)])
    assert meta.get_slice(kept).state is SliceState.WRITING
    assert meta.getattr(kept_ino).size == 0
    # Committed alone (as OrderedCommits retries a failed batch), the live one goes in.
    [attr] = meta.commit_slices([commit_of(kept_ino, kept)])
    assert attr.size == LENGTH
    check()


def test_a_registered_slice_commits_and_takes_its_length_and_replicas(meta, check) -> None:
    ino, sid = registered(meta, b"f")
    other = Replica(LOCAL_SERVER, "1")
    c = commit_of(ino, sid)
    meta.commit_slices([SliceCommit(c.ino, c.chunk_index, c.piece, c.new_size,
                                    slice_length=LENGTH, replicas=(other,), registered=True)])
    info = meta.get_slice(sid)
    assert (info.state, info.refcount, info.length, info.replicas) == (
        SliceState.COMMITTED, 1, LENGTH, (other,))
    assert [p.slice_id for p in meta.read_map(ino, 0, LENGTH)] == [sid]
    # A second reference to the committed slice (a second file, say) is one more count.
    again = meta.create(ROOT_INO, b"g", 0o644).ino
    meta.commit_slices([commit_of(again, sid)])
    assert meta.get_slice(sid).refcount == 2
    check()


def test_an_unregistered_slice_is_registered_by_its_commit(meta, check) -> None:
    ino = meta.create(ROOT_INO, b"small", 0o644).ino
    sid = meta.next_slice_id()
    meta.commit_slices([commit_of(ino, sid, is_registered=False)])
    info = meta.get_slice(sid)
    assert (info.state, info.refcount, info.replicas) == (SliceState.COMMITTED, 1, (REPLICA,))
    check()


def test_an_inline_slice_cannot_be_committed_as_registered(meta, check) -> None:
    ino = meta.create(ROOT_INO, b"inline", 0o644).ino
    sid = meta.next_slice_id() | INLINE_SLICE_BIT
    data = b"x" * 10
    bad = SliceCommit(ino, 0, SliceRef(sid, 0, len(data), 0), len(data), inline=data,
                      registered=True)
    with pytest.raises(FsError) as refused:
        meta.commit_slices([bad])
    assert refused.value.errno == E.EINVAL
    assert meta.getattr(ino).size == 0
    check()


def test_a_compaction_whose_slice_was_deleted_meanwhile_changes_nothing(meta, check) -> None:
    ino = meta.create(ROOT_INO, b"fragmented", 0o644).ino
    for k in range(3):  # three unregistered pieces: a chunk worth compacting
        meta.commit_slice(ino, 0, SliceRef(meta.next_slice_id(), k * 100, 100), (k + 1) * 100)
    chunk = meta.get_chunk(ino, 0)
    sid = meta.next_slice_id()
    meta.add_slice(SliceInfo(sid, 0, replicas=(REPLICA,)))  # the compactor's new slice
    delete_as_the_consumer_would(meta, sid)
    with pytest.raises(SliceStateError) as refused:
        meta.replace_chunk(ino, 0, chunk.version, SliceRef(sid, 0, 300), slice_length=300,
                           registered=True)
    assert refused.value.errno == E.ESTALE
    assert meta.get_chunk(ino, 0) == chunk
    with pytest.raises(FsError) as gone:
        meta.get_slice(sid)
    assert gone.value.errno == E.ENOENT
    check()
