"""``create`` with ``parent_seen``: the parent's mode, owner and group as the
caller last saw them, used instead of reading them (one round trip on
PostgreSQL). A hint only: right or stale, the answer is the one a create
without it gives -- the same errno, the same file, nothing left behind."""

from __future__ import annotations

import errno as E
import stat

import pytest

from shinglefs.meta.api import ROOT_INO, Ctx
from shinglefs.meta.errors import FsError

USER = Ctx(uid=1000, gid=1000, umask=0o022)


def seen(meta, ino):
    a = meta.getattr(ino)
    return (a.mode, a.uid, a.gid)


def errno_of(call, *args, **kwargs) -> int:
    with pytest.raises(FsError) as info:
        call(*args, **kwargs)
    return info.value.errno


def test_a_right_guess_creates_the_file_as_without_it(meta, check):
    d = meta.mkdir(ROOT_INO, b"d", 0o777)
    f = meta.create(d.ino, b"f", 0o644, USER, parent_seen=seen(meta, d.ino))
    assert meta.lookup(d.ino, b"f") == f
    assert (f.uid, f.gid, stat.S_IMODE(f.mode)) == (1000, 1000, 0o644)
    assert meta.getattr(d.ino).mtime_ns == f.ctime_ns
    assert meta.statfs().inodes == 3
    check()


def test_a_stale_guess_gets_the_answer_of_the_parent_as_it_is(meta, check):
    d = meta.mkdir(ROOT_INO, b"d", 0o777)
    old = seen(meta, d.ino)
    meta.setattr(d.ino, mode=0o755)  # the user may not write there any more
    assert errno_of(meta.create, d.ino, b"f", 0o644, USER, parent_seen=old) == E.EACCES
    meta.setattr(d.ino, mode=0o777)
    denying = (stat.S_IFDIR | 0o755, 0, 0)  # seen as closed, open now: created
    f = meta.create(d.ino, b"f", 0o644, USER, parent_seen=denying)
    assert meta.lookup(d.ino, b"f") == f
    meta.setattr(d.ino, mode=0o2777, gid=50)  # setgid since: the group is inherited
    g = meta.create(d.ino, b"g", 0o644, USER, parent_seen=old)
    assert g.gid == 50
    check()


def test_a_guess_for_a_removed_parent_is_enoent(meta, check):
    d = meta.mkdir(ROOT_INO, b"d", 0o777)
    old = seen(meta, d.ino)
    meta.rmdir(ROOT_INO, b"d")
    assert errno_of(meta.create, d.ino, b"f", 0o644, USER, parent_seen=old) == E.ENOENT
    check()


def test_an_existing_name_is_eexist_exclusive_or_opened_otherwise(meta, check):
    d = meta.mkdir(ROOT_INO, b"d", 0o777)
    f = meta.create(d.ino, b"f", 0o666, USER)
    guess = seen(meta, d.ino)
    assert errno_of(meta.create, d.ino, b"f", 0o644, USER, parent_seen=guess) == E.EEXIST
    again = meta.create(d.ino, b"f", 0o644, USER, exclusive=False, parent_seen=guess)
    assert again.ino == f.ino
    assert meta.statfs().inodes == 3  # root, d, f: no inode of a refused attempt
    check()


def test_a_guess_that_is_no_directory_falls_back(meta, check):
    f = meta.create(ROOT_INO, b"plain", 0o644)
    assert errno_of(meta.create, f.ino, b"x", 0o644, USER,
                    parent_seen=(stat.S_IFDIR | 0o777, 0, 0)) == E.ENOTDIR
    d = meta.mkdir(ROOT_INO, b"d", 0o777)
    made = meta.create(d.ino, b"x", 0o644, USER, parent_seen=(stat.S_IFREG | 0o777, 0, 0))
    assert meta.lookup(d.ino, b"x") == made
    check()


def test_create_file_says_whether_it_made_the_file(meta, check):
    d = meta.mkdir(ROOT_INO, b"d", 0o777)
    for guess in (None, seen(meta, d.ino)):
        name = b"f" if guess is None else b"g"
        first = meta.create_file(d.ino, name, 0o644, USER, exclusive=False, parent_seen=guess)
        again = meta.create_file(d.ino, name, 0o644, USER, exclusive=False, parent_seen=guess)
        assert first.made and not again.made
        assert again.attr.ino == first.attr.ino
    check()
