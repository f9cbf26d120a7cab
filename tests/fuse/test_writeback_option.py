"""``-o writeback_cache``: the kernel's writeback cache, off by default."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from shinglefs.fuse.harness import MountedFileSystem
from shinglefs.fuse.mount import WRITEBACK_OPTION, fuse_options, split_options
from shinglefs.meta.records import MAX_FILE_SIZE


def test_our_option_is_not_passed_to_libfuse() -> None:
    opts = fuse_options(False, ["ro,writeback_cache", " allow_root "], "x")
    assert WRITEBACK_OPTION not in opts
    assert {"ro", "allow_root", "fsname=x", "subtype=shinglefs"} <= opts
    assert split_options(["a,b", "", "c"]) == ["a", "b", "c"]


def test_a_mount_with_the_writeback_cache_keeps_posix_semantics(tmp_path: Path) -> None:
    with MountedFileSystem(tmp_path / "data", tmp_path / "mnt",
                           extra_args=["-o", WRITEBACK_OPTION]) as fs:
        path = fs.mountpoint / "f"
        with open(path, "wb") as f:
            for i in range(8):
                f.write(bytes([i]) * 300_000)  # unaligned: partial pages
        with open(path, "ab") as f:  # O_APPEND, write-only
            f.write(b"tail")
        data = path.read_bytes()
        assert len(data) == 8 * 300_000 + 4 and data.endswith(b"tail")
        assert data[:300_000] == b"\0" * 300_000 and data[-5] == 7
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, b"MID", 1_000_000)
            os.fsync(fd)
        finally:
            os.close(fd)
        assert path.read_bytes()[1_000_000:1_000_003] == b"MID"
        # The kernel takes a write past the largest file size into its cache;
        # writing it back fails, and fsync says so (it said nothing: a byte lost).
        fd = os.open(fs.mountpoint / "huge", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            assert os.pwrite(fd, b"xy", MAX_FILE_SIZE - 1) == 2
            with pytest.raises(OSError):
                os.fsync(fd)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        status = json.loads(os.getxattr(fs.mountpoint, "user.shinglefs.status"))
        assert status["fuse_ops"]["write"]["count"] >= 1
