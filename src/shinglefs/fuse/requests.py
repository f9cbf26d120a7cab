"""Requests a process sends a mount through its files: ``shinglefs snapshot``
on a mount asks the mount daemon to make the copy, so that it runs as the
caller (the kernel and the metadata engine check the caller's permissions,
as for any file operation), commits what the mount still buffers first, and
needs no access to the metadata database.

``shinglefs snapshot --delete PATH`` sends ``WRITABLE_XATTR`` with PATH's
name to its directory: the daemon clears the read-only snapshot's
immutability as the caller (root or its owner), and the command then removes
the tree through the mount like ``rm -r``.

``shinglefs policy DIR --tier T --move`` sends ``TIER_MOVE_XATTR`` the same
way: the daemon moves DIR's existing data to its tier before ``setxattr``
returns.

A snapshot request is an extended attribute set on the directory that will hold the
copy: ``setxattr(DIR, SNAPSHOT_XATTR, snapshot_request(src, name, read_only))``.
The daemon never stores it; ``setxattr`` returns once the copy exists, or
fails with the errno of ``MetaStore.snapshot`` (EEXIST, ENOENT, EACCES,
EINVAL, EPERM, ...). Setting an attribute of the ``user`` namespace needs
write permission on the directory (which making an entry in it needs
anyway); the kernel refuses it (EPERM) in a sticky directory the caller does
not own, so a user snapshots into a directory of their own there.
"""

from __future__ import annotations

import errno

from shinglefs.meta.errors import FsError

SNAPSHOT_XATTR = b"user.shinglefs.snapshot"
# Set (any value) on a directory or file: the daemon moves the data below it to
# the tier its directories set (``VFS.move_to_tier``); reading it afterwards
# gives that move's figures as JSON (``files``, ``chunks``, ``skipped``).
TIER_MOVE_XATTR = b"user.shinglefs.tier-move"
# Set on a directory, the value an entry's name: the daemon makes that read-only
# snapshot writable (``VFS.make_writable``) so that it can be removed
# (``shinglefs snapshot --delete``); EINVAL when it is no read-only snapshot.
WRITABLE_XATTR = b"user.shinglefs.make-writable"
_VERSION = b"snapshot-1"
_FLAGS = {b"rw": False, b"ro": True}
PATH_MAX = 4096  # as the kernel refuses a longer path (ENAMETOOLONG)


def snapshot_request(src: bytes, name: bytes, read_only: bool) -> bytes:
    """The value of ``SNAPSHOT_XATTR`` asking for a copy named ``name`` of ``src``
    (an absolute path inside the file system, not followed if a symlink)."""
    flag = b"ro" if read_only else b"rw"
    return b"\0".join((_VERSION, src, name, flag))


def parse_entry_name(value: bytes) -> bytes:
    """The entry name a ``WRITABLE_XATTR`` request carries; EINVAL for anything
    that is not one name."""
    if not value or b"/" in value or b"\0" in value or value in (b".", b".."):
        raise FsError(errno.EINVAL, f"not an entry name: {value[:80]!r}")
    return value


def parse_snapshot_request(value: bytes) -> tuple[bytes, bytes, bool]:
    """(source path, new name, read_only) of a request; ``FsError(EINVAL)`` for
    anything ``snapshot_request`` did not make."""
    parts = value.split(b"\0")
    if len(parts) != 4 or parts[0] != _VERSION or parts[3] not in _FLAGS:
        raise FsError(errno.EINVAL, f"not a snapshot request: {value[:80]!r}")
    _, src, name, flag = parts
    if len(src) >= PATH_MAX:
        raise FsError(errno.ENAMETOOLONG, f"a source path of {len(src)} bytes")
    if not src.startswith(b"/") or not name or b"/" in name or name in (b".", b".."):
        raise FsError(errno.EINVAL, f"bad snapshot request: source {src!r}, name {name!r}")
    return src, name, _FLAGS[flag]
