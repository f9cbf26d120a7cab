"""Differential test for many users: random operation sequences, each step run
by one of several credentials, on a root mount and on a local directory.

The two trees start identical (owners, modes, a sticky world-writable
directory owned by root, a setgid directory of group 1000, directories
without read or search permission). Each step runs in a forked child that
drops to one user (``run_as``) and does the same operation on the local
directory (ext4 or whatever /tmp is; the reference) and on the mount. The
errno, what the call returned, and the state of every path it touched and
their parents (mode, owner, link count, size, content, mtime changed or not)
must be the same; so must the whole tree at the end. It is a small-scale
pjdfstest: 30 examples of up to 30 steps by default, 300 of up to 60 steps
in the slow variant.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.fuse.opskit import (
    NOBODY,
    NOGROUP,
    UTIME_NOW,
    UTIME_OMIT,
    root_mount_and_local,
    run_as,
    utimensat,
)

pytestmark = pytest.mark.fuse

OLD_NS = 1_000_000_000  # the mtime every seeded path starts with (2001-09-09)

# name: (uid, gid, supplementary groups)
USERS: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "root": (0, 0, ()),
    "nobody": (NOBODY, NOGROUP, ()),
    "u1000": (1000, 1000, (NOGROUP,)),
    "u1001": (1001, 1001, (1000,)),
}

UMASKS = {"root": 0o000, "nobody": 0o022, "u1000": 0o002, "u1001": 0o077}

# (path, mode, uid, gid, content): content None is a directory, a str a symlink target
SEED: list[tuple[str, int, int, int, bytes | str | None]] = [
    ("pub", 0o1777, 0, 0, None),  # sticky and world-writable, owned by root
    ("pub/n", 0o644, NOBODY, NOGROUP, b"nobody's"),
    ("pub/a", 0o664, 1000, 1000, b"group 1000 may write"),
    ("pub/e", 0o755, 1001, 1001, None),  # an empty directory of 1001
    ("pub/s", 0o777, 0, 0, "../rw"),
    ("pub/o", 0o755, NOBODY, 1000, None),  # owner outside its group
    ("pub/g", 0o644, NOBODY, 1000, b"owner outside its group"),
    ("sg", 0o2775, 1000, 1000, None),  # setgid directory of group 1000
    ("sg/f", 0o2764, 1000, 1000, b"setgid file"),
    ("sg/d", 0o2755, 1000, 1000, None),
    ("home", 0o755, 1000, 1000, None),
    ("home/f", 0o640, 1000, NOGROUP, b"group nogroup may read"),
    ("home/x", 0o4755, 1000, 1000, b"#!/bin/true"),
    ("root", 0o644, 0, 0, b"root's"),
    ("rw", 0o666, 0, 0, b"anyone may write"),
    ("nox", 0o744, 0, 0, None),  # readable, not searchable
    ("nox/f", 0o666, 0, 0, b"behind r--"),
    ("nor", 0o711, 0, 0, None),  # searchable, not readable
    ("nor/f", 0o666, 0, 0, b"behind --x"),
]
NEW = ["new", "pub/new", "sg/new", "sg/d/new", "home/new", "nox/new", "nor/new", "pub/e/new"]
PATHS = ["", *[p for p, *_ in SEED], *NEW]
# operations on files pick mostly files, on directories directories: fewer
# steps spent on EISDIR and ENOTDIR
FILES = [p for p, _, _, _, content in SEED if content is not None] + NEW + ["pub"]
DIRS = ["", *[p for p, _, _, _, content in SEED if content is None], *NEW, "rw"]
MODES = [0o644, 0o600, 0o755, 0o777, 0o000, 0o4755, 0o2755, 0o2775, 0o1777, 0o6777, 0o2644]
OWNERS = [-1, 0, 1000, 1001, NOBODY]
OPEN_FLAGS = {
    "r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR,
    "creat": os.O_CREAT | os.O_WRONLY,
    "excl": os.O_CREAT | os.O_EXCL | os.O_RDWR,
    "trunc": os.O_TRUNC | os.O_WRONLY,
    "creat_trunc": os.O_CREAT | os.O_TRUNC | os.O_RDWR,
    "append": os.O_APPEND | os.O_WRONLY,
    "creat_append": os.O_CREAT | os.O_APPEND | os.O_RDWR,
    "r_trunc": os.O_RDONLY | os.O_TRUNC,
}

users = st.sampled_from(sorted(USERS))
paths = st.sampled_from(PATHS)
files = st.sampled_from(FILES)
dirs = st.sampled_from(DIRS)
data = st.binary(min_size=1, max_size=40)
xattr_names = st.sampled_from(["user.a", "user.b"])

OPS = st.one_of(
    st.tuples(st.just("open"), users, files, st.sampled_from(sorted(OPEN_FLAGS)),
              st.sampled_from(MODES), data),
    st.tuples(st.just("read"), users, files),
    st.tuples(st.just("write"), users, files, data),
    st.tuples(st.just("truncate"), users, files, st.integers(0, 30)),
    st.tuples(st.just("ftruncate"), users, files, st.sampled_from(["r", "w", "rw"]),
              st.integers(0, 30)),
    st.tuples(st.just("unlink"), users, files),
    st.tuples(st.just("rmdir"), users, dirs),
    st.tuples(st.just("mkdir"), users, dirs, st.sampled_from(MODES)),
    st.tuples(st.just("rename"), users, paths, paths),
    st.tuples(st.just("link"), users, files, paths),
    st.tuples(st.just("symlink"), users, st.sampled_from(["rw", "../rw", "nowhere"]), files),
    st.tuples(st.just("readlink"), users, files),
    st.tuples(st.just("chmod"), users, paths, st.sampled_from(MODES)),
    st.tuples(st.just("chown"), users, paths, st.sampled_from(OWNERS),
              st.sampled_from(OWNERS)),
    st.tuples(st.just("utime"), users, paths,
              st.sampled_from(["now", "explicit", "both_now", "now_omit"])),
    st.tuples(st.just("access"), users, paths,
              st.sampled_from([os.F_OK, os.R_OK, os.W_OK, os.X_OK, os.R_OK | os.W_OK])),
    st.tuples(st.just("setxattr"), users, paths, xattr_names, data),
    st.tuples(st.just("getxattr"), users, paths, xattr_names),
    st.tuples(st.just("listdir"), users, dirs),
    st.tuples(st.just("stat"), users, paths),
)


# -- the operations, run in the child as the step's user ---------------------------------


def do_open(path: str, how: str, mode: int, payload: bytes) -> tuple[bytes | None, int]:
    """Open with ``how``'s flags, write ``payload`` if writable, then read it all back
    if readable; returns (what was read, the size through the descriptor)."""
    flags = OPEN_FLAGS[how]
    fd = os.open(path, flags, mode)
    try:
        if flags & (os.O_WRONLY | os.O_RDWR):
            os.write(fd, payload)
        got = os.pread(fd, 4096, 0) if not flags & os.O_WRONLY else None
        return got, os.fstat(fd).st_size
    finally:
        os.close(fd)


def do_write(path: str, payload: bytes) -> int:
    fd = os.open(path, os.O_WRONLY)
    try:
        return os.pwrite(fd, payload, 3)
    finally:
        os.close(fd)


def do_ftruncate(path: str, how: str, size: int) -> None:
    fd = os.open(path, OPEN_FLAGS[how])
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def do_utime(path: str, how: str) -> None:
    if how == "now":
        os.utime(path, None)
    elif how == "explicit":
        os.utime(path, ns=(OLD_NS + 5, OLD_NS + 7))
    elif how == "both_now":
        utimensat(Path(path), UTIME_NOW, UTIME_NOW)
    else:
        utimensat(Path(path), UTIME_NOW, UTIME_OMIT)


def do_stat(path: str) -> tuple[int, ...]:
    st_ = os.lstat(path)
    size = -1 if stat.S_ISDIR(st_.st_mode) else st_.st_size  # ext4 says 4096
    return st_.st_mode, st_.st_uid, st_.st_gid, st_.st_nlink, size


def apply(root: Path, op: tuple[Any, ...]) -> object:
    """Run ``op`` (without its user) under ``root``; return what it returned."""
    name, args = op[0], op[2:]

    def p(rel: str) -> str:
        return str(root / rel) if rel else str(root)

    if name == "open":
        return do_open(p(args[0]), *args[1:])
    if name == "read":
        with open(p(args[0]), "rb") as f:
            return f.read()
    if name == "write":
        return do_write(p(args[0]), args[1])
    if name == "truncate":
        return os.truncate(p(args[0]), args[1])
    if name == "ftruncate":
        return do_ftruncate(p(args[0]), args[1], args[2])
    if name == "unlink":
        return os.unlink(p(args[0]))
    if name == "rmdir":
        return os.rmdir(p(args[0]))
    if name == "mkdir":
        return os.mkdir(p(args[0]), args[1])
    if name == "rename":
        return os.rename(p(args[0]), p(args[1]))
    if name == "link":
        return os.link(p(args[0]), p(args[1]), follow_symlinks=False)
    if name == "symlink":
        return os.symlink(args[0], p(args[1]))
    if name == "readlink":
        return os.readlink(p(args[0]))
    if name == "chmod":
        return os.chmod(p(args[0]), args[1])
    if name == "chown":
        return os.chown(p(args[0]), args[1], args[2])
    if name == "utime":
        return do_utime(p(args[0]), args[1])
    if name == "access":
        return os.access(p(args[0]), args[1])
    if name == "setxattr":
        return os.setxattr(p(args[0]), args[1], args[2])
    if name == "getxattr":
        return os.getxattr(p(args[0]), args[1])
    if name == "listdir":
        return sorted(os.listdir(p(args[0])))
    if name == "stat":
        return do_stat(p(args[0]))
    raise AssertionError(f"unknown operation {name}")


def touched(op: tuple[Any, ...]) -> list[str]:
    """The paths ``op`` may change, with their parents."""
    name, args = op[0], op[2:]
    if name == "symlink":
        rels = [args[1]]
    elif name in ("rename", "link"):
        rels = [args[0], args[1]]
    else:
        rels = [args[0]]
    out: list[str] = []
    for rel in rels:
        for r in (rel, os.path.dirname(rel)):
            if r not in out:
                out.append(r)
    return out


# -- what a step leaves behind, read as root ---------------------------------------------


def describe(path: Path) -> tuple[Any, ...] | None:
    """(mode, uid, gid, nlink, size, content or listing or target, mtime, ctime)
    or None."""
    try:
        st_ = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st_.st_mode):
        body: object = os.readlink(path)
        size = None  # a symlink's size is its target's length on both
    elif stat.S_ISDIR(st_.st_mode):
        body, size = sorted(os.listdir(path)), None  # directory sizes differ (ext4 4096)
    else:
        body, size = path.read_bytes(), st_.st_size
    return (oct(st_.st_mode), st_.st_uid, st_.st_gid, st_.st_nlink, size, body,
            st_.st_mtime_ns, st_.st_ctime_ns)


def compare_form(before: tuple[Any, ...] | None, after: tuple[Any, ...] | None,
                 op: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``after`` with its mtime and ctime replaced by whether they changed since
    ``before``. Two ext4 quirks are not compared (tmpfs and ShingleFS do as
    POSIX says): the ctime after setxattr, which ext4 leaves alone when the
    value is the one it had (ext4_xattr_value_same); the mtime after a
    truncation to the size the file has, which ext4 sets (POSIX: only "if the
    file size is changed")."""
    if after is None:
        return None
    if before is None:
        return (*after[:6], "new")
    mtime = "mtime changed" if before[6] != after[6] else "mtime kept"
    ctime = "ctime changed" if before[7] != after[7] else "ctime kept"
    if op[0] in ("truncate", "ftruncate") and before[4] == op[-1]:
        mtime = "-"
    return (*after[:6], mtime, "-" if op[0] == "setxattr" else ctime)


