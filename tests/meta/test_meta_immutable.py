"""Read-only snapshots are immutable: every change is refused, root's too, until
``make_writable``. On every backend.

Each test tries to change a read-only copy by one more door (a name, an
attribute, an extended attribute, a write, a rename from either side, a
policy, a snapshot into it, a create that skips reading its parent) and
checks that nothing changed and the database stays consistent.
"""

from __future__ import annotations

import errno as E
import stat

from tests.meta.test_meta_content import errno_of, write

from shinglefs.meta.api import IMMUTABLE, ROOT_CTX, ROOT_INO, Ctx, DirPolicy, SliceRef

USER = Ctx(uid=1000, gid=1000, pid=1, umask=0o022)
OTHER = Ctx(uid=1001, gid=1001, pid=1, umask=0o022)


def pinned(meta, ctx=ROOT_CTX):
    """/src (a file with data, sub/ with b, an empty d/, a symlink) and /v1, its
    read-only copy made by ``ctx``; returns (src, v1, names of v1 by name)."""
    src = meta.mkdir(ROOT_INO, b"src", 0o777)
    if ctx is not ROOT_CTX:
        meta.setattr(src.ino, uid=ctx.uid, gid=ctx.gid)
    a = meta.create(src.ino, b"a", 0o644, ctx)
    write(meta, a.ino, 0, 5000)
    sub = meta.mkdir(src.ino, b"sub", 0o755, ctx)
    meta.create(sub.ino, b"b", 0o644, ctx)
    meta.mkdir(src.ino, b"d", 0o755, ctx)
    meta.symlink(src.ino, b"link", b"a", ctx)
    meta.setxattr(a.ino, b"user.tag", b"v", ctx=ctx)
    meta.setattr(ROOT_INO, mode=0o777)
    v1 = meta.snapshot(src.ino, ROOT_INO, b"v1", ctx, read_only=True)
    entries = {n: meta.lookup(v1.ino, n) for n in (b"a", b"sub", b"d", b"link")}
    return meta.getattr(src.ino), v1, entries


def shape(meta, ino):
    """Everything a change could touch, below ``ino``: names, attributes, xattrs."""
    out = []
    for e in sorted(meta.readdir(ino, 0), key=lambda e: e.name):
        xattrs = {n: meta.getxattr(e.ino, n) for n in meta.listxattr(e.ino)}
        out.append((e.name, meta.getattr(e.ino), xattrs))
        if stat.S_ISDIR(e.attr.mode):
            out.append(shape(meta, e.ino))
    return out


def test_every_inode_of_a_read_only_copy_is_immutable_and_the_source_is_not(meta, check):
    src, v1, entries = pinned(meta)
    assert v1.immutable and v1.flags & IMMUTABLE
    assert all(a.immutable for a in entries.values())
    b = meta.lookup(entries[b"sub"].ino, b"b")
    assert b.immutable
    assert not src.immutable and not meta.lookup(src.ino, b"a").immutable
    writable = meta.snapshot(src.ino, ROOT_INO, b"w")
    assert not writable.immutable and not meta.lookup(writable.ino, b"a").immutable
    check()


