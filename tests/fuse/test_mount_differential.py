"""Differential test: random operation sequences on the mount and on a local directory.

Every operation's result (bytes, sizes, modes, link counts, listings) or errno
must be the same on ShingleFS as on the local file system, and so must the
whole tree at the end. 30 examples of up to 30 steps run by default; the slow
variant runs 300 examples of up to 60 steps.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shinglefs.fuse.harness import MountedFileSystem

pytestmark = pytest.mark.fuse

PATHS = ["a", "b", "c", "d", "d/a", "d/b", "d/e", "d/e/f"]
DIRS = ["", "d", "d/e", "a"]
MODES = [0o644, 0o600, 0o755, 0o700, 0o444]
XATTRS = ["user.x", "user.y"]

paths = st.sampled_from(PATHS)
small_data = st.binary(min_size=0, max_size=3000)
offsets = st.one_of(st.integers(0, 5000), st.sampled_from([65536 - 3, 131072, 200000]))
slots = st.integers(0, 1)

OPS = st.one_of(
    st.tuples(st.just("write_file"), paths, small_data),
    st.tuples(st.just("pwrite"), paths, offsets, small_data),
    st.tuples(st.just("append"), paths, small_data),
    st.tuples(st.just("read"), paths),
    st.tuples(st.just("pread"), paths, offsets, st.integers(0, 70000)),
    st.tuples(st.just("truncate"), paths, offsets),
    st.tuples(st.just("rename"), paths, paths),
    st.tuples(st.just("link"), paths, paths),
    st.tuples(st.just("unlink"), paths),
    st.tuples(st.just("mkdir"), paths),
    st.tuples(st.just("rmdir"), paths),
    st.tuples(st.just("symlink"), st.sampled_from(["a", "../a", "d/b", "nowhere"]), paths),
    st.tuples(st.just("readlink"), paths),
    st.tuples(st.just("setxattr"), paths, st.sampled_from(XATTRS), st.binary(max_size=64)),
    st.tuples(st.just("getxattr"), paths, st.sampled_from(XATTRS)),
    st.tuples(st.just("removexattr"), paths, st.sampled_from(XATTRS)),
    st.tuples(st.just("fsync"), paths),
    st.tuples(st.just("chmod"), paths, st.sampled_from(MODES)),
    st.tuples(st.just("utime"), paths, st.integers(0, 2**40)),
    st.tuples(st.just("mmap_write"), paths, st.integers(0, 5000), st.binary(min_size=1, max_size=200)),
    st.tuples(st.just("stat"), paths),
    st.tuples(st.just("listdir"), st.sampled_from(DIRS)),
    st.tuples(st.just("create_excl"), paths),
    st.tuples(st.just("fd_open"), slots, paths, st.sampled_from(["r", "rw", "append"])),
    st.tuples(st.just("fd_pwrite"), slots, offsets, small_data),
    st.tuples(st.just("fd_read"), slots, offsets, st.integers(0, 5000)),
    st.tuples(st.just("fd_close"), slots),
)


SEED_TREE: list[tuple[Any, ...]] = [
    ("write_file", "a", bytes(range(256)) * 4),
    ("mkdir", "d"),
    ("write_file", "d/a", b"0123456789" * 7000),
    ("mkdir", "d/e"),
    ("symlink", "a", "c"),
    ("setxattr", "a", "user.x", b"seed"),
]


class Runner:
    """Applies operations under one root; returns comparable outcomes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fds: dict[int, int] = {}

    def close_all(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def apply(self, op: tuple[Any, ...]) -> Any:
        try:
            return ("ok", getattr(self, "op_" + op[0])(*op[1:]))
        except OSError as exc:
            return ("err", errno.errorcode.get(exc.errno, exc.errno))

    def p(self, rel: str) -> str:
        return str(self.root / rel) if rel else str(self.root)

    # -- operations --------------------------------------------------------------------
    def op_write_file(self, rel: str, data: bytes) -> int:
        fd = os.open(self.p(rel), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            return os.write(fd, data)
        finally:
            os.close(fd)

    def op_pwrite(self, rel: str, offset: int, data: bytes) -> int:
        fd = os.open(self.p(rel), os.O_WRONLY)
        try:
            return os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def op_append(self, rel: str, data: bytes) -> int:
        fd = os.open(self.p(rel), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def op_read(self, rel: str) -> bytes:
        with open(self.p(rel), "rb") as f:
            return f.read()

    def op_pread(self, rel: str, offset: int, length: int) -> bytes:
        fd = os.open(self.p(rel), os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def op_truncate(self, rel: str, size: int) -> int:
        os.truncate(self.p(rel), size)
        return os.stat(self.p(rel)).st_size

    def op_rename(self, a: str, b: str) -> None:
        os.rename(self.p(a), self.p(b))

    def op_link(self, a: str, b: str) -> int:
        os.link(self.p(a), self.p(b), follow_symlinks=False)
        return os.lstat(self.p(b)).st_nlink

    def op_unlink(self, rel: str) -> None:
        os.unlink(self.p(rel))

    def op_mkdir(self, rel: str) -> None:
        os.mkdir(self.p(rel), 0o755)

    def op_rmdir(self, rel: str) -> None:
        os.rmdir(self.p(rel))

    def op_symlink(self, target: str, rel: str) -> None:
        os.symlink(target, self.p(rel))

    def op_readlink(self, rel: str) -> str:
        return os.readlink(self.p(rel))

    def op_setxattr(self, rel: str, name: str, value: bytes) -> None:
        os.setxattr(self.p(rel), name, value, follow_symlinks=False)

    def op_getxattr(self, rel: str, name: str) -> bytes:
        return os.getxattr(self.p(rel), name, follow_symlinks=False)

    def op_removexattr(self, rel: str, name: str) -> None:
        os.removexattr(self.p(rel), name, follow_symlinks=False)

    def op_fsync(self, rel: str) -> None:
        fd = os.open(self.p(rel), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def op_chmod(self, rel: str, mode: int) -> int:
        os.chmod(self.p(rel), mode)
        return stat.S_IMODE(os.stat(self.p(rel)).st_mode)

    def op_utime(self, rel: str, ns: int) -> tuple[int, int]:
        os.utime(self.p(rel), ns=(ns, ns + 1))
        st_ = os.stat(self.p(rel))
        return st_.st_atime_ns, st_.st_mtime_ns

    def op_mmap_write(self, rel: str, offset: int, data: bytes) -> bytes:
        with open(self.p(rel), "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return b""
            offset %= size
            data = data[: size - offset]
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE) as m:
                m[offset : offset + len(data)] = data
                m.flush()
                return m[:]

    def op_stat(self, rel: str) -> tuple[int, ...]:
        st_ = os.lstat(self.p(rel))
        if stat.S_ISDIR(st_.st_mode):
            return (st_.st_mode, st_.st_nlink)
        return (st_.st_mode, st_.st_size, st_.st_nlink)

    def op_listdir(self, rel: str) -> list[str]:
        return sorted(os.listdir(self.p(rel)))

    def op_create_excl(self, rel: str) -> None:
        os.close(os.open(self.p(rel), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640))

    def op_fd_open(self, slot: int, rel: str, how: str) -> None:
        flags = {"r": os.O_RDONLY, "rw": os.O_RDWR, "append": os.O_WRONLY | os.O_APPEND}[how]
        fd = os.open(self.p(rel), flags)
        if slot in self.fds:
            os.close(self.fds.pop(slot))
        self.fds[slot] = fd

    def op_fd_pwrite(self, slot: int, offset: int, data: bytes) -> int:
        if slot not in self.fds:
            raise OSError(errno.EBADF, "no descriptor in this slot")
        fd = self.fds[slot]
        os.pwrite(fd, data, offset)
        return os.fstat(fd).st_size

    def op_fd_read(self, slot: int, offset: int, length: int) -> bytes:
        if slot not in self.fds:
            raise OSError(errno.EBADF, "no descriptor in this slot")
        return os.pread(self.fds[slot], length, offset)

    def op_fd_close(self, slot: int) -> None:
        if slot not in self.fds:
            raise OSError(errno.EBADF, "no descriptor in this slot")
        os.close(self.fds.pop(slot))


def snapshot(root: Path) -> dict[str, Any]:
    """The whole tree: type, permission bits, size, contents/targets, link counts, xattrs."""
    tree: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st_ = os.lstat(path)
            if stat.S_ISLNK(st_.st_mode):
                tree[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st_.st_mode):
                tree[rel] = ("dir", stat.S_IMODE(st_.st_mode), st_.st_nlink,
                             sorted(os.listxattr(path)))
            else:
                with open(path, "rb") as f:
                    data = f.read()
                tree[rel] = ("file", stat.S_IMODE(st_.st_mode), st_.st_size, st_.st_nlink, data,
                             sorted((n, os.getxattr(path, n)) for n in os.listxattr(path)))
    return tree


def run_differential(mount_root: Path, local_root: Path, ops: list[tuple[Any, ...]]) -> None:
    tag = uuid.uuid4().hex[:8]
    ours, theirs = Runner(mount_root / tag), Runner(local_root / tag)
    ours.root.mkdir()
    theirs.root.mkdir()
    try:
        for runner in (ours, theirs):  # a small tree to start from, so most ops find their target
            for op in SEED_TREE:
                assert runner.apply(op)[0] == "ok"
        for step, op in enumerate(ops):
            expected = theirs.apply(op)
            got = ours.apply(op)
            assert got == expected, f"step {step}: {op!r}: mount {got!r} != local {expected!r}"
        ours.close_all()
        theirs.close_all()
        assert snapshot(ours.root) == snapshot(theirs.root)
    finally:
        ours.close_all()
        theirs.close_all()
        shutil.rmtree(ours.root, ignore_errors=True)
        shutil.rmtree(theirs.root, ignore_errors=True)


@pytest.fixture
def local(tmp_path: Path) -> Path:
    path = tmp_path / "local"
    path.mkdir()
    return path


def test_random_operations_match_a_local_directory(mnt: Path, local: Path) -> None:
    @settings(max_examples=30, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(OPS, min_size=1, max_size=30))
    def check(ops: list[tuple[Any, ...]]) -> None:
        run_differential(mnt, local, ops)

    check()


@pytest.mark.slow
def test_random_operations_match_a_local_directory_long(
    mnt: Path, local: Path, shinglefs_mount: MountedFileSystem
) -> None:
    @settings(max_examples=300, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(OPS, min_size=1, max_size=60))
    def check(ops: list[tuple[Any, ...]]) -> None:
        run_differential(mnt, local, ops)

    check()
