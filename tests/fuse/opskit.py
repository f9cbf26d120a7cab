"""The operations class without a kernel: handlers called directly under trio
over a real VFS on a freshly formatted file system."""

from __future__ import annotations

import ctypes
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from shinglefs.client.config import ClientConfig
from shinglefs.client.filesystem import format_filesystem, open_filesystem
from shinglefs.fuse.harness import MountedFileSystem, default_drives
from shinglefs.fuse.operations import ShingleOperations

GiB = 1024**3


@dataclass
class Request:
    """What the handlers read of a pyfuse3.RequestContext."""

    uid: int = 0
    gid: int = 0
    pid: int = os.getpid()
    umask: int = 0o022


@contextmanager
def handlers(tmp_path: Path, config: ClientConfig | None = None) -> Iterator[ShingleOperations]:
    """``ShingleOperations`` over a new file system in ``tmp_path`` (one SMR drive)."""
    url = f"sqlite3://{tmp_path / 'meta.db'}"
    format_filesystem(url, default_drives(tmp_path, smr_drives=1, smr_bytes=4 * GiB,
                                          conventional_bytes=0))
    vfs = open_filesystem(url, config=config)
    try:
        yield ShingleOperations(vfs)
    finally:
        vfs.shutdown()


def call(handler: Any, *args: Any) -> Any:
    """Await one handler under trio and return its result."""
    async def run() -> Any:
        return await handler(*args)

    return trio.run(run)


# -- running one call as another user (the multi-user tests) -----------------------------

NOBODY = 65534
NOGROUP = 65534

# utimensat(2) markers and AT_FDCWD (os.utime cannot pass UTIME_NOW/UTIME_OMIT)
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
AT_FDCWD = -100


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)


def utimensat(path: Path, atime_nsec: int, mtime_nsec: int) -> None:
    """utimensat(2) with UTIME_NOW/UTIME_OMIT markers (or a plain nanosecond part)."""
    times = (Timespec * 2)(Timespec(5, atime_nsec), Timespec(7, mtime_nsec))
    if _libc.utimensat(AT_FDCWD, os.fsencode(path), times, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))


def run_as(func: Callable[[], object], uid: int = NOBODY, gid: int = NOGROUP,
           groups: tuple[int, ...] = ()) -> tuple[int, object]:
    """Run ``func()`` in a forked child with the given credentials (uid 0: stay
    root); return (the errno it raised or 0, what it returned or None).
    What it returns must pickle; the child imports nothing new (the user may
    not be able to read this interpreter's standard library)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 1
        try:
            os.close(read_fd)
            if uid != 0:
                os.setgroups(list(groups))
                os.setgid(gid)
                os.setuid(uid)
            try:
                result: tuple[int, object] = (0, func())
            except OSError as exc:
                result = (exc.errno or -1, None)
            data = pickle.dumps(result)
            while data:
                data = data[os.write(write_fd, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and out, "the child failed"
    err, value = pickle.loads(out)
    return err, value


def as_user(func: Callable[[], object], uid: int = NOBODY, gid: int = NOGROUP,
            groups: tuple[int, ...] = ()) -> int:
    """Run ``func()`` in a forked child with the given credentials (uid 0: stay root);
    return the errno it raised, or 0."""
    return run_as(lambda: (func(), None)[1], uid, gid, groups)[0]


@contextmanager
def root_mount_and_local(prefix: str) -> Iterator[tuple[Path, Path]]:
    """(mount, local): a default mount made by root (so it serves every user:
    allow_other, default_permissions) and a local directory, both 0755 under a
    fresh /tmp directory every user may traverse (pytest's are 0700). The
    caller skips unless root."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    fs = MountedFileSystem(base / "data", base / "mnt")
    fs.format()
    fs.start()
    try:
        local = base / "local"
        local.mkdir(mode=0o755)
        for root in (fs.mountpoint, local):
            root.chmod(0o755)
        yield fs.mountpoint, local
    finally:
        code = fs.stop()
        shutil.rmtree(base, ignore_errors=True)
    assert code == 0, fs.log_text()
