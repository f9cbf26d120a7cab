"""The Python API's setattr path grants what Linux grants: a descriptor opened
for writing lets its holder change the size whatever the file's mode is now
(ftruncate after ``open(O_CREAT | O_RDWR, 0)``)."""

from __future__ import annotations

import errno
import os

import pytest

from shinglefs.client.api import ShingleFS
from shinglefs.client.vfs import VFS, SetAttrChanges
from shinglefs.meta.api import ROOT_INO, Ctx

USER = Ctx(uid=1000, gid=1000)


def test_truncate_through_a_file_created_with_mode_0_succeeds(vfs: VFS) -> None:
    vfs.setattr(ROOT_INO, SetAttrChanges(mode=0o777))
    fs = ShingleFS(vfs, ctx=USER)
    with fs.open_raw("/made", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0) as f:
        f.write(b"abc")
        assert f.truncate(100) == 100
    assert fs.stat("/made").st_size == 100
    with pytest.raises(PermissionError):
        fs.truncate("/made", 10)  # by path: needs write permission, which mode 0 denies
    assert fs.stat("/made").st_size == 100


def test_truncate_through_a_read_only_handle_still_needs_write_permission(vfs: VFS) -> None:
    vfs.setattr(ROOT_INO, SetAttrChanges(mode=0o777))
    fs = ShingleFS(vfs, ctx=USER)
    fs.open("/ro", "wb").close()
    fs.chmod("/ro", 0o444)
    fh = vfs.open(fs.stat("/ro").st_ino, os.O_RDONLY, USER)
    try:
        with pytest.raises(Exception) as raised:
            vfs.setattr(fs.stat("/ro").st_ino, SetAttrChanges(size=0), fh, USER)
        assert getattr(raised.value, "errno", None) == errno.EACCES
    finally:
        vfs.release(fh)
