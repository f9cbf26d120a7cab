"""Crash loops: SIGKILL of a real mount's daemon, and power cuts, at random instants.

Each trial runs the shared workload (tests/support/crashload.py: closed files,
files mid-write, fsynced files, an O_APPEND corpus, rename-committed
checkpoints) in a child process, crashes the file system at a random instant,
brings it back and checks every acknowledged promise — with no file reading
EIO. The default run makes a few trials of each; ``-m slow`` runs long loops.
The SIGKILL loop itself (with fsck after each kill and remount) is
tests/support/crashloop.py, shared with test_crash_loops_postgres.py.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import crashload, crashloop  # noqa: E402

from shinglefs.fuse.harness import MountedFileSystem, default_drives  # noqa: E402

GiB = 1024**3


def sigkill_trials(tmp_path: Path, trials: int, seed: int) -> list[crashloop.Trial]:
    fs = MountedFileSystem(tmp_path / "data", tmp_path / "mnt",
                           drives=default_drives(tmp_path / "data", smr_bytes=4 * GiB))
    fs.format()
    return crashloop.sigkill_trials(fs, tmp_path / "journal", trials, seed)


def power_cut_trials(tmp_path: Path, trials: int, seed: int) -> list[crashload.Verdict]:
    import shinglefs
    from shinglefs.client.filesystem import format_filesystem

    rng = random.Random(seed)
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite3://{data / 'meta.db'}"
    format_filesystem(url, default_drives(data, smr_bytes=4 * GiB), name="power-cut")
    journal = tmp_path / "journal"
    verdicts = []
    for trial in range(trials):
        child = crashloop.start_workload("api-power-cut", url, str(journal), f"p{trial}",
                                         f"{rng.uniform(0.3, 2.5):.3f}")
        try:
            child.wait(120)
        finally:
            crashloop.stop(child)
        assert child.returncode == 9, child.stderr.read().decode() if child.stderr else ""
        with shinglefs.connect(url) as fs:
            def read(rel: str, fs=fs) -> bytes | None:  # type: ignore[no-untyped-def]
                try:
                    return fs.read_bytes("/" + rel)
                except FileNotFoundError:
                    return None
            verdict = crashload.verify(read, journal, closed_promised=False)
        verdicts.append(verdict)
        assert not verdict.problems, f"trial {trial}: {verdict.problems[:10]}"
    return verdicts


@pytest.mark.fuse
def test_sigkill_of_the_mount_loses_no_closed_file_and_no_file_reads_eio(tmp_path: Path) -> None:
    results = sigkill_trials(tmp_path, trials=3, seed=1)
    assert sum(r.verdict.closed_ok for r in results) > 10  # the loop really wrote and checked


def test_power_cuts_keep_every_fsynced_file_and_no_file_reads_eio(tmp_path: Path) -> None:
    verdicts = power_cut_trials(tmp_path, trials=3, seed=2)
    assert sum(v.files_checked for v in verdicts) > 10


@pytest.mark.slow
@pytest.mark.fuse
@pytest.mark.timeout(3600)
def test_sigkill_loop_soak(tmp_path: Path) -> None:
    trials = int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40"))
    print(crashloop.summary("sigkill loop", sigkill_trials(tmp_path, trials=trials,
                                                           seed=int(time.time()))))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_power_cut_loop_soak(tmp_path: Path) -> None:
    trials = int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40"))
    verdicts = power_cut_trials(tmp_path, trials=trials, seed=int(time.time()))
    print(f"power-cut loop: {trials} trials, {sum(v.files_checked for v in verdicts)} files "
          f"checked, {sum(v.closed_ok for v in verdicts)} closed intact, 0 problems")
