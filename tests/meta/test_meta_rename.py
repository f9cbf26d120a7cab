"""The rename matrix: every source/target kind, flags, subtree and sticky rules."""

from __future__ import annotations

import errno as E

import pytest

from shinglefs.meta.api import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    ROOT_INO,
    Ctx,
    SessionInfo,
    SliceRef,
)
from shinglefs.meta.errors import FsError


def errno_of(call, *args, **kwargs) -> int:
    with pytest.raises(FsError) as info:
        call(*args, **kwargs)
    return info.value.errno


def names(meta, ino):
    return sorted(e.name for e in meta.readdir(ino))


def test_rename_file_to_free_name_in_same_directory(meta, check):
    f = meta.create(ROOT_INO, b"a", 0o644)
    res = meta.rename(ROOT_INO, b"a", ROOT_INO, b"b")
    assert res.ino == f.ino and res.replaced is None
    assert names(meta, ROOT_INO) == [b"b"]
    assert meta.lookup(ROOT_INO, b"b").ino == f.ino
    check()


def test_rename_replaces_target_file_atomically_and_frees_it(meta, check):
    a = meta.create(ROOT_INO, b"a", 0o644)
    b = meta.create(ROOT_INO, b"b", 0o644)
    sid = meta.next_slice_id()
    meta.commit_slice(b.ino, 0, SliceRef(sid, 0, 4096), 4096)
    res = meta.rename(ROOT_INO, b"a", ROOT_INO, b"b")
    assert res.replaced is not None and res.replaced.ino == b.ino and res.released
    assert meta.lookup(ROOT_INO, b"b").ino == a.ino
    assert names(meta, ROOT_INO) == [b"b"]
    assert errno_of(meta.getattr, b.ino) == E.ENOENT
    assert [s.id for s in meta.pop_deletions()] == [sid]
    assert meta.statfs().used_bytes == 0
    check()


def test_rename_replacing_an_open_file_defers_its_release(meta, check):
    meta.create(ROOT_INO, b"a", 0o644)
    b = meta.create(ROOT_INO, b"b", 0o644)
    sid = meta.next_slice_id()
    meta.commit_slice(b.ino, 0, SliceRef(sid, 0, 100), 100)
    session = meta.register_session(SessionInfo(host="h", pid=1))
    meta.open_file(session, b.ino)
    res = meta.rename(ROOT_INO, b"a", ROOT_INO, b"b")
    assert res.replaced.ino == b.ino and res.replaced.nlink == 0 and not res.released
    assert meta.getattr(b.ino).size == 100
    assert meta.read_map(b.ino, 0, 100)[0].slice_id == sid
    assert meta.pop_deletions() == []
    check()
    assert meta.close_file(session, b.ino)
    assert [s.id for s in meta.pop_deletions()] == [sid]
    check()


def test_rename_directory_across_parents_moves_nlink(meta, check):
    p1 = meta.mkdir(ROOT_INO, b"p1", 0o755)
    p2 = meta.mkdir(ROOT_INO, b"p2", 0o755)
    d = meta.mkdir(p1.ino, b"d", 0o755)
    meta.create(d.ino, b"inner", 0o644)
    meta.rename(p1.ino, b"d", p2.ino, b"d2")
    assert meta.getattr(p1.ino).nlink == 2 and meta.getattr(p2.ino).nlink == 3
    assert meta.lookup(d.ino, b"..").ino == p2.ino
    assert meta.lookup(meta.lookup(p2.ino, b"d2").ino, b"inner").is_file
    check()


def test_rename_directory_over_empty_directory(meta, check):
    p1 = meta.mkdir(ROOT_INO, b"p1", 0o755)
    p2 = meta.mkdir(ROOT_INO, b"p2", 0o755)
    src = meta.mkdir(p1.ino, b"src", 0o755)
    dst = meta.mkdir(p2.ino, b"dst", 0o755)
    res = meta.rename(p1.ino, b"src", p2.ino, b"dst")
    assert res.replaced.ino == dst.ino and res.released
    assert meta.lookup(p2.ino, b"dst").ino == src.ino
    assert meta.getattr(p1.ino).nlink == 2 and meta.getattr(p2.ino).nlink == 3
    assert errno_of(meta.getattr, dst.ino) == E.ENOENT
    check()


def test_rename_directory_over_empty_directory_in_same_parent(meta, check):
    meta.mkdir(ROOT_INO, b"a", 0o755)
    meta.mkdir(ROOT_INO, b"b", 0o755)
    assert meta.getattr(ROOT_INO).nlink == 4
    meta.rename(ROOT_INO, b"a", ROOT_INO, b"b")
    assert meta.getattr(ROOT_INO).nlink == 3
    check()