def snapshot(root: Path) -> dict[str, Any]:
    """The whole tree as root: every path's state and user.* extended attributes."""
    tree: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            state = describe(path)
            assert state is not None
            xattrs = [] if path.is_symlink() else sorted(
                (n, os.getxattr(path, n)) for n in os.listxattr(path) if n.startswith("user."))
            tree[str(path.relative_to(root))] = (*state[:6], xattrs)
    return tree


def seed(root: Path) -> None:
    """As root: the starting tree under ``root`` (itself 0755 root:root)."""
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    for rel, mode, uid, gid, content in SEED:
        path = root / rel
        if content is None:
            path.mkdir()
        elif isinstance(content, str):
            path.symlink_to(content)
        else:
            path.write_bytes(content)
        os.chown(path, uid, gid, follow_symlinks=False)
        if not isinstance(content, str):
            os.chmod(path, mode)  # after chown, which clears setuid/setgid
    for rel, *_ in reversed(SEED):  # children first: creating them changed their parents
        os.utime(root / rel, ns=(OLD_NS, OLD_NS), follow_symlinks=False)
    os.utime(root, ns=(OLD_NS, OLD_NS))


def run_differential(mount_root: Path, local_root: Path, ops: list[tuple[Any, ...]]) -> None:
    tag = uuid.uuid4().hex[:8]
    ours, theirs = mount_root / tag, local_root / tag
    try:
        for root in (ours, theirs):
            seed(root)
        for step, op in enumerate(ops):
            rels = touched(op)
            before = {root: [describe(root / r) for r in rels] for root in (theirs, ours)}

            def both(op: tuple[Any, ...] = op) -> list[tuple[int, object]]:
                os.umask(UMASKS[op[1]])  # in the child
                out: list[tuple[int, object]] = []
                for root in (theirs, ours):  # the reference first
                    try:
                        out.append((0, apply(root, op)))
                    except OSError as exc:
                        out.append((exc.errno or -1, None))
                return out

            err, results = run_as(both, *USERS[op[1]])
            assert err == 0 and isinstance(results, list)
            (lerr, lval), (merr, mval) = results
            states = {root: [compare_form(b, describe(root / r), op)
                             for r, b in zip(rels, before[root], strict=True)]
                      for root in (theirs, ours)}
            expected = (errno.errorcode.get(lerr, lerr), lval, dict(zip(rels, states[theirs],
                                                                       strict=True)))
            got = (errno.errorcode.get(merr, merr), mval, dict(zip(rels, states[ours],
                                                                  strict=True)))
            assert got == expected, (f"step {step}: {op!r}:\n  mount {got!r}\n"
                                     f"  local {expected!r}")
        assert snapshot(ours) == snapshot(theirs)
    finally:
        shutil.rmtree(ours, ignore_errors=True)
        shutil.rmtree(theirs, ignore_errors=True)


