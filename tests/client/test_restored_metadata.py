"""Metadata restored from an older copy (a ``shinglefs dump`` kept as a backup):
the drives hold slices whose ids the restored counter would hand out again.
Opening the file system moves the counter past them, so new files are
written, not refused (they failed on close with EINVAL and stayed empty)."""

from __future__ import annotations

import os
from pathlib import Path

from fsfixtures import FsFactory, pattern

from shinglefs.client.api import ShingleFS
from shinglefs.meta.dump import dump_url, load_url

MiB = 1 << 20


def test_new_files_after_loading_an_older_dump_take_ids_past_the_drives(
        fs_factory: FsFactory, tmp_path: Path) -> None:
    fs = ShingleFS(fs_factory.vfs())
    fs.write_bytes("/before", pattern(1, 5 * MiB))
    backup = str(tmp_path / "backup.jsonl")
    fs.close()
    dump_url(fs_factory.meta_url, backup)
    later = ShingleFS(fs_factory.vfs())  # a new session takes a new batch of ids
    for i in range(3):  # slices the dump does not know
        later.write_bytes(f"/after-{i}", pattern(10 + i, 5 * MiB))
    later.close()
    db = fs_factory.meta_url.removeprefix("sqlite3://")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.rename(db + suffix, db + suffix + ".lost")
    load_url(backup, fs_factory.meta_url)
    restored = ShingleFS(fs_factory.vfs())
    assert restored.read_bytes("/before") == pattern(1, 5 * MiB)
    for i in range(3):
        restored.write_bytes(f"/new-{i}", pattern(20 + i, 5 * MiB))
    for i in range(3):
        assert restored.read_bytes(f"/new-{i}") == pattern(20 + i, 5 * MiB)
