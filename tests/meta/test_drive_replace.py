"""``shinglefs drive replace``: a file system on this host that lost one drive
for good opens again, every file on the other drives bit-exact, the files that
had bytes on the lost drive cut at their first lost byte (never EIO), and
nothing is done while the drive is there, the file system is open or
something else sits at the new drive's path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from tests.meta.recoverykit import FsFactory, cli, listing, pattern, sql, write_file

from shinglefs.client.drivereplace import replace_drives
from shinglefs.client.filesystem import format_filesystem, open_filesystem
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.zoned.drivespec import DriveIdentityError

FILES = 16


def _two_drives(root: Path, drives: int = 2) -> tuple[FsFactory, dict[str, bytes]]:
    """A file system on drive0/drive1 (...) holding FILES files of drive slices in
    four directories (four lifetime groups: placed on several drives), closed."""
    factory = FsFactory(root)
    vfs = factory.vfs(drives=drives)
    files = {}
    for d in range(4):
        parent = vfs.mkdir(1, f"d{d}".encode(), 0o755).ino
        for i in range(FILES // 4):
            data = pattern(100 + d * 10 + i, 20_000 + 7_919 * i)  # past the inline limit
            write_file(vfs, f"f{i}".encode(), data, parent=parent)
            files[f"/d{d}/f{i}"] = data
    vfs.shutdown()
    return factory, files


def _on_drive(root: Path, drive: int) -> set[str]:
    """The files with a slice whose only copy is on ``drive``."""
    return {f"/{parent.decode()}/{name.decode()}" for parent, name in sql(
        root, "SELECT p.name, d.name FROM dentries d JOIN dentries p ON p.ino = d.parent "
              "JOIN chunk_refs r ON r.ino = d.ino "
              "JOIN slice_replicas s ON s.slice_id = r.slice_id WHERE s.drive = ?",
        (str(drive),))}


def _lose(root: Path, drive: int, suffixes: tuple[str, ...] = ("", ".zones")) -> None:
    for suffix in suffixes:
        os.unlink(root / f"drive{drive}.img{suffix}")


def _check_after(factory: FsFactory, files: dict[str, bytes], lost: set[str]) -> None:
    """Every file off the lost drives bit-exact, every one on them cut, fsck clean."""
    tree = listing(factory.meta_url)
    for path in set(files) - lost:
        assert tree[path] == files[path], path
    assert _lost_paths(tree, files) == lost
    assert cli("fsck", factory.meta_url) == 0


def test_replacing_a_lost_drive_keeps_every_file_of_the_other_and_cuts_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory, files = _two_drives(tmp_path)
    lost = _on_drive(tmp_path, 1)
    kept = set(files) - lost
    assert lost and kept, "placement put every file on one drive: the test needs both"
    _lose(tmp_path, 1)
    with pytest.raises(DriveIdentityError, match=r"drive 1 of file system .* is missing") as no:
        open_filesystem(factory.meta_url)
    assert f"`shinglefs drive replace {factory.meta_url} 1`" in str(no.value.hint)
    capsys.readouterr()

    assert cli("drive", "replace", factory.meta_url, "1") == 0
    out = capsys.readouterr().out
    assert f"formatted an empty drive at emulated:{tmp_path}/drive1.img" in out
    for path in lost:
        assert f"truncated {path} " in out

    tree = listing(factory.meta_url)  # opens: no drive missing any more; reads every byte
    for path in kept:
        assert tree[path] == files[path]
    for path in lost:
        assert tree[path] == b""  # one slice each, on the lost drive: nothing is left
    assert cli("fsck", factory.meta_url) == 0

    vfs = open_filesystem(factory.meta_url)  # the new drive takes writes
    write_file(vfs, b"after", b"x" * 300_000)
    vfs.shutdown()
    assert listing(factory.meta_url)["/after"] == b"x" * 300_000


def test_replace_refuses_a_drive_that_is_there_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory, files = _two_drives(tmp_path)
    capsys.readouterr()
    assert cli("drive", "replace", factory.meta_url, "1") == 1
    assert "nothing to replace" in capsys.readouterr().err
    assert cli("drive", "replace", factory.meta_url, "5") == 2
    assert _files(listing(factory.meta_url)) == files


def test_replace_never_overwrites_what_is_at_the_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory, files = _two_drives(tmp_path)
    lost = _on_drive(tmp_path, 1)
    _lose(tmp_path, 1)
    (tmp_path / "drive1.img").write_bytes(b"someone's notes")
    capsys.readouterr()
    assert cli("drive", "replace", factory.meta_url, "1") == 20
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "drive1.img").read_bytes() == b"someone's notes"
    # elsewhere, with --to: done
    assert cli("drive", "replace", factory.meta_url, "1", "--to",
               f"emulated:{tmp_path}/new1.img") == 0
    assert "new1.img" in sql(tmp_path, "SELECT spec FROM drives WHERE id = 1")[0][0]
    tree = listing(factory.meta_url)
    assert lost and _lost_paths(tree, files) == lost
    assert all(tree[p] == files[p] for p in set(files) - lost)


def _files(tree: dict[str, Any]) -> dict[str, Any]:
    return {path: data for path, data in tree.items() if data != "dir"}


def _lost_paths(tree: dict[str, Any], files: dict[str, bytes]) -> set[str]:
    return {p for p in files if tree[p] == b""}


def test_replace_refuses_while_the_file_system_is_open(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory, _ = _two_drives(tmp_path)
    vfs = open_filesystem(factory.meta_url)  # a live session, holding the drives
    try:
        _lose(tmp_path, 1)
        capsys.readouterr()
        assert cli("drive", "replace", factory.meta_url, "1") == 3
        assert "live session" in capsys.readouterr().err
        assert not (tmp_path / "drive1.img").exists()
    finally:
        vfs.shutdown()


def test_an_interrupted_replace_is_finished_by_running_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    factory, files = _two_drives(tmp_path)
    lost = _on_drive(tmp_path, 1)
    _lose(tmp_path, 1)

    class Interrupted(Exception):
        pass

    def interrupted(*_: object, **__: object) -> None:
        raise Interrupted  # as if the process died before recording the new drive

    monkeypatch.setattr(SqlMetaStore, "set_drives", interrupted)
    with pytest.raises(Interrupted):
        replace_drives(factory.meta_url, [1])
    monkeypatch.undo()
    assert (tmp_path / "drive1.img").exists()
    done = replace_drives(factory.meta_url, [1])
    assert [d.how for d in done.drives] == ["adopted"]
    tree = listing(factory.meta_url)
    for path in set(files) - lost:
        assert tree[path] == files[path]
    assert _lost_paths(tree, files) == lost


def test_replace_on_a_file_system_on_servers_says_it_has_no_drives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite3://{tmp_path}/meta.db"
    format_filesystem(url, [], servers=True)
    capsys.readouterr()
    assert cli("drive", "replace", url, "0") == 2
    assert "storage servers" in capsys.readouterr().err


def test_two_lost_drives_are_replaced_in_one_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory, files = _two_drives(tmp_path, drives=3)
    lost = _on_drive(tmp_path, 1) | _on_drive(tmp_path, 2)
    _lose(tmp_path, 1)
    _lose(tmp_path, 2)
    capsys.readouterr()
    assert cli("drive", "replace", factory.meta_url, "1") == 18  # drive 2 is missing too
    assert f"`shinglefs drive replace {factory.meta_url} 1 2`" in capsys.readouterr().err
    assert cli("drive", "replace", factory.meta_url, "1", "2") == 0
    _check_after(factory, files, lost)


def test_an_image_deleted_alone_leaves_its_zone_table_moved_aside_not_in_the_way(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory, files = _two_drives(tmp_path)
    lost = _on_drive(tmp_path, 1)
    table = (tmp_path / "drive1.img.zones").read_bytes()
    _lose(tmp_path, 1, suffixes=("",))  # rm drive1.img: its .zones stays
    capsys.readouterr()
    assert cli("drive", "replace", factory.meta_url, "1") == 0
    assert f"moved the lost drive's zone table aside to {tmp_path}/drive1.img.zones.lost" \
        in capsys.readouterr().out
    assert (tmp_path / "drive1.img.zones.lost").read_bytes() == table  # kept, not deleted
    _check_after(factory, files, lost)


@pytest.mark.parametrize("step", ["identity", "repair"])
def test_a_replace_killed_before_its_identity_or_its_repair_is_finished_by_a_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    import shinglefs.client.drivereplace as replace

    factory, files = _two_drives(tmp_path)
    lost = _on_drive(tmp_path, 1)
    _lose(tmp_path, 1)

    class Killed(Exception):
        pass

    def killed(*_: object, **__: object) -> None:
        raise Killed

    monkeypatch.setattr(replace, "write_identity" if step == "identity" else "fsck", killed)
    with pytest.raises(Killed):
        replace_drives(factory.meta_url, [1])
    monkeypatch.undo()
    done = replace_drives(factory.meta_url, [1])
    assert [d.how for d in done.drives] == \
        ["adopted" if step == "identity" else "already replaced"]
    _check_after(factory, files, lost)