def test_root_can_change_nothing_in_a_read_only_copy(meta, check):
    src, v1, e = pinned(meta)
    a, sub, d = e[b"a"], e[b"sub"], e[b"d"]
    before = shape(meta, v1.ino), meta.getattr(v1.ino)
    refusals = [
        lambda: meta.setattr(a.ino, mode=0o666),
        lambda: meta.setattr(a.ino, uid=5, gid=5),
        lambda: meta.setattr(a.ino, size=0),
        lambda: meta.truncate(a.ino, 10),
        lambda: meta.setattr(a.ino, atime_ns=1, mtime_ns=1),
        lambda: meta.setattr(v1.ino, mode=0o777),
        lambda: meta.create(v1.ino, b"new", 0o644),
        lambda: meta.create_file(v1.ino, b"new", 0o644, exclusive=False),
        lambda: meta.mkdir(sub.ino, b"new", 0o755),
        lambda: meta.symlink(v1.ino, b"new", b"a"),
        lambda: meta.mknod(d.ino, b"fifo", stat.S_IFIFO | 0o644),
        lambda: meta.link(a.ino, src.ino, b"a-link"),
        lambda: meta.link(meta.lookup(src.ino, b"a").ino, v1.ino, b"in"),
        lambda: meta.unlink(v1.ino, b"a"),
        lambda: meta.unlink(v1.ino, b"link"),
        lambda: meta.rmdir(v1.ino, b"d"),
        lambda: meta.rmdir(ROOT_INO, b"v1"),  # EPERM before ENOTEMPTY, as Linux
        lambda: meta.rename(ROOT_INO, b"v1", ROOT_INO, b"v2"),
        lambda: meta.rename(v1.ino, b"a", v1.ino, b"a2"),
        lambda: meta.rename(v1.ino, b"a", src.ino, b"out"),
        lambda: meta.rename(src.ino, b"a", v1.ino, b"in"),
        lambda: meta.rename(src.ino, b"a", v1.ino, b"a"),  # over an immutable target
        lambda: meta.rename(src.ino, b"a", sub.ino, b"b"),
        lambda: meta.setxattr(a.ino, b"user.tag", b"changed"),
        lambda: meta.setxattr(v1.ino, b"user.new", b"x"),
        lambda: meta.removexattr(a.ino, b"user.tag"),
        lambda: write(meta, a.ino, 0, 10),
        lambda: meta.set_policy(v1.ino, DirPolicy(retention=2)),
        lambda: meta.snapshot(src.ino, v1.ino, b"inside"),
    ]
    for i, refuse in enumerate(refusals):
        assert errno_of(refuse) == E.EPERM, f"refusal {i}"
    assert (shape(meta, v1.ino), meta.getattr(v1.ino)) == before
    assert meta.lookup(src.ino, b"a").size == 5000  # the source untouched
    check()


def test_exchange_with_an_immutable_entry_is_refused(meta, check):
    from shinglefs.meta.api import RENAME_EXCHANGE

    src, v1, e = pinned(meta)
    assert errno_of(meta.rename, src.ino, b"a", v1.ino, b"a", RENAME_EXCHANGE) == E.EPERM
    assert errno_of(meta.rename, ROOT_INO, b"src", ROOT_INO, b"v1", RENAME_EXCHANGE) == E.EPERM
    assert meta.lookup(v1.ino, b"a").ino == e[b"a"].ino
    check()


def test_placement_may_change_but_not_retention(meta, check):
    _, v1, _ = pinned(meta)
    meta.set_policy(v1.ino, DirPolicy(tier="cold", replicas=2))
    assert meta.get_policy(v1.ino) == DirPolicy(tier="cold", retention=None, replicas=2)
    assert errno_of(meta.set_policy, v1.ino, DirPolicy(tier="cold", retention=3,
                                                       replicas=2)) == E.EPERM
    check()


def test_reading_a_read_only_copy_works(meta, check):
    _, v1, e = pinned(meta)
    assert sum(p.length for p in meta.read_map(e[b"a"].ino, 0, 5000)) == 5000
    assert meta.getxattr(e[b"a"].ino, b"user.tag") == b"v"
    assert meta.readlink(e[b"link"].ino) == b"a"
    assert sorted(x.name for x in meta.readdir(v1.ino, 0)) == [b"a", b"d", b"link", b"sub"]


def test_a_copy_of_a_read_only_copy_is_writable_unless_asked(meta, check):
    _, v1, _ = pinned(meta)
    restored = meta.snapshot(v1.ino, ROOT_INO, b"restored")
    a = meta.lookup(restored.ino, b"a")
    assert not restored.immutable and not a.immutable
    meta.setattr(a.ino, mode=0o644)
    write(meta, a.ino, 5000, 100)
    meta.unlink(restored.ino, b"link")
    again = meta.snapshot(v1.ino, ROOT_INO, b"v1-again", read_only=True)
    assert again.immutable and meta.lookup(again.ino, b"a").immutable
    check()


def test_make_writable_thaws_the_tree_so_it_can_be_removed(meta, check):
    src, v1, e = pinned(meta)
    assert meta.make_writable(v1.ino) == 6  # v1, a, sub, sub/b, d, link
    assert errno_of(meta.make_writable, v1.ino) == E.EINVAL  # no snapshot any more
    assert not meta.getattr(v1.ino).immutable
    assert not meta.lookup(e[b"sub"].ino, b"b").immutable
    assert stat.S_IMODE(meta.getattr(e[b"a"].ino).mode) == 0o444  # modes stay
    meta.unlink(e[b"sub"].ino, b"b")
    for name in (b"sub", b"d"):
        meta.rmdir(v1.ino, name)
    for name in (b"a", b"link"):
        meta.unlink(v1.ino, name)
    meta.rmdir(ROOT_INO, b"v1")
    assert meta.lookup(src.ino, b"a").size == 5000
    check()


