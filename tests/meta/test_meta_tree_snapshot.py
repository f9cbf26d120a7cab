"""``MetaStore.snapshot``: a copy-on-write copy of a file or a tree, on every backend.

Each test tries to break a promise of the contract: the copy shares the
source's slices (refcounts, not bytes), it is the source at one instant, later
changes on either side never reach the other, deleting either side frees only
what the other does not hold, and the database stays consistent (fsck's
passes) after every step.
"""

from __future__ import annotations

import errno as E
import itertools
import stat
import threading

import pytest
from tests.meta.test_meta_content import errno_of, write

from shinglefs.meta.api import (
    ROOT_CTX,
    ROOT_INO,
    Ctx,
    DirPolicy,
    ReadPiece,
    SessionInfo,
    SliceRef,
)
from shinglefs.meta.errors import FsError

USER = Ctx(uid=1000, gid=1000, pid=1, umask=0o022)


def tree(meta):
    """/src: a (2 slices), sub/b (hard link sub/b2), link -> a, d/ (empty), xattrs."""
    src = meta.mkdir(ROOT_INO, b"src", 0o755)
    a = meta.create(src.ino, b"a", 0o644)
    s1 = write(meta, a.ino, 0, 1000)
    s2 = write(meta, a.ino, 500, 1000)  # overlaps: a has two references
    sub = meta.mkdir(src.ino, b"sub", 0o750)
    b = meta.create(sub.ino, b"b", 0o600)
    s3 = write(meta, b.ino, 0, 4096)
    meta.link(b.ino, sub.ino, b"b2")
    meta.symlink(src.ino, b"link", b"a")
    meta.mkdir(src.ino, b"d", 0o700)
    meta.setxattr(a.ino, b"user.tag", b"v1")
    return src, meta.getattr(a.ino), meta.getattr(b.ino), (s1, s2, s3)


def names(meta, ino):
    return sorted(e.name for e in meta.readdir(ino, 0))


def test_a_tree_copy_shares_every_slice_and_keeps_shape(meta, check):
    src, a, b, (s1, s2, s3) = tree(meta)
    snap = meta.snapshot(src.ino, ROOT_INO, b"snap")
    assert stat.S_ISDIR(snap.mode) and snap.ino != src.ino and snap.nlink == 4  # sub, d
    assert names(meta, snap.ino) == names(meta, src.ino) == [b"a", b"d", b"link", b"sub"]
    ca = meta.lookup(snap.ino, b"a")
    assert ca.ino != a.ino and ca.size == a.size == 1500 and ca.mtime_ns == a.mtime_ns
    assert meta.read_map(ca.ino, 0, 1500) == meta.read_map(a.ino, 0, 1500)
    assert meta.getxattr(ca.ino, b"user.tag") == b"v1"
    csub = meta.lookup(snap.ino, b"sub")
    cb, cb2 = meta.lookup(csub.ino, b"b"), meta.lookup(csub.ino, b"b2")
    assert cb.ino == cb2.ino != b.ino and cb.nlink == 2  # the hard link stays one inode
    assert stat.S_IMODE(csub.mode) == 0o750
    assert meta.readlink(meta.lookup(snap.ino, b"link").ino) == b"a"
    assert [meta.get_slice(s).refcount for s in (s1, s2, s3)] == [2, 2, 2]
    assert meta.statfs().used_bytes == 2 * (1500 + 4096 + 1)  # a, b and the link's 1 byte
    check()


def test_later_writes_on_either_side_stay_on_their_side(meta, check):
    src, a, _, (s1, s2, _) = tree(meta)
    before = meta.read_map(a.ino, 0, 1500)
    snap = meta.snapshot(src.ino, ROOT_INO, b"snap")
    ca = meta.lookup(snap.ino, b"a")
    s4 = write(meta, a.ino, 0, 100)  # the source changes
    assert meta.read_map(ca.ino, 0, 1500) == before
    s5 = write(meta, ca.ino, 1400, 200)  # the copy grows
    assert meta.getattr(a.ino).size == 1500 and meta.getattr(ca.ino).size == 1600
    assert meta.read_map(a.ino, 0, 100) == [ReadPiece(0, 100, s4, 0)]
    assert meta.read_map(ca.ino, 1400, 200) == [ReadPiece(1400, 200, s5, 0)]
    meta.truncate(a.ino, 0)
    assert meta.read_map(ca.ino, 0, 1500)[0] == before[0]
    assert meta.get_slice(s1).refcount == 1 and meta.get_slice(s2).refcount == 1
    check()