@pytest.mark.parametrize(
    ("src_kind", "dst_kind", "err"),
    [
        ("dir", "file", E.ENOTDIR),
        ("file", "dir", E.EISDIR),
        ("dir", "full_dir", E.ENOTEMPTY),
        ("file", "full_dir", E.EISDIR),
        ("symlink", "dir", E.EISDIR),
    ],
)
def test_rename_kind_mismatches(meta, check, src_kind, dst_kind, err):
    def make(name, kind):
        if kind == "dir":
            return meta.mkdir(ROOT_INO, name, 0o755)
        if kind == "full_dir":
            d = meta.mkdir(ROOT_INO, name, 0o755)
            meta.create(d.ino, b"x", 0o644)
            return d
        if kind == "symlink":
            return meta.symlink(ROOT_INO, name, b"t")
        return meta.create(ROOT_INO, name, 0o644)

    s = make(b"s", src_kind)
    d = make(b"d", dst_kind)
    assert errno_of(meta.rename, ROOT_INO, b"s", ROOT_INO, b"d") == err
    assert meta.lookup(ROOT_INO, b"s").ino == s.ino and meta.lookup(ROOT_INO, b"d").ino == d.ino
    check()


def test_rename_noreplace(meta):
    meta.create(ROOT_INO, b"a", 0o644)
    b = meta.create(ROOT_INO, b"b", 0o644)
    assert errno_of(meta.rename, ROOT_INO, b"a", ROOT_INO, b"b", RENAME_NOREPLACE) == E.EEXIST
    assert meta.lookup(ROOT_INO, b"b").ino == b.ino
    meta.rename(ROOT_INO, b"a", ROOT_INO, b"c", RENAME_NOREPLACE)
    assert names(meta, ROOT_INO) == [b"b", b"c"]


def test_rename_exchange_swaps_file_and_directory_across_parents(meta, check):
    p1 = meta.mkdir(ROOT_INO, b"p1", 0o755)
    p2 = meta.mkdir(ROOT_INO, b"p2", 0o755)
    f = meta.create(p1.ino, b"x", 0o644)
    d = meta.mkdir(p2.ino, b"y", 0o755)
    res = meta.rename(p1.ino, b"x", p2.ino, b"y", RENAME_EXCHANGE)
    assert res.ino == f.ino and res.replaced.ino == d.ino and not res.released
    assert meta.lookup(p1.ino, b"x").ino == d.ino
    assert meta.lookup(p2.ino, b"y").ino == f.ino
    assert meta.getattr(p1.ino).nlink == 3 and meta.getattr(p2.ino).nlink == 2
    assert meta.lookup(d.ino, b"..").ino == p1.ino
    check()


def test_rename_exchange_needs_an_existing_target(meta):
    meta.create(ROOT_INO, b"a", 0o644)
    assert errno_of(meta.rename, ROOT_INO, b"a", ROOT_INO, b"zz", RENAME_EXCHANGE) == E.ENOENT


def test_rename_flags_validation(meta):
    meta.create(ROOT_INO, b"a", 0o644)
    both = RENAME_EXCHANGE | RENAME_NOREPLACE
    assert errno_of(meta.rename, ROOT_INO, b"a", ROOT_INO, b"b", both) == E.EINVAL
    assert errno_of(meta.rename, ROOT_INO, b"a", ROOT_INO, b"b", 0x40) == E.EINVAL


def test_rename_directory_into_its_own_subtree_is_einval(meta, check):
    a = meta.mkdir(ROOT_INO, b"a", 0o755)
    b = meta.mkdir(a.ino, b"b", 0o755)
    c = meta.mkdir(b.ino, b"c", 0o755)
    assert errno_of(meta.rename, ROOT_INO, b"a", c.ino, b"a") == E.EINVAL
    assert errno_of(meta.rename, ROOT_INO, b"a", a.ino, b"self") == E.EINVAL
    assert errno_of(meta.rename, a.ino, b"b", ROOT_INO, b"a", RENAME_EXCHANGE) == E.EINVAL
    check()


def test_rename_missing_source_and_dots(meta):
    assert errno_of(meta.rename, ROOT_INO, b"nope", ROOT_INO, b"x") == E.ENOENT
    meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.rename, ROOT_INO, b".", ROOT_INO, b"x") == E.EBUSY
    assert errno_of(meta.rename, ROOT_INO, b"d", ROOT_INO, b"..") == E.EBUSY
    assert errno_of(meta.rename, ROOT_INO, b"d", ROOT_INO, b".", RENAME_NOREPLACE) == E.EEXIST