@pytest.fixture(scope="module")
def trees() -> Iterator[tuple[Path, Path]]:
    """(mount, local) under a fresh /tmp directory every user may traverse; the
    mount is a default one made by root (allow_other, default_permissions)."""
    if os.geteuid() != 0:
        pytest.skip("switches users: needs root")
    with root_mount_and_local("shinglefs-udiff-") as pair:
        yield pair


# Sequences the random test once found wrong on the mount, kept as fixed cases.
REGRESSIONS: dict[str, list[tuple[Any, ...]]] = {
    # write, fstat, close: a stat after close showed the mtime before the write
    # (the fstat's attributes, taken before the commit, were kept by the kernel)
    "stat_after_write_fstat_close_sees_the_new_mtime": [
        ("open", "nobody", "pub/n", "append", 0o644, b"\0")],
    # Linux truncates on open(O_RDONLY | O_TRUNC) with write permission
    "open_read_only_with_o_trunc_truncates": [
        ("open", "nobody", "pub/n", "r_trunc", 0o644, b"\0")],
    # open(O_TRUNC) by the owner of a setuid file clears setuid (the kernel
    # leaves that to the file system's open)
    "open_with_o_trunc_by_the_owner_clears_setuid": [
        ("open", "u1000", "home/x", "trunc", 0o644, b"")],
    # open(O_TRUNC) of an existing empty file still sets mtime and ctime
    "open_with_o_trunc_of_an_empty_file_sets_mtime": [
        ("truncate", "root", "rw", 0), ("open", "nobody", "rw", "r_trunc", 0o644, b"")],
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_found_sequence_matches_a_local_directory(trees: tuple[Path, Path], name: str) -> None:
    run_differential(*trees, REGRESSIONS[name])


def check_random(trees: tuple[Path, Path], examples: int, steps: int) -> None:
    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(OPS, min_size=1, max_size=steps))
    def check(ops: list[tuple[Any, ...]]) -> None:
        run_differential(*trees, ops)

    check()


def test_random_operations_by_many_users_match_a_local_directory(
        trees: tuple[Path, Path]) -> None:
    check_random(trees, examples=30, steps=30)


@pytest.mark.slow
def test_random_operations_by_many_users_match_a_local_directory_long(
        trees: tuple[Path, Path]) -> None:
    check_random(trees, examples=300, steps=60)
