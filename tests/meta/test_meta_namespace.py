"""Namespace operations and their errno, on every backend."""

from __future__ import annotations

import errno as E
import stat
import time

import pytest

from shinglefs.meta.api import (
    LINK_MAX,
    ROOT_INO,
    UTIME_NOW,
    UTIME_OMIT,
    Ctx,
    DirPolicy,
)
from shinglefs.meta.errors import FsError


def errno_of(call, *args, **kwargs) -> int:
    with pytest.raises(FsError) as info:
        call(*args, **kwargs)
    return info.value.errno


def test_root_is_a_directory_owned_by_root(meta):
    root = meta.getattr(ROOT_INO)
    assert root.is_dir and root.mode == stat.S_IFDIR | 0o755
    assert (root.uid, root.gid, root.nlink) == (0, 0, 2)


def test_mkdir_then_lookup_returns_the_same_inode_and_bumps_parent_nlink(meta, check):
    d = meta.mkdir(ROOT_INO, b"data", 0o750)
    assert d.is_dir and d.nlink == 2 and stat.S_IMODE(d.mode) == 0o750
    assert meta.lookup(ROOT_INO, b"data") == d
    assert meta.getattr(ROOT_INO).nlink == 3
    check()


def test_create_applies_umask_and_caller_ids(meta):
    ctx = Ctx(uid=1000, gid=100, umask=0o022)
    meta.setattr(ROOT_INO, mode=0o777)
    f = meta.create(ROOT_INO, b"f", 0o666, ctx)
    assert f.is_file and stat.S_IMODE(f.mode) == 0o644
    assert (f.uid, f.gid, f.nlink, f.size) == (1000, 100, 1, 0)


def test_create_exclusive_on_existing_name_raises_eexist(meta, check):
    meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.create, ROOT_INO, b"f", 0o644) == E.EEXIST
    meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.create, ROOT_INO, b"d", 0o644) == E.EEXIST
    check()


def test_create_non_exclusive_returns_the_existing_file(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    again = meta.create(ROOT_INO, b"f", 0o600, exclusive=False)
    assert again.ino == f.ino and stat.S_IMODE(again.mode) == 0o644
    meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.create, ROOT_INO, b"d", 0o644, exclusive=False) == E.EISDIR


def test_lookup_errors(meta):
    assert errno_of(meta.lookup, ROOT_INO, b"missing") == E.ENOENT
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.lookup, f.ino, b"x") == E.ENOTDIR
    assert errno_of(meta.lookup, 999_999, b"x") == E.ENOENT


def test_lookup_dot_and_dotdot(meta):
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    assert meta.lookup(d.ino, b".").ino == d.ino
    assert meta.lookup(d.ino, b"..").ino == ROOT_INO
    assert meta.lookup(ROOT_INO, b"..").ino == ROOT_INO


@pytest.mark.parametrize(
    ("name", "err"),
    [
        (b"", E.EINVAL),
        (b"a/b", E.EINVAL),
        (b"a\0b", E.EINVAL),
        (b".", E.EEXIST),
        (b"..", E.EEXIST),
        (b"x" * 256, E.ENAMETOOLONG),
    ],
)
def test_name_validation_on_create_like_ops(meta, name, err):
    f = meta.create(ROOT_INO, b"target", 0o644)
    assert errno_of(meta.create, ROOT_INO, name, 0o644) == err
    assert errno_of(meta.mkdir, ROOT_INO, name, 0o755) == err
    assert errno_of(meta.mknod, ROOT_INO, name, stat.S_IFIFO | 0o644) == err
    assert errno_of(meta.symlink, ROOT_INO, name, b"t") == err
    assert errno_of(meta.link, f.ino, ROOT_INO, name) == err


def test_name_of_255_bytes_is_accepted_and_any_bytes_allowed(meta):
    long = b"n" * 255
    assert meta.create(ROOT_INO, long, 0o644).ino == meta.lookup(ROOT_INO, long).ino
    odd = bytes(range(1, 47)) + b"\xff\xfe"
    meta.create(ROOT_INO, odd, 0o644)
    assert meta.lookup(ROOT_INO, odd).is_file
    assert errno_of(meta.lookup, ROOT_INO, b"x" * 256) == E.ENAMETOOLONG


