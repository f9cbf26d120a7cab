"""Per-inode tables of a client stay bounded however many files it touches."""

from __future__ import annotations

import os
import time

import pytest
from fsfixtures import FsFactory, create, read_all

from shinglefs.client import inodes as inodes_module
from shinglefs.client.vfs import VFS, Declined, SetAttrChanges
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_CTX, ROOT_INO, InodeAttr


def test_map_caches_stay_bounded_over_many_files(
    fs_factory: FsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel may never ``forget`` an inode, so what the client keeps per
    inode it wrote or read must be bounded by itself (before: one map window
    and one generation per file, for the life of the mount)."""
    monkeypatch.setattr(inodes_module, "INODE_MEMO_ENTRIES", 16)
    vfs = fs_factory.vfs()
    inos = []
    for i in range(100):
        fh, ino = create(vfs, f"f{i}".encode())
        vfs.write(fh, 0, f"file {i}".encode())
        vfs.flush(fh)
        vfs.release(fh)
        inos.append(ino)
    for i, ino in enumerate(inos):
        assert read_all(vfs, ino) == f"file {i}".encode()
    stats = vfs.stats()
    assert stats["map_windows"] <= 16 and stats["map_generations"] <= 16
    for i, ino in enumerate(inos):  # and nothing read wrong after the tables were emptied
        assert read_all(vfs, ino) == f"file {i}".encode()


# ---- a directory's attributes for the kernel's getattr (InodeTable.dirs) -------------------


def _fresh(vfs: VFS, ino: int) -> InodeAttr:
    return vfs.meta.getattr(ino)


def test_a_directorys_remembered_attributes_follow_this_clients_own_entries(
    fs_factory: FsFactory,
) -> None:
    vfs = fs_factory.vfs()
    d = vfs.mkdir(ROOT_INO, b"d", 0o755, ROOT_CTX).ino
    with pytest.raises(Declined):
        vfs.getattr(d, cached=True, wait=False)  # never read: nothing remembered
    assert vfs.getattr(d, cached=True) == _fresh(vfs, d)
    for i in range(3):
        fh, _attr = vfs.create(d, b"f%d" % i, 0o644, os.O_RDWR | os.O_CREAT | os.O_EXCL, ROOT_CTX)
        vfs.release(fh)
        assert vfs.getattr(d, cached=True, wait=False) == _fresh(vfs, d)
    vfs.mkdir(d, b"sub", 0o755, ROOT_CTX)
    vfs.symlink(d, b"lnk", b"f0", ROOT_CTX)
    assert vfs.getattr(d, cached=True, wait=False) == _fresh(vfs, d)
    assert vfs.getattr(d, cached=True, wait=False).nlink == 3
    # Opening an existing file without O_EXCL changes nothing in the directory.
    fh, _attr = vfs.create(d, b"f0", 0o644, os.O_RDWR | os.O_CREAT, ROOT_CTX)
    vfs.release(fh)
    assert vfs.getattr(d, cached=True, wait=False) == _fresh(vfs, d)


@pytest.mark.parametrize("change", ["unlink", "rename", "rmdir", "link", "chmod", "setxattr"])
def test_any_other_change_through_this_client_forgets_remembered_directories(
    fs_factory: FsFactory, change: str
) -> None:
    vfs = fs_factory.vfs()
    d = vfs.mkdir(ROOT_INO, b"d", 0o755, ROOT_CTX).ino
    vfs.mkdir(d, b"sub", 0o755, ROOT_CTX)
    fh, attr = vfs.create(d, b"f", 0o644, os.O_RDWR | os.O_CREAT | os.O_EXCL, ROOT_CTX)
    vfs.release(fh)
    vfs.getattr(d)
    {
        "unlink": lambda: vfs.unlink(d, b"f", ROOT_CTX),
        "rename": lambda: vfs.rename(d, b"f", d, b"g", 0, ROOT_CTX),
        "rmdir": lambda: vfs.rmdir(d, b"sub", ROOT_CTX),
        "link": lambda: vfs.link(attr.ino, d, b"h", ROOT_CTX),
        "chmod": lambda: vfs.setattr(d, SetAttrChanges(mode=0o700), None, ROOT_CTX),
        "setxattr": lambda: vfs.setxattr(d, b"user.k", b"v", 0, ROOT_CTX),
    }[change]()
    with pytest.raises(Declined):
        vfs.getattr(d, cached=True, wait=False)
    assert vfs.getattr(d, cached=True) == _fresh(vfs, d)


def test_another_clients_entry_shows_in_a_remembered_directory_after_the_ttl(
    fs_factory: FsFactory,
) -> None:
    vfs = fs_factory.vfs()
    vfs.inodes.dirs.ttl = 0.05
    d = vfs.mkdir(ROOT_INO, b"d", 0o755, ROOT_CTX).ino
    before = vfs.getattr(d, cached=True)
    other = open_meta(fs_factory.meta_url)  # another client's metadata connection
    try:
        other.mkdir(d, b"theirs", 0o755, ROOT_CTX)
    finally:
        other.close()
    time.sleep(0.1)
    after = vfs.getattr(d, cached=True)
    assert after.nlink == before.nlink + 1 and after == _fresh(vfs, d)
