"""Metadata dump and load (any backend to any backend), and the metadata
backup on the drives that rebuilds a lost meta.db."""

from __future__ import annotations

import gzip
import io
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.meta.recoverykit import (
    FsFactory,
    cli,
    drive_specs,
    listing,
    node_of,
    pattern,
    sql,
    tree_with_bytes,
    write_file,
)
from tests.support.pgcluster import PgCluster

from shinglefs.client.filesystem import open_filesystem
from shinglefs.client.recovery import NoMetadataBackup, load_from_drives
from shinglefs.errors import PathError, UsageError
from shinglefs.meta import open_meta
from shinglefs.meta.backend import backend_from_url
from shinglefs.meta.dump import (
    DumpError,
    LoadTargetNotEmpty,
    dump_url,
    load_backend,
    load_url,
)
from shinglefs.meta.errors import AlreadyFormatted, NotFormatted
from shinglefs.store.metabackup import BackupError, backup_slots, write_backup

MiB = 1024 * 1024


def _populate(factory: FsFactory, drives: int = 1) -> None:
    """Files of several sizes, a directory, a symlink, a hard link, xattrs, odd names."""
    vfs = factory.vfs(drives=drives)
    try:
        d = vfs.mkdir(1, b"ckpt", 0o750).ino
        ino = write_file(vfs, b"model.pt", pattern(1, 5 * MiB + 3), parent=d)
        write_file(vfs, b"small", pattern(2, 4096))
        write_file(vfs, "naïve \x01 name".encode(), pattern(3, 10))
        vfs.link(ino, 1, b"hardlink")
        vfs.symlink(1, b"latest", b"ckpt/model.pt")
        vfs.setxattr(ino, b"user.step", b"\x00\xff1000")
        write_file(vfs, b"empty", b"")
    finally:
        vfs.shutdown()


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FsFactory]:
    factory = FsFactory(tmp_path / "fs")
    factory.root.mkdir()
    _populate(factory)
    yield factory
    factory.close_all()


def _rows(path: Path) -> list[bytes]:
    """The dump's lines without its first (which names the source and the time)."""
    return path.read_bytes().splitlines()[1:]


@pytest.mark.postgres
def test_round_trip_sqlite_postgresql_sqlite_keeps_listing_and_bytes(
        fs: FsFactory, tmp_path: Path, pg_cluster: PgCluster) -> None:
    before = listing(fs.meta_url)
    pg_url = pg_cluster.new_database()
    assert cli("dump", fs.meta_url, str(tmp_path / "one.jsonl")) == 0
    assert cli("load", str(tmp_path / "one.jsonl"), pg_url) == 0
    assert cli("dump", pg_url, str(tmp_path / "two.jsonl.gz")) == 0
    with gzip.open(tmp_path / "two.jsonl.gz") as two:
        assert two.read().splitlines()[1:] == _rows(tmp_path / "one.jsonl")
    # Beside the drives: the file system records them relative to its SQLite file.
    back = f"sqlite3://{fs.root / 'back.db'}"
    assert cli("load", str(tmp_path / "two.jsonl.gz"), back) == 0
    assert cli("dump", back, str(tmp_path / "three.jsonl")) == 0
    assert _rows(tmp_path / "one.jsonl") == _rows(tmp_path / "three.jsonl")
    assert listing(back) == before
    assert cli("fsck", back) == 0


