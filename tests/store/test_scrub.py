"""Scrub: corrupted record bytes on an emulated drive's file are found and
named by file path; the scrub resumes where it stopped and keeps to its rate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.meta.recoverykit import (
    FsFactory,
    cli,
    drive_specs,
    node_of,
    pattern,
    sql,
    write_file,
)
from tests.meta.recoverykit import file_bytes as overwrite_drive

from shinglefs.client.recovery import scrub, scrub_state_path
from shinglefs.store.scrub import ScrubState

MiB = 1024 * 1024
HEADER_BLOCK = 4096


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FsFactory]:
    factory = FsFactory(tmp_path)
    vfs = factory.vfs()
    d = vfs.mkdir(1, b"data", 0o755).ino
    for i in range(4):
        write_file(vfs, f"shard-{i}".encode(), pattern(i, 2 * MiB + 11), parent=d)
    vfs.shutdown()
    yield factory
    factory.close_all()


def _corrupt_payload(root: Path, name: bytes) -> None:
    """Flip bytes inside the payload of the record holding file ``name``."""
    sid = sql(root, "SELECT r.slice_id FROM chunk_refs r JOIN dentries d ON d.ino = r.ino "
                    "WHERE d.name = ?", (name,))[0][0]
    with node_of(root) as node:
        _off, _len, dev = node.store(0).slice_log.index.extents(sid)[0]  # type: ignore[attr-defined]
    overwrite_drive(root, 0, dev + HEADER_BLOCK + 300_000, b"\xde\xad\xbe\xef" * 16)


def test_scrub_of_a_healthy_file_system_reads_every_byte_exit_0(fs: FsFactory) -> None:
    result = scrub(fs.meta_url)
    assert result.finished and not result.damaged_files
    assert sum(s.bytes_read for s in result.drives.values()) == 4 * (2 * MiB + 11)
    assert cli("scrub", fs.meta_url) == 0
    assert not scrub_state_path(drive_specs(fs.root)[0]).exists()


def test_corrupted_record_bytes_are_reported_by_file_path(
        fs: FsFactory, capsys: pytest.CaptureFixture[str]) -> None:
    _corrupt_payload(fs.root, b"shard-2")
    result = scrub(fs.meta_url)
    assert list(result.damaged_files) == ["/data/shard-2"]
    assert "checksum mismatch" in result.damaged_files["/data/shard-2"][0]
    assert cli("scrub", fs.meta_url) == 41
    assert "damaged: /data/shard-2" in capsys.readouterr().out


def test_an_interrupted_scrub_resumes_from_its_saved_position(fs: FsFactory) -> None:
    _corrupt_payload(fs.root, b"shard-0")
    extents = iter(range(100))
    first = scrub(fs.meta_url, stop=lambda: next(extents) >= 2)  # stop after two extents
    assert not first.finished
    state = ScrubState.load(scrub_state_path(drive_specs(fs.root)[0]))
    assert state.position > 0 and state.bytes_read == 2 * (2 * MiB + 11)
    second = scrub(fs.meta_url)
    assert second.finished
    # The bytes of the first run are not read again, and its findings are kept.
    assert second.drives[0].bytes_read == 4 * (2 * MiB + 11)
    assert list(second.damaged_files) == ["/data/shard-0"]
    assert not scrub_state_path(drive_specs(fs.root)[0]).exists()


def test_scrub_keeps_to_its_rate(fs: FsFactory) -> None:
    t0 = time.monotonic()
    result = scrub(fs.meta_url, rate_bytes=8 * MiB)  # 8 MiB of slices at 8 MiB/s
    assert result.finished and time.monotonic() - t0 >= 0.95
    assert cli("scrub", "--rate", "256", fs.meta_url) == 0
    assert cli("scrub", "--rate", "-1", fs.meta_url) == 2