def test_only_root_or_the_owner_may_make_a_copy_writable(meta, check):
    _, v1, e = pinned(meta, USER)
    assert meta.getattr(v1.ino).uid == USER.uid
    assert errno_of(meta.make_writable, v1.ino, OTHER) == E.EPERM
    assert meta.getattr(v1.ino).immutable
    # The owner cannot change it either while it is read-only ...
    assert errno_of(meta.setattr, e[b"a"].ino, mode=0o644, ctx=USER) == E.EPERM
    assert errno_of(meta.unlink, v1.ino, b"a", USER) == E.EPERM
    # ... but may thaw it, and then remove it like any tree of theirs.
    assert meta.make_writable(v1.ino, USER) == 6
    meta.setattr(v1.ino, mode=0o755, ctx=USER)
    meta.unlink(v1.ino, b"a", USER)
    assert errno_of(meta.make_writable, 10**9) == E.ENOENT
    check()


def test_a_create_that_skips_reading_its_parent_is_still_refused(meta, check):
    _, v1, _ = pinned(meta)
    seen = (v1.mode, v1.uid, v1.gid)  # what a client remembers of the directory
    assert errno_of(meta.create_file, v1.ino, b"new", 0o644, parent_seen=seen) == E.EPERM
    assert b"new" not in [x.name for x in meta.readdir(v1.ino, 0)]
    check()


def test_a_slice_commit_to_an_immutable_file_is_refused_with_the_rest(meta, check):
    _, _, e = pinned(meta)
    a = e[b"a"]
    sid = meta.next_slice_id()
    assert errno_of(meta.commit_slice, a.ino, 0, SliceRef(sid, 0, 10, 0), 10,
                    slice_length=10) == E.EPERM
    assert meta.getattr(a.ino).size == 5000
    check()


def test_only_a_whole_read_only_snapshot_is_made_writable(meta, check):
    """Not a part of one (its directory or a file inside), and not an ordinary
    tree that holds one: a user owning the directory around another user's
    pinned copy cannot thaw it that way."""
    src, _, e = pinned(meta)
    assert errno_of(meta.make_writable, e[b"sub"].ino) == E.EPERM
    assert errno_of(meta.make_writable, e[b"a"].ino) == E.EPERM
    assert errno_of(meta.make_writable, src.ino) == E.EINVAL  # an ordinary tree
    proj = meta.mkdir(ROOT_INO, b"proj", 0o777)
    meta.setattr(proj.ino, uid=USER.uid, gid=USER.gid)
    theirs = meta.snapshot(src.ino, proj.ino, b"data@v1", OTHER, read_only=True)
    assert errno_of(meta.make_writable, proj.ino, USER) == E.EINVAL
    assert errno_of(meta.make_writable, theirs.ino, USER) == E.EPERM
    assert meta.getattr(theirs.ino).immutable and meta.getattr(e[b"sub"].ino).immutable
    assert meta.getattr(e[b"a"].ino).immutable
    check()


def test_access_for_writing_is_refused_and_truncating_a_directory_is_eisdir(meta, check):
    _, v1, e = pinned(meta)
    assert errno_of(meta.access, ROOT_CTX, e[b"a"].ino, 2) == E.EPERM  # W_OK, root too
    meta.access(ROOT_CTX, e[b"a"].ino, 4)  # R_OK is fine
    assert errno_of(meta.truncate, v1.ino, 0) == E.EISDIR  # the type first, as Linux
    check()


def test_a_big_snapshot_is_made_writable_whole(meta, check):
    """More inodes than one statement names (batches, the last one padded)."""
    src = meta.mkdir(ROOT_INO, b"big", 0o755)
    sub = meta.mkdir(src.ino, b"sub", 0o755)
    for i in range(600):
        meta.create(sub.ino if i % 2 else src.ino, b"f%d" % i, 0o644)
    v1 = meta.snapshot(src.ino, ROOT_INO, b"big@v1", read_only=True)
    assert meta.make_writable(v1.ino) == 602
    copy_sub = meta.lookup(v1.ino, b"sub")
    assert not any(e.attr.immutable for d in (v1.ino, copy_sub.ino)
                   for e in meta.readdir(d, 0, 1000))
    meta.unlink(copy_sub.ino, b"f599")
    check()
