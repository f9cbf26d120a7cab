"""The SIGKILL loop against a mount whose metadata is on PostgreSQL.

The same loop as test_crash_loops.py's (tests/support/crashloop.py): the
shared workload (closed-not-fsynced small and large files, files mid-write
and mid-fsync, an O_APPEND corpus, rename-committed checkpoints) runs
against a real mount of a file system whose metadata lives in a private
PostgreSQL cluster (tests/support/pgcluster.py: a missing or broken
PostgreSQL fails the test, as every PostgreSQL test here does); the daemon
is SIGKILLed at a random instant — its open transactions die with their
connections, the server lives on — and mounted again. Every closed file
must read back exactly, a file being written must be its previous content
or a prefix of the new one, no file may read EIO, and ``shinglefs fsck``
must find nothing but what a crash is documented to leave
(``crashloop.CRASH_LEFTOVERS``). The default run makes 2 trials;
``-m slow`` runs ``SHINGLEFS_CRASH_TRIALS`` (40).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import crashloop  # noqa: E402
from tests.support.pgcluster import PgCluster, private_cluster  # noqa: E402

from shinglefs.fuse.harness import MountedFileSystem, default_drives  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.postgres]

GiB = 1024**3


@pytest.fixture(scope="module")
def pg() -> Iterator[PgCluster]:
    with private_cluster("shinglefs-crash-pg-") as cluster:
        yield cluster


def sigkill_trials(pg: PgCluster, tmp_path: Path, trials: int, seed: int
                   ) -> list[crashloop.Trial]:
    data = tmp_path / "data"
    fs = MountedFileSystem(data, tmp_path / "mnt", meta_url=pg.new_database(),
                           drives=default_drives(data, smr_bytes=4 * GiB))
    fs.format()
    return crashloop.sigkill_trials(fs, tmp_path / "journal", trials, seed)


def test_sigkill_of_a_postgresql_backed_mount_loses_no_closed_file(
        pg: PgCluster, tmp_path: Path) -> None:
    results = sigkill_trials(pg, tmp_path, trials=2, seed=6)
    assert sum(r.verdict.closed_ok for r in results) > 5  # the loop really wrote and checked
    print(crashloop.summary("postgresql sigkill loop", results))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_loop_soak_on_postgresql(pg: PgCluster, tmp_path: Path) -> None:
    trials = int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40"))
    print(crashloop.summary("postgresql sigkill loop",
                            sigkill_trials(pg, tmp_path, trials, seed=int(time.time()))))
