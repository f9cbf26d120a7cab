"""readdir cookies, extended attributes and permission checks."""

from __future__ import annotations

import errno as E
import os
import stat

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import (
    FIRST_COOKIE,
    ROOT_INO,
    XATTR_CREATE,
    XATTR_REPLACE,
    Ctx,
)
from shinglefs.meta.errors import FsError


def errno_of(call, *args, **kwargs) -> int:
    with pytest.raises(FsError) as info:
        call(*args, **kwargs)
    return info.value.errno


# ---- readdir -------------------------------------------------------------------------


def list_all(meta, ino, page=7):
    out, cookie = [], 0
    while True:
        batch = meta.readdir(ino, cookie, page)
        if not batch:
            return out
        out += batch
        cookie = batch[-1].cookie


def test_readdir_returns_entries_with_attributes_in_cookie_order(meta):
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    made = [meta.create(d.ino, b"f%02d" % i, 0o644) for i in range(20)]
    entries = list_all(meta, d.ino)
    assert [e.name for e in entries] == [b"f%02d" % i for i in range(20)]
    assert [e.attr for e in entries] == made
    cookies = [e.cookie for e in entries]
    assert cookies == sorted(cookies) and cookies[0] >= FIRST_COOKIE
    assert meta.readdir(d.ino, cookies[-1]) == []


def test_readdir_cookies_survive_concurrent_inserts_and_deletes(meta, meta_url):
    """A second client mutates the directory between pages: entries present for
    the whole listing appear exactly once, deleted ones never, new ones (added
    after the resume point) do."""
    other = open_meta(meta_url)
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    for i in range(30):
        meta.create(d.ino, b"old%02d" % i, 0o644)
    seen: list[bytes] = []
    cookie, page = 0, 0
    while batch := meta.readdir(d.ino, cookie, 5):
        seen += [e.name for e in batch]
        cookie = batch[-1].cookie
        page += 1
        if page == 1:
            other.unlink(d.ino, b"old00")  # already listed
            for i in range(25, 30):
                other.unlink(d.ino, b"old%02d" % i)  # not listed yet
            other.rename(d.ino, b"old10", d.ino, b"renamed")
        if page <= 3:
            other.create(d.ino, b"new%02d" % page, 0o644)
    other.close()
    survivors = {b"old%02d" % i for i in range(1, 25)} - {b"old10"}
    assert len(seen) == len(set(seen)), "an entry was listed twice"
    assert survivors <= set(seen), "an entry present throughout was skipped"
    assert not {b"old%02d" % i for i in range(25, 30)} & set(seen), "a deleted entry was listed"
    assert {b"new01", b"new02", b"new03", b"renamed"} <= set(seen)
    assert b"old10" not in seen


def test_readdir_errors(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.readdir, f.ino) == E.ENOTDIR
    assert errno_of(meta.readdir, 98765) == E.ENOENT
    d = meta.mkdir(ROOT_INO, b"private", 0o700)
    assert errno_of(meta.readdir, d.ino, 0, 10, Ctx(uid=1000, gid=1000)) == E.EACCES


def test_rename_gives_a_new_cookie_after_the_old_ones(meta):
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    meta.create(d.ino, b"a", 0o644)
    meta.create(d.ino, b"b", 0o644)
    first = meta.readdir(d.ino)
    meta.rename(d.ino, b"a", d.ino, b"c")
    after = meta.readdir(d.ino)
    assert [e.name for e in after] == [b"b", b"c"]
    assert after[-1].cookie > first[-1].cookie


# ---- xattrs --------------------------------------------------------------------------


