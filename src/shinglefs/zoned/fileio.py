"""Positional vectored I/O and durability calls for the file-backed drives, in one place.

Everything here moves whole buffers with one system call where the kernel
allows it (``pwritev``/``preadv`` on memoryviews: no Python-level copies, no
per-block loops) and retries only on short transfers. Durability calls
(``sync_data``, ``sync_file``, ``sync_dir``; hole punching) live here rather
than scattered through the drives, the zone tables and the store's checkpoints.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
from collections.abc import Sequence
from typing import Any

from shinglefs.zoned.model import Buffer

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

_ZEROS = bytes(8 * 1024 * 1024)


def as_views(data: Buffer | Sequence[Buffer]) -> list[memoryview]:
    """``data`` (one buffer or a sequence of buffers) as flat byte memoryviews, no copies."""
    if isinstance(data, bytes | bytearray | memoryview | mmap.mmap):
        items: Sequence[Buffer] = (data,)
    else:
        items = data
    views = []
    for item in items:
        view = memoryview(item)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if view.nbytes:
            views.append(view)
    return views


class Payload:
    """Bytes given as several buffers and held without copying (``views``, ``nbytes``).

    The owner of the buffers must not modify them while a ``Payload`` of them
    is in use (a queued piece keeps it until its future completes).
    """

    __slots__ = ("nbytes", "views")

    def __init__(self, data: Buffer | Sequence[Buffer] | Payload) -> None:
        self.views: list[memoryview] = (
            data.views if isinstance(data, Payload) else as_views(data))
        self.nbytes = sum(v.nbytes for v in self.views)

    def __len__(self) -> int:
        return self.nbytes


def pwritev_all(fd: int, views: list[memoryview], offset: int) -> int:
    """Write every view back to back at ``offset``; returns the byte count."""
    total = 0
    pending = views
    while pending:
        batch = pending[:IOV_MAX]
        want = sum(v.nbytes for v in batch)
        done = os.pwritev(fd, batch, offset)
        offset += done
        total += done
        if done == want:
            pending = pending[IOV_MAX:]
            continue
        if done == 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        # Short write: drop what went out and retry the rest.
        rest = list(pending)
        while done:
            if rest[0].nbytes <= done:
                done -= rest[0].nbytes
                rest.pop(0)
            else:
                rest[0] = rest[0][done:]
                done = 0
        pending = rest
    return total


def preadv_all(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from ``offset``; bytes past the end of the file read as zeros."""
    total = 0
    length = view.nbytes
    while total < length:
        got = os.preadv(fd, [view[total:]], offset + total)
        if got == 0:
            zero_fill(view, total, length)
            break
        total += got
    return length


def preadv_views_all(fd: int, views: list[memoryview], offset: int) -> int:
    """Fill ``views`` back to back from ``offset`` with as few ``preadv`` calls as the kernel
    allows (one, unless a read comes back short); bytes past the end of the file read as zeros.
    """
    total = sum(v.nbytes for v in views)
    done = 0
    pending = views
    while pending:
        batch = pending[:IOV_MAX]
        want = sum(v.nbytes for v in batch)
        got = os.preadv(fd, batch, offset + done)
        done += got
        if got == want:
            pending = pending[IOV_MAX:]
            continue
        if got == 0:
            for view in pending:
                zero_fill(view, 0, view.nbytes)
            break
        # Short read: drop what arrived and read the rest.
        rest = list(pending)
        while got:
            if rest[0].nbytes <= got:
                got -= rest[0].nbytes
                rest.pop(0)
            else:
                rest[0] = rest[0][got:]
                got = 0
        pending = rest
    return total


def zero_fill(view: memoryview, start: int, end: int) -> None:
    """Set ``view[start:end]`` to zero bytes without allocating a buffer of that size."""
    pos = start
    while pos < end:
        n = min(end - pos, len(_ZEROS))
        view[pos : pos + n] = _ZEROS[:n]
        pos += n


def write_zeros(fd: int, offset: int, length: int) -> None:
    """Overwrite ``length`` bytes at ``offset`` with zeros (for devices that cannot punch holes)."""
    zeros = memoryview(_ZEROS)
    while length > 0:
        n = min(length, len(_ZEROS))
        os.pwrite(fd, zeros[:n], offset)
        offset += n
        length -= n


_libc: Any = None


def _fallocate() -> Any:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c") or "libc.so.6"
        _libc = ctypes.CDLL(name, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _libc.fallocate.restype = ctypes.c_int
    return _libc.fallocate


def discard(fd: int, offset: int, length: int, *, must_zero: bool = True) -> bool:
    """Free ``[offset, offset+length)`` by punching a hole (a TRIM on a block device).

    Afterwards the range reads as zeros. Where punching is not supported, it
    writes zeros instead when ``must_zero``, and otherwise leaves the bytes (the
    caller only wanted the space back). Returns whether the range now reads as zeros.
    """
    if length <= 0:
        return True
    try:
        rc = _fallocate()(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length)
    except (OSError, AttributeError):
        rc = -1
    if rc == 0:
        return True
    if must_zero:
        write_zeros(fd, offset, length)
        return True
    return False


# Durability calls. Every fsync/fdatasync of the drives, zone tables and store
# checkpoints goes through these three, so that a platform difference (macOS's
# F_FULLFSYNC, a sync_file_range variant) or an instrumented test has one place.


def sync_data(fd: int) -> None:
    """``fdatasync``: the file's data, and the metadata needed to read it back, are
    on stable storage when this returns. Raises ``OSError``."""
    os.fdatasync(fd)


def sync_file(fd: int) -> None:
    """``fsync``: the file's data and all its metadata (size, times) are on stable
    storage when this returns. Raises ``OSError``."""
    os.fsync(fd)


def sync_dir(path: str) -> None:
    """``fsync`` of directory ``path``: a create, rename or unlink in it is durable
    when this returns. Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
