"""fsck and scrub against damage a review found them mishandling: bytes that can
still be read are never deleted, drives of another file system are refused
before anything is read, a file system that would not mount is not called
clean, and the checks stay linear in the number of inodes."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from tests.meta.recoverykit import (
    A,
    B,
    C,
    FsFactory,
    cli,
    drive_specs,
    listing,
    node_of,
    pattern,
    populate,
    read_all,
    slice_of,
    sql,
    write_file,
)

from shinglefs.client.filesystem import open_filesystem
from shinglefs.client.recovery import fsck
from shinglefs.meta.check import CheckContext, _file_nlink, _unreachable, check_consistency

MiB = 1024 * 1024


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FsFactory]:
    factory = FsFactory(tmp_path)
    populate(factory)
    yield factory
    factory.close_all()


def _ino_of(root: Path, name: bytes) -> int:
    return int(sql(root, "SELECT ino FROM dentries WHERE name = ?", (name,))[0][0])


def _rows(root: Path) -> list[Any]:
    """Every row fsck's repairs could change (to prove nothing was)."""
    return [sql(root, f"SELECT * FROM {t} ORDER BY 1, 2") for t in
            ("inodes", "dentries", "chunk_refs", "slices", "slice_replicas", "ids")]


# ---- 1. committed slices nothing references are kept, never deleted ----------------------