def test_dump_streams_in_pages_and_reads_one_snapshot(fs: FsFactory, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import shinglefs.meta.dump as dump

    monkeypatch.setattr(dump, "PAGE_ROWS", 2)  # many pages: keyset pagination must join up
    counts = dump_url(fs.meta_url, str(tmp_path / "paged.jsonl"))
    monkeypatch.undo()
    dump_url(fs.meta_url, str(tmp_path / "whole.jsonl"))
    assert counts["inodes"] == 7 and counts["counters"] == 16
    assert _rows(tmp_path / "paged.jsonl") == _rows(tmp_path / "whole.jsonl")
    target = f"sqlite3://{fs.root / 'paged.db'}"
    monkeypatch.setattr(dump, "PAGE_ROWS", 3)
    load_url(str(tmp_path / "paged.jsonl"), target)
    assert listing(target) == listing(fs.meta_url)


def test_load_refuses_a_target_that_holds_a_file_system(fs: FsFactory, tmp_path: Path) -> None:
    dump_url(fs.meta_url, str(tmp_path / "d.jsonl"))
    with pytest.raises(AlreadyFormatted):
        load_url(str(tmp_path / "d.jsonl"), fs.meta_url)
    assert cli("load", str(tmp_path / "d.jsonl"), fs.meta_url) == 3


def test_a_dump_cut_short_is_refused_and_never_looks_like_a_file_system(
        fs: FsFactory, tmp_path: Path) -> None:
    dump_url(fs.meta_url, str(tmp_path / "d.jsonl"))
    lines = (tmp_path / "d.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "cut.jsonl").write_bytes(b"".join(lines[: len(lines) - 3]))
    target = f"sqlite3://{tmp_path / 'cut.db'}"
    with pytest.raises(DumpError, match=r"cut short"):
        load_url(str(tmp_path / "cut.jsonl"), target)
    assert not (tmp_path / "cut.db").exists()  # a file is checked before the target is made
    # A dump read once (a pipe) is checked as it is loaded: cut short, it leaves rows
    # that never look like a file system, and the next load refuses them.
    backend = backend_from_url(target)
    try:
        with pytest.raises(DumpError, match=r"cut short"):
            load_backend(io.BytesIO(b"".join(lines[: len(lines) - 3])), backend,
                         check_first=False)
    finally:
        backend.close()
    meta = open_meta(target)
    try:
        with pytest.raises(NotFormatted):
            meta.format_info()
    finally:
        meta.close()
    with pytest.raises(LoadTargetNotEmpty):
        load_url(str(tmp_path / "d.jsonl"), target)
    (tmp_path / "junk.jsonl").write_bytes(b"hello\n")
    assert cli("load", str(tmp_path / "junk.jsonl"), f"sqlite3://{tmp_path / 'j.db'}") == 3


def test_lost_meta_db_is_rebuilt_from_the_backup_on_the_drives(tmp_path: Path) -> None:
    factory = FsFactory(tmp_path)
    _populate(factory, drives=2)
    vfs = open_filesystem(factory.meta_url)
    slots = vfs.meta_backup.write()
    assert len(slots) == 2  # one copy per drive
    late = write_file(vfs, b"after-backup", pattern(7, 300_000))
    late_slice = vfs.meta.read_map(late, 0, 10)[0].slice_id
    before = tree_with_bytes(vfs)
    vfs.shutdown()  # within FIRST_BACKUP_S of the backup above: writes no other
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path}/meta.db{suffix}").unlink(missing_ok=True)
    specs = drive_specs(tmp_path, 2)
    assert cli("load", "--from-drives", *specs, factory.meta_url) == 0
    del before["/after-backup"]  # written after the backup: not in it...
    after = listing(factory.meta_url)
    assert {k: v for k, v in after.items()} == before
    # ...but its slice is still on a drive: fsck re-attaches it.
    assert cli("fsck", "--repair", factory.meta_url) == 40
    assert listing(factory.meta_url)[f"/lost+found/slice-{late_slice:x}"] == pattern(7, 300_000)
    assert cli("fsck", factory.meta_url) == 0


def lose_database(data: Path) -> None:
    """Move ``data``'s meta.db (and its WAL files) out of the drives' directory, as
    a lost database: ``load --from-drives`` refuses drives whose database lies
    beside them."""
    (data / "lost").mkdir()
    for f in data.glob("meta.db*"):
        f.rename(data / "lost" / f.name)


def test_a_load_beside_the_drives_own_database_is_refused(tmp_path: Path) -> None:
    """The drives' database is beside them: a second one loaded from their backup
    would diverge from it (files deleted through one lose their bytes under the
    other), so the load is refused before anything is written."""
    factory = FsFactory(tmp_path)
    _populate(factory)
    target = tmp_path / "restored.db"
    with pytest.raises(UsageError, match="has its metadata database at"):
        load_from_drives(drive_specs(tmp_path), f"sqlite3://{target}")
    assert not target.exists()


def test_the_newest_valid_backup_wins_and_a_damaged_one_is_skipped(tmp_path: Path) -> None:
    factory = FsFactory(tmp_path)
    _populate(factory)
    vfs = open_filesystem(factory.meta_url)
    first = vfs.meta_backup.write()[0]
    write_file(vfs, b"second", b"2")
    second = vfs.meta_backup.write()[0]
    vfs.shutdown()
    # (_populate's clean shutdown wrote the one before them)
    assert second.number == first.number + 1 and first.slot != second.slot
    # Damage the first payload block of the newest backup, in place on the drive.
    with node_of(tmp_path) as node:
        area = node.store(0).slice_log.area  # type: ignore[attr-defined]
        area.write_backup(second.slot, 4096, [pattern(5, 4096)])
    lose_database(tmp_path)
    target = f"sqlite3://{tmp_path / 'restored.db'}"  # beside the drives
    loaded = load_from_drives(drive_specs(tmp_path), target)
    assert loaded.backup.number == first.number
    assert "/second" not in listing(target)


def test_no_backup_on_the_drives_is_one_line_and_exit_3(tmp_path: Path) -> None:
    factory = FsFactory(tmp_path)
    factory.format()
    lose_database(tmp_path)
    with pytest.raises(NoMetadataBackup):
        load_from_drives(drive_specs(tmp_path), f"sqlite3://{tmp_path / 'x.db'}")
    assert cli("load", "--from-drives", *drive_specs(tmp_path),
               f"sqlite3://{tmp_path / 'y.db'}") == 3


def test_the_maintenance_thread_writes_the_backup_when_due(tmp_path: Path) -> None:
    factory = FsFactory(tmp_path)
    vfs = factory.vfs()
    try:
        write_file(vfs, b"x", b"hello")
        vfs.meta_backup.next_due = time.monotonic()
        deadline = time.monotonic() + 20
        while vfs.meta_backup.written == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert vfs.meta_backup.written == 1
    finally:
        vfs.shutdown()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path}/meta.db{suffix}").unlink(missing_ok=True)
    load_from_drives(drive_specs(tmp_path), factory.meta_url)
    assert listing(factory.meta_url) == {"/x": b"hello"}
    # Sessions are the source's processes: never carried over.
    assert sql(tmp_path, "SELECT COUNT(*) FROM sessions")[0][0] == 0


