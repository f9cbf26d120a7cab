"""The operations class without a mount: error translation and attribute mapping.

The handlers are called directly (under trio) over a real VFS on a freshly
formatted file system; only the kernel is missing.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
from tests.fuse.opskit import GiB, Request, call, handlers

from shinglefs.errors import ShingleError
from shinglefs.fuse.operations import ATTR_TIMEOUT, ENTRY_TIMEOUT, ShingleOperations


@pytest.fixture
def ops(tmp_path: Path) -> Iterator[ShingleOperations]:
    with handlers(tmp_path) as operations:
        yield operations


def fuse_errno(handler: Any, *args: Any) -> int:
    with pytest.raises(pyfuse3.FUSEError) as info:
        call(handler, *args)
    return info.value.errno


def test_shingle_errors_become_their_errno(ops: ShingleOperations) -> None:
    assert fuse_errno(ops.lookup, pyfuse3.ROOT_INODE, b"missing", Request()) == errno.ENOENT
    call(ops.mkdir, pyfuse3.ROOT_INODE, b"d", 0o755, Request())
    assert fuse_errno(ops.mkdir, pyfuse3.ROOT_INODE, b"d", 0o755, Request()) == errno.EEXIST
    assert fuse_errno(ops.read, 987654, 0, 10) == errno.EBADF
    assert fuse_errno(ops.getxattr, pyfuse3.ROOT_INODE, b"user.none", Request()) == errno.ENODATA


def test_unexpected_exceptions_become_eio_and_are_logged_with_context(
    ops: ShingleOperations, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="shinglefs.fuse.operations"):
        # An inode number beyond SQLite's integers fails below with OverflowError,
        # not a ShingleError: the caller gets EIO, the log gets the context.
        assert fuse_errno(ops.getattr, 2**70, Request()) == errno.EIO
    assert any(f"getattr(inode={2**70}" in r.getMessage() and r.exc_info
               for r in caplog.records)


def test_entries_carry_attributes_and_the_chosen_timeouts(ops: ShingleOperations) -> None:
    assert not ops.enable_writeback_cache  # the default (docs/mount.md)
    fi, entry = call(ops.create, pyfuse3.ROOT_INODE, b"f", stat.S_IFREG | 0o640,
                     os.O_WRONLY | os.O_APPEND, Request(uid=0, gid=0))
    assert stat.S_ISREG(entry.st_mode) and stat.S_IMODE(entry.st_mode) == 0o640
    assert (entry.attr_timeout, entry.entry_timeout) == (ATTR_TIMEOUT, ENTRY_TIMEOUT)
    assert entry.st_size == 0 and entry.st_nlink == 1
    # Without the writeback cache the flags are the application's: O_APPEND
    # appends whatever offset comes but a page boundary inside the file (a
    # page of a shared mapping written back), and a write-only handle cannot read.
    assert call(ops.write, fi.fh, 0, b"hello") == 5
    assert call(ops.write, fi.fh, 3, b"J") == 1
    assert call(ops.write, fi.fh, 0, b"Y") == 1
    assert fuse_errno(ops.read, fi.fh, 0, 100) == errno.EBADF
    call(ops.flush, fi.fh)
    call(ops.release, fi.fh)
    looked_up = call(ops.lookup, pyfuse3.ROOT_INODE, b"f", Request())
    assert looked_up.st_ino == entry.st_ino and looked_up.st_size == 6
    reader = call(ops.open, entry.st_ino, os.O_RDONLY, Request(uid=0, gid=0))
    assert call(ops.read, reader.fh, 0, 100) == b"YelloJ"
    call(ops.release, reader.fh)


def test_with_the_writeback_cache_opens_are_read_write_without_append(
    ops: ShingleOperations,
) -> None:
    ops.enable_writeback_cache = True
    fi, entry = call(ops.create, pyfuse3.ROOT_INODE, b"f", stat.S_IFREG | 0o640,
                     os.O_WRONLY | os.O_APPEND, Request(uid=0, gid=0))
    # The kernel may read any handle's pages to fill a partly written page,
    # and it computes append offsets itself (it owns the size).
    assert call(ops.write, fi.fh, 0, b"hello") == 5
    assert call(ops.write, fi.fh, 0, b"J") == 1
    assert call(ops.read, fi.fh, 0, 100) == b"Jello"
    call(ops.flush, fi.fh)
    call(ops.release, fi.fh)
    looked_up = call(ops.lookup, pyfuse3.ROOT_INODE, b"f", Request())
    assert looked_up.st_ino == entry.st_ino and looked_up.st_size == 5


def test_statfs_maps_bytes_to_blocks(ops: ShingleOperations) -> None:
    st = call(ops.statfs, Request())
    assert st.f_frsize == st.f_bsize > 0
    assert st.f_blocks * st.f_frsize > 3 * GiB
    assert 0 < st.f_bfree <= st.f_blocks and st.f_ffree > 0 and st.f_namemax == 255


def test_df_used_is_the_files_bytes_and_avail_what_can_be_written(
        ops: ShingleOperations) -> None:
    """As ext4 shows its reserved blocks: an empty file system is 0 % used (the
    GC reserve and zone granularity are free, not available); "Avail" is what
    ``write(2)`` can still take."""
    empty = call(ops.statfs, Request())
    assert empty.f_bfree == empty.f_blocks  # df: Used 0
    assert empty.f_bavail * empty.f_frsize <= ops.vfs.statfs().free_bytes
    assert empty.f_bavail < empty.f_bfree
    fi, _entry = call(ops.create, pyfuse3.ROOT_INODE, b"f", stat.S_IFREG | 0o644,
                      os.O_WRONLY, Request(uid=0, gid=0))
    for off in range(0, 8 << 20, 1 << 20):
        call(ops.write, fi.fh, off, b"x" * (1 << 20))
    call(ops.flush, fi.fh)
    call(ops.release, fi.fh)
    used = call(ops.statfs, Request())
    assert (used.f_blocks - used.f_bfree) * used.f_frsize == 8 << 20


def test_the_status_xattr_is_read_only(ops: ShingleOperations) -> None:
    ops.status_provider = lambda: b'{"ok": 1}'
    name = b"user.shinglefs.status"
    assert call(ops.getxattr, pyfuse3.ROOT_INODE, name, Request()) == b'{"ok": 1}'
    assert fuse_errno(ops.setxattr, pyfuse3.ROOT_INODE, name, b"x", Request()) == errno.EPERM
    assert name not in call(ops.listxattr, pyfuse3.ROOT_INODE, Request())


def test_fast_paths_run_inline_only_with_local_metadata(ops: ShingleOperations) -> None:
    def small_file(name: bytes) -> dict[str, Any]:
        fi, _entry = call(ops.create, pyfuse3.ROOT_INODE, name, stat.S_IFREG | 0o644,
                          os.O_RDWR, Request(uid=0, gid=0))
        assert call(ops.write, fi.fh, 0, b"x" * 4096) == 4096
        call(ops.flush, fi.fh)
        assert bytes(call(ops.read, fi.fh, 0, 4096)) == b"x" * 4096
        call(ops.release, fi.fh)
        return ops.op_stats.snapshot()

    local = small_file(b"local")
    assert local["write"]["threaded"] == 0 and local["flush"]["threaded"] == 0
    # Networked metadata (PostgreSQL): a commit is a round trip, so the flush
    # leaves the loop; a buffered write still does not.
    ops.offload_metadata = True
    remote = small_file(b"remote")
    assert remote["write"]["threaded"] == 0
    assert remote["flush"]["threaded"] == 1


def test_per_inode_tables_follow_the_kernels_references_not_the_files_ever_seen(
    ops: ShingleOperations,
) -> None:
    """A long-running mount churns files by the hundred thousand, and the
    kernel sends ``forget`` for each inode it drops. Before the fix the note
    of the attributes last told to the kernel (``_told``) stayed until its
    bound of 2^16 inodes: a daemon churning small files grew ~1.2 MiB per
    5,000 files, 15.5 MiB over the churn soak (tests/fuse/test_memory.py)."""
    ctx = Request(uid=0, gid=0)
    d = call(ops.mkdir, pyfuse3.ROOT_INODE, b"churn", 0o755, ctx).st_ino
    for i in range(300):
        name = b"f%d" % i
        fi, entry = call(ops.create, d, name, stat.S_IFREG | 0o644, os.O_WRONLY, ctx)
        assert call(ops.write, fi.fh, 0, b"x" * (100 + i)) == 100 + i
        call(ops.flush, fi.fh)
        call(ops.release, fi.fh)
        call(ops.getattr, entry.st_ino, ctx)
        call(ops.rename, d, name, d, b"g%d" % i, 0, ctx)
        assert call(ops.lookup, d, b"g%d" % i, ctx).st_size == 100 + i
        reader = call(ops.open, entry.st_ino, os.O_RDONLY, ctx)
        assert bytes(call(ops.read, reader.fh, 0, 4096)) == b"x" * (100 + i)
        call(ops.release, reader.fh)
        call(ops.unlink, d, b"g%d" % i, ctx)
        call(ops.forget, [(entry.st_ino, 2)])  # the create's and the lookup's
    entries = ops.inode_entries()
    assert all(count <= 1 for count in entries.values()), entries
    assert all(count <= 4 for count in ops.vfs.inodes.memo_entries().values())


def test_a_release_that_fails_leaves_its_inode_unmarked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written since its last flush is marked (its attributes go out
    with a 0 s timeout, stat shows its last write's time); the release ends
    the mark. A release that failed (EIO: the drive's image deleted under
    it) left the mark for good: the inode's entry stayed in ``_dirty`` for
    the daemon's life."""
    from shinglefs.zoned.emulated_zones import EmulatedZones

    monkeypatch.setattr(EmulatedZones, "IMAGE_CHECK_S", 0.0)
    ctx = Request(uid=0, gid=0)
    opened = handlers(tmp_path)
    ops = opened.__enter__()
    try:
        fi, _entry = call(ops.create, pyfuse3.ROOT_INODE, b"f", stat.S_IFREG | 0o644,
                          os.O_WRONLY, ctx)
        assert call(ops.write, fi.fh, 0, b"x" * (1 << 20)) == 1 << 20
        assert ops.inode_entries()["dirty"] == 1
        for image in tmp_path.glob("*.img"):
            image.unlink()
        assert fuse_errno(ops.release, fi.fh) == errno.EIO
        after = ops.inode_entries()
        assert after["dirty"] == 0 and after["handles"] == 0, after
    finally:
        with contextlib.suppress(ShingleError):  # its shutdown fails too: the image is gone
            opened.__exit__(None, None, None)