def test_a_file_whose_inode_row_is_lost_comes_back_at_its_path(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    ino, sid = _ino_of(fs.root, b"b"), slice_of(fs.root, b"b")
    sql(fs.root, "DELETE FROM inodes WHERE ino = ?", (ino,))
    assert cli("fsck", fs.meta_url) == 41
    assert f"inode {ino} is missing but 1 chunk reference(s) of it remain" in \
        capsys.readouterr().out
    assert cli("fsck", "--repair", fs.meta_url) == 40
    out = capsys.readouterr().out
    assert f"re-created lost inode {ino} at /d/b" in out and "deleted" not in out
    assert cli("fsck", fs.meta_url) == 0
    with node_of(fs.root) as node:
        assert node.contains(sid)
    tree = listing(fs.meta_url)
    assert tree["/d/b"] == B and tree["/a"] == A and tree["/c"] == C


def test_a_lost_inode_without_entries_comes_back_in_lost_found(fs: FsFactory) -> None:
    ino = _ino_of(fs.root, b"c")
    sql(fs.root, "DELETE FROM inodes WHERE ino = ?", (ino,))
    sql(fs.root, "DELETE FROM dentries WHERE ino = ?", (ino,))
    report = fsck(fs.meta_url, repair=True)
    assert not report.remaining
    assert f"re-created lost inode {ino} as /lost+found/#{ino} (mode 0600, owner root)" in \
        report.actions
    assert fsck(fs.meta_url).clean
    assert listing(fs.meta_url)[f"/lost+found/#{ino}"] == C


def test_slices_of_a_file_whose_references_are_lost_go_to_lost_found(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    ino, sid = _ino_of(fs.root, b"c"), slice_of(fs.root, b"c")
    sql(fs.root, "DELETE FROM chunk_refs WHERE ino = ?", (ino,))
    assert cli("fsck", "--repair", fs.meta_url) == 40
    out = capsys.readouterr().out
    assert (f"re-attached slice {sid:#x}, which no file references any more, as "
            f"/lost+found/slice-{sid:x} ({len(C)} bytes)") in out
    assert "deleted" not in out
    assert cli("fsck", fs.meta_url) == 0
    with node_of(fs.root) as node:
        assert node.contains(sid)
    assert listing(fs.meta_url)[f"/lost+found/slice-{sid:x}"] == C


def test_a_writing_slice_nothing_references_is_left_to_the_janitor(fs: FsFactory) -> None:
    sid = int(sql(fs.root, "SELECT next_id FROM ids WHERE name = 'slice'")[0][0])
    sql(fs.root, "UPDATE ids SET next_id = next_id + 1 WHERE name = 'slice'")
    data = pattern(8, 5000)
    with node_of(fs.root) as node:
        node.write(sid, 0, data, group=7, durable=True, drive_id=0)
    sql(fs.root, "INSERT INTO slices (id, length, grp, state, refcount, created_ns) "
                 "VALUES (?, ?, 7, 'writing', 0, ?)", (sid, len(data), time.time_ns()))
    report = fsck(fs.meta_url, repair=True)
    assert report.clean and not report.actions
    assert sql(fs.root, "SELECT state FROM slices WHERE id = ?", (sid,)) == [("writing",)]
    with node_of(fs.root) as node:
        assert node.contains(sid)


# ---- 2. drives of another file system, or swapped, are refused before anything ----------


def test_fsck_and_scrub_refuse_a_drive_of_another_file_system(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine, other = FsFactory(tmp_path / "mine"), FsFactory(tmp_path / "other")
    (tmp_path / "mine").mkdir()
    (tmp_path / "other").mkdir()
    populate(mine)
    vfs = other.vfs()
    write_file(vfs, b"c", b"not this file system's")
    vfs.shutdown()
    for suffix in ("", ".zones"):
        os.replace(tmp_path / "other" / f"drive0.img{suffix}",
                   tmp_path / "mine" / f"drive0.img{suffix}")
    before = _rows(mine.root)
    capsys.readouterr()
    assert cli("fsck", "--repair", mine.meta_url) == 18
    err = capsys.readouterr().err
    assert "belongs to another file system" in err and "Traceback" not in err
    assert cli("fsck", mine.meta_url) == 18
    assert cli("scrub", mine.meta_url) == 18
    assert "belongs to another file system" in capsys.readouterr().err
    assert _rows(mine.root) == before


def test_fsck_refuses_swapped_drives_of_its_own_file_system(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory = FsFactory(tmp_path)
    populate(factory, drives=2)
    for suffix in ("", ".zones"):
        os.replace(tmp_path / f"drive0.img{suffix}", tmp_path / f"swap{suffix}")
        os.replace(tmp_path / f"drive1.img{suffix}", tmp_path / f"drive0.img{suffix}")
        os.replace(tmp_path / f"swap{suffix}", tmp_path / f"drive1.img{suffix}")
    before = _rows(tmp_path)
    capsys.readouterr()
    assert cli("fsck", "--repair", factory.meta_url) == 18
    assert "is drive 1 of file system" in capsys.readouterr().err
    assert _rows(tmp_path) == before


# ---- 3. load --from-drives never mixes file systems --------------------------------------


def test_load_from_drives_of_two_file_systems_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        factory = FsFactory(tmp_path / name)
        vfs = factory.vfs()
        write_file(vfs, name.encode(), name.encode())
        vfs.meta_backup.write()
        vfs.shutdown()
        specs += drive_specs(tmp_path / name)
    target = tmp_path / "restored.db"
    capsys.readouterr()
    assert cli("load", "--from-drives", *specs, f"sqlite3://{target}") == 18
    err = capsys.readouterr().err
    assert re.search(rf"different file systems: {tmp_path}/one/drive0\.img \([0-9a-f-]+\), "
                     rf"{tmp_path}/two/drive0\.img \([0-9a-f-]+\)", err.replace("\n", "")), err
    assert not target.exists() or not sqlite3.connect(target).execute(
        "SELECT name FROM sqlite_master WHERE name = 'format'").fetchall()


# ---- 4. the namespace checks are linear in the number of inodes --------------------------


class _SqliteTx:
    """Enough of ``Tx`` for a pass's find over a plain sqlite3 connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def one(self, statement: str, params: Any = ()) -> Any:
        return self.db.execute(statement, params).fetchone()

    def all(self, statement: str, params: Any = ()) -> list[Any]:
        return self.db.execute(statement, params).fetchall()


def _add_files(db: sqlite3.Connection, first: int, count: int) -> None:
    now = time.time_ns()
    db.executemany(
        "INSERT INTO inodes (ino, mode, uid, gid, nlink, size, atime_ns, mtime_ns, ctime_ns, "
        "rdev, generation, flags, parent, next_cookie) "
        "VALUES (?, ?, 0, 0, 1, 0, ?, ?, ?, 0, 1, 0, 1, 1)",
        [(ino, stat.S_IFREG | 0o644, now, now, now) for ino in range(first, first + count)])
    db.executemany("INSERT INTO dentries (parent, name, ino, cookie) VALUES (1, ?, ?, ?)",
                   [(f"f{ino}".encode(), ino, ino) for ino in range(first, first + count)])
    db.commit()


def _steps(db: sqlite3.Connection, find: Any) -> tuple[int, list[Any]]:
    """SQLite virtual-machine steps (in hundreds) a pass's find takes, and its findings."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    db.set_progress_handler(tick, 100)
    try:
        found = find(_SqliteTx(db), cast(CheckContext, None))
    finally:
        db.set_progress_handler(None, 0)
    return steps[0], found


def test_unreachable_and_file_nlink_do_work_linear_in_the_inodes(tmp_path: Path) -> None:
    factory = FsFactory(tmp_path)
    factory.format()
    db = sqlite3.connect(tmp_path / "meta.db")
    try:
        _add_files(db, 1000, 2000)
        small = {f.__name__: _steps(db, f) for f in (_unreachable, _file_nlink)}
        _add_files(db, 3000, 2000)
        # One of each problem, to see that the checks still find them.
        db.execute("DELETE FROM dentries WHERE ino = 4999")
        db.execute("UPDATE inodes SET nlink = 3 WHERE ino = 4998")
        db.commit()
        large = {f.__name__: _steps(db, f) for f in (_unreachable, _file_nlink)}
    finally:
        db.close()
    assert [f.key[0] for f in small["_unreachable"][1]] == []
    assert [f.key[0] for f in large["_unreachable"][1]] == [4999]
    assert sorted(f.key for f in large["_file_nlink"][1]) == [(4998, 1), (4999, 0)]
    for name in small:
        # Twice the inodes: about twice the work (a per-inode scan would be 4x).
        assert large[name][0] < 3 * max(small[name][0], 1), (name, small[name][0],
                                                             large[name][0])


# ---- 5. id counters and the root directory -----------------------------------------------


def test_missing_id_counters_are_found_and_restored_past_every_id_in_use(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    top_ino = int(sql(fs.root, "SELECT MAX(ino) FROM inodes")[0][0])
    with node_of(fs.root) as node:
        top_slice = max(node.store(0).slice_ids())  # type: ignore[attr-defined]
    sql(fs.root, "DELETE FROM ids")
    assert cli("fsck", fs.meta_url) == 41
    assert "the inode id counter is missing" in capsys.readouterr().out
    assert cli("fsck", "--repair", fs.meta_url) == 40
    assert cli("fsck", fs.meta_url) == 0
    ids = dict(sql(fs.root, "SELECT name, next_id FROM ids"))
    assert set(ids) == {"inode", "slice", "session", "server"}
    assert ids["inode"] > top_ino and ids["slice"] > top_slice
    vfs = open_filesystem(fs.meta_url)  # mounts again
    try:
        ino = write_file(vfs, b"new", b"after the repair")
        assert ino > top_ino and read_all(vfs, ino) == b"after the repair"
        assert read_all(vfs, vfs.lookup(1, b"a").ino) == A
    finally:
        vfs.shutdown()


def test_a_missing_root_directory_is_recreated_with_its_entries(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    before = listing(fs.meta_url)
    sql(fs.root, "DELETE FROM inodes WHERE ino = 1")
    assert cli("fsck", fs.meta_url) == 41
    assert cli("fsck", "--repair", fs.meta_url) == 40
    out = capsys.readouterr().out
    assert "re-created the missing root directory" in out and "dropped entry" not in out
    assert cli("fsck", fs.meta_url) == 0
    assert listing(fs.meta_url) == before


# ---- 6. scrub reports files whose slices are on no drive ---------------------------------


def test_scrub_reports_a_file_whose_slice_is_on_no_drive(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    sid = slice_of(fs.root, b"b")
    assert cli("scrub", fs.meta_url) == 0
    with node_of(fs.root) as node:
        node.delete(sid)
        node.flush()
    capsys.readouterr()
    assert cli("scrub", fs.meta_url) == 41
    out = capsys.readouterr().out
    assert f"damaged: /d/b\n  slice {sid:#x}: on no drive" in out
    assert "/a" not in out and "/c" not in out


# ---- 7. hints name commands that exist and never suggest deleting data --------------------


def test_a_drive_of_another_size_than_recorded_is_refused_naming_a_command(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    sql(fs.root, "UPDATE drives SET spec = 'emulated:drive0.img:4294967296' WHERE id = 0")
    capsys.readouterr()
    assert cli("fsck", "--repair", fs.meta_url) == 18
    err = capsys.readouterr().err
    assert "not the one the metadata recorded" in err
    assert f"`shinglefs fsck {fs.meta_url}`" in err and "drop the size" not in err


def test_fsck_of_drives_a_process_holds_hints_at_umount(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    vfs = open_filesystem(fs.meta_url)
    try:
        capsys.readouterr()
        assert cli("fsck", fs.meta_url) == 3
        err = capsys.readouterr().err
    finally:
        vfs.shutdown()
    assert "`shinglefs umount MOUNTPOINT`" in err and "use other drives" not in err


def test_hints_of_the_recovery_code_name_commands_that_exist() -> None:
    import ast

    import typer.main

    from shinglefs.cli.main import _register_all, app

    _register_all()
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    src = Path(__file__).resolve().parents[2] / "src" / "shinglefs"
    destroys = re.compile(r"\b(remove|delete|deleting|wipe|erase|rm)\b|start over", re.I)
    hints = []
    for name in ("meta/fsck.py", "meta/check.py", "client/recovery.py", "store/metabackup.py"):
        for node in ast.walk(ast.parse((src / name).read_text())):
            if isinstance(node, ast.keyword) and node.arg == "hint":
                parts = [n.value for n in ast.walk(node.value)
                         if isinstance(n, ast.Constant) and isinstance(n.value, str)]
                hints.append((name, "".join(parts)))
    assert hints
    for name, hint in hints:
        named = re.findall(r"`shinglefs (\w[\w-]*)", hint)
        assert named and set(named) <= commands, (name, hint)
        assert not destroys.search(hint), (name, hint)


# ---- the metadata repairs on both backends -----------------------------------------------


@pytest.mark.parametrize("damage", ["inode row", "entry and inode row", "references", "ids",
                                    "root"])
def test_metadata_repairs_keep_every_readable_byte_on_both_backends(meta: Any,
                                                                     damage: str) -> None:
    from shinglefs.meta.api import LOCAL_SERVER, Replica, SliceRef
    from shinglefs.meta.check import META_PASSES
    from shinglefs.meta.dump import backend_of
    from shinglefs.meta.fsck import run_fsck

    d = meta.mkdir(1, b"d", 0o755).ino
    ino = meta.mknod(d, b"f", stat.S_IFREG | 0o644).ino
    sid = meta.next_slice_id()
    meta.commit_slice(ino, 1, SliceRef(sid, 0, 1000, 0), meta.format_info().chunk_size + 1000,
                      slice_length=1000, replicas=[Replica(LOCAL_SERVER, "0")])
    statements = {
        "inode row": [f"DELETE FROM inodes WHERE ino = {ino}"],
        "entry and inode row": [f"DELETE FROM inodes WHERE ino = {ino}",
                                f"DELETE FROM dentries WHERE ino = {ino}"],
        "references": [f"DELETE FROM chunk_refs WHERE ino = {ino}"],
        "ids": ["DELETE FROM ids"],
        "root": ["DELETE FROM inodes WHERE ino = 1"],
    }[damage]
    backend = backend_of(meta)
    backend.run(lambda tx: [tx.run(s) for s in statements], "write")
    ctx = CheckContext(backend, meta, meta.format_info().chunk_size)
    report = run_fsck(ctx, repair=True, passes=META_PASSES)
    assert not report.clean and not report.remaining, report.remaining
    assert check_consistency(meta) == []
    where = {"entry and inode row": f"/lost+found/#{ino}",
             "references": f"/lost+found/slice-{sid:x}"}.get(damage, "/d/f")

    def holder(tx: Any) -> Any:
        return tx.all("SELECT r.slice_id, r.length FROM chunk_refs r WHERE r.ino = ?",
                      (meta.lookup(meta.lookup(1, where.split("/")[1].encode()).ino,
                                   where.split("/")[2].encode()).ino,))

    assert backend.run(holder, "read") == [(sid, 1000)]
    assert meta.statfs().inodes == backend.run(
        lambda tx: tx.one("SELECT COUNT(*) FROM inodes")[0], "read")
    created = meta.mknod(1, b"later", stat.S_IFREG | 0o644).ino  # the counters work again
    assert created > ino and meta.next_slice_id() > sid
