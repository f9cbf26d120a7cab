"""Per-inode state does not grow with the number of files a client has ever touched.

A mount runs for weeks: files are created, written, read, renamed and
removed by the hundred thousand, few alive at once, and the kernel sends
``forget`` for inodes it drops. What the client keeps per inode must follow
the files alive (and the kernel's references), not the files ever seen.

Before the fix every create noted "no ``security.capability``" for its inode
and nothing but the memo's bound (2^16 inodes) ever removed the note: a
forget left it, and it outlived its 1 s trust. A mount churning small
files grew by ~15 MiB on that memo alone (64 -> 84 MiB over 88,000 files,
71 MiB after the fix; docs/mount.md, "Memory").

Nor do the statements meta keeps prepared: the deferred closes reach meta in
batches of whatever size the maintenance pass found, and each size was a
statement text of its own, prepared and kept by the connection (43 KB for a
batch of 500): the maintenance thread's statements grew 1.4 MB in the first
20,000 files of a churning mount, and went on growing, one new batch size at a
time. Id lists are now padded to a power-of-two length (``schema.in_list``).
"""

from __future__ import annotations

import errno
import os

import pytest
from fsfixtures import FsFactory, create

from shinglefs.client.inodes import NO_CAPS_TTL, InodeTable
from shinglefs.client.vfs import VFS
from shinglefs.meta.api import ROOT_CTX, ROOT_INO
from shinglefs.meta.errors import FsError

CAPS = b"security.capability"
# What may stay after the churn whatever its length: the last directory's
# and file's memos until their own forget, rounding.
FEW = 4


def churn(vfs: VFS, rounds: int, files: int) -> None:
    """``rounds`` directories of ``files`` files each, every one created, written,
    read, looked up, renamed, given an xattr, removed and forgotten as the
    kernel would (one ``forget`` per inode it held)."""
    for r in range(rounds):
        d = vfs.mkdir(ROOT_INO, b"d%d" % r, 0o755, ROOT_CTX).ino
        for i in range(files):
            name = b"f%d" % i
            fh, ino = create(vfs, name, d)
            vfs.write(fh, 0, b"x" * (100 + i))
            vfs.flush(fh)
            vfs.release(fh)
            if i % 2:
                vfs.setxattr(ino, b"user.k", b"v")
            with pytest.raises(FsError) as absent:
                vfs.getxattr(ino, CAPS)  # what the kernel asks before a write
            assert absent.value.errno == errno.ENODATA
            fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
            assert vfs.read(fh, 0, 4096) == b"x" * (100 + i)
            vfs.release(fh)
            vfs.rename(d, name, d, b"g%d" % i, 0, ROOT_CTX)
            vfs.lookup(d, b"g%d" % i)
            vfs.unlink(d, b"g%d" % i, ROOT_CTX)
            vfs.forget(ino, 2)
        dh = vfs.opendir(d, ROOT_CTX)
        assert {e.name for e in vfs.readdir(dh, 0)} <= {b".", b".."}
        vfs.releasedir(dh)
        vfs.rmdir(ROOT_INO, b"d%d" % r, ROOT_CTX)
        vfs.forget(d, 1)


def test_churned_and_forgotten_inodes_leave_no_per_inode_state(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs()
    churn(vfs, rounds=8, files=50)  # 400 files in 8 directories, far below every bound
    entries = vfs.inodes.memo_entries()
    print(f"after 400 files: {entries}")
    assert all(count <= FEW for count in entries.values()), entries
    assert len(vfs.handles) == 0


def test_no_caps_notes_expire_in_order_without_forget() -> None:
    """The Python API has no kernel to forget: a note older than its trust
    goes when the next one is made (the memo holds about one TTL of notes)."""
    table = InodeTable()
    for ino in range(100, 400):
        table.note_no_caps(ino, now=10.0)
    assert table.memo_entries()["no_caps"] == 300
    assert table.caps_absent(399, 10.0 + NO_CAPS_TTL / 2)
    table.note_no_caps(7, now=10.0 + NO_CAPS_TTL)  # the 300 expire at exactly this time
    assert table.memo_entries()["no_caps"] == 1
    assert table.caps_absent(7, 10.0 + NO_CAPS_TTL)
    assert not table.caps_absent(399, 10.0 + NO_CAPS_TTL)


def test_forget_drops_the_no_caps_note() -> None:
    table = InodeTable()
    table.note_no_caps(5, now=1.0)
    table.forget(5)
    assert not table.caps_absent(5, 1.0)
    assert table.memo_entries()["no_caps"] == 0


def close_batch_sizes(vfs: VFS) -> set[int]:
    """The batch sizes of ``close_linked`` (closes of many inodes at once) prepared
    so far in this process (the rendered texts are shared by every connection)."""
    rendered = vfs.meta.backend.dialect.rendered  # type: ignore[attr-defined]
    return {text.count("?") - 1 for text in rendered
            if text.startswith("DELETE FROM open_files") and " IN (" in text}


def test_closes_in_batches_of_every_size_prepare_few_statements(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs()
    before = close_batch_sizes(vfs)
    made = 0
    for batch in range(1, 41):  # 820 files closed in batches of 1..40
        for _ in range(batch):
            fh, _ino = create(vfs, b"f%d" % made)
            vfs.release(fh)
            made += 1
        vfs.jobs.closes.drain()
    sizes = close_batch_sizes(vfs)
    print(f"close_linked batch sizes prepared: {sorted(sizes)}")
    # 1, 2, 4, ..., 64 inodes whatever the batches were (40 sizes before the
    # fix); earlier tests in this process may have prepared up to 512.
    assert sizes - before <= {1, 2, 4, 8, 16, 32, 64}, sorted(sizes - before)
    assert all(n & (n - 1) == 0 for n in sizes) and len(sizes) <= 10, sorted(sizes)
    backend = vfs.meta.backend  # type: ignore[attr-defined]
    still_open = backend.run(lambda tx: tx.one("SELECT COUNT(*) FROM open_files"), "read")[0]
    assert still_open == 0  # the padded lists closed every inode, each once