def test_a_failed_dump_leaves_no_file_and_an_existing_one_is_never_overwritten(
        fs: FsFactory, tmp_path: Path) -> None:
    """The dump is written beside its file and linked into place once complete:
    dumping a database that holds no file system fails and leaves no file; a file
    already at the path (yesterday's dump) is refused and kept as it was."""
    out = tmp_path / "d.jsonl"
    dump_url(fs.meta_url, str(out))
    before = out.read_bytes()
    with pytest.raises(PathError, match="already exists"):
        dump_url(fs.meta_url, str(out))
    assert out.read_bytes() == before
    empty = f"sqlite3://{tmp_path / 'empty.db'}"
    open_meta(empty).close()  # a database, but no file system in it
    with pytest.raises(NotFormatted):
        dump_url(empty, str(tmp_path / "new.jsonl"))
    assert sorted(p.name for p in tmp_path.iterdir() if "jsonl" in p.name) == ["d.jsonl"]


def test_loading_a_missing_dump_is_one_line_and_creates_no_database(tmp_path: Path) -> None:
    target = tmp_path / "new.db"
    with pytest.raises(DumpError, match="cannot read the dump"):
        load_url(str(tmp_path / "none.jsonl"), f"sqlite3://{target}")
    assert not target.exists()


def test_a_backup_that_outgrew_the_slots_leaves_both_slots_as_they_were(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Metadata grown past the drives' backup slots: the backup is refused before
    a slot is touched (the previous backups stay valid and loadable), and the
    periodic job says so in one warning line naming the newest backup left."""
    factory = FsFactory(tmp_path)
    vfs = factory.vfs()
    try:
        write_file(vfs, b"x", b"hello")
        first = vfs.meta_backup.write()[0]
        second = vfs.meta_backup.write()[0]
        logs = [store.slice_log for store in vfs.meta_backup._logs()]
        size = logs[0].area.backup_slot_size
        for log in logs:  # as if the metadata had outgrown the slots: 4 KiB of payload
            log.area.backup_slot_size = 8192
        for i in range(200):  # names that do not compress away
            write_file(vfs, pattern(i, 24).hex().encode(), b"")
        with pytest.raises(BackupError, match="number 2 of"):
            vfs.meta_backup.write()
        vfs.meta_backup.next_due = 0.0
        with caplog.at_level("WARNING"):
            vfs.meta_backup.maybe_write()
        failed = [r for r in caplog.records if "backup to the drives failed" in r.message]
        assert len(failed) == 1 and failed[0].exc_info is None
        for log in logs:
            log.area.backup_slot_size = size
        kept = {slot.number for log in logs for slot in backup_slots(log)}
        assert kept == {first.number, second.number}
    finally:
        vfs.shutdown()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path}/meta.db{suffix}").unlink(missing_ok=True)
    assert load_from_drives(drive_specs(tmp_path), factory.meta_url).backup.number == 2
    assert listing(factory.meta_url) == {"/x": b"hello"}


def test_a_backup_larger_than_its_slot_is_refused_before_the_slot_is_touched(
        tmp_path: Path) -> None:
    """Backup n goes to slot n mod 2; one that cannot fit must not first
    invalidate that slot, which holds the backup before the newest."""
    factory = FsFactory(tmp_path)
    vfs = factory.vfs()
    try:
        log = vfs.meta_backup._logs()[0].slice_log
        write_backup(log, io.BytesIO(b"backup one"), number=1, created_ns=1, label="t")
        write_backup(log, io.BytesIO(b"backup two"), number=2, created_ns=2, label="t")
        too_big = io.BytesIO(bytes(log.area.backup_slot_size))
        with pytest.raises(BackupError, match="does not fit"):
            write_backup(log, too_big, number=3, created_ns=3, label="t")
        assert sorted(slot.number for slot in backup_slots(log)) == [1, 2]
    finally:
        vfs.shutdown()


def test_a_clean_shutdown_leaves_a_backup_of_the_metadata_as_left(tmp_path: Path) -> None:
    """The periodic backup comes 30 s after opening: a file system used for less
    than that had none on its drives. A clean shutdown writes one more, with
    everything done before it; a second shutdown soon after writes none."""
    factory = FsFactory(tmp_path)
    vfs = factory.vfs()
    write_file(vfs, b"short-lived", pattern(4, 10_000))
    vfs.shutdown()
    assert vfs.meta_backup.written == 1
    vfs = factory.vfs()
    vfs.meta_backup.write()  # written by this process just now: no second one
    vfs.shutdown()
    assert vfs.meta_backup.written == 1
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path}/meta.db{suffix}").unlink(missing_ok=True)
    assert load_from_drives(drive_specs(tmp_path), factory.meta_url).backup.number == 2
    assert listing(factory.meta_url) == {"/short-lived": pattern(4, 10_000)}


# ---- a dump that is not complete, or damaged, is refused in one line (exit 3) -------------


def _cut_table(lines: list[bytes], table: str) -> list[bytes]:
    start = lines.index(next(ln for ln in lines if ln.startswith(b'{"table":"%s"' % table.encode())))
    end = lines.index(next(ln for ln in lines if ln.startswith(b'{"end":"%s"' % table.encode())))
    return lines[:start] + lines[end + 1:]


def _json_edit(line: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    obj = json.loads(line)
    edit(obj)
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _first_row(lines: list[bytes], table: str) -> int:
    return lines.index(next(ln for ln in lines if ln.startswith(b'{"table":"%s"' % table.encode()))) + 1


def _drop_row_fix_end(lines: list[bytes], also_trailer: bool) -> list[bytes]:
    row = _first_row(lines, "inodes")
    out = lines[:row] + lines[row + 1:]
    end = next(i for i, ln in enumerate(out) if ln.startswith(b'{"end":"inodes"'))
    out[end] = _json_edit(out[end], lambda o: o.update(rows=o["rows"] - 1))
    if also_trailer:
        out[-1] = _json_edit(out[-1], lambda o: o["rows"].update(inodes=o["rows"]["inodes"] - 1))
    return out


def _trailer_count(lines: list[bytes]) -> list[bytes]:
    return [*lines[:-1], _json_edit(lines[-1], lambda o: o["rows"].update(chunk_refs=7))]


def _table_twice(lines: list[bytes]) -> list[bytes]:
    start = _first_row(lines, "dentries") - 1
    end = next(i for i, ln in enumerate(lines) if ln.startswith(b'{"end":"dentries"'))
    return lines[: end + 1] + lines[start: end + 1] + lines[end + 1:]


INCOMPLETE: dict[str, Callable[[list[bytes]], list[bytes]]] = {
    "chunk_refs removed": lambda lines: _cut_table(lines, "chunk_refs"),
    "inodes removed": lambda lines: _cut_table(lines, "inodes"),
    "a trailer count changed": _trailer_count,
    "a row removed, its end count fixed": lambda lines: _drop_row_fix_end(lines, False),
    "a row removed, its end and trailer counts fixed": lambda lines: _drop_row_fix_end(lines, True),
    "a table twice": _table_twice,
    "lines after the trailer": lambda lines: [*lines, *lines[1:3]],
    "a row changed": lambda lines: [
        *lines[: _first_row(lines, "chunks")],
        lines[_first_row(lines, "chunks")].replace(b"[", b"[9", 1),
        *lines[_first_row(lines, "chunks") + 1:]],
}


@pytest.mark.parametrize("damage", sorted(INCOMPLETE))
def test_a_dump_that_is_not_complete_is_refused_and_the_target_stays_loadable(
        fs: FsFactory, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "d.jsonl"
    dump_url(fs.meta_url, str(good))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(INCOMPLETE[damage](good.read_bytes().splitlines(keepends=True))))
    target = f"sqlite3://{fs.root / 'copy.db'}"  # beside the drives: listing reads them
    capsys.readouterr()
    assert cli("load", str(bad), target) == 3
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln]
    assert err[0].startswith("shinglefs: error:") and "Traceback" not in "".join(err)
    # Refused before a row was written: the same target takes the complete dump.
    assert cli("load", str(good), target) == 0
    assert listing(target) == listing(fs.meta_url)


MALFORMED_ROWS = ["5", "null", '"table"', '{"table":"inodes"}', '{"b64":123}', '{"x":1}',
                  '{"end":"inodes","rows":"many"}', "[1,2]", '{"complete":true}']


@pytest.mark.parametrize("replacement", MALFORMED_ROWS)
def test_a_malformed_line_is_one_line_naming_its_number_and_exit_3(
        fs: FsFactory, tmp_path: Path, replacement: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "d.jsonl"
    dump_url(fs.meta_url, str(good))
    lines = good.read_bytes().splitlines(keepends=True)
    row = _first_row(lines, "inodes")
    lines[row] = replacement.encode() + b"\n"
    (tmp_path / "bad.jsonl").write_bytes(b"".join(lines))
    capsys.readouterr()
    assert cli("load", str(tmp_path / "bad.jsonl"), f"sqlite3://{tmp_path / 'x.db'}") == 3
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln]
    assert err[0].startswith("shinglefs: error:") and f"line {row + 1}" in err[0], err


def test_a_bad_value_in_a_row_is_refused(fs: FsFactory, tmp_path: Path) -> None:
    good = tmp_path / "d.jsonl"
    dump_url(fs.meta_url, str(good))
    lines = good.read_bytes().splitlines(keepends=True)
    row = _first_row(lines, "dentries")
    values = json.loads(lines[row])
    for bad in ({"b64": 123}, {"b64": "!!"}, [1], {"x": "AA=="}):
        values[1] = bad
        lines[row] = json.dumps(values).encode() + b"\n"
        (tmp_path / "bad.jsonl").write_bytes(b"".join(lines))
        with pytest.raises(DumpError, match=f"line {row + 1}"):
            load_url(str(tmp_path / "bad.jsonl"), f"sqlite3://{tmp_path / 'x.db'}")


def _without_checksums(lines: list[bytes]) -> list[bytes]:
    """As a dump written before the tables carried a checksum."""
    def strip(obj: dict[str, Any]) -> None:
        obj.pop("sha256", None)
    return [_json_edit(ln, strip) if ln.startswith(b'{"end"') else ln for ln in lines]


def test_a_dump_without_checksums_still_loads(fs: FsFactory, tmp_path: Path) -> None:
    good = tmp_path / "d.jsonl"
    dump_url(fs.meta_url, str(good))
    old = tmp_path / "old.jsonl"
    old.write_bytes(b"".join(_without_checksums(good.read_bytes().splitlines(keepends=True))))
    target = f"sqlite3://{fs.root / 'old.db'}"
    assert cli("load", str(old), target) == 0
    assert listing(target) == listing(fs.meta_url)


def test_a_duplicate_row_is_one_line_and_exit_3(fs: FsFactory, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "d.jsonl"
    dump_url(fs.meta_url, str(good))
    lines = _without_checksums(good.read_bytes().splitlines(keepends=True))
    row = _first_row(lines, "inodes")
    lines.insert(row, lines[row])
    end = next(i for i, ln in enumerate(lines) if ln.startswith(b'{"end":"inodes"'))
    lines[end] = _json_edit(lines[end], lambda o: o.update(rows=o["rows"] + 1))
    lines[-1] = _json_edit(lines[-1], lambda o: o["rows"].update(inodes=o["rows"]["inodes"] + 1))
    (tmp_path / "dup.jsonl").write_bytes(b"".join(lines))
    capsys.readouterr()
    assert cli("load", str(tmp_path / "dup.jsonl"), f"sqlite3://{tmp_path / 'x.db'}") == 3
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln]
    assert err[0].startswith("shinglefs: error:") and "inodes" in err[0], err
    assert not re.search(r"\b(drop|delete|remove)\b", "\n".join(err), re.I)


def test_a_damaged_or_cut_gzip_dump_is_one_line_and_exit_3(
        fs: FsFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = tmp_path / "d.jsonl.gz"
    dump_url(fs.meta_url, str(packed))
    whole = packed.read_bytes()
    cases = {"garbage.gz": whole[:2] + b"this is not deflate data" * 10,
             "cut.gz": whole[: len(whole) // 2]}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        capsys.readouterr()
        assert cli("load", str(tmp_path / name), f"sqlite3://{tmp_path / name}.db") == 3, name
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln]
        assert err and err[0].startswith("shinglefs: error:"), (name, err)
