"""``shinglefs demo`` (what ``make demo`` runs) end to end on a real mount: the
main job — corpus appended, pinned as a read-only snapshot while it grows,
training through a DataLoader on the pinned version, checkpoints committed
by rename with keep-last-N, the newest loaded back — each step checked by
the demo itself, which fails loudly when one does not hold."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from shinglefs.fuse.harness import shinglefs_command
from shinglefs.fuse.mount import mount_entry


def test_the_demo_runs_its_main_job_and_leaves_nothing_mounted(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    done = subprocess.run([*shinglefs_command(), "demo", "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [line.split(":")[0] for line in done.stdout.splitlines()
             if line.startswith("[demo]")]
    assert steps == ["[demo] mounting", "[demo] corpus appended", "[demo] versioned",
                     "[demo] trained", "[demo] checkpoints", "[demo] verified",
                     "[demo] unmounted"], done.stdout
    assert "corpus@v1 still holds 8" in done.stdout
    assert mount_entry(data / "mnt") is None
