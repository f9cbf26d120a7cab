"""fsck on a real file system damaged on purpose: each pass finds what it
should, ``--repair`` fixes it, and a second fsck is clean (exit codes 41 / 40 / 0)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.meta.recoverykit import (
    A,
    C,
    FsFactory,
    cli,
    listing,
    node_of,
    pattern,
    populate,
    read_all,
    slice_of,
    sql,
)

from shinglefs.client.filesystem import open_filesystem
from shinglefs.client.recovery import FileSystemInUse, fsck
from shinglefs.meta import open_meta
from shinglefs.meta.api import SessionInfo
from shinglefs.meta.check import check_consistency

MiB = 1024 * 1024


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FsFactory]:
    """A file system with /a, /d/b and /c, written and unmounted."""
    factory = FsFactory(tmp_path)
    populate(factory)
    yield factory
    factory.close_all()


def _found(report: object) -> dict[str, list[str]]:
    return {k: [f.detail for f in v] for k, v in report.found.items() if v}  # type: ignore[attr-defined]


def test_fsck_of_a_healthy_file_system_is_clean_exit_0(fs: FsFactory) -> None:
    assert fsck(fs.meta_url).clean
    assert cli("fsck", fs.meta_url) == 0


def test_slice_deleted_on_the_drive_is_found_and_the_file_truncated(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    sid = slice_of(fs.root, b"b")
    with node_of(fs.root) as node:
        node.delete(sid)
        node.flush()
    assert cli("fsck", fs.meta_url) == 41
    assert f"slice {sid:#x} is referenced but on no drive" in capsys.readouterr().out
    assert cli("fsck", "--repair", fs.meta_url) == 40
    assert "truncated /d/b (inode" in capsys.readouterr().out
    assert cli("fsck", fs.meta_url) == 0
    tree = listing(fs.meta_url)
    assert tree["/d/b"] == b"" and tree["/a"] == A and tree["/c"] == C


def test_references_past_the_stored_end_are_cut_to_the_readable_bytes(fs: FsFactory) -> None:
    # The file claims 8 KiB more than its slice holds (a size committed before its bytes).
    sql(fs.root, "UPDATE chunk_refs SET length = length + 8192 WHERE slice_id = ?",
        (slice_of(fs.root, b"c"),))
    sql(fs.root, "UPDATE inodes SET size = size + 8192 WHERE ino = "
                 "(SELECT ino FROM dentries WHERE name = ?)", (b"c",))
    sql(fs.root, "UPDATE counters SET used_bytes = used_bytes + 8192 WHERE shard = 0")
    report = fsck(fs.meta_url)
    assert list(_found(report)) == ["short_slices"]
    repaired = fsck(fs.meta_url, repair=True)
    assert not repaired.remaining and any("truncated /c" in a for a in repaired.actions)
    assert fsck(fs.meta_url).clean
    assert listing(fs.meta_url)["/c"] == C


def test_a_read_only_snapshots_file_is_repaired_and_stays_read_only(fs: FsFactory) -> None:
    meta = open_meta(fs.meta_url)
    try:
        c = meta.lookup(1, b"c")
        meta.snapshot(c.ino, 1, b"c@v1", read_only=True)
    finally:
        meta.close()
    # Both names claim 8 KiB more than their shared slice holds.
    sql(fs.root, "UPDATE chunk_refs SET length = length + 8192 WHERE slice_id = ?",
        (slice_of(fs.root, b"c"),))
    sql(fs.root, "UPDATE inodes SET size = size + 8192 WHERE ino IN "
                 "(SELECT ino FROM dentries WHERE name IN (?, ?))", (b"c", b"c@v1"))
    sql(fs.root, "UPDATE counters SET used_bytes = used_bytes + 16384 WHERE shard = 0")
    repaired = fsck(fs.meta_url, repair=True)
    assert not repaired.remaining and any("truncated /c@v1" in a for a in repaired.actions)
    assert fsck(fs.meta_url).clean
    assert listing(fs.meta_url)["/c@v1"] == C
    meta = open_meta(fs.meta_url)
    try:
        assert meta.lookup(1, b"c@v1").immutable
    finally:
        meta.close()


def test_a_dropped_entry_makes_the_file_unreachable_and_repair_links_it_into_lost_found(
        fs: FsFactory) -> None:
    ino = sql(fs.root, "SELECT ino FROM dentries WHERE name = ?", (b"c",))[0][0]
    sql(fs.root, "DELETE FROM dentries WHERE name = ?", (b"c",))
    found = _found(fsck(fs.meta_url))
    assert found["unreachable"] == [f"inode {ino} has links but no entry (unreachable)"]
    assert cli("fsck", "--repair", fs.meta_url) == 40
    assert fsck(fs.meta_url).clean
    tree = listing(fs.meta_url)
    assert "/c" not in tree and tree[f"/lost+found/#{ino}"] == C


def test_an_orphan_inode_is_freed_and_its_slice_deleted_from_the_drive(fs: FsFactory) -> None:
    sid = slice_of(fs.root, b"c")
    sql(fs.root, "UPDATE inodes SET nlink = 0 WHERE ino = "
                 "(SELECT ino FROM dentries WHERE name = ?)", (b"c",))
    sql(fs.root, "DELETE FROM dentries WHERE name = ?", (b"c",))
    assert "orphans" in _found(fsck(fs.meta_url))
    assert cli("fsck", "--repair", fs.meta_url) == 40
    assert fsck(fs.meta_url).clean
    with node_of(fs.root) as node:
        assert not node.contains(sid)


def test_counters_and_nlink_are_recomputed(fs: FsFactory) -> None:
    sql(fs.root, "UPDATE counters SET used_bytes = used_bytes + 999, inodes = inodes + 3 "
                 "WHERE shard = 5")
    sql(fs.root, "UPDATE inodes SET nlink = 7 WHERE ino = "
                 "(SELECT ino FROM dentries WHERE name = ?)", (b"a",))
    sql(fs.root, "UPDATE inodes SET nlink = 9 WHERE ino = 1")
    found = _found(fsck(fs.meta_url))
    assert {"counters", "file_nlink", "dir_nlink"} <= set(found)
    assert cli("fsck", "--repair", fs.meta_url) == 40
    assert fsck(fs.meta_url).clean
    meta = open_meta(fs.meta_url)
    try:
        assert check_consistency(meta) == []
        assert meta.statfs().inodes == 5
    finally:
        meta.close()


def test_a_recreated_chunk_row_takes_a_version_past_its_references(fs: FsFactory) -> None:
    """A chunk row lost (or a version behind its references' seqs) is repaired
    with a version past every seq: a write after the repair lands on top of
    the old bytes, not under them."""
    ino = sql(fs.root, "SELECT ino FROM dentries WHERE name = ?", (b"a",))[0][0]
    sql(fs.root, "UPDATE chunk_refs SET seq = seq + 50 WHERE ino = ?", (ino,))
    sql(fs.root, "DELETE FROM chunks WHERE ino = ?", (ino,))
    c = sql(fs.root, "SELECT ino FROM dentries WHERE name = ?", (b"c",))[0][0]
    sql(fs.root, "UPDATE chunk_refs SET seq = seq + 50 WHERE ino = ?", (c,))
    found = _found(fsck(fs.meta_url))
    assert len(found["chunk_nrefs"]) == 2, found
    assert cli("fsck", "--repair", fs.meta_url) == 40
    assert fsck(fs.meta_url).clean
    vfs = open_filesystem(fs.meta_url)
    try:
        for i in (ino, c):
            fh = vfs.open(i, os.O_WRONLY)
            vfs.write(fh, 0, b"after the repair")
            vfs.release(fh)
            assert read_all(vfs, i)[:16] == b"after the repair"
    finally:
        vfs.shutdown()


def test_a_committed_slice_no_file_references_is_kept_in_lost_found(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    # Its references lost: its bytes can still be read, so repair never deletes them.
    sid = slice_of(fs.root, b"c")
    sql(fs.root, "DELETE FROM chunk_refs WHERE slice_id = ?", (sid,))
    sql(fs.root, "UPDATE chunks SET nrefs = 0")
    sql(fs.root, "UPDATE inodes SET size = 0 WHERE ino = "
                 "(SELECT ino FROM dentries WHERE name = ?)", (b"c",))
    sql(fs.root, f"UPDATE counters SET used_bytes = used_bytes - {len(C)} WHERE shard = 0")
    found = _found(fsck(fs.meta_url))
    assert f"slice {sid} ({len(C)} bytes) is committed but no file references it" in \
        found["slice_refcounts"]
    assert cli("fsck", "--repair", fs.meta_url) == 40
    out = capsys.readouterr().out
    assert f"as /lost+found/slice-{sid:x} ({len(C)} bytes)" in out
    assert "deleted" not in out
    assert cli("fsck", fs.meta_url) == 0
    with node_of(fs.root) as node:
        assert node.contains(sid)
    assert listing(fs.meta_url)[f"/lost+found/slice-{sid:x}"] == C


def test_a_slice_on_the_drive_unknown_to_meta_is_reattached_in_lost_found(
        fs: FsFactory) -> None:
    orphan = 1 << 40
    data = pattern(9, 123_456)
    with node_of(fs.root) as node:
        node.write(orphan, 0, data, group=7, durable=True, drive_id=0)
    found = _found(fsck(fs.meta_url))
    assert set(found) == {"unknown_slices", "slice_ids"}
    assert cli("fsck", "--repair", fs.meta_url) == 40
    assert fsck(fs.meta_url).clean
    assert listing(fs.meta_url)[f"/lost+found/slice-{orphan:x}"] == data
    vfs = open_filesystem(fs.meta_url)
    try:
        assert vfs.meta.next_slice_id() > orphan  # new slices never reuse an id on a drive
    finally:
        vfs.shutdown()


def test_repair_refuses_while_a_live_session_has_the_file_system_open(fs: FsFactory) -> None:
    meta = open_meta(fs.meta_url)
    session = meta.register_session(SessionInfo(host="another-host", pid=4242))
    meta.close()
    with pytest.raises(FileSystemInUse):
        fsck(fs.meta_url, repair=True)
    assert cli("fsck", "--repair", fs.meta_url) == 3
    assert fsck(fs.meta_url).clean  # a live session is no problem for a check
    report = fsck(fs.meta_url, repair=True, force=True)
    assert [f.key for f in report.found["stale_sessions"]] == [(session,)]
    assert fsck(fs.meta_url).clean


def test_a_dead_local_session_does_not_block_repair(fs: FsFactory) -> None:
    import socket

    meta = open_meta(fs.meta_url)
    meta.register_session(SessionInfo(host=socket.gethostname(), pid=2**22 + 17))
    meta.close()
    report = fsck(fs.meta_url, repair=True)
    assert "stale_sessions" in _found(report) and not report.remaining
    vfs = open_filesystem(fs.meta_url)
    try:
        assert read_all(vfs, vfs.lookup(1, b"a").ino) == A
    finally:
        vfs.shutdown()


def test_hints_that_send_the_user_to_fsck_or_scrub_name_commands_that_exist() -> None:
    import re

    import typer.main

    from shinglefs.cli.main import _register_all, app
    from shinglefs.client.errors import ShortSlice
    from shinglefs.store.errors import ChecksumMismatch

    _register_all()
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    hints = [ShortSlice(1, 0, 10, 5).hint,
             ChecksumMismatch(drive="d", zone=1, offset=0, detail="x").hint]
    for hint in hints:
        named = re.findall(r"`shinglefs (\w+)", hint or "")
        assert named and set(named) <= commands, hint
