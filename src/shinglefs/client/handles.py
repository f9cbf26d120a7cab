"""Open handles of one client: file handles and directory handles, numbered from one counter.

A handle is what ``open``/``create``/``opendir`` return and every later
call names; misuse (an unknown or already released number) raises
``BadHandle`` (EBADF). Thread-safe: numbering and the tables take one lock,
never held across I/O; lookups read the tables without it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from shinglefs.client.errors import BadHandle
from shinglefs.client.reader import ReadState
from shinglefs.meta.api import Ctx

__all__ = ["DirHandle", "FileHandle", "HandleTable"]


@dataclass(slots=True)
class FileHandle:
    """An open file: its inode, open flags, ``keep_cache`` and access pattern."""

    fh: int
    ino: int
    flags: int
    keep_cache: bool
    stamp: tuple[int, int, int] | None = None  # (mtime_ns, ctime_ns, size) in meta at open
    read_state: ReadState = field(default_factory=ReadState)

    @property
    def readable(self) -> bool:
        return (self.flags & os.O_ACCMODE) in (os.O_RDONLY, os.O_RDWR)

    @property
    def writable(self) -> bool:
        return (self.flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)

    @property
    def append(self) -> bool:
        return bool(self.flags & os.O_APPEND)


@dataclass(slots=True)
class DirHandle:
    """An open directory, listed with the permissions of who opened it."""

    fh: int
    ino: int
    ctx: Ctx


class HandleTable:
    """The file and directory handles a client has open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[int, FileHandle] = {}
        self._dirs: dict[int, DirHandle] = {}
        self._next_fh = 1

    def __len__(self) -> int:
        """Open file handles."""
        return len(self._files)

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    # ------------------------------------------------------------------ files
    def add_file(self, ino: int, flags: int, keep_cache: bool,
                 stamp: tuple[int, int, int] | None = None) -> int:
        """A new file handle on ``ino`` (``stamp``: meta's version of it at open);
        returns its number."""
        with self._lock:
            fh = self._new_fh()
            self._files[fh] = FileHandle(fh, ino, flags, keep_cache, stamp)
        return fh

    def file(self, fh: int) -> FileHandle:
        """The open file ``fh`` (else BadHandle)."""
        try:
            return self._files[fh]
        except KeyError:
            raise BadHandle(fh) from None

    def find_file(self, fh: int) -> FileHandle | None:
        """The open file ``fh``, or None."""
        return self._files.get(fh)

    def pop_file(self, fh: int) -> FileHandle:
        """Remove the open file ``fh`` and return it (else BadHandle)."""
        with self._lock:
            h = self._files.pop(fh, None)
        if h is None:
            raise BadHandle(fh)
        return h

    def file_numbers(self) -> list[int]:
        """The numbers of every open file handle (a snapshot)."""
        return list(self._files)

    # ------------------------------------------------------------------ directories
    def add_dir(self, ino: int, ctx: Ctx) -> int:
        """A new directory handle on ``ino``; returns its number."""
        with self._lock:
            fh = self._new_fh()
            self._dirs[fh] = DirHandle(fh, ino, ctx)
        return fh

    def dir(self, fh: int) -> DirHandle:
        """The open directory ``fh`` (else BadHandle)."""
        d = self._dirs.get(fh)
        if d is None:
            raise BadHandle(fh, "directory")
        return d

    def pop_dir(self, fh: int) -> None:
        """Close the directory handle ``fh`` (else BadHandle)."""
        with self._lock:
            if self._dirs.pop(fh, None) is None:
                raise BadHandle(fh, "directory")

    def clear_dirs(self) -> None:
        self._dirs.clear()
