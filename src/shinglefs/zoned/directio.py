"""I/O around the page cache: descriptors opened ``O_DIRECT``.

The emulated drive writes this way where its backing file allows it, as a
real zoned device is written: no double caching, and no dirty-page throttling
of the writer (``DirectWriter``, fed through a bounce buffer). It reads this
way too whenever every buffer of a read is page-aligned (``page_aligned``):
the bytes go from the disk straight into the caller's buffer, with no copy
through the page cache and no page cache filled with the drive's image; any
other read is buffered (the kernel keeps the two coherent). Whether to try
is the environment's call (``SHINGLEFS_EMULATED_DIRECT``, on unless "0"),
read when a drive is opened, never at import.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

BOUNCE_BYTES = 8 * 1024 * 1024  # O_DIRECT writes go out in rounds of at most this
DIRECT_ENV = "SHINGLEFS_EMULATED_DIRECT"


ALIGN = 4096  # the alignment a direct read asks of offsets, lengths and buffers


def direct_writes_from_env() -> bool:
    """Whether emulated drives go around the page cache (writes, aligned reads):
    on unless ``SHINGLEFS_EMULATED_DIRECT=0``.

    Read each time a drive is opened, never at import.
    """
    return os.environ.get(DIRECT_ENV, "1") != "0"


def page_aligned(views: list[memoryview]) -> bool:
    """Can ``views`` take a direct read: each writable, its address and length
    multiples of ``ALIGN``?"""
    for view in views:
        if view.readonly or view.nbytes % ALIGN or not view.c_contiguous:
            return False
        if ctypes.addressof(ctypes.c_char.from_buffer(view)) % ALIGN:
            return False
    return True


def open_direct_reads(path: str) -> int | None:
    """A descriptor of ``path`` opened ``O_RDONLY | O_DIRECT``, or None where the
    file system (tmpfs, some overlays) refuses it."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None


class DirectWriter:
    """One ``O_DIRECT`` descriptor of a file and its page-aligned bounce buffer.

    Not thread-safe: the drive calls it under its own lock. Offsets and
    lengths must be block-aligned; the caller's buffers need not be (they are
    gathered into the bounce buffer).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._bounce: mmap.mmap | None = None

    @classmethod
    def open(cls, path: str) -> DirectWriter | None:
        """A writer on a second descriptor of ``path`` opened ``O_WRONLY | O_DIRECT``, or
        None where the file system (tmpfs, some overlays) refuses it."""
        if not hasattr(os, "O_DIRECT"):
            return None
        try:
            return cls(os.open(path, os.O_WRONLY | os.O_DIRECT))
        except OSError:
            return None

    def write(self, views: list[memoryview], offset: int, length: int) -> bool:
        """Write ``views`` (``length`` bytes in all) at ``offset``, in bounce-buffer rounds.

        Returns False when the file refuses ``O_DIRECT`` writes (EINVAL before
        any byte): the writer then closes itself and the caller writes
        buffered from now on. Raises ``OSError`` for any other failure.
        """
        if self._bounce is None:
            self._bounce = mmap.mmap(-1, BOUNCE_BYTES)  # page-aligned
        bounce = memoryview(self._bounce)
        pending = list(views)
        done = 0
        try:
            while done < length:
                fill = 0
                while pending and fill < BOUNCE_BYTES:
                    view = pending[0]
                    take = min(view.nbytes, BOUNCE_BYTES - fill)
                    bounce[fill : fill + take] = view[:take]
                    fill += take
                    if take == view.nbytes:
                        pending.pop(0)
                    else:
                        pending[0] = view[take:]
                written = 0
                while written < fill:
                    n = os.pwrite(self._fd, bounce[written:fill], offset + done + written)
                    if n <= 0:
                        raise OSError(errno.EIO, "O_DIRECT write wrote nothing")
                    written += n
                done += fill
        except OSError as exc:
            if exc.errno != errno.EINVAL or done:  # EINVAL before any byte: no O_DIRECT here
                raise
            bounce.release()  # before the buffer it views is closed
            self.close()
            return False
        finally:
            bounce.release()  # idempotent
        return True

    def close(self) -> None:
        """Release the descriptor and the bounce buffer. Idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._bounce is not None:
            self._bounce.close()
            self._bounce = None
