"""Who may change what in ``setattr``: Linux's rules, and the two grants a caller
can hold beyond its credentials (a descriptor open for writing; a change the
kernel of a ``default_permissions`` mount already checked). Runs on every
metadata backend (``meta`` fixture)."""

from __future__ import annotations

import errno as E
import stat
import time

from shinglefs.meta.api import ROOT_INO, UTIME_NOW, UTIME_OMIT, Ctx
from shinglefs.meta.errors import FsError

OWNER = Ctx(uid=1000, gid=1000)
OTHER = Ctx(uid=2000, gid=2000)


def errno_of(call, *args, **kwargs) -> int:
    try:
        call(*args, **kwargs)
    except FsError as exc:
        return exc.errno
    return 0


def owned_file(meta, perm: int, name: bytes = b"f"):
    meta.setattr(ROOT_INO, mode=0o777)
    f = meta.create(ROOT_INO, name, 0o644, OWNER)
    return meta.setattr(f.ino, mode=perm)  # root: setuid/setgid kept as asked


def test_size_change_through_a_descriptor_open_for_writing_needs_no_write_permission(meta):
    f = owned_file(meta, 0)
    assert errno_of(meta.setattr, f.ino, size=100, ctx=OWNER) == E.EACCES
    assert meta.setattr(f.ino, size=100, ctx=OWNER, open_for_write=True).size == 100
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.setattr, d.ino, size=0, open_for_write=True) == E.EISDIR


def test_now_for_one_time_and_omit_for_the_other_needs_ownership(meta):
    f = owned_file(meta, 0o666)
    assert errno_of(meta.setattr, f.ino, atime_ns=UTIME_OMIT, mtime_ns=UTIME_NOW,
                    ctx=OTHER) == E.EPERM
    assert errno_of(meta.setattr, f.ino, mtime_ns=UTIME_NOW, ctx=OTHER) == E.EPERM
    before = time.time_ns()
    g = meta.setattr(f.ino, atime_ns=UTIME_NOW, mtime_ns=UTIME_NOW, ctx=OTHER)
    assert g.mtime_ns >= before and g.atime_ns >= before
    assert meta.setattr(f.ino, mtime_ns=UTIME_NOW, ctx=OWNER).mtime_ns >= g.mtime_ns


def test_chown_of_a_file_clears_setuid_even_when_owner_and_group_stay(meta):
    f = owned_file(meta, 0o6755)
    g = meta.setattr(f.ino, uid=-1, gid=-1, ctx=OWNER)
    assert (g.uid, g.gid, stat.S_IMODE(g.mode)) == (1000, 1000, 0o755)
    f2 = owned_file(meta, 0o6745, b"no-group-exec")
    g2 = meta.setattr(f2.ino, uid=1000, ctx=OWNER)
    assert stat.S_IMODE(g2.mode) == 0o2745  # setgid without group-exec stays (as FUSE's kernel)
    d = meta.mkdir(ROOT_INO, b"dir", 0o755)
    d = meta.setattr(d.ino, mode=0o6755)
    assert stat.S_IMODE(meta.setattr(d.ino, uid=5, gid=5).mode) == 0o6755


def test_checked_change_is_applied_as_the_kernel_allowed_it(meta):
    f = owned_file(meta, 0o6777)
    # The mode change a non-owner's write makes the kernel send (setuid/setgid cleared)
    assert errno_of(meta.setattr, f.ino, mode=0o777, ctx=OTHER) == E.EPERM
    g = meta.setattr(f.ino, mode=0o777, ctx=OTHER, checked=True)
    assert stat.S_IMODE(g.mode) == 0o777
    # "now" times, which pyfuse3 hands over as an explicit time
    now = time.time_ns()
    assert errno_of(meta.setattr, f.ino, atime_ns=now, mtime_ns=now, ctx=OTHER) == E.EPERM
    h = meta.setattr(f.ino, atime_ns=now, mtime_ns=now, ctx=OTHER, checked=True)
    assert h.mtime_ns == now
    # the kernel checks rights, not types: a directory still has no size
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.setattr, d.ino, size=0, ctx=OTHER, checked=True) == E.EISDIR



def test_truncate_by_a_non_root_caller_clears_setuid_and_setgid(meta):
    # Linux's setattr_should_drop_suidgid; the kernel of a mount does not send
    # it for open(O_TRUNC), which truncates in the file system's open
    f = owned_file(meta, 0o6755)
    assert stat.S_IMODE(meta.truncate(f.ino, 0, OWNER).mode) == 0o755
    f2 = owned_file(meta, 0o6755, b"by-root")
    assert stat.S_IMODE(meta.truncate(f2.ino, 0).mode) == 0o6755
    f3 = owned_file(meta, 0o2746, b"no-group-exec")
    assert stat.S_IMODE(meta.truncate(f3.ino, 1, OWNER).mode) == 0o2746  # in the group
    g3 = meta.setattr(f3.ino, size=0, ctx=OTHER, open_for_write=True)
    assert stat.S_IMODE(g3.mode) == 0o746  # not in the group


def test_chmod_by_an_owner_outside_the_group_drops_setgid_of_a_directory_too(meta):
    # setattr_prepare: no exception for directories (ext4 on Linux agrees)
    meta.setattr(ROOT_INO, mode=0o777)
    d = meta.mkdir(ROOT_INO, b"d", 0o755, OWNER)
    d = meta.setattr(d.ino, gid=1000, ctx=OWNER)
    assert stat.S_IMODE(meta.setattr(d.ino, mode=0o2775, ctx=OWNER).mode) == 0o2775
    d = meta.setattr(d.ino, gid=3000)  # root gives it a group the owner is not in
    assert stat.S_IMODE(meta.setattr(d.ino, mode=0o2775, ctx=OWNER).mode) == 0o775