def test_mknod_types(meta):
    fifo = meta.mknod(ROOT_INO, b"fifo", stat.S_IFIFO | 0o600)
    assert stat.S_ISFIFO(fifo.mode)
    sock = meta.mknod(ROOT_INO, b"sock", stat.S_IFSOCK | 0o600)
    assert stat.S_ISSOCK(sock.mode)
    dev = meta.mknod(ROOT_INO, b"dev", stat.S_IFCHR | 0o600, rdev=0x0103)
    assert stat.S_ISCHR(dev.mode) and dev.rdev == 0x0103
    plain = meta.mknod(ROOT_INO, b"plain", 0o644)
    assert stat.S_ISREG(plain.mode)
    assert errno_of(meta.mknod, ROOT_INO, b"dir", stat.S_IFDIR | 0o755) == E.EPERM
    assert errno_of(meta.mknod, ROOT_INO, b"lnk", stat.S_IFLNK | 0o777) == E.EINVAL
    meta.setattr(ROOT_INO, mode=0o777)
    user = Ctx(uid=1000, gid=1000)
    assert errno_of(meta.mknod, ROOT_INO, b"dev2", stat.S_IFBLK | 0o600, 1, user) == E.EPERM


def test_unlink_removes_entry_and_frees_inode(meta, check):
    f = meta.create(ROOT_INO, b"f", 0o644)
    res = meta.unlink(ROOT_INO, b"f")
    assert res.released and res.attr.nlink == 0
    assert errno_of(meta.lookup, ROOT_INO, b"f") == E.ENOENT
    assert errno_of(meta.getattr, f.ino) == E.ENOENT
    check()


def test_unlink_errors(meta):
    assert errno_of(meta.unlink, ROOT_INO, b"nope") == E.ENOENT
    meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.unlink, ROOT_INO, b"d") == E.EISDIR
    assert errno_of(meta.unlink, ROOT_INO, b".") == E.EISDIR
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.unlink, f.ino, b"x") == E.ENOTDIR


def test_rmdir_semantics(meta, check):
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    meta.create(d.ino, b"f", 0o644)
    assert errno_of(meta.rmdir, ROOT_INO, b"d") == E.ENOTEMPTY
    meta.unlink(d.ino, b"f")
    assert meta.rmdir(ROOT_INO, b"d").released
    assert meta.getattr(ROOT_INO).nlink == 2
    meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.rmdir, ROOT_INO, b"f") == E.ENOTDIR
    assert errno_of(meta.rmdir, ROOT_INO, b"nope") == E.ENOENT
    assert errno_of(meta.rmdir, ROOT_INO, b".") == E.EINVAL
    assert errno_of(meta.rmdir, ROOT_INO, b"..") == E.ENOTEMPTY
    check()


def test_hard_links_share_the_inode_and_count(meta, check):
    f = meta.create(ROOT_INO, b"a", 0o644)
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    linked = meta.link(f.ino, d.ino, b"b")
    assert linked.ino == f.ino and linked.nlink == 2
    assert meta.lookup(d.ino, b"b").ino == f.ino
    res = meta.unlink(ROOT_INO, b"a")
    assert not res.released and res.attr.nlink == 1
    assert meta.getattr(f.ino).nlink == 1
    check()


def test_link_errors(meta):
    f = meta.create(ROOT_INO, b"a", 0o644)
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.link, d.ino, ROOT_INO, b"d2") == E.EPERM
    assert errno_of(meta.link, f.ino, ROOT_INO, b"d") == E.EEXIST
    assert errno_of(meta.link, 424242, ROOT_INO, b"x") == E.ENOENT
    assert errno_of(meta.link, f.ino, f.ino, b"x") == E.ENOTDIR


def test_link_beyond_link_max_raises_emlink(meta):
    f = meta.create(ROOT_INO, b"a", 0o644)
    # Reach the bound through the database, as 65,000 links would take too long.
    meta.backend.run(
        lambda tx: tx.run("UPDATE inodes SET nlink = ? WHERE ino = ?", (LINK_MAX, f.ino)), "write"
    )
    assert errno_of(meta.link, f.ino, ROOT_INO, b"b") == E.EMLINK


def test_symlink_and_readlink(meta):
    s = meta.symlink(ROOT_INO, b"l", b"../some/where")
    assert s.is_symlink and s.size == len(b"../some/where") and stat.S_IMODE(s.mode) == 0o777
    assert meta.readlink(s.ino) == b"../some/where"
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.readlink, f.ino) == E.EINVAL
    assert errno_of(meta.symlink, ROOT_INO, b"e", b"") == E.ENOENT
    assert errno_of(meta.symlink, ROOT_INO, b"big", b"x" * 4096) == E.ENAMETOOLONG
    assert errno_of(meta.symlink, ROOT_INO, b"l", b"t") == E.EEXIST


