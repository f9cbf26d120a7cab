"""SIGKILL of the mount daemon while it makes a snapshot (docs/metadata.md,
"Snapshots": one transaction). Each trial asks the mount for a copy of a
corpus of a few thousand files (``shinglefs snapshot`` on the mount, which
the daemon makes), kills the daemon at a random instant during the request,
mounts again and checks: the copy is absent or whole (every name, every
byte), the corpus is untouched, and fsck finds only what a crash may leave.

The default run makes 2 trials; ``-m slow`` runs ``SHINGLEFS_CRASH_TRIALS``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import crashloop  # noqa: E402

from shinglefs.fuse.harness import MountedFileSystem, drop_caches, shinglefs_command  # noqa: E402

pytestmark = pytest.mark.fuse

MiB = 1 << 20
FILES = 2000


def tree_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def snapshot_kill_trials(tmp_path: Path, trials: int, seed: int) -> None:
    rng = random.Random(seed)
    fs = MountedFileSystem(tmp_path / "data", tmp_path / "mnt")
    fs.format()
    fs.start()
    try:
        corpus = fs.mountpoint / "corpus"
        for shard in range(3):
            (corpus / f"shard-{shard}").mkdir(parents=True)
            (corpus / f"shard-{shard}" / "data.bin").write_bytes(
                rng.randbytes(2 * MiB + shard))
        for i in range(FILES):
            (corpus / f"shard-{i % 3}" / f"s{i:05d}.json").write_bytes(b'{"i": %d}' % i)
        want = tree_of(corpus)
        # How long a whole request takes here (the command's start-up, then the
        # copy): the kills land from well before its end to just after it.
        started = time.monotonic()
        subprocess.run([*shinglefs_command(), "snapshot", str(corpus),
                        str(fs.mountpoint / "corpus@whole")], check=True, timeout=120)
        whole = time.monotonic() - started
        made = 0
        for trial in range(trials):
            request = subprocess.Popen(
                [*shinglefs_command(), "snapshot", str(corpus),
                 str(fs.mountpoint / f"corpus@{trial}")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(rng.uniform(0.6, 1.1) * whole)
            fs.kill()
            request.wait(60)
            fs.start()
            drop_caches()
            copy = fs.mountpoint / f"corpus@{trial}"
            if copy.exists():
                assert tree_of(copy) == want, f"trial {trial}: a partial copy"
                made += 1
            assert tree_of(corpus) == want, f"trial {trial}: the corpus changed"
        print(f"snapshot sigkill loop: {trials} trials, {made} copies made whole, "
              f"{trials - made} absent")
    finally:
        fs.stop()
    outcome = crashloop.run_fsck(fs.meta_url)
    assert outcome.unexpected(crashes=trials) == {}, outcome.found


def test_a_killed_snapshot_is_all_or_nothing(tmp_path: Path) -> None:
    snapshot_kill_trials(tmp_path, 2, seed=25)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_snapshot_sigkill_loop_soak(tmp_path: Path) -> None:
    snapshot_kill_trials(tmp_path, int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40")),
                         seed=int(time.time()))
