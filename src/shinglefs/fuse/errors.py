"""Errors of mounting and unmounting, each with its documented CLI exit code.

The exit codes (10-15, 21) are listed in docs/cli.md; they do not overlap the
codes of the layers below (0 ok, 1 failure, 2 usage error).
"""

from __future__ import annotations

import errno as _errno

from shinglefs.errors import ShingleError


class MountError(ShingleError):
    """Base of every mount/unmount failure."""

    exit_code = 13


class MountPointError(MountError):
    """The mount point does not exist or is not a directory."""

    errno = _errno.ENOTDIR
    exit_code = 10

    def __init__(self, mountpoint: str, reason: str) -> None:
        super().__init__(
            f"{mountpoint}: {reason}",
            hint="create an empty directory first, e.g. `mkdir -p " + mountpoint + "`",
        )
        self.mountpoint = mountpoint


class AlreadyMountedError(MountError):
    """Something is already mounted on the mount point."""

    errno = _errno.EBUSY
    exit_code = 11

    def __init__(self, mountpoint: str) -> None:
        super().__init__(
            f"{mountpoint} is already a mount point",
            hint=f"unmount it first: `shinglefs umount {mountpoint}`",
        )
        self.mountpoint = mountpoint


class FuseUnavailableError(MountError):
    """The kernel's FUSE device or the fusermount3 helper is missing."""

    errno = _errno.ENODEV
    exit_code = 12

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"FUSE is not available: {reason}",
            hint="install fuse3 (`apt-get install fuse3`) and load the module (`modprobe fuse`)",
        )


class MountFailedError(MountError):
    """The mount did not come up (the daemon's own error is in the message)."""

    errno = _errno.EIO
    exit_code = 13


class NotMountedError(MountError):
    """``umount`` of a path that is not a ShingleFS (or any) mount point."""

    errno = _errno.EINVAL
    exit_code = 14

    def __init__(self, mountpoint: str) -> None:
        super().__init__(
            f"{mountpoint} is not a mount point", hint="`mount | grep shinglefs` lists the mounts"
        )
        self.mountpoint = mountpoint


class UnmountBusyError(MountError):
    """The mount is in use (open files, a working directory) and cannot be unmounted."""

    errno = _errno.EBUSY
    exit_code = 15

    def __init__(self, mountpoint: str, detail: str) -> None:
        super().__init__(
            f"cannot unmount {mountpoint}: {detail}",
            hint=f"close the files using it (`fuser -vm {mountpoint}`), or use --force "
            "for a lazy unmount",
        )
        self.mountpoint = mountpoint


class AllowOtherDeniedError(MountError):
    """``--allow-other`` asked by a non-root user while /etc/fuse.conf does not
    allow it (fusermount3 would refuse the mount with a cryptic message)."""

    errno = _errno.EPERM
    exit_code = 21

    def __init__(self, conf: str) -> None:
        super().__init__(
            f"--allow-other needs user_allow_other in {conf} when not mounting as root",
            hint=f"add a line `user_allow_other` to {conf} (as root), or mount without "
            "--allow-other (only you will see the files)",
        )
