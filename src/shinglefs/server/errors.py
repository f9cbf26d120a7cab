"""Typed errors of the storage node."""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Iterable

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
            hint="`shinglefs umount MOUNTPOINT` (or `shinglefs status` to see the mounts) or "
                 "stop the storage server that holds it, then try again",
        )
        self.drive = drive
        self.lock_path = lock_path
        self.holder_pid = holder_pid


class DriveNotPermitted(NodeError):
    """This user may not open a drive's lock file (the drives belong to the user
    who formatted them, often root)."""

    errno = _errno.EACCES
    exit_code = 3

    def __init__(self, drive: str, lock_path: str, owner_uid: int | None) -> None:
        owner = f"uid {owner_uid}" if owner_uid is not None else "another user"
        super().__init__(
            f"drive {drive}: uid {os.getuid()} may not open its lock file {lock_path} "
            f"(owned by {owner})",
            hint="run the command as the user who formatted the file system; a mount's "
                 "state is also shown by `shinglefs status MOUNTPOINT`, as any user",
        )
        self.drive = drive
        self.lock_path = lock_path


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


class PartialFlush(NodeError):
    """A flush reached some drives but not others (their servers are gone): the
    writes on ``failed`` drives may not be durable; the others are."""

    def __init__(self, failed: Iterable[int], cause: BaseException) -> None:
        self.failed = frozenset(failed)
        super().__init__(f"flush failed on drive(s) {sorted(self.failed)}: {cause}")


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


# --------------------------------------------------------------------- the wire
# Errors of the slice protocol (server/wire.py, auth.py, service.py, remote.py).
# The server logs the first four and closes that one connection; the client
# raises the last four to its caller, so a caller can fail over to a replica.


class WireError(NodeError):
    """A failure of the slice protocol or of the connection carrying it."""


class FrameError(WireError):
    """A frame broke the protocol: bad magic or version, unknown kind or flags,
    a field or length out of its bound, or a body that does not parse."""

    errno = _errno.EPROTO


class PeerClosed(WireError):
    """The peer closed the connection (``truncated``: in the middle of a frame)."""

    def __init__(self, truncated: bool = False) -> None:
        super().__init__("the peer closed the connection"
                         + (" in the middle of a frame" if truncated else ""))
        self.truncated = truncated


class AuthFailed(WireError):
    """The handshake failed: a wrong cluster secret, a replayed or forged proof
    (on the server: also a peer that closed during the handshake)."""

    errno = _errno.EACCES

    def __init__(self, message: str) -> None:
        super().__init__(message, hint="give every server and client the same cluster secret")


class FrameRejected(WireError):
    """A frame on an authenticated connection failed its MAC or came out of
    sequence (forged, stale or replayed)."""

    errno = _errno.EACCES


class ServerUnreachable(WireError):
    """No connection to the storage server could be made (refused, unreachable,
    timed out)."""

    def __init__(self, address: str, detail: str, *,
                 hint: str = "check that the server runs and listens on that address") -> None:
        super().__init__(f"storage server {address} is unreachable: {detail}", hint=hint)
        self.address = address


class ConnectionLost(WireError):
    """The connection to a storage server broke while requests were outstanding;
    whether the server carried them out is unknown."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(f"connection to storage server {address} lost: {detail}")
        self.address = address


class RequestTimeout(WireError):
    """A storage server did not answer a request within the client's timeout."""

    errno = _errno.ETIMEDOUT

    def __init__(self, address: str, what: str, seconds: float) -> None:
        super().__init__(f"storage server {address} did not answer {what} in {seconds:g} s")
        self.address = address


class RemoteNodeError(NodeError):
    """The storage server reported an error of a kind the client has no class for;
    carries the server's errno and message."""

    def __init__(self, kind: str, message: str, errno: int) -> None:
        super().__init__(f"{kind} on the storage server: {message}")
        self.kind = kind
        self.errno = errno


# ------------------------------------------------------------------ a client of servers


class NoServers(ShingleError):
    """No live storage server with a drive: nothing can be written. Not a full
    file system but a missing one: EIO, as every read that needs a server gets
    meanwhile (ENOSPC would send a user looking for space to free)."""

    errno = _errno.EIO


class OwnerGone(NoServers):
    """The process that shares an embedded file system's drives (``shinglefs up``,
    or the first process that opened it: server/share.py) is not serving them."""


def no_servers(local_server: int | None) -> NoServers:
    """What a client of servers raises when no live one has a drive: ``OwnerGone``
    for a process sharing an embedded file system's drives (server
    ``local_server``), else ``NoServers``."""
    if local_server is not None:
        return OwnerGone(f"the process that shares this file system's drives (server "
                         f"{local_server}) is not running",
                         hint="start it again (`shinglefs up DATA_DIR MOUNTPOINT`); this "
                              "process's files work again once it serves")
    return NoServers("no live storage server has a drive",
                     hint="start one: `shinglefs server META_URL --drive ... --listen "
                          "HOST:PORT`; `shinglefs status --servers`")


# ------------------------------------------------------------------ the server process
# Raised by ``shinglefs server`` (server/process.py) before it serves.


class AddressInUse(NodeError):
    """The address a storage server is to listen on is taken by another process."""

    errno = _errno.EADDRINUSE
    exit_code = 23

    def __init__(self, address: str) -> None:
        super().__init__(f"cannot listen on {address}: the address is in use",
                         hint="stop the process listening there, or choose another --listen port")
        self.address = address


class ClusterSecretError(NodeError):
    """The cluster secret recorded in meta is too short to authenticate with."""

    errno = _errno.EACCES
    exit_code = 3
