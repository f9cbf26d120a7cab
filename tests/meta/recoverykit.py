"""Shared code of the recovery tests (fsck, scrub, dump/load, backups on the drives).

Every test builds a real file system (SQLite metadata, emulated SMR drives on
sparse files), damages it on purpose with plain SQL or by writing the drive's
file, and runs the commands as a user does (``shinglefs.cli.main.main``).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from tests.client.fsfixtures import FsFactory, drive_specs, pattern, read_all, write_file

from shinglefs.cli.main import main
from shinglefs.client.filesystem import open_filesystem
from shinglefs.client.vfs import VFS
from shinglefs.meta.api import ROOT_INO
from shinglefs.server.node import StorageNode

__all__ = ["A", "B", "C", "FsFactory", "cli", "drive_specs", "listing", "node_of", "pattern",
           "populate", "read_all", "slice_of", "sql", "tree_with_bytes", "write_file"]

MiB = 1024 * 1024
# The files of ``populate``: /a (a drive slice of 3 MiB), /d/b, /c.
A = pattern(1, 3 * MiB + 5)
B = pattern(2, 200_000)
C = pattern(3, 70_000)


def populate(factory: FsFactory, drives: int = 1) -> None:
    """/a, /d/b and /c (``A``, ``B``, ``C``) written on ``factory``'s file
    system (formatted with ``drives``), which is then closed."""
    vfs = factory.vfs(drives=drives)
    write_file(vfs, b"a", A)
    d = vfs.mkdir(1, b"d", 0o755).ino
    write_file(vfs, b"b", B, parent=d)
    write_file(vfs, b"c", C)
    vfs.shutdown()


def cli(*args: str) -> int:
    """Run ``shinglefs ARGS`` in this process; returns its exit code."""
    with pytest.raises(SystemExit) as exited:
        main(list(args))
        raise SystemExit(0)
    return int(exited.value.code or 0)


def sql(root: Path, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Run one statement on the SQLite metadata of the file system in ``root``."""
    db = sqlite3.connect(root / "meta.db")
    try:
        rows = db.execute(statement, params).fetchall()
        db.commit()
        return rows
    finally:
        db.close()


def node_of(root: Path, drives: int = 1) -> StorageNode:
    """The drives of the file system in ``root``, opened directly (it must be unmounted)."""
    return StorageNode.open(list(enumerate(drive_specs(root, drives))))


def tree_with_bytes(vfs: VFS, ino: int = ROOT_INO, prefix: str = "") -> dict[str, Any]:
    """path -> file bytes (or "dir" / the symlink target), for the whole tree."""
    out: dict[str, Any] = {}
    fh = vfs.opendir(ino)
    try:
        entries = list(vfs.readdir(fh))
    finally:
        vfs.releasedir(fh)
    for entry in entries:
        path = f"{prefix}/{entry.name.decode()}"
        mode = entry.attr.mode
        if stat.S_ISDIR(mode):
            out[path] = "dir"
            out.update(tree_with_bytes(vfs, entry.attr.ino, path))
        elif stat.S_ISLNK(mode):
            out[path] = vfs.readlink(entry.attr.ino)
        else:
            out[path] = read_all(vfs, entry.attr.ino)
    return out


def listing(meta_url: str) -> dict[str, Any]:
    """``tree_with_bytes`` of the file system at ``meta_url`` (opened, then shut down)."""
    vfs = open_filesystem(meta_url)
    try:
        return tree_with_bytes(vfs)
    finally:
        vfs.shutdown()


def file_bytes(root: Path, drive: int, offset: int, data: bytes) -> None:
    """Overwrite bytes of an emulated drive's file (corruption on purpose)."""
    fd = os.open(root / f"drive{drive}.img", os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def slice_of(root: Path, name: bytes) -> int:
    """The slice of the first chunk reference of the file named ``name``."""
    return int(sql(root, "SELECT r.slice_id FROM chunk_refs r JOIN dentries d ON d.ino = r.ino "
                         "WHERE d.name = ?", (name,))[0][0])
