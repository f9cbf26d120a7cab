"""``shinglefs fsck`` of a file system on storage servers (no drives of its own).

It used to stop at "the metadata names no drives". It runs the metadata
passes, repairs what they find, and names the drive passes it skipped (the
servers hold those inventories; their orphan sweep and repair look after them).
"""

from __future__ import annotations

import json

import pytest

from shinglefs.cli.main import main
from shinglefs.client.recovery import fsck
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO
from shinglefs.meta.fsck import DRIVE_PASSES, SLICE_DRIVE_PASSES

EXIT_REPAIRED = 40
EXIT_DAMAGED = 41


def cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
        raise SystemExit(0)
    return int(exited.value.code or 0)


def test_a_clean_file_system_on_servers_is_clean_and_names_what_it_skipped(
        any_meta_url: str) -> None:
    meta = open_meta(any_meta_url)
    meta.mkdir(ROOT_INO, b"d", 0o755)
    meta.close()
    report = fsck(any_meta_url)
    assert report.clean, report.found
    skipped = {line.split(":")[0] for line in report.skipped}
    assert skipped == {p.name for p in DRIVE_PASSES + SLICE_DRIVE_PASSES}


def test_metadata_damage_is_found_and_repaired(any_meta_url: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    meta = open_meta(any_meta_url)
    meta.create(ROOT_INO, b"f", 0o644)
    meta.backend.run(lambda tx: tx.run("UPDATE counters SET inodes = inodes + 5 WHERE shard = 0"),
                     "write")
    meta.close()
    assert cli("fsck", any_meta_url, "--json") == EXIT_DAMAGED
    out = json.loads(capsys.readouterr().out)
    assert out["found"]["counters"]
    assert len(out["skipped"]) == len(DRIVE_PASSES + SLICE_DRIVE_PASSES)
    assert cli("fsck", any_meta_url, "--repair") == EXIT_REPAIRED
    assert fsck(any_meta_url).clean
