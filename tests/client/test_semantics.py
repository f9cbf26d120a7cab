"""POSIX semantics AI tools rely on, through the VFS: rename-over, links, unlinked-open files,
symlinks, xattrs, O_EXCL, fallocate, statfs, close-to-open keep_cache."""

from __future__ import annotations

import errno
import os

import pytest
from fsfixtures import FsFactory, MiB, create, pattern, read_all, write_file

from shinglefs.client.vfs import VFS
from shinglefs.errors import ShingleError
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_CTX, ROOT_INO


def slices_of(vfs: VFS, ino: int) -> list[int]:
    return [r.slice_id for r in vfs.meta.get_chunk(ino, 0).refs]


def test_rename_replaces_target_atomically_and_frees_its_slices(vfs: VFS) -> None:
    old = write_file(vfs, b".metadata", b"old metadata")
    old_slices = slices_of(vfs, old)
    new = write_file(vfs, b".metadata.tmp", b"new metadata")
    vfs.rename(ROOT_INO, b".metadata.tmp", ROOT_INO, b".metadata", 0, ROOT_CTX)
    assert vfs.lookup(ROOT_INO, b".metadata", ROOT_CTX).ino == new
    with pytest.raises(ShingleError) as exc:
        vfs.lookup(ROOT_INO, b".metadata.tmp", ROOT_CTX)
    assert exc.value.errno == errno.ENOENT
    assert read_all(vfs, new) == b"new metadata"
    vfs.run_deletions()
    assert not any(vfs.node.contains(s) for s in old_slices)


def test_link_then_unlink_keeps_the_data_like_zarr(vfs: VFS) -> None:
    ino = write_file(vfs, b"chunk.partial", b"zarr chunk bytes")
    attr = vfs.link(ino, ROOT_INO, b"chunk", ROOT_CTX)
    assert attr.nlink == 2
    with pytest.raises(ShingleError) as exc:  # exclusive create through link
        vfs.link(ino, ROOT_INO, b"chunk", ROOT_CTX)
    assert exc.value.errno == errno.EEXIST
    vfs.unlink(ROOT_INO, b"chunk.partial", ROOT_CTX)
    assert vfs.getattr(ino).nlink == 1
    vfs.run_deletions()
    assert read_all(vfs, vfs.lookup(ROOT_INO, b"chunk", ROOT_CTX).ino) == b"zarr chunk bytes"


def test_unlinked_open_file_is_usable_until_close_then_its_slices_are_deleted(vfs: VFS) -> None:
    data = pattern(20, 5 * MiB)
    fh, ino = create(vfs, b"doomed")
    vfs.write(fh, 0, data)
    vfs.flush(fh)
    slices = slices_of(vfs, ino)
    vfs.unlink(ROOT_INO, b"doomed", ROOT_CTX)
    vfs.run_deletions()
    assert vfs.read(fh, 0, len(data)) == data
    vfs.write(fh, len(data), b"more")
    assert vfs.read(fh, len(data), 10) == b"more"
    assert all(vfs.node.contains(s) for s in slices)
    vfs.release(fh)
    vfs.run_deletions()
    assert not any(vfs.node.contains(s) for s in slices)
    with pytest.raises(ShingleError) as exc:
        vfs.getattr(ino)
    assert exc.value.errno == errno.ENOENT


def test_o_excl_create_fails_on_an_existing_name(vfs: VFS) -> None:
    write_file(vfs, b"lock", b"")
    with pytest.raises(ShingleError) as exc:
        vfs.create(ROOT_INO, b"lock", 0o644, os.O_RDWR | os.O_CREAT | os.O_EXCL, ROOT_CTX)
    assert exc.value.errno == errno.EEXIST
    fh, _attr = vfs.create(ROOT_INO, b"lock", 0o644, os.O_RDWR | os.O_CREAT, ROOT_CTX)
    vfs.release(fh)


