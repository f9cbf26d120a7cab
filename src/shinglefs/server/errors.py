"""Typed errors of the storage node."""

from __future__ import annotations

import errno as _errno

from shinglefs.errors import ShingleError


class NodeError(ShingleError):
    """A storage-node failure (maps to EIO unless a subclass says otherwise)."""

    errno = _errno.EIO


class DriveInUse(NodeError):
    """Another process holds the lock file of a drive."""

    errno = _errno.EBUSY
    exit_code = 3

    def __init__(self, drive: str, lock_path: str, holder_pid: int | None) -> None:
        holder = f"pid {holder_pid}" if holder_pid else "another process"
        super().__init__(
            f"drive {drive} is in use by {holder} (lock file {lock_path})",
            hint="stop the other shinglefs process (unmount it) or use other drives",
        )
        self.drive = drive
        self.lock_path = lock_path
        self.holder_pid = holder_pid


class UnknownDrive(NodeError):
    """A slice names a drive this node does not have."""

    def __init__(self, drive_id: int, known: list[int]) -> None:
        super().__init__(f"drive {drive_id} is not part of this node (drives {known})")
        self.drive_id = drive_id


class SliceMissing(NodeError):
    """No drive of this node holds the slice (deleted, or lost in a crash)."""

    def __init__(self, slice_id: int, drive_id: int | None) -> None:
        where = f"drive {drive_id}" if drive_id is not None else "any drive"
        super().__init__(f"slice {slice_id:#x} not found on {where}")
        self.slice_id = slice_id
        self.drive_id = drive_id


class NodeFull(NodeError):
    """No drive can take the bytes of a slice."""

    errno = _errno.ENOSPC

    def __init__(self, slice_id: int, drive_id: int | None, detail: str = "") -> None:
        super().__init__(
            f"no space for slice {slice_id:#x}"
            + (f" on drive {drive_id}" if drive_id is not None else "")
            + (f": {detail}" if detail else ""),
            hint="free space in the file system (files no longer needed) or add drives",
        )
        self.slice_id = slice_id
        self.drive_id = drive_id


class NodeClosed(NodeError):
    """The node was closed; no further I/O is possible."""