def test_deleting_either_side_frees_only_what_the_other_does_not_hold(meta, check):
    src, _, _, (s1, s2, s3) = tree(meta)
    snap = meta.snapshot(src.ino, ROOT_INO, b"snap")
    meta.unlink(src.ino, b"a")
    assert meta.get_slice(s1).refcount == 1
    assert meta.pop_deletions() == []
    ca = meta.lookup(snap.ino, b"a")
    assert meta.read_map(ca.ino, 0, 1500)[0].slice_id == s1
    meta.unlink(snap.ino, b"a")
    queued = {d.id for d in meta.pop_deletions()}
    assert queued == {s1, s2}
    assert meta.get_slice(s3).refcount == 2
    check()


def test_a_single_file_is_copied_into_another_directory(meta, check):
    _, a, _, (s1, _, _) = tree(meta)
    other = meta.mkdir(ROOT_INO, b"other", 0o755)
    c = meta.snapshot(a.ino, other.ino, b"a-v1")
    assert stat.S_ISREG(c.mode) and c.nlink == 1 and c.size == 1500
    assert meta.lookup(other.ino, b"a-v1").ino == c.ino
    assert meta.get_slice(s1).refcount == 2
    check()


def test_read_only_clears_write_bits_and_keeps_the_rest(meta, check):
    src, _, _, _ = tree(meta)
    snap = meta.snapshot(src.ino, ROOT_INO, b"ro", read_only=True)
    for name, want in ((b"a", 0o444), (b"sub", 0o550), (b"d", 0o500)):
        assert stat.S_IMODE(meta.lookup(snap.ino, name).mode) == want
    assert stat.S_IMODE(snap.mode) == 0o555
    with pytest.raises(FsError) as info:
        meta.create(snap.ino, b"new", 0o644, USER)
    assert info.value.errno == E.EPERM  # immutable: tests/meta/test_meta_immutable.py
    check()


def test_refusals_change_nothing(meta, check):
    src, a, _, (s1, _, _) = tree(meta)
    sub = meta.lookup(src.ino, b"sub")
    assert errno_of(meta.snapshot, src.ino, ROOT_INO, b"src") == E.EEXIST
    assert errno_of(meta.snapshot, src.ino, src.ino, b"x") == E.EINVAL
    assert errno_of(meta.snapshot, src.ino, sub.ino, b"x") == E.EINVAL
    assert errno_of(meta.snapshot, 999_999, ROOT_INO, b"x") == E.ENOENT
    assert errno_of(meta.snapshot, src.ino, a.ino, b"x") == E.ENOTDIR
    assert errno_of(meta.snapshot, src.ino, ROOT_INO, b"a/b") == E.EINVAL
    # Another user may not read sub/ (0o750 root) nor write the root.
    assert errno_of(meta.snapshot, src.ino, ROOT_INO, b"x", USER) == E.EACCES
    home = meta.mkdir(ROOT_INO, b"home", 0o777)
    assert errno_of(meta.snapshot, src.ino, home.ino, b"x", USER) == E.EACCES
    assert names(meta, ROOT_INO) == [b"home", b"src"]
    assert meta.get_slice(s1).refcount == 1
    check()


def inode_ids_taken(meta) -> int:
    return int(meta.backend.run(
        lambda tx: tx.one("SELECT next_id FROM ids WHERE name = 'inode'"), "read")[0])


def test_a_refusal_is_found_before_the_tree_is_walked(meta, check):
    """A refused copy takes no inode numbers (on SQLite it would otherwise hold
    the write lock for a whole walk just to say EEXIST)."""
    src, _, _, _ = tree(meta)
    for i in range(300):
        meta.create(src.ino, b"f%d" % i, 0o644)
    before = inode_ids_taken(meta)
    for _ in range(3):
        assert errno_of(meta.snapshot, src.ino, ROOT_INO, b"src") == E.EEXIST
        assert errno_of(meta.snapshot, src.ino, src.ino, b"x") == E.EINVAL
    assert inode_ids_taken(meta) == before
    check()


