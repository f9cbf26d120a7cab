"""Typed errors of the metadata engine.

Two families:

- ``FsError`` (and the few named subclasses below it): a namespace or content
  operation (or ``format``'s arguments: ``ChunkSizeError``) failed the way a
  Linux file system would fail it. It carries the errno the FUSE boundary
  returns unchanged (``ENOENT``, ``EEXIST``, ``ENOTEMPTY``...). The
  transaction that raised it was rolled back: nothing of the operation is
  visible.
- Set-up errors (``MetaURLError``, ``MetaUnavailable``, ``SchemaVersionError``,
  ``NotFormatted``, ``AlreadyFormatted``): the engine cannot serve at all. Each
  says in one line what was expected and carries a ``hint`` saying how to fix
  it; the CLI prints both and no traceback.
"""

from __future__ import annotations

import errno as _errno
import os

from shinglefs.errors import ShingleError


class MetaError(ShingleError):
    """Base of every metadata-engine error (``errno`` says what Linux would return)."""

    errno = _errno.EIO


class FsError(MetaError):
    """A file-system operation failed with ``errno`` (as Linux would fail it).

    ``FsError(errno.ENOENT, "no entry b'x' in directory 1")``. ``ino`` and
    ``name`` name the inode / entry involved when known.
    """

    def __init__(
        self,
        errno_: int,
        message: str | None = None,
        *,
        ino: int | None = None,
        name: bytes | None = None,
        hint: str | None = None,
    ) -> None:
        if message is None:
            message = os.strerror(errno_)
        super().__init__(f"{message} [{_errno.errorcode.get(errno_, errno_)}]", hint=hint)
        self.errno = errno_
        self.ino = ino
        self.name = name


class ChunkChanged(FsError):
    """``replace_chunk`` lost the optimistic race: the chunk changed since it was read."""

    def __init__(self, ino: int, chunk_index: int, expected: int, found: int) -> None:
        super().__init__(
            _errno.EAGAIN,
            f"chunk {chunk_index} of inode {ino} is at version {found}, not {expected}",
            ino=ino,
            hint="the chunk changed meanwhile: read it again and retry the compaction",
        )
        self.chunk_index = chunk_index
        self.expected = expected
        self.found = found


class SliceStateError(FsError):
    """A slice is in a state that forbids the operation (e.g. referencing a slice queued for deletion)."""

    def __init__(self, slice_id: int, state: str, wanted: str) -> None:
        super().__init__(_errno.ESTALE, f"slice {slice_id} is {state}; cannot {wanted}", hint=None)
        self.slice_id = slice_id
        self.state = state


class ChunkSizeError(FsError):
    """``format`` was given a chunk size this file system cannot use: not a
    positive multiple of the block size, or larger than the store's largest
    slice (``shinglefs.store.api.MAX_SLICE_SIZE``: a slice never crosses a
    chunk, and one slice must be able to fill one). Nothing was written.

    ``chunk_size``, ``block_size`` and ``max_slice_size`` are the values checked.
    """

    exit_code = 2

    def __init__(self, chunk_size: int, block_size: int, max_slice_size: int, why: str) -> None:
        super().__init__(
            _errno.EINVAL,
            f"chunk size {chunk_size} {why}",
            hint=f"use a multiple of {block_size} bytes, at most {max_slice_size} "
            f"({max_slice_size / (1 << 20):g} MiB)",
        )
        self.chunk_size = chunk_size
        self.block_size = block_size
        self.max_slice_size = max_slice_size


class MetaURLError(MetaError):
    """The metadata URL is malformed or names an unknown backend."""

    errno = _errno.EINVAL
    exit_code = 2


class TxConflict(MetaError):
    """A transaction met a concurrent change it cannot write over (a row it
    read changed or went before its write): the backend runs it again, as it
    does on a serialization failure. Never leaves the backend's ``run``
    unless every attempt met one."""

    errno = _errno.EAGAIN


class MetaUnavailable(MetaError):
    """The metadata database cannot be reached or opened (server down, no such database, bad file)."""

    errno = _errno.EIO
    exit_code = 3


class SchemaVersionError(MetaError):
    """The database holds a schema of another version than this code speaks."""

    errno = _errno.EPROTO
    exit_code = 3


class NotFormatted(MetaError):
    """The database holds no ShingleFS format record yet."""

    errno = _errno.ENODEV
    exit_code = 3


class AlreadyFormatted(MetaError):
    """``format`` was called on a database that already holds a file system."""

    errno = _errno.EEXIST
    exit_code = 3