def test_rename_between_hard_links_of_one_inode_changes_nothing(meta, check):
    f = meta.create(ROOT_INO, b"a", 0o644)
    meta.link(f.ino, ROOT_INO, b"b")
    res = meta.rename(ROOT_INO, b"a", ROOT_INO, b"b")
    assert res.replaced is None
    assert names(meta, ROOT_INO) == [b"a", b"b"]
    assert meta.getattr(f.ino).nlink == 2
    check()


def test_rename_onto_itself_is_a_no_op(meta):
    f = meta.create(ROOT_INO, b"a", 0o644)
    meta.rename(ROOT_INO, b"a", ROOT_INO, b"a")
    assert meta.lookup(ROOT_INO, b"a").ino == f.ino


def test_rename_replacing_hard_linked_target_keeps_the_other_link(meta, check):
    meta.create(ROOT_INO, b"a", 0o644)
    b = meta.create(ROOT_INO, b"b", 0o644)
    meta.link(b.ino, ROOT_INO, b"b2")
    res = meta.rename(ROOT_INO, b"a", ROOT_INO, b"b")
    assert res.replaced.nlink == 1 and not res.released
    assert meta.lookup(ROOT_INO, b"b2").ino == b.ino
    check()


def test_rename_in_sticky_directory_needs_ownership(meta):
    tmp = meta.mkdir(ROOT_INO, b"tmp", 0o1777)
    alice, bob = Ctx(uid=1001, gid=1001), Ctx(uid=1002, gid=1002)
    meta.create(tmp.ino, b"alice", 0o644, alice)
    meta.create(tmp.ino, b"bob", 0o644, bob)
    assert errno_of(meta.rename, tmp.ino, b"alice", tmp.ino, b"mine", 0, bob) == E.EPERM
    assert errno_of(meta.rename, tmp.ino, b"bob", tmp.ino, b"alice", 0, bob) == E.EPERM
    meta.rename(tmp.ino, b"bob", tmp.ino, b"bob2", 0, bob)


def test_rename_needs_write_permission_on_both_parents(meta):
    ro = meta.mkdir(ROOT_INO, b"ro", 0o755)
    meta.setattr(ROOT_INO, mode=0o777)
    user = Ctx(uid=1000, gid=1000)
    meta.create(ROOT_INO, b"f", 0o644, user)
    assert errno_of(meta.rename, ROOT_INO, b"f", ro.ino, b"f", 0, user) == E.EACCES
    meta.create(ro.ino, b"g", 0o644)
    assert errno_of(meta.rename, ro.ino, b"g", ROOT_INO, b"g", 0, user) == E.EACCES


def test_moving_a_directory_across_parents_needs_write_on_it(meta):
    meta.setattr(ROOT_INO, mode=0o777)
    user = Ctx(uid=1000, gid=1000)
    p = meta.mkdir(ROOT_INO, b"p", 0o777, user)
    meta.mkdir(ROOT_INO, b"locked", 0o555, user)
    assert errno_of(meta.rename, ROOT_INO, b"locked", p.ino, b"locked", 0, user) == E.EACCES
    meta.rename(ROOT_INO, b"locked", ROOT_INO, b"renamed", 0, user)  # same parent: fine


def test_rename_onto_an_ancestor_of_the_source_is_enotempty(meta):
    a = meta.mkdir(ROOT_INO, b"a", 0o755)
    meta.create(a.ino, b"f", 0o644)
    sub = meta.mkdir(a.ino, b"sub", 0o755)
    assert errno_of(meta.rename, a.ino, b"f", ROOT_INO, b"a") == E.ENOTEMPTY
    assert errno_of(meta.rename, sub.ino, b"..", ROOT_INO, b"x") == E.EBUSY
    assert errno_of(meta.rename, a.ino, b"sub", ROOT_INO, b"a", RENAME_EXCHANGE) == E.EINVAL


def test_subtree_check_comes_before_the_type_check(meta):
    a = meta.mkdir(ROOT_INO, b"a", 0o755)
    b = meta.mkdir(a.ino, b"b", 0o755)
    meta.create(b.ino, b"file", 0o644)
    # Linux: EINVAL (source is an ancestor of the target), not ENOTDIR.
    assert errno_of(meta.rename, ROOT_INO, b"a", b.ino, b"file") == E.EINVAL