def test_setattr_mode_keeps_type_and_sets_ctime(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    time.sleep(0.001)
    g = meta.setattr(f.ino, mode=0o4711)
    assert g.mode == stat.S_IFREG | 0o4711 and g.ctime_ns > f.ctime_ns
    assert meta.getattr(f.ino) == g


def test_setattr_times_now_omit_and_explicit(meta):
    f = meta.create(ROOT_INO, b"f", 0o644)
    g = meta.setattr(f.ino, atime_ns=1_000_000_007, mtime_ns=UTIME_OMIT)
    assert g.atime_ns == 1_000_000_007 and g.mtime_ns == f.mtime_ns
    before = time.time_ns()
    h = meta.setattr(f.ino, mtime_ns=UTIME_NOW)
    assert h.mtime_ns >= before and h.atime_ns == 1_000_000_007
    assert meta.getattr(f.ino) == h


def test_setattr_permission_rules(meta):
    meta.setattr(ROOT_INO, mode=0o777)
    owner = Ctx(uid=1000, gid=1000, groups=(50,))
    other = Ctx(uid=2000, gid=2000)
    f = meta.create(ROOT_INO, b"f", 0o644, owner)
    assert errno_of(meta.setattr, f.ino, mode=0o600, ctx=other) == E.EPERM
    assert errno_of(meta.setattr, f.ino, uid=2000, ctx=owner) == E.EPERM
    assert errno_of(meta.setattr, f.ino, gid=7, ctx=owner) == E.EPERM
    assert meta.setattr(f.ino, gid=50, ctx=owner).gid == 50
    assert errno_of(meta.setattr, f.ino, atime_ns=5, ctx=other) == E.EPERM
    assert (
        errno_of(meta.setattr, f.ino, atime_ns=UTIME_NOW, mtime_ns=UTIME_NOW, ctx=other) == E.EACCES
    )
    meta.setattr(f.ino, mode=0o666, ctx=owner)
    meta.setattr(f.ino, atime_ns=UTIME_NOW, mtime_ns=UTIME_NOW, ctx=other)  # writable: allowed
    meta.setattr(f.ino, mode=0o644, ctx=owner)
    assert errno_of(meta.setattr, f.ino, size=0, ctx=other) == E.EACCES
    assert meta.setattr(f.ino, size=0, ctx=owner).size == 0


def test_chown_clears_setuid(meta):
    f = meta.create(ROOT_INO, b"f", 0o6755)
    g = meta.setattr(f.ino, uid=1000, gid=1000)
    assert (g.uid, g.gid) == (1000, 1000)
    assert stat.S_IMODE(g.mode) == 0o0755


def test_setattr_size_errors(meta):
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.setattr, d.ino, size=0) == E.EISDIR
    s = meta.symlink(ROOT_INO, b"l", b"t")
    assert errno_of(meta.setattr, s.ino, size=0) == E.EINVAL
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.setattr, f.ino, size=-1) == E.EINVAL
    assert errno_of(meta.setattr, 777777, mode=0o600) == E.ENOENT
    meta.setattr(ROOT_INO, mode=0o777)
    ro = meta.create(ROOT_INO, b"ro", 0o444, Ctx(uid=1000, gid=1000))
    assert errno_of(meta.setattr, ro.ino, size=10, ctx=Ctx(uid=1000, gid=1000)) == E.EACCES


def test_setgid_directory_passes_group_down(meta):
    d = meta.mkdir(ROOT_INO, b"shared", 0o2775)
    meta.setattr(d.ino, gid=77)
    ctx = Ctx(uid=1000, gid=1000, groups=(77,))
    f = meta.create(d.ino, b"f", 0o644, ctx)
    sub = meta.mkdir(d.ino, b"sub", 0o755, ctx)
    assert f.gid == 77 and sub.gid == 77 and sub.mode & stat.S_ISGID


def test_policy_is_stored_and_a_new_subdirectory_inherits_the_tier_not_the_retention(meta):
    d = meta.mkdir(ROOT_INO, b"ckpt", 0o755)
    meta.set_policy(d.ino, DirPolicy(tier="cold", retention="keep-last=3"))
    assert meta.get_policy(d.ino) == DirPolicy("cold", "keep-last=3")
    sub = meta.mkdir(d.ino, b"step-100", 0o755)  # a checkpoint step: all of it stays
    assert meta.get_policy(sub.ino) == DirPolicy("cold", None)
    f = meta.create(d.ino, b"f", 0o644)
    assert errno_of(meta.get_policy, f.ino) == E.ENOTDIR
    assert errno_of(meta.set_policy, d.ino, DirPolicy("hot"), Ctx(uid=5, gid=5)) == E.EPERM


def test_mkdir_in_missing_or_non_directory_parent(meta):
    assert errno_of(meta.mkdir, 31337, b"x", 0o755) == E.ENOENT
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.mkdir, f.ino, b"x", 0o755) == E.ENOTDIR