def test_an_unlinked_open_file_is_not_brought_back(meta, check):
    """As ``link`` refuses to: a file whose last name is gone stays gone."""
    session = meta.register_session(SessionInfo("host", 1, "/mnt", "test"))
    f = meta.create(ROOT_INO, b"f", 0o644, session=session)
    write(meta, f.ino, 0, 10)
    meta.unlink(ROOT_INO, b"f")
    assert errno_of(meta.link, f.ino, ROOT_INO, b"back") == E.ENOENT
    assert errno_of(meta.snapshot, f.ino, ROOT_INO, b"back") == E.ENOENT
    assert names(meta, ROOT_INO) == []
    check()


def test_a_user_copies_no_device_node_and_no_privileged_xattr(meta, check):
    """What a user may not make (a device node, a file capability, a trusted.*
    attribute) a copy does not make for them either; root's copy keeps all."""
    home = meta.mkdir(ROOT_INO, b"home", 0o777)
    pub = meta.mkdir(ROOT_INO, b"pub", 0o755)
    meta.mknod(pub.ino, b"sda", stat.S_IFBLK | 0o600, rdev=8 << 8)
    assert errno_of(meta.mknod, home.ino, b"sdb", stat.S_IFBLK | 0o600, 8 << 8, USER) == E.EPERM
    assert errno_of(meta.snapshot, pub.ino, home.ino, b"mine", USER) == E.EPERM
    tools = meta.mkdir(ROOT_INO, b"tools", 0o755)
    ping = meta.create(tools.ino, b"ping", 0o755)
    caps = {b"security.capability": b"\x01\0\0\x02" + bytes(16), b"trusted.secret": b"root",
            b"user.note": b"kept"}
    for xname, value in caps.items():
        meta.setxattr(ping.ino, xname, value)
    mine = meta.lookup(meta.snapshot(tools.ino, home.ino, b"tools", USER).ino, b"ping")
    assert meta.listxattr(mine.ino) == [b"user.note"]
    roots = meta.lookup(meta.snapshot(tools.ino, ROOT_INO, b"tools@1").ino, b"ping")
    assert sorted(meta.listxattr(roots.ino)) == sorted(caps)
    assert names(meta, home.ino) == [b"tools"]
    check()


def test_a_busy_destination_does_not_starve_a_copy(meta, check):
    """Creates in the destination directory all along: the copy still commits
    (on PostgreSQL it takes the directory first, so they wait for it rather
    than making it start over until its retries run out)."""
    src = meta.mkdir(ROOT_INO, b"src", 0o755)
    for i in range(1500):
        meta.create(src.ino, b"f%d" % i, 0o644)
    stop, made = threading.Event(), []

    def creator():
        while not stop.is_set():
            made.append(meta.create(ROOT_INO, b"busy%d" % len(made), 0o644).ino)

    busy = threading.Thread(target=creator)
    busy.start()
    try:
        while len(made) < 5:  # the creator is running
            stop.wait(0.01)
        copy = meta.snapshot(src.ino, ROOT_INO, b"copy")
    finally:
        stop.set()
        busy.join()
    assert len(meta.readdir(copy.ino, 0, limit=2000)) == 1500
    check()


def test_a_user_copies_what_they_may_read_into_where_they_may_write(meta, check):
    home = meta.mkdir(ROOT_INO, b"home", 0o777)
    mine = meta.mkdir(home.ino, b"mine", 0o755, USER)
    f = meta.create(mine.ino, b"f", 0o644, USER)
    write(meta, f.ino, 0, 10)
    copy = meta.snapshot(mine.ino, home.ino, b"mine@1", USER)
    assert (copy.uid, copy.gid) == (1000, 1000)
    assert meta.lookup(copy.ino, b"f").uid == 1000
    check()


def test_a_users_copy_is_theirs_and_loses_set_id_bits(meta, check):
    """As ``cp -p`` by a user: no copy may make a setuid file of root's."""
    tools = meta.mkdir(ROOT_INO, b"tools", 0o755)
    su = meta.create(tools.ino, b"su", 0o4755)
    write(meta, su.ino, 0, 100)
    home = meta.mkdir(ROOT_INO, b"home", 0o777)
    copy = meta.snapshot(tools.ino, home.ino, b"tools", USER)
    got = meta.lookup(copy.ino, b"su")
    assert (got.uid, got.gid, copy.uid) == (1000, 1000, 1000)
    assert stat.S_IMODE(got.mode) == 0o755
    by_root = meta.lookup(meta.snapshot(tools.ino, ROOT_INO, b"tools@1").ino, b"su")
    assert by_root.uid == 0 and stat.S_IMODE(by_root.mode) == 0o4755
    check()