def test_symlinks_and_xattrs(vfs: VFS) -> None:
    ino = write_file(vfs, b"target", b"t")
    link = vfs.symlink(ROOT_INO, b"ln", b"target", ROOT_CTX)
    assert vfs.readlink(link.ino, ROOT_CTX) == b"target"
    vfs.setxattr(ino, b"user.k", b"v", 0, ROOT_CTX)
    assert vfs.getxattr(ino, b"user.k", ROOT_CTX) == b"v"
    assert b"user.k" in vfs.listxattr(ino, ROOT_CTX)
    vfs.removexattr(ino, b"user.k", ROOT_CTX)
    with pytest.raises(ShingleError) as exc:
        vfs.getxattr(ino, b"user.k", ROOT_CTX)
    assert exc.value.errno == errno.ENODATA


def test_fallocate_mode_zero_extends_and_other_modes_are_refused(vfs: VFS) -> None:
    fh, ino = create(vfs, b"pre")
    vfs.write(fh, 0, b"abc")
    vfs.fallocate(fh, 0, 0, 2 * MiB)
    assert vfs.getattr(ino).size == 2 * MiB
    assert vfs.read(fh, 0, 5) == b"abc\0\0"
    with pytest.raises(ShingleError) as exc:
        vfs.fallocate(fh, 1, 0, 4 * MiB)  # FALLOC_FL_KEEP_SIZE
    assert exc.value.errno == errno.EOPNOTSUPP
    vfs.release(fh)


def test_statfs_reports_drive_capacity_and_free_space(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(drives=2)
    before = vfs.statfs(ROOT_CTX)
    node = vfs.node.stats()
    assert before.capacity_bytes == node.capacity_bytes
    assert before.capacity_bytes == sum(d.capacity_bytes for d in node.drives)
    write_file(vfs, b"filler", pattern(21, 8 * MiB))
    after = vfs.statfs(ROOT_CTX)
    assert after.free_bytes <= before.free_bytes - 8 * MiB
    assert after.inodes >= 2


def test_keep_cache_only_when_the_file_did_not_change_elsewhere(
    vfs: VFS, fs_factory: FsFactory
) -> None:
    ino = write_file(vfs, b"shared", b"version 1")
    fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    vfs.release(fh)
    fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    assert vfs.open_file_info(fh) is True
    vfs.release(fh)
    other = open_meta(fs_factory.meta_url)  # another client changes the file
    try:
        other.truncate(ino, 3)
    finally:
        other.close()
    assert vfs.changed_since_open(ino)
    fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    assert vfs.open_file_info(fh) is False
    assert vfs.read(fh, 0, 100) == b"ver"
    vfs.release(fh)


def test_bad_handles_and_wrong_modes_are_ebadf(vfs: VFS) -> None:
    fh, _ino = create(vfs, b"f", flags=os.O_WRONLY | os.O_CREAT)
    with pytest.raises(ShingleError) as exc:
        vfs.read(fh, 0, 10)
    assert exc.value.errno == errno.EBADF
    vfs.release(fh)
    with pytest.raises(ShingleError) as exc:
        vfs.write(fh, 0, b"x")
    assert exc.value.errno == errno.EBADF


def test_readdir_lists_entries_with_buffered_sizes(vfs: VFS) -> None:
    write_file(vfs, b"a", b"1")
    fh, _ino = create(vfs, b"b")
    vfs.write(fh, 0, b"12345")
    dh = vfs.opendir(ROOT_INO, ROOT_CTX)
    entries = {e.name: e.attr.size for e in vfs.readdir(dh, 0)}
    vfs.releasedir(dh)
    assert entries == {b"a": 1, b"b": 5}
    vfs.release(fh)


def test_an_expired_session_registers_again_and_reopens_its_files(
    vfs: VFS, fs_factory: FsFactory
) -> None:
    fh, ino = create(vfs, b"held")
    old_session = vfs.session
    other = open_meta(fs_factory.meta_url)
    try:
        assert old_session in other.expire_sessions(0)
        vfs.jobs.session.heartbeat()
        assert vfs.session != old_session
        sessions = {s.id: s for s in other.list_sessions()}
        assert ino in sessions[vfs.session].open_inodes
    finally:
        other.close()
    vfs.write(fh, 0, b"still works")
    vfs.release(fh)
    assert read_all(vfs, ino) == b"still works"
