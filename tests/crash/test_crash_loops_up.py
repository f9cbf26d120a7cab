"""The SIGKILL loop against ``shinglefs up``, the daemon users run.

``up`` is not ``mount``: it formats on first use and serves its drives on
loopback to the host's other processes (server/share.py), so a ``connect()``
in a script writes through it. Two loops (tests/support/crashloop.py),
each on a file system ``up`` formatted itself (``fuse.harness.UpMount``):

- the shared loop of test_crash_loops.py (a POSIX workload on the mount,
  SIGKILL of the daemon at a random instant, ``up`` again, every promise
  checked, fsck after the kill and after the clean unmount);
- the daemon killed while ANOTHER process writes through ``connect()``
  (``crashload.run_shared``): every file whose ``close()`` returned in that
  process reads back exactly through the new ``up`` mount, no file reads
  EIO, fsck finds only the documented crash leftovers; while the daemon is
  dead the client's operations fail with EIO (what was in flight, reads,
  a new file's bytes: ``OwnerGone``, never ENOSPC: the drives are not
  full), never a hang (each step bounded by ``crashloop.LIMIT_S``);
  once ``up`` is back the same handle writes again and a new ``connect()``
  works (the next trial's).

The default run makes 2 trials of each; ``-m slow`` runs
``SHINGLEFS_CRASH_TRIALS`` (40). Also: fsck of slices a ``connect()`` client
wrote through ``up`` finds nothing (their replicas name the sharing server).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import crashloop  # noqa: E402

from shinglefs.fuse.harness import UpMount  # noqa: E402

pytestmark = pytest.mark.fuse

FAILS_CLEANLY = {errno.errorcode[errno.EIO]}  # never ENOSPC: the drives are not full


def seen_by_client(results: list[crashloop.SharedTrial]) -> str:
    """What the connect() client saw while the daemon was dead, counted."""
    seen = Counter(f"{k}={v}" for r in results for k, v in sorted(r.seen.items()))
    return "client saw: " + ", ".join(f"{k} x{n}" for k, n in sorted(seen.items()))


def up_mount(tmp_path: Path) -> UpMount:
    fs = UpMount(tmp_path / "data", tmp_path / "mnt")
    fs.format()  # the directories: the first start formats
    return fs


def test_sigkill_of_up_loses_no_closed_file_and_no_file_reads_eio(tmp_path: Path) -> None:
    results = crashloop.sigkill_trials(up_mount(tmp_path), tmp_path / "journal", trials=2,
                                       seed=11)
    assert sum(r.verdict.closed_ok for r in results) > 5  # the loop really wrote and checked
    print(crashloop.summary("up sigkill loop", results))


def test_sigkill_of_up_under_a_connect_client_keeps_its_closed_files(tmp_path: Path) -> None:
    results = crashloop.shared_sigkill_trials(up_mount(tmp_path), tmp_path / "journal",
                                              trials=2, seed=12)
    for trial, r in enumerate(results):
        assert r.seen["failed"] in FAILS_CLEANLY, (trial, r.seen)
        assert r.seen["dead-write"] in FAILS_CLEANLY, (trial, r.seen)
        assert r.seen["dead-read"] in {"EIO", "ENOENT", "ok"}, (trial, r.seen)
    assert sum(r.verdict.closed_ok for r in results) > 5
    print(crashloop.summary("up + connect() sigkill loop", results), seen_by_client(results))


def test_fsck_finds_nothing_in_slices_a_connect_client_wrote_through_up(tmp_path: Path) -> None:
    # Their replicas name the drives as the sharing server's, not as "local":
    # fsck's replica_drives pass reported every one of them before.
    fs = up_mount(tmp_path)
    fs.start()
    try:
        script = ("import shinglefs, sys\n"
                  "with shinglefs.connect(sys.argv[1]) as fs:\n"
                  "    fs.write_bytes('/by-connect.bin', bytes(range(256)) * 4096)\n")
        run = subprocess.run([sys.executable, "-c", script, fs.meta_url],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    finally:
        assert fs.stop() == 0
    fs.start()
    try:
        assert (fs.mountpoint / "by-connect.bin").read_bytes() == bytes(range(256)) * 4096
    finally:
        fs.stop()
    outcome = crashloop.run_fsck(fs.meta_url)
    assert (outcome.code, outcome.found) == (0, {})


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_loop_soak_on_up(tmp_path: Path) -> None:
    trials = int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40"))
    print(crashloop.summary("up sigkill loop", crashloop.sigkill_trials(
        up_mount(tmp_path), tmp_path / "journal", trials, seed=int(time.time()))))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_loop_soak_on_up_under_a_connect_client(tmp_path: Path) -> None:
    trials = int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40"))
    results = crashloop.shared_sigkill_trials(up_mount(tmp_path), tmp_path / "journal",
                                              trials, seed=int(time.time()))
    for r in results:
        assert {r.seen["failed"], r.seen["dead-write"]} <= FAILS_CLEANLY, r.seen
    print(crashloop.summary("up + connect() sigkill loop", results), seen_by_client(results))
