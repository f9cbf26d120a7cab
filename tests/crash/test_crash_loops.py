"""Crash loops: SIGKILL of a real mount's daemon, and power cuts, at random instants.

Each trial runs the shared workload (tests/support/crashload.py: closed files,
files mid-write, fsynced files, an O_APPEND corpus, rename-committed
checkpoints) in a child process, crashes the file system at a random instant,
brings it back and checks every acknowledged promise — with no file reading
EIO. The default run makes a few trials of each; ``-m slow`` runs long loops.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import crashload  # noqa: E402

from shinglefs.fuse.harness import MountedFileSystem, default_drives  # noqa: E402

GiB = 1024**3
WORKLOAD = str(ROOT / "tests" / "support" / "crashload.py")


def start_workload(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, WORKLOAD, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(60)


def sigkill_trials(tmp_path: Path, trials: int, seed: int) -> list[crashload.Verdict]:
    rng = random.Random(seed)
    fs = MountedFileSystem(tmp_path / "data", tmp_path / "mnt",
                           drives=default_drives(tmp_path / "data", smr_bytes=4 * GiB))
    fs.format()
    journal = tmp_path / "journal"
    verdicts = []
    try:
        for trial in range(trials):
            fs.start()
            child = start_workload("posix", str(fs.mountpoint), str(journal), f"t{trial}")
            time.sleep(rng.uniform(0.3, 2.5))
            fs.kill()  # SIGKILL of the daemon, wherever it is
            stop(child)
            fs.start()
            verdict = crashload.verify(crashload.posix_reader(fs.mountpoint), journal,
                                       closed_promised=True)
            verdicts.append(verdict)
            assert not verdict.problems, (f"trial {trial}: {verdict.problems[:10]}\n"
                                          f"{fs.log_text()[-3000:]}")
            fs.stop()
    finally:
        fs.stop()
    return verdicts


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
        child = start_workload("api-power-cut", url, str(journal), f"p{trial}",
                               f"{rng.uniform(0.3, 2.5):.3f}")
        try:
            child.wait(120)
        finally:
            stop(child)
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
    verdicts = sigkill_trials(tmp_path, trials=3, seed=1)
    assert sum(v.closed_ok for v in verdicts) > 10  # the loop really wrote and checked files


def test_power_cuts_keep_every_fsynced_file_and_no_file_reads_eio(tmp_path: Path) -> None:
    verdicts = power_cut_trials(tmp_path, trials=3, seed=2)
    assert sum(v.files_checked for v in verdicts) > 10


@pytest.mark.slow
@pytest.mark.fuse
@pytest.mark.timeout(3600)
def test_sigkill_loop_soak(tmp_path: Path) -> None:
    trials = int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40"))
    verdicts = sigkill_trials(tmp_path, trials=trials, seed=int(time.time()))
    print(f"sigkill loop: {trials} trials, {sum(v.files_checked for v in verdicts)} files "
          f"checked, {sum(v.closed_ok for v in verdicts)} closed intact, "
          f"{sum(v.partial_ok for v in verdicts)} mid-write prefixes, 0 problems")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_power_cut_loop_soak(tmp_path: Path) -> None:
    trials = int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40"))
    verdicts = power_cut_trials(tmp_path, trials=trials, seed=int(time.time()))
    print(f"power-cut loop: {trials} trials, {sum(v.files_checked for v in verdicts)} files "
          f"checked, {sum(v.closed_ok for v in verdicts)} closed intact, 0 problems")
