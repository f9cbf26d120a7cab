"""Shared test code of the client tests: drive specs, a file-system factory, file helpers."""

from __future__ import annotations

import os
import random
from pathlib import Path

from shinglefs.client.config import ClientConfig
from shinglefs.client.filesystem import format_filesystem, open_filesystem
from shinglefs.client.vfs import VFS
from shinglefs.meta.api import ROOT_CTX, ROOT_INO

MiB = 1024 * 1024
DRIVE_BYTES = 8 * 1024 * MiB
ZONE_BYTES = 64 * MiB
RW = os.O_RDWR | os.O_CREAT


def drive_specs(root: Path, count: int = 1, size: int = DRIVE_BYTES) -> list[str]:
    """Specs of emulated host-managed SMR drives on sparse files under ``root``."""
    return [f"emulated:{root}/drive{i}.img:{size}" for i in range(count)]


class FsFactory:
    """Formats one file system under a temp dir and opens clients on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.meta_url = f"sqlite3://{root}/meta.db"
        self.opened: list[VFS] = []
        self.formatted = False

    def format(self, drives: int = 1, **kwargs: object) -> None:
        kwargs.setdefault("zone_size", ZONE_BYTES)
        format_filesystem(self.meta_url, drive_specs(self.root, drives), **kwargs)  # type: ignore[arg-type]
        self.formatted = True

    def vfs(self, config: ClientConfig | None = None, drives: int = 1, **kwargs: object) -> VFS:
        if not self.formatted:
            self.format(drives, **kwargs)
        vfs = open_filesystem(self.meta_url, config=config)
        self.opened.append(vfs)
        return vfs

    def close_all(self) -> None:
        for vfs in self.opened:
            if not vfs.closed:
                vfs.shutdown()


def pattern(seed: int, length: int) -> bytes:
    """Deterministic, position-dependent bytes (a misplaced byte shows)."""
    return random.Random(seed).randbytes(length)


def create(vfs: VFS, name: bytes, parent: int = ROOT_INO, flags: int = RW) -> tuple[int, int]:
    """Create and open a file; returns (fh, ino)."""
    fh, attr = vfs.create(parent, name, 0o644, flags, ROOT_CTX)
    return fh, attr.ino


def read_all(vfs: VFS, ino: int) -> bytes:
    """The whole file through a fresh read-only handle."""
    fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    try:
        size = vfs.getattr(ino).size
        return vfs.read(fh, 0, size + 10)
    finally:
        vfs.release(fh)


def write_file(vfs: VFS, name: bytes, data: bytes, parent: int = ROOT_INO) -> int:
    """Create a file holding ``data`` (closed); returns its inode."""
    fh, ino = create(vfs, name, parent)
    vfs.write(fh, 0, data)
    vfs.release(fh)
    return ino
