"""Typed errors of the client (each with the errno the FUSE boundary returns)."""

from __future__ import annotations

import errno as _errno
import os as _os

from shinglefs.errors import ShingleError


class ClientError(ShingleError):
    """A client-side failure; EIO unless a subclass says otherwise."""

    errno = _errno.EIO


class BadHandle(ClientError):
    """A file or directory handle that is not open in this client."""

    errno = _errno.EBADF

    def __init__(self, fh: int, what: str = "file") -> None:
        super().__init__(f"{what} handle {fh} is not open")
        self.fh = fh


class NotOpenForWriting(ClientError):
    errno = _errno.EBADF

    def __init__(self, fh: int) -> None:
        super().__init__(f"handle {fh} is not open for writing")


class NotOpenForReading(ClientError):
    errno = _errno.EBADF

    def __init__(self, fh: int) -> None:
        super().__init__(f"handle {fh} is not open for reading")


class UnsupportedFallocate(ClientError):
    """Only fallocate mode 0 (allocate, extending the size) is supported."""

    errno = _errno.EOPNOTSUPP

    def __init__(self, mode: int) -> None:
        super().__init__(
            f"fallocate mode {mode:#x} is not supported (only mode 0)",
            hint="punch-hole, zero-range, collapse and keep-size need in-place writes",
        )


class ShortSlice(ClientError):
    """A slice returned fewer bytes than the chunk map says it holds (lost bytes)."""

    def __init__(self, slice_id: int, offset: int, wanted: int, got: int) -> None:
        super().__init__(
            f"slice {slice_id:#x} returned {got} of {wanted} bytes at offset {offset}",
            hint="bytes were lost before they were made durable; unmount and run "
            "`shinglefs fsck --repair META_URL` (it truncates the file to what is readable)",
        )
        self.slice_id = slice_id


class NotAFileSystem(ClientError):
    """The metadata names no drives (formatted by something else, or damaged)."""

    errno = _errno.ENODEV
    exit_code = 3


class ClientClosed(ClientError):
    """The file system was shut down; no further operations."""

    errno = _errno.ESHUTDOWN

    def __init__(self) -> None:
        super().__init__("the ShingleFS client is shut down")


class ForkedClient(ClientError):
    """A file system opened in a parent process, used in a forked child: its
    threads, connections and session are the parent's. ``connect()`` and
    ``shinglefs://`` open one of the child's own."""

    errno = _errno.EBADF

    def __init__(self, owner_pid: int) -> None:
        super().__init__(
            f"this ShingleFS file system was opened by process {owner_pid}, the parent "
            f"of this forked process ({_os.getpid()})",
            hint="call shinglefs.connect() (or open shinglefs:// with fsspec) in the "
                 "child: it opens a file system of its own")


class TooManySymlinks(ClientError):
    errno = _errno.ELOOP

    def __init__(self, name: str) -> None:
        super().__init__(f"too many levels of symbolic links at {name!r}")
