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


def test_move_brings_existing_data_to_a_new_tier_and_leaves_snapshots_whole(
        fs: MountedFileSystem) -> None:
    """Data written before a tier was set sits on SMR; ``policy --tier hot
    --move`` rewrites it onto the hot drive through the mount: every byte
    reads back, a snapshot taken before keeps its own (old) slices, inline
    files stay in meta, and fsck finds nothing."""
    from shinglefs.meta.check import check_consistency

    data = fs.mountpoint / "data"
    (data / "sub").mkdir(parents=True)
    want = {data / "a.bin": os.urandom(9 * MiB + 7), data / "sub" / "b.bin": os.urandom(3 * MiB),
            data / "small.json": b'{"inline": true}'}
    for path, content in want.items():
        path.write_bytes(content)
    assert tiers_holding(fs, data / "a.bin") == {"cold"}
    snap = subprocess.run([*shinglefs_command(), "snapshot", str(data),
                           str(fs.mountpoint / "data@v1")], capture_output=True, text=True,
                          timeout=120)
    assert snap.returncode == 0, snap.stderr
    done = policy(str(data), "--tier", "hot", "--move", "--json")
    assert done.returncode == 0, done.stderr
    import json
    moved = json.loads(done.stdout)["moved"]
    assert moved["files"] == 3 and moved["chunks"] >= 2 and moved["skipped"] == 0, moved
    assert tiers_holding(fs, data / "a.bin") == {"hot"}
    assert tiers_holding(fs, data / "sub" / "b.bin") == {"hot"}
    assert tiers_holding(fs, fs.mountpoint / "data@v1" / "a.bin") == {"cold"}
    drop_caches()
    for path, content in want.items():
        assert path.read_bytes() == content
        assert (fs.mountpoint / "data@v1" / path.relative_to(data)).read_bytes() == content
    again = policy(str(data), "--move", "--json")  # nothing left elsewhere: nothing moved
    assert again.returncode == 0 and json.loads(again.stdout)["moved"]["chunks"] == 0
    url_form = policy(fs.meta_url, "/data", "--move")
    assert url_form.returncode == 2 and "through a mount" in url_form.stderr
    meta = open_meta(fs.meta_url)
    try:
        assert check_consistency(meta) == []
    finally:
        meta.close()


def test_move_to_a_full_tier_says_so_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """A tier whose drives are full takes no more of ``--move``: the command
    says how many chunks it could not move instead of counting rewrites that
    placement put back on the cold drive, and a rewrite that ran out of space
    leaves no slice behind (fsck clean, the cold drive's figures back)."""
    import json

    from shinglefs.client.filesystem import format_filesystem
    from shinglefs.meta.check import check_consistency

    data = tmp_path / "data"
    data.mkdir()
    fs = MountedFileSystem(data, tmp_path / "mnt")
    format_filesystem(fs.meta_url, [f"emulated:{data / 'smr.img'}:512M",
                                    f"conventional:{data / 'flash.img'}:128M"],
                      name="test", zone_size=16 * MiB)
    fs.mountpoint.mkdir()
    fs.start()
    try:
        hot, cold = fs.mountpoint / "hot", fs.mountpoint / "cold"
        hot.mkdir()
        cold.mkdir()
        assert policy(str(hot), "--tier", "hot").returncode == 0
        (hot / "filler").write_bytes(os.urandom(56 * MiB))  # the hot drive is (nearly) full
        want = os.urandom(40 * MiB)
        (cold / "big").write_bytes(want)
        done = policy(str(cold), "--tier", "hot", "--move", "--json")
        assert done.returncode in (0, 1), done.stderr
        if done.returncode == 0:
            moved = json.loads(done.stdout)["moved"]
            assert moved["chunks"] == 0 and moved["no_room"] >= 1, moved
        else:
            assert "No space left" in done.stderr, done.stderr
        assert tiers_holding(fs, cold / "big") == {"cold"}
        drop_caches()
        assert (cold / "big").read_bytes() == want
    finally:
        fs.stop()
    meta = open_meta(fs.meta_url)
    try:
        assert check_consistency(meta) == []
        assert meta.abandoned_slices(older_than_s=-1.0) == []  # no WRITING slice left
    finally:
        meta.close()
