"""The content map: slice overlay, truncate, holes, compaction, slices and deletions."""

from __future__ import annotations

import errno as E
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shinglefs.meta import open_meta
from shinglefs.meta.api import (
    ROOT_INO,
    ReadPiece,
    Replica,
    SessionInfo,
    SliceCommit,
    SliceInfo,
    SliceRef,
    SliceState,
)
from shinglefs.meta.check import check_consistency
from shinglefs.meta.errors import ChunkChanged, FsError, SliceStateError

MiB = 1 << 20
CHUNK = 64 * MiB


def errno_of(call, *args, **kwargs) -> int:
    with pytest.raises(FsError) as info:
        call(*args, **kwargs)
    return info.value.errno


def write(meta, ino, offset, length, chunk=CHUNK):
    """Commit one new slice covering [offset, offset+length), split at chunk ends."""
    sid = meta.next_slice_id()
    pos = offset
    while pos < offset + length:
        ci, coff = divmod(pos, chunk)
        n = min(chunk - coff, offset + length - pos)
        meta.commit_slice(ino, ci, SliceRef(sid, coff, n, pos - offset), pos + n,
                          slice_length=length)  # fmt: skip
        pos += n
    return sid


def test_commit_slice_grows_size_and_maps_bytes(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    sid = meta.next_slice_id()
    attr = meta.commit_slice(f.ino, 0, SliceRef(sid, 0, 1000, 0), 1000, mtime_ns=123)
    assert attr.size == 1000 and attr.mtime_ns == 123
    assert meta.getattr(f.ino) == attr
    assert meta.read_map(f.ino, 0, 4096) == [ReadPiece(0, 1000, sid, 0)]
    info = meta.get_slice(sid)
    assert info.state is SliceState.COMMITTED and info.refcount == 1 and info.length == 1000
    assert meta.statfs().used_bytes == 1000
    check()


def test_commit_slices_commits_a_batch_in_one_transaction_in_order(meta, check):
    a = meta.create(ROOT_INO, b"a", 0o644)
    b = meta.create(ROOT_INO, b"b", 0o644)
    s1, s2, s3 = (meta.next_slice_id() for _ in range(3))
    attrs = meta.commit_slices([
        SliceCommit(b.ino, 0, SliceRef(s1, 0, 100), 100, replicas=(Replica("local", "0"),)),
        SliceCommit(a.ino, 0, SliceRef(s2, 0, 50), 50),
        SliceCommit(b.ino, 0, SliceRef(s3, 10, 20), 100),  # later in the batch: wins
    ])
    assert [x.ino for x in attrs] == [b.ino, a.ino, b.ino]
    assert [x.size for x in attrs] == [100, 50, 100]
    assert meta.read_map(b.ino, 0, 100) == [
        ReadPiece(0, 10, s1, 0), ReadPiece(10, 20, s3, 0), ReadPiece(30, 70, s1, 30)]
    assert meta.get_slice(s1).replicas == (Replica("local", "0"),)
    assert meta.statfs().used_bytes == 150
    check()


def test_commit_slices_is_all_or_nothing(meta, check):
    a = meta.create(ROOT_INO, b"a", 0o644)
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    s1, s2 = meta.next_slice_id(), meta.next_slice_id()
    with pytest.raises(FsError) as info:
        meta.commit_slices([SliceCommit(a.ino, 0, SliceRef(s1, 0, 100), 100),
                            SliceCommit(d.ino, 0, SliceRef(s2, 0, 10), 10)])
    assert info.value.errno == E.EISDIR
    assert meta.getattr(a.ino).size == 0
    assert meta.read_map(a.ino, 0, 100) == []
    check()


def test_later_references_win_where_they_overlap(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    a = write(meta, f.ino, 0, 100)
    b = write(meta, f.ino, 30, 20)
    c = write(meta, f.ino, 40, 100)
    assert meta.read_map(f.ino, 0, 200) == [
        ReadPiece(0, 30, a, 0),
        ReadPiece(30, 10, b, 0),
        ReadPiece(40, 100, c, 0),
    ]
    assert meta.read_map(f.ino, 35, 10) == [ReadPiece(35, 5, b, 5), ReadPiece(40, 5, c, 0)]
    check()


def test_holes_are_reported_as_holes(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    sid = write(meta, f.ino, 4096, 100)
    meta.truncate(f.ino, 10_000)
    assert meta.read_map(f.ino, 0, 20_000) == [
        ReadPiece(0, 4096, None),
        ReadPiece(4096, 100, sid, 0),
        ReadPiece(4196, 10_000 - 4196, None),
    ]
    assert meta.read_map(f.ino, 10_000, 5) == []


def test_a_write_across_a_chunk_boundary_maps_both_chunks(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    sid = write(meta, f.ino, CHUNK - 10, 30)
    assert meta.read_map(f.ino, CHUNK - 20, 100) == [
        ReadPiece(CHUNK - 20, 10, None),
        ReadPiece(CHUNK - 10, 30, sid, 0),
    ]
    assert meta.get_slice(sid).refcount == 2
    check()


def test_truncate_down_trims_and_dereferences(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    a = write(meta, f.ino, 0, 100)
    b = write(meta, f.ino, 200, 100)
    c = write(meta, f.ino, CHUNK, 100)
    meta.truncate(f.ino, 250)
    assert meta.getattr(f.ino).size == 250
    assert meta.read_map(f.ino, 0, 1000) == [
        ReadPiece(0, 100, a, 0),
        ReadPiece(100, 100, None),
        ReadPiece(200, 50, b, 0),
    ]
    assert {s.id for s in meta.pop_deletions()} == {c}
    meta.truncate(f.ino, 150)
    assert {s.id for s in meta.pop_deletions()} == {b}
    meta.truncate(f.ino, 1000)  # up: the trimmed bytes come back as zeros
    assert meta.read_map(f.ino, 0, 1000) == [ReadPiece(0, 100, a, 0), ReadPiece(100, 900, None)]
    assert meta.statfs().used_bytes == 1000
    check()


def test_commit_slice_errors(meta):
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    f = meta.create(ROOT_INO, b"f", 0o644)
    piece = SliceRef(meta.next_slice_id(), 0, 10)
    assert errno_of(meta.commit_slice, d.ino, 0, piece, 10) == E.EISDIR
    assert errno_of(meta.commit_slice, 999_999, 0, piece, 10) == E.ENOENT
    assert errno_of(meta.commit_slice, f.ino, 0, SliceRef(1, CHUNK - 5, 10), CHUNK + 5) == E.EINVAL
    assert errno_of(meta.commit_slice, f.ino, 0, SliceRef(1, 0, 0), 0) == E.EINVAL
    assert errno_of(meta.commit_slice, f.ino, 0, piece, 5) == E.EINVAL  # size before piece end
    assert errno_of(meta.read_map, d.ino, 0, 10) == E.EISDIR


def test_compaction_replaces_a_fragmented_chunk(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    olds = [write(meta, f.ino, i * 10, 10) for i in range(12)]
    cand = meta.compaction_candidates(min_refs=10)
    assert [(c.ino, c.chunk_index, c.nrefs) for c in cand] == [(f.ino, 0, 12)]
    chunk = meta.get_chunk(f.ino, 0)
    assert len(chunk.refs) == 12 and chunk.version == cand[0].version
    new = meta.next_slice_id()
    out = meta.replace_chunk(f.ino, 0, chunk.version, SliceRef(new, 0, 120, 0))
    assert out.version > chunk.version and out.refs == (SliceRef(new, 0, 120, 0),)
    assert meta.read_map(f.ino, 0, 120) == [ReadPiece(0, 120, new, 0)]
    assert sorted(s.id for s in meta.pop_deletions()) == sorted(olds)
    assert meta.compaction_candidates(min_refs=10) == []
    check()


def test_compaction_loses_to_a_concurrent_write(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    write(meta, f.ino, 0, 10)
    chunk = meta.get_chunk(f.ino, 0)
    late = write(meta, f.ino, 5, 10)
    new = meta.next_slice_id()
    with pytest.raises(ChunkChanged) as info:
        meta.replace_chunk(f.ino, 0, chunk.version, SliceRef(new, 0, 10))
    assert info.value.errno == E.EAGAIN
    assert meta.read_map(f.ino, 5, 10) == [ReadPiece(5, 10, late, 0)]
    errno_of(meta.get_slice, new)
    check()


def test_compaction_loses_to_a_truncate(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    write(meta, f.ino, 0, 100)
    chunk = meta.get_chunk(f.ino, 0)
    meta.truncate(f.ino, 0)
    with pytest.raises(ChunkChanged):
        meta.replace_chunk(f.ino, 0, chunk.version, SliceRef(meta.next_slice_id(), 0, 100))


def test_a_compaction_of_the_references_it_read_keeps_those_committed_since_on_top(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    olds = [write(meta, f.ino, i * 10, 10) for i in range(12)]
    chunk = meta.get_chunk(f.ino, 0)
    assert len(chunk.seqs) == 12 and chunk.seqs == tuple(sorted(chunk.seqs))
    late = write(meta, f.ino, 55, 10)  # an appender's commit lands during the compaction
    new = meta.next_slice_id()
    out = meta.replace_chunk(f.ino, 0, chunk.version, SliceRef(new, 0, 120, 0),
                             replaced=list(zip(chunk.seqs, chunk.refs, strict=True)))
    assert out.refs == (SliceRef(new, 0, 120, 0), SliceRef(late, 55, 10, 0))
    assert meta.get_chunk(f.ino, 0) == out
    assert meta.read_map(f.ino, 0, 120) == [
        ReadPiece(0, 55, new, 0), ReadPiece(55, 10, late, 0), ReadPiece(65, 55, new, 65)]
    assert sorted(s.id for s in meta.pop_deletions()) == sorted(olds)
    check()


def test_a_compaction_of_the_newest_references_keeps_the_older_ones_under_them(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    base = write(meta, f.ino, 0, 1000)
    tail = [write(meta, f.ino, 1000 + i * 10, 10) for i in range(4)]
    over = write(meta, f.ino, 990, 20)  # overlaps the base and the first appended
    chunk = meta.get_chunk(f.ino, 0)
    merged = list(zip(chunk.seqs, chunk.refs, strict=True))[1:]
    new = meta.next_slice_id()
    out = meta.replace_chunk(f.ino, 0, chunk.version, SliceRef(new, 990, 50, 0), replaced=merged)
    assert out.refs == (SliceRef(base, 0, 1000, 0), SliceRef(new, 990, 50, 0))
    assert meta.read_map(f.ino, 0, 1040) == [ReadPiece(0, 990, base, 0), ReadPiece(990, 50, new, 0)]
    assert sorted(s.id for s in meta.pop_deletions()) == sorted([*tail, over])
    check()


def test_a_compaction_of_the_references_it_read_loses_when_one_of_them_changed(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    for i in range(4):
        write(meta, f.ino, i * 10, 10)
    chunk = meta.get_chunk(f.ino, 0)
    read = list(zip(chunk.seqs, chunk.refs, strict=True))
    meta.truncate(f.ino, 35)  # trims the newest reference read
    new = meta.next_slice_id()
    with pytest.raises(ChunkChanged):
        meta.replace_chunk(f.ino, 0, chunk.version, SliceRef(new, 0, 40), replaced=read)
    assert [p.length for p in meta.read_map(f.ino, 0, 40)] == [10, 10, 10, 5]
    errno_of(meta.get_slice, new)
    assert errno_of(meta.replace_chunk, f.ino, 0, chunk.version,
                    [SliceRef(new, 0, 5), SliceRef(new, 10, 5, 5)], replaced=read[:1]) == E.EINVAL
    check()


# ---- slices and the deletion queue -----------------------------------------------------


def test_slice_registry(meta):
    sid = meta.next_slice_id()
    meta.add_slice(SliceInfo(sid, 4096, group=7, replicas=(Replica("s1", "d0"),)))
    info = meta.get_slice(sid)
    assert (info.length, info.group, info.state, info.refcount) == (4096, 7, SliceState.WRITING, 0)
    assert info.replicas == (Replica("s1", "d0"),)
    meta.set_slice_replicas(sid, [Replica("s2", "d1"), Replica("s1", "d0")])
    assert meta.get_slice(sid).replicas == (Replica("s1", "d0"), Replica("s2", "d1"))
    assert errno_of(meta.add_slice, SliceInfo(sid, 1)) == E.EEXIST
    assert errno_of(meta.get_slice, 10**12) == E.ENOENT
    assert errno_of(meta.set_slice_replicas, 10**12, []) == E.ENOENT
    f = meta.create(ROOT_INO, b"f", 0o644)
    meta.commit_slice(f.ino, 0, SliceRef(sid, 0, 4096), 4096, group=7)
    committed = meta.get_slice(sid)
    assert committed.state is SliceState.COMMITTED and committed.refcount == 1
    assert committed.replicas == (Replica("s1", "d0"), Replica("s2", "d1"))


def test_a_commit_with_replicas_replaces_the_registered_set(meta):
    sid = meta.next_slice_id()
    meta.add_slice(SliceInfo(sid, 0, replicas=(Replica("1", "0"), Replica("2", "0"))))
    f = meta.create(ROOT_INO, b"f", 0o644)
    meta.commit_slice(f.ino, 0, SliceRef(sid, 0, 4096), 4096, replicas=[Replica("2", "0")])
    assert meta.get_slice(sid).replicas == (Replica("2", "0"),)  # "1" failed mid-write


def test_stored_slices_pages_committed_slices_with_their_replicas(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    ids = [write(meta, f.ino, i * 100, 100) for i in range(5)]
    meta.set_slice_replicas(ids[1], [Replica("1", "0"), Replica("3", "2")])
    meta.add_slice(SliceInfo(meta.next_slice_id(), 0))  # writing: not stored yet
    first = meta.stored_slices(0, 2)
    assert [s.id for s in first] == ids[:2]
    assert first[1].replicas == (Replica("1", "0"), Replica("3", "2"))
    rest = meta.stored_slices(first[-1].id, 100)
    assert [s.id for s in rest] == ids[2:] and all(s.refcount == 1 for s in rest)
    assert meta.stored_slices(ids[-1]) == []


def test_deletion_queue_leases_and_acknowledges(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    sid = write(meta, f.ino, 0, 10)
    meta.set_slice_replicas(sid, [Replica("s1", "d0")])
    meta.unlink(ROOT_INO, b"f")
    popped = meta.pop_deletions(lease_s=60)
    assert [(s.id, s.state, s.refcount, s.replicas) for s in popped] == [
        (sid, SliceState.TO_DELETE, 0, (Replica("s1", "d0"),))
    ]
    assert meta.pop_deletions() == []  # leased
    check()
    meta.ack_deletions([sid])
    assert errno_of(meta.get_slice, sid) == E.ENOENT
    meta.ack_deletions([sid])  # idempotent
    check()


def test_deletion_lease_expiry_offers_the_slice_again(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    sid = write(meta, f.ino, 0, 10)
    meta.unlink(ROOT_INO, b"f")
    assert [s.id for s in meta.pop_deletions(lease_s=0.05)] == [sid]
    time.sleep(0.1)
    assert [s.id for s in meta.pop_deletions()] == [sid]


def test_a_slice_queued_for_deletion_cannot_be_referenced_again(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    sid = write(meta, f.ino, 0, 10)
    meta.truncate(f.ino, 0)
    with pytest.raises(SliceStateError) as info:
        meta.commit_slice(f.ino, 0, SliceRef(sid, 0, 10), 10)
    assert info.value.errno == E.ESTALE
    g = meta.create(ROOT_INO, b"g", 0o644)
    assert errno_of(meta.ack_deletions, [write(meta, g.ino, 0, 5)]) == E.ESTALE


def test_shared_slice_is_deleted_only_after_its_last_reference(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    g = meta.create(ROOT_INO, b"g", 0o644)
    sid = meta.next_slice_id()
    meta.commit_slice(f.ino, 0, SliceRef(sid, 0, 100), 100)
    meta.commit_slice(g.ino, 0, SliceRef(sid, 0, 100), 100)  # a clone shares the slice
    assert meta.get_slice(sid).refcount == 2
    meta.unlink(ROOT_INO, b"f")
    assert meta.pop_deletions() == []
    meta.unlink(ROOT_INO, b"g")
    assert [s.id for s in meta.pop_deletions()] == [sid]
    check()


# ---- sessions: unlinked files that are still open ------------------------------------


def test_unlinked_open_file_stays_usable_until_last_close(meta, check):
    s = meta.register_session(SessionInfo(host="h", pid=1, mountpoint="/mnt"))
    f = meta.create(ROOT_INO, b"f", 0o644, session=s)
    a = write(meta, f.ino, 0, 100)
    meta.open_file(s, f.ino)  # a second descriptor
    res = meta.unlink(ROOT_INO, b"f")
    assert not res.released and res.attr.nlink == 0
    assert errno_of(meta.lookup, ROOT_INO, b"f") == E.ENOENT
    b = write(meta, f.ino, 100, 50)  # still writable
    assert meta.getattr(f.ino).size == 150
    assert meta.read_map(f.ino, 0, 150) == [ReadPiece(0, 100, a, 0), ReadPiece(100, 50, b, 0)]
    assert meta.pop_deletions() == []
    assert meta.statfs().inodes == 2
    check()
    assert meta.close_file(s, f.ino) is False  # one descriptor left
    assert meta.close_file(s, f.ino) is True
    assert errno_of(meta.getattr, f.ino) == E.ENOENT
    assert sorted(x.id for x in meta.pop_deletions()) == sorted([a, b])
    assert meta.statfs().inodes == 1 and meta.statfs().used_bytes == 0
    check()


def test_file_open_in_two_sessions_is_freed_after_both_close(meta, check):
    s1 = meta.register_session(SessionInfo(host="a"))
    s2 = meta.register_session(SessionInfo(host="b"))
    f = meta.create(ROOT_INO, b"f", 0o644)
    meta.open_file(s1, f.ino)
    meta.open_file(s2, f.ino)
    meta.unlink(ROOT_INO, b"f")
    assert meta.close_file(s1, f.ino) is False
    meta.getattr(f.ino)
    assert meta.unregister_session(s2) == [f.ino]
    assert errno_of(meta.getattr, f.ino) == E.ENOENT
    check()


def test_expired_session_releases_its_unlinked_files(meta, check):
    dead = meta.register_session(SessionInfo(host="dead", pid=1))
    f = meta.create(ROOT_INO, b"f", 0o644, session=dead)
    sid = write(meta, f.ino, 0, 10)
    meta.unlink(ROOT_INO, b"f")
    time.sleep(0.6)
    alive = meta.register_session(SessionInfo(host="alive", pid=2))
    g = meta.create(ROOT_INO, b"g", 0o644, session=alive)
    meta.unlink(ROOT_INO, b"g")
    assert [x.id for x in meta.list_sessions()] == [dead, alive]
    assert meta.list_sessions()[0].open_inodes == (f.ino,)
    meta.heartbeat(alive)  # silent for 0.6 s vs just heard from: wide apart on a loaded host
    assert meta.expire_sessions(0.5) == [dead]
    assert errno_of(meta.getattr, f.ino) == E.ENOENT
    assert meta.getattr(g.ino).nlink == 0  # held by the live session
    assert [x.id for x in meta.pop_deletions()] == [sid]
    assert errno_of(meta.heartbeat, dead) == E.ESTALE
    meta.heartbeat(alive)
    assert errno_of(meta.open_file, dead, g.ino) == E.ESTALE
    check()


def test_open_file_errors(meta):
    s = meta.register_session(SessionInfo())
    assert errno_of(meta.open_file, s, 424242) == E.ENOENT
    assert errno_of(meta.create, ROOT_INO, b"f", 0o644, session=10**9) == E.ESTALE
    assert errno_of(meta.lookup, ROOT_INO, b"f") == E.ENOENT  # the failed create left nothing
    assert meta.close_file(s, 424242) is False


# ---- property: the map equals a bytearray model --------------------------------------------

SMALL_CHUNK = 4096 * 4

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"), st.integers(0, 5 * SMALL_CHUNK), st.integers(1, 2 * SMALL_CHUNK)
        ),
        st.tuples(st.just("truncate"), st.integers(0, 6 * SMALL_CHUNK), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=ops,
    probes=st.lists(
        st.tuples(st.integers(0, 7 * SMALL_CHUNK), st.integers(0, 3 * SMALL_CHUNK)),
        min_size=1,
        max_size=4,
    ),
)
def test_read_map_matches_a_byte_model(small_store, ops, probes):
    meta = small_store
    name = uuid.uuid4().hex.encode()
    f = meta.create(ROOT_INO, name, 0o644)
    model: list[tuple[int, int] | None] = []
    for op, a, b in ops:
        if op == "write":
            sid = write(meta, f.ino, a, b, chunk=SMALL_CHUNK)
            if len(model) < a + b:
                model += [None] * (a + b - len(model))
            model[a : a + b] = [(sid, k) for k in range(b)]
        else:
            meta.truncate(f.ino, a)
            model = model[:a] + [None] * max(0, a - len(model))
    assert meta.getattr(f.ino).size == len(model)
    for off, length in probes:
        pieces = meta.read_map(f.ino, off, length)
        got: list[tuple[int, int] | None] = []
        pos = off
        for p in pieces:
            assert p.file_offset == pos and p.length > 0
            got += (
                [None] * p.length
                if p.slice_id is None
                else [(p.slice_id, p.slice_offset + k) for k in range(p.length)]
            )
            pos += p.length
        assert got == model[off : off + length]
    meta.unlink(ROOT_INO, name)
    problems = check_consistency(meta)
    assert problems == []


@pytest.fixture
def small_store(meta_url):
    store = open_meta(meta_url)
    store.format("small", str(uuid.uuid4()), chunk_size=SMALL_CHUNK, block_size=4096)
    yield store
    store.close()


def test_abandoned_writing_slices_can_be_found_and_discarded(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    lost, used = meta.next_slice_id(), meta.next_slice_id()
    meta.add_slice(SliceInfo(lost, 4096, replicas=(Replica("s1", "d0"),)))
    meta.add_slice(SliceInfo(used, 4096))
    meta.commit_slice(f.ino, 0, SliceRef(used, 0, 4096), 4096)
    assert meta.abandoned_slices(older_than_s=60) == []  # too young
    time.sleep(0.05)
    found = meta.abandoned_slices(older_than_s=0.01)
    assert [(s.id, s.state, s.replicas) for s in found] == [
        (lost, SliceState.WRITING, (Replica("s1", "d0"),))
    ]
    assert meta.discard_slices([lost, used]) == [lost]  # the committed one is left alone
    assert [s.id for s in meta.pop_deletions()] == [lost]
    assert meta.get_slice(used).state is SliceState.COMMITTED
    with pytest.raises(SliceStateError):
        meta.commit_slice(f.ino, 0, SliceRef(lost, 0, 10), 4096)
    check()