def test_a_users_copy_takes_the_group_of_a_set_group_id_directory(meta, check):
    """As a file the user made there would: a shared team directory keeps its group."""
    team = meta.mkdir(ROOT_INO, b"team", 0o2777, Ctx(uid=0, gid=4242, pid=1, umask=0))
    assert team.gid == 4242 and team.mode & stat.S_ISGID
    mine = meta.mkdir(ROOT_INO, b"mine", 0o777, Ctx(uid=0, gid=0, pid=1, umask=0))
    f = meta.create(mine.ino, b"f", 0o644, USER)
    write(meta, f.ino, 0, 10)
    copy = meta.snapshot(mine.ino, team.ino, b"mine", USER)
    assert (copy.uid, copy.gid) == (1000, 4242)
    assert meta.lookup(copy.ino, b"f").gid == 4242
    elsewhere = meta.snapshot(mine.ino, ROOT_INO, b"x", ROOT_CTX)
    assert elsewhere.gid == 0  # root's copy keeps the source's owners
    check()


def test_policy_is_copied_but_not_retention(meta, check):
    src = meta.mkdir(ROOT_INO, b"ckpt", 0o755)
    meta.set_policy(src.ino, DirPolicy(tier="cold", retention="keep-last=2", replicas=2))
    copy = meta.snapshot(src.ino, ROOT_INO, b"ckpt@1")
    policy = meta.get_policy(copy.ino)
    assert policy.tier == "cold" and policy.replicas == 2 and policy.retention is None
    check()


def test_copies_of_copies_and_a_big_tree(meta, check):
    src = meta.mkdir(ROOT_INO, b"corpus", 0o755)
    sids = []
    for d in range(5):
        sub = meta.mkdir(src.ino, b"shard%d" % d, 0o755)
        for i in range(60):
            f = meta.create(sub.ino, b"f%03d" % i, 0o644)
            sids.append(write(meta, f.ino, 0, 4096))
    v1 = meta.snapshot(src.ino, ROOT_INO, b"v1")
    v2 = meta.snapshot(v1.ino, ROOT_INO, b"v2")
    assert {meta.get_slice(s).refcount for s in sids} == {3}
    f = meta.lookup(meta.lookup(v2.ino, b"shard4").ino, b"f059")
    assert meta.read_map(f.ino, 0, 4096) == [ReadPiece(0, 4096, sids[-1], 0)]
    assert meta.statfs().inodes == 1 + 3 * 306
    check()


def test_the_copy_is_one_instant_while_a_writer_commits(meta, check):
    """A writer commits slices to the source's files while copies are taken:
    each copy holds, per file, a prefix of the writer's commits in order, and
    the refcounts match (fsck) at the end."""
    src = meta.mkdir(ROOT_INO, b"live", 0o755)
    files = [meta.create(src.ino, b"f%d" % i, 0o644) for i in range(4)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            n = 0
            while not stop.is_set() and n < 400:
                f = files[n % 4]
                sid = meta.next_slice_id()
                meta.commit_slice(f.ino, 0, SliceRef(sid, 0, 100, 0), (n // 4 + 1) * 100,
                                  slice_length=100)
                n += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    copies = [meta.snapshot(src.ino, ROOT_INO, b"c%d" % i) for i in range(6)]
    stop.set()
    thread.join()
    assert not errors
    for c in copies:
        sizes = [meta.lookup(c.ino, b"f%d" % i).size for i in range(4)]
        # The writer goes f0, f1, f2, f3, f0, ...: one instant sees sizes that
        # never rise along the order, by at most one step.
        assert all(x >= y for x, y in itertools.pairwise(sizes)), sizes
        assert sizes[0] - sizes[3] <= 100, sizes
    check()


def test_many_hands_through_the_root_ctx(meta, check):
    src, _, _, _ = tree(meta)
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        meta.snapshot(src.ino, ROOT_INO, b"t%d" % i, ROOT_CTX).ino)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 4
    check()
