"""The client's memory of a missing ``security.capability`` (asked before every write)."""

from __future__ import annotations

import errno
import os

import pytest

from shinglefs.client.vfs import CAPS_XATTR, VFS
from shinglefs.meta.errors import FsError

ROOT = 1


def _enodata(vfs: VFS, ino: int) -> None:
    with pytest.raises(FsError) as info:
        vfs.getxattr(ino, CAPS_XATTR)
    assert info.value.errno == errno.ENODATA


def test_a_new_file_has_no_capability_and_a_set_one_is_seen_at_once(vfs: VFS) -> None:
    fh, attr = vfs.create(ROOT, b"new", 0o755, os.O_RDWR | os.O_EXCL)
    _enodata(vfs, attr.ino)
    vfs.setxattr(attr.ino, CAPS_XATTR, b"\x01\x00\x00\x02")
    assert vfs.getxattr(attr.ino, CAPS_XATTR) == b"\x01\x00\x00\x02"
    vfs.removexattr(attr.ino, CAPS_XATTR)
    _enodata(vfs, attr.ino)
    vfs.release(fh)


def test_an_existing_file_opened_by_create_keeps_its_capability(vfs: VFS) -> None:
    fh, attr = vfs.create(ROOT, b"tool", 0o755, os.O_RDWR | os.O_EXCL)
    vfs.setxattr(attr.ino, CAPS_XATTR, b"caps")
    vfs.release(fh)
    # A non-exclusive create of an existing name opens that file: not "new".
    fh, again = vfs.create(ROOT, b"tool", 0o755, os.O_RDWR)
    assert again.ino == attr.ino
    assert vfs.getxattr(attr.ino, CAPS_XATTR) == b"caps"
    vfs.release(fh)


def test_other_xattrs_are_not_affected(vfs: VFS) -> None:
    fh, attr = vfs.create(ROOT, b"f", 0o644, os.O_RDWR | os.O_EXCL)
    _enodata(vfs, attr.ino)
    vfs.setxattr(attr.ino, b"user.k", b"v")
    assert vfs.getxattr(attr.ino, b"user.k") == b"v"
    with pytest.raises(FsError) as info:
        vfs.getxattr(attr.ino, b"user.missing")
    assert info.value.errno == errno.ENODATA
    vfs.release(fh)


def test_without_waiting_only_a_remembered_absence_is_answered(vfs: VFS) -> None:
    """What a PostgreSQL-backed mount answers on its event loop (``wait=False``)."""
    from shinglefs.client.vfs import Declined

    fh, attr = vfs.create(ROOT, b"plain", 0o644, os.O_RDWR | os.O_EXCL)
    with pytest.raises(FsError) as info:  # remembered since the create
        vfs.getxattr(attr.ino, CAPS_XATTR, wait=False)
    assert info.value.errno == errno.ENODATA
    vfs.setxattr(attr.ino, b"user.k", b"v")
    vfs.setxattr(attr.ino, CAPS_XATTR, b"caps")
    for name in (b"user.k", CAPS_XATTR):  # both need meta now: declined, nothing done
        with pytest.raises(Declined):
            vfs.getxattr(attr.ino, name, wait=False)
    assert vfs.getxattr(attr.ino, b"user.k") == b"v"
    assert vfs.getxattr(attr.ino, CAPS_XATTR) == b"caps"
    vfs.release(fh)
