"""The root of every typed ShingleFS error.

Each layer defines its own subclasses next to its code (``zoned.errors``,
``store.errors``, ``meta.errors``...). Two boundaries translate them: the FUSE
layer maps ``errno`` to a ``FUSEError``; the CLI maps ``exit_code`` and the
one-line ``str()`` to what a user sees. Nothing else should need to know.
"""

from __future__ import annotations

import errno as _errno


class ShingleError(Exception):
    """Base class: a message a user can act on, an errno, and a CLI exit code.

    Subclasses set ``errno`` (what a Linux file system would return for this
    condition) and ``exit_code`` (the CLI's documented code for it). ``hint``,
    when set, is printed after the message as what to do about it.
    """

    errno: int = _errno.EIO
    exit_code: int = 1
    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class UsageError(ShingleError):
    """The user asked for something malformed (a bad URL, a bad size...)."""

    errno = _errno.EINVAL
    exit_code = 2


class PathError(ShingleError):
    """A path the command must create or write cannot be used: its directory is
    missing or not writable, or a file is already there that the command would
    overwrite. Nothing was created or changed."""

    errno = _errno.EACCES
    exit_code = 20
