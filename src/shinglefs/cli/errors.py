"""Errors raised by the ``shinglefs`` commands themselves, each with its
documented exit code (docs/cli.md).

The layers' own errors live next to their code; these are the conditions only
a command meets: ``up``'s disk check, a mount point of another file system,
a bad configuration file.
"""

from __future__ import annotations

import errno as _errno

from shinglefs.errors import ShingleError
from shinglefs.fuse.errors import MountError


class NoSpaceError(MountError):
    """``up`` found too little free disk space for the emulated drives."""

    errno = _errno.ENOSPC
    exit_code = 16


class NotShingleMountError(MountError):
    """``umount``/``status`` of a mount point that holds another file system:
    refused without touching it."""

    exit_code = 17

    def __init__(self, mountpoint: str, fstype: str) -> None:
        super().__init__(
            f"{mountpoint} is a {fstype} mount, not ShingleFS; left alone",
            hint="pass a ShingleFS mount point (`shinglefs status` lists them)",
        )
        self.mountpoint = mountpoint


class ConfigFileError(ShingleError):
    """The configuration file is missing (when named), not TOML, or has a key
    that is unknown or of the wrong type; ``key`` names it (``store.linger_s``).
    Nothing was started."""

    errno = _errno.EINVAL
    exit_code = 22

    def __init__(self, path: str, message: str, *, key: str | None = None,
                 hint: str | None = None) -> None:
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + message,
                         hint=hint or "fix the file (keys: docs/configuration.md), "
                         "or pass another with --config")
        self.path = path
        self.key = key