def test_xattr_set_get_list_remove(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    before = meta.getattr(f.ino).ctime_ns
    meta.setxattr(f.ino, b"user.b", b"\x00\x01binary")
    meta.setxattr(f.ino, b"user.a", b"")
    assert meta.getxattr(f.ino, b"user.b") == b"\x00\x01binary"
    assert meta.getxattr(f.ino, b"user.a") == b""
    assert meta.listxattr(f.ino) == [b"user.a", b"user.b"]
    assert meta.getattr(f.ino).ctime_ns >= before
    meta.setxattr(f.ino, b"user.b", b"v2")
    assert meta.getxattr(f.ino, b"user.b") == b"v2"
    meta.removexattr(f.ino, b"user.b")
    assert meta.listxattr(f.ino) == [b"user.a"]
    assert errno_of(meta.getxattr, f.ino, b"user.b") == E.ENODATA
    assert errno_of(meta.removexattr, f.ino, b"user.b") == E.ENODATA


def test_xattr_create_and_replace_flags(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.setxattr, f.ino, b"user.k", b"v", XATTR_REPLACE) == E.ENODATA
    meta.setxattr(f.ino, b"user.k", b"v1", XATTR_CREATE)
    assert errno_of(meta.setxattr, f.ino, b"user.k", b"v2", XATTR_CREATE) == E.EEXIST
    assert meta.getxattr(f.ino, b"user.k") == b"v1"
    meta.setxattr(f.ino, b"user.k", b"v3", XATTR_REPLACE)
    assert meta.getxattr(f.ino, b"user.k") == b"v3"
    assert errno_of(meta.setxattr, f.ino, b"user.k", b"v", 0x10) == E.EINVAL


def test_xattr_name_and_size_limits(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.setxattr, f.ino, b"", b"v") == E.ERANGE
    assert errno_of(meta.setxattr, f.ino, b"user." + b"x" * 251, b"v") == E.ERANGE
    assert errno_of(meta.setxattr, f.ino, b"nonamespace", b"v") == E.EOPNOTSUPP
    # A C string cannot hold it: stored, it made every listxattr of the file EIO
    # through the mount.
    assert errno_of(meta.setxattr, f.ino, b"user.\0x", b"v") == E.EINVAL
    assert meta.listxattr(f.ino) == []
    assert errno_of(meta.setxattr, f.ino, b"user.big", b"x" * 65537) == E.E2BIG
    meta.setxattr(f.ino, b"user.max", b"x" * 65536)
    assert len(meta.getxattr(f.ino, b"user.max")) == 65536
    assert errno_of(meta.getxattr, 55555, b"user.x") == E.ENOENT


def test_xattr_permissions_follow_mode_bits(meta):
    meta.setattr(ROOT_INO, mode=0o777)
    owner, other = Ctx(uid=1000, gid=1000), Ctx(uid=2000, gid=2000)
    f = meta.create(ROOT_INO, b"f", 0o640, owner)
    meta.setxattr(f.ino, b"user.k", b"v", 0, owner)
    assert errno_of(meta.getxattr, f.ino, b"user.k", other) == E.EACCES
    assert errno_of(meta.setxattr, f.ino, b"user.k", b"w", 0, other) == E.EACCES
    assert errno_of(meta.removexattr, f.ino, b"user.k", other) == E.EACCES


def test_trusted_names_are_listed_to_root_alone_acls_to_nobody(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    meta.setxattr(f.ino, b"user.k", b"v")
    meta.setxattr(f.ino, b"trusted.t", b"v")
    assert meta.listxattr(f.ino) == [b"trusted.t", b"user.k"]
    assert meta.listxattr(f.ino, Ctx(uid=1000, gid=1000)) == [b"user.k"]
    for acl in (b"system.posix_acl_access", b"system.posix_acl_default"):
        assert errno_of(meta.setxattr, f.ino, acl, b"\x02\x00\x00\x00") == E.EOPNOTSUPP
        assert errno_of(meta.getxattr, f.ino, acl) == E.EOPNOTSUPP


def test_xattrs_go_with_the_inode(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    meta.setxattr(f.ino, b"user.k", b"v")
    meta.unlink(ROOT_INO, b"f")
    g = meta.create(ROOT_INO, b"f", 0o644)
    assert meta.listxattr(g.ino) == []
    check()


# ---- permissions ---------------------------------------------------------------------


def test_access_owner_group_other_bits(meta):
    f = meta.create(ROOT_INO, b"f", 0o640)
    meta.setattr(f.ino, uid=1000, gid=100)
    owner = Ctx(uid=1000, gid=1000)
    member = Ctx(uid=2000, gid=2000, groups=(100,))
    primary = Ctx(uid=2001, gid=100)
    stranger = Ctx(uid=3000, gid=3000)
    meta.access(owner, f.ino, os.R_OK | os.W_OK)
    assert errno_of(meta.access, owner, f.ino, os.X_OK) == E.EACCES
    meta.access(member, f.ino, os.R_OK)
    meta.access(primary, f.ino, os.R_OK)
    assert errno_of(meta.access, member, f.ino, os.W_OK) == E.EACCES
    assert errno_of(meta.access, stranger, f.ino, os.R_OK) == E.EACCES
    meta.access(stranger, f.ino, os.F_OK)
    assert errno_of(meta.access, stranger, 1234567, os.F_OK) == E.ENOENT


def test_owner_bits_win_even_when_group_bits_allow_more(meta):
    f = meta.create(ROOT_INO, b"f", 0o070)
    meta.setattr(f.ino, uid=1000, gid=100)
    assert errno_of(meta.access, Ctx(uid=1000, gid=100), f.ino, os.R_OK) == E.EACCES


def test_root_bypass_except_execute_without_any_x_bit(meta):
    f = meta.create(ROOT_INO, b"f", 0o000)
    meta.setattr(f.ino, uid=1000, gid=1000)
    root = Ctx()
    meta.access(root, f.ino, os.R_OK | os.W_OK)
    assert errno_of(meta.access, root, f.ino, os.X_OK) == E.EACCES
    meta.setattr(f.ino, mode=0o001)
    meta.access(root, f.ino, os.X_OK)
    d = meta.mkdir(ROOT_INO, b"d", 0o000)
    meta.access(root, d.ino, os.X_OK | os.R_OK | os.W_OK)


def test_create_needs_write_and_search_on_parent(meta):
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    user = Ctx(uid=1000, gid=1000)
    assert errno_of(meta.create, d.ino, b"f", 0o644, user) == E.EACCES
    assert errno_of(meta.mkdir, d.ino, b"s", 0o755, user) == E.EACCES
    meta.create(d.ino, b"exists", 0o644)
    # Linux reports EEXIST before the write-permission check.
    assert errno_of(meta.create, d.ino, b"exists", 0o644, user) == E.EEXIST
    noexec = meta.mkdir(ROOT_INO, b"noexec", 0o666)
    assert errno_of(meta.lookup, noexec.ino, b"x", user) == E.EACCES


def test_sticky_directory_lets_only_owners_delete(meta, check):
    tmp = meta.mkdir(ROOT_INO, b"tmp", 0o1777)
    alice, bob = Ctx(uid=1001, gid=1001), Ctx(uid=1002, gid=1002)
    meta.create(tmp.ino, b"a", 0o666, alice)
    assert errno_of(meta.unlink, tmp.ino, b"a", bob) == E.EPERM
    meta.unlink(tmp.ino, b"a", alice)
    meta.mkdir(tmp.ino, b"ad", 0o777, alice)
    assert errno_of(meta.rmdir, tmp.ino, b"ad", bob) == E.EPERM
    meta.setattr(tmp.ino, uid=1002)  # the directory's owner may delete anything
    meta.rmdir(tmp.ino, b"ad", bob)
    check()


def test_supplementary_groups_grant_directory_write(meta):
    d = meta.mkdir(ROOT_INO, b"team", 0o770)
    meta.setattr(d.ino, uid=1, gid=500)
    member = Ctx(uid=1000, gid=1000, groups=(20, 500))
    outsider = Ctx(uid=1001, gid=1001, groups=(20,))
    f = meta.create(d.ino, b"f", 0o644, member)
    assert stat.S_ISREG(f.mode)
    assert errno_of(meta.create, d.ino, b"g", 0o644, outsider) == E.EACCES
    assert errno_of(meta.unlink, d.ino, b"f", outsider) == E.EACCES
    meta.unlink(d.ino, b"f", member)
