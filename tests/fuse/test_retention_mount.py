"""Keep-last-N retention on a real mount, set with the real ``shinglefs policy``
command while mounted, checkpoints saved the way training scripts save them
(docs/client.md, "Retention")."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import torch

from shinglefs.fuse.harness import MountedFileSystem, shinglefs_command


def set_retention(where: list[str], rule: str) -> None:
    """``shinglefs policy WHERE --retention RULE`` (WHERE: URL and path, or a mounted dir)."""
    done = subprocess.run([*shinglefs_command(), "policy", *where, "--retention", rule],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"retention {rule}" in done.stdout


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_pt(ckpt: Path, step: int) -> None:
    """torch.save to a temporary name, fsync, os.replace, fsync of the directory."""
    tmp = ckpt / f"step-{step}.pt.tmp"
    with open(tmp, "wb") as f:
        torch.save({"step": step, "w": torch.full((256, 256), float(step))}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt / f"step-{step}.pt")
    fsync_dir(ckpt)


def save_sharded(ckpt: Path, step: int) -> None:
    """A sharded save: ranks' files in ``step-N.tmp/``, renamed to ``step-N/``."""
    tmp = ckpt / f"step-{step}.tmp"
    tmp.mkdir()
    for rank in range(2):
        torch.save(torch.full((128,), float(step * 10 + rank)), tmp / f"rank{rank}.pt")
    (tmp / ".metadata").write_bytes(b"%d" % step)
    fsync_dir(tmp)
    tmp.rename(ckpt / f"step-{step}")
    fsync_dir(ckpt)


def wait_for(listing: list[str], path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while sorted(os.listdir(path)) != listing:
        assert time.monotonic() < deadline, sorted(os.listdir(path))
        time.sleep(0.1)


def test_a_mounted_checkpoint_directory_keeps_the_last_n_steps(
        shinglefs_mount: MountedFileSystem, mnt: Path) -> None:
    pt, sharded = mnt / "pt", mnt / "sharded"
    pt.mkdir()
    sharded.mkdir()
    (sharded / "config.json").write_text("{}")
    set_retention([shinglefs_mount.meta_url, f"/{mnt.name}/pt"], "keep-last=2")
    set_retention([str(sharded)], "keep-last=2,match=step-*")  # the directory on the mount
    # Walked as the kernel walks it: x does not exist, so this is not pt (it
    # was: pt would have kept only its newest step).
    done = subprocess.run([*shinglefs_command(), "policy", f"{mnt}/x/../pt", "--retention",
                           "keep-last=1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "x/../pt does not exist" in done.stderr, done.stderr
    for step in range(1, 6):
        save_pt(pt, step)
        save_sharded(sharded, step)
    wait_for(["step-4.pt", "step-5.pt"], pt)
    wait_for(["config.json", "step-4", "step-5"], sharded)
    for step in (4, 5):
        state = torch.load(pt / f"step-{step}.pt")
        assert state["step"] == step and float(state["w"][0, 0]) == step
        shard = torch.load(sharded / f"step-{step}" / "rank1.pt")
        assert float(shard[0]) == step * 10 + 1
        assert sorted(os.listdir(sharded / f"step-{step}")) == [".metadata", "rank0.pt",
                                                                 "rank1.pt"]
