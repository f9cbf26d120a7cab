"""Per-inode tables of a client stay bounded however many files it touches."""

from __future__ import annotations

import pytest
from fsfixtures import FsFactory, create, read_all

from shinglefs.client import inodes as inodes_module


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
