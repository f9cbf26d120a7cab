"""Tiers on a real mount: ``shinglefs policy DIR --tier hot|cold`` decides
which drives the files written below DIR go to (the harness's file system has
an SMR drive, cold, and a conventional drive, hot): the slices' replicas in
meta name the tier's drive, and the bytes read back from it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from shinglefs.fuse.harness import MountedFileSystem, drop_caches, shinglefs_command
from shinglefs.meta import open_meta
from shinglefs.server.node import drive_tier

MiB = 1 << 20


@pytest.fixture
def fs(tmp_path: Path):
    with MountedFileSystem(tmp_path / "data", tmp_path / "mnt") as mounted:
        yield mounted


def policy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shinglefs_command(), "policy", *args], capture_output=True,
                          text=True, timeout=120)


def tiers_holding(fs: MountedFileSystem, path: Path) -> set[str | None]:
    """The tiers of the drives holding the slices of ``path``."""
    meta = open_meta(fs.meta_url)
    try:
        tier_of_drive = {str(i): drive_tier(r.spec) for i, r in enumerate(meta.drive_records())}
        pieces = meta.read_map(os.stat(path).st_ino, 0, os.stat(path).st_size)
        slices = {p.slice_id for p in pieces if p.slice_id is not None and p.inline is None}
        assert slices, f"{path} has no slice on a drive"
        return {tier_of_drive[r.drive] for s in slices for r in meta.get_slice(s).replicas}
    finally:
        meta.close()


def test_a_directorys_tier_sends_its_files_to_that_tiers_drives(fs: MountedFileSystem) -> None:
    hot, cold = fs.mountpoint / "hot", fs.mountpoint / "cold"
    hot.mkdir()
    cold.mkdir()
    for directory, tier in ((hot, "hot"), (cold, "cold")):
        done = policy(str(directory), "--tier", tier)
        assert done.returncode == 0, done.stderr
    (hot / "sub").mkdir()  # made after the policy: it copies the tier
    want = {}
    for path in (hot / "index.bin", hot / "sub" / "part-0", cold / "shard-0.tar"):
        want[path] = os.urandom(8 * MiB + 123)
        path.write_bytes(want[path])
    assert tiers_holding(fs, hot / "index.bin") == {"hot"}
    assert tiers_holding(fs, hot / "sub" / "part-0") == {"hot"}
    assert tiers_holding(fs, cold / "shard-0.tar") == {"cold"}
    drop_caches()
    assert all(path.read_bytes() == data for path, data in want.items())
    refused = policy(str(hot), "--tier", "warm")
    assert refused.returncode == 1 and "not one of hot, cold" in refused.stderr, refused.stderr
