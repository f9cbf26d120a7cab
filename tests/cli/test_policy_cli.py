"""``shinglefs policy`` and ``shinglefs drive`` against a real SQLite metadata file."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.cli.main import main
from shinglefs.client.filesystem import format_filesystem
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO, DirPolicy, MetaStore, ServerDrive

GiB = 1024**3


def cli(*args: str) -> int:
    """``shinglefs ARGS`` in this process; its exit code."""
    with pytest.raises(SystemExit) as exited:
        main(list(args))
        raise SystemExit(0)
    return int(exited.value.code or 0)


@pytest.fixture
def meta_url(tmp_path: Path) -> str:
    url = f"sqlite3://{tmp_path / 'meta.db'}"
    format_filesystem(url, [], servers=True)
    return url


@pytest.fixture
def meta(meta_url: str) -> Iterator[MetaStore]:
    store = open_meta(meta_url)
    yield store
    store.close()


def shown(capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    return dict(json.loads(capsys.readouterr().out))


def test_policy_sets_and_shows_a_goal_and_keeps_the_rest_of_the_policy(
        meta_url: str, meta: MetaStore, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = meta.mkdir(ROOT_INO, b"ckpt", 0o755)
    step = meta.mkdir(ckpt.ino, b"step-1", 0o755)
    meta.set_policy(ckpt.ino, DirPolicy(tier="cold"))
    assert cli("policy", meta_url, "/ckpt/step-1", "--json") == 0
    assert shown(capsys) == {"path": "/ckpt/step-1", "ino": step.ino, "replicas": None,
                             "tier": None, "retention": None, "effective_replicas": None}
    assert cli("policy", meta_url, "/ckpt", "--replicas", "3") == 0
    assert "replicas 3" in capsys.readouterr().out
    assert meta.get_policy(ckpt.ino) == DirPolicy("cold", None, 3)
    assert cli("policy", meta_url, "/ckpt/step-1", "--json") == 0
    assert shown(capsys)["effective_replicas"] == 3  # inherited
    assert cli("policy", meta_url, "/ckpt", "--replicas", "inherit", "--retention",
               "keep_last=2", "--json") == 0
    assert shown(capsys)["effective_replicas"] is None
    assert meta.get_policy(ckpt.ino) == DirPolicy("cold", "keep-last=2", None)  # canonical


@pytest.mark.parametrize(("args", "code", "says"), [
    (["/nowhere", "--replicas", "2"], 1, "/nowhere: no 'nowhere' in / [ENOENT]"),
    (["/ckpt/none/deeper"], 1, "/ckpt/none/deeper: no 'none' in /ckpt [ENOENT]"),
    (["/ckpt/file"], 1, "/ckpt/file is not a directory: a policy is set on the directory"),
    (["/ckpt/file/x"], 1, "/ckpt/file/x: /ckpt/file is not a directory [ENOTDIR]"),
    (["/ckpt", "--replicas", "0"], 1, "1..16"),
    (["/ckpt", "--replicas", "two"], 2, "neither a number"),
    (["ckpt"], 2, "absolute path"),
    (["/ckpt", "--retention", "keep-last=0"], 2, "not a rule"),
    (["/ckpt", "--retention", "forever"], 2, "not a rule"),
    (["/", "--retention", "keep-last=3"], 2, "retention on the root"),
])
def test_policy_refuses_what_it_cannot_do_with_one_line(
        meta_url: str, meta: MetaStore, capsys: pytest.CaptureFixture[str], args: list[str],
        code: int, says: str) -> None:
    ckpt = meta.mkdir(ROOT_INO, b"ckpt", 0o755)
    meta.create(ckpt.ino, b"file", 0o644)
    assert cli("policy", meta_url, *args) == code
    assert says in capsys.readouterr().err
    assert meta.get_policy(ckpt.ino) == DirPolicy()


def test_policy_of_a_directory_that_is_on_no_mount_is_refused_with_both_forms(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("policy", str(tmp_path), "--retention", "keep-last=2") == 2
    err = capsys.readouterr().err
    assert "neither a metadata URL nor on a ShingleFS mount" in err
    assert "META_URL /ckpt" in err


def test_drive_offline_and_online_record_the_state(
        meta_url: str, meta: MetaStore, capsys: pytest.CaptureFixture[str]) -> None:
    sid = meta.register_server("h1:7070", [ServerDrive(
        0, "emulated:/srv/d0.img:4G", str(uuid.uuid4()), "cold", 4 * GiB, GiB)])
    assert cli("drive", "offline", meta_url, f"{sid}:0") == 0
    assert meta.drive_states() == {(sid, 0): "offline"}
    assert cli("drive", "offline", meta_url, f"{sid}:7") == 1
    assert cli("drive", "offline", meta_url, "zero") == 2
    assert "SERVER:DRIVE" in capsys.readouterr().err
    assert cli("drive", "online", meta_url, f"{sid}:0") == 0
    assert meta.drive_states() == {}


def test_an_embedded_file_system_not_mounted_has_lost_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its drives are files on this host: ``status --servers`` counted every
    slice lost (and the default goal 0) whenever nothing had it mounted."""
    import os

    import shinglefs
    from shinglefs.fuse.harness import default_drives

    url = f"sqlite3://{tmp_path / 'meta.db'}"
    format_filesystem(url, default_drives(tmp_path, smr_drives=1))
    fs = shinglefs.connect(url)
    try:
        fs.write_bytes("/a.bin", os.urandom(5 << 20))
    finally:
        fs.close()
    assert cli("status", url, "--servers", "--json") == 0
    health = shown(capsys)["replication"]
    assert (health["goal"], health["slices"], health["under_replicated"], health["lost"]) \
        == (1, 1, 0, 0)


def test_a_relative_snapshot_name_is_named_in_the_refusal(
        meta_url: str, meta: MetaStore, capsys: pytest.CaptureFixture[str]) -> None:
    meta.mkdir(ROOT_INO, b"ckpt", 0o755)
    assert cli("snapshot", meta_url, "/ckpt", "ckpt2") == 2
    err = capsys.readouterr().err
    assert "'ckpt2' is not an absolute path" in err and "/ckpt2" in err  # it named ''


def test_snapshot_paths_are_walked_name_by_name_not_lexically(
        meta_url: str, meta: MetaStore, capsys: pytest.CaptureFixture[str]) -> None:
    """``/c2/../c3`` needs a directory ``/c2``, as the kernel's path walk does;
    ``..`` of a walked directory goes back up, and a file is not a directory."""
    ckpt = meta.mkdir(ROOT_INO, b"ckpt", 0o755).ino
    meta.create(ckpt, b"weights", 0o644)
    assert cli("snapshot", meta_url, "/ckpt", "/c2/../c3") != 0
    assert "c2" in capsys.readouterr().err
    assert cli("snapshot", meta_url, "/ckpt/weights/..", "/ckpt/../c4") != 0
    assert "not a directory" in capsys.readouterr().err
    assert [e.name for e in meta.readdir(ROOT_INO)] == [b"ckpt"]
    assert cli("snapshot", meta_url, "/ckpt/./..//ckpt", "/ckpt/../c5") == 0
    assert sorted(e.name for e in meta.readdir(ROOT_INO)) == [b"c5", b"ckpt"]
    c5 = meta.lookup(ROOT_INO, b"c5").ino
    assert [e.name for e in meta.readdir(c5)] == [b"weights"]
