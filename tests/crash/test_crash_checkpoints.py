"""The SIGKILL loop of ``shinglefs up`` under checkpoint commits with keep-last-N.

The ML engineer's promise (README, docs/architecture.md "Ordered commits"):
a checkpoint written under a temporary name, fsynced and renamed to its
final name, then the directory fsynced, survives any crash; the last N steps
are kept. ``tests/support/ckptload.py`` saves checkpoints in a loop on an
``up`` mount, each step three ways (``torch.save`` + ``os.replace``, a 2-rank
``torch.distributed.checkpoint`` into ``step-N.tmp/`` renamed to ``step-N/``,
safetensors + rename) and keeps the last N steps: either the file system does
(``shinglefs policy --retention keep-last=N``, docs/client.md "Retention": a
crash may come at any point of its rename-out-then-remove) or the workload
deletes the older steps itself, as scripts that manage their own do. The loop
(``crashloop.sigkill_trials``) SIGKILLs the daemon at a random instant after
the first step, runs ``up`` again and checks through the new mount: every
journaled committed checkpoint is present (unless retention deleted it, then
it was not one of the N newest) and loads back, with its own tool, equal to the
tensors its step derives; nothing half-visible under a final name; no file
reads EIO; at most N + 1 (N + 2 with the file system's retention, which runs
after the commit) checkpoints of a kind; fsck finds only the
documented crash leftovers (one unknown slice per open file: two ranks).

The default run makes 2 trials; ``-m slow`` runs ``SHINGLEFS_CRASH_TRIALS`` (40).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import ckptload, crashloop  # noqa: E402

from shinglefs.fuse.harness import UpMount  # noqa: E402

pytestmark = pytest.mark.fuse

pytest.importorskip("torch")
pytest.importorskip("safetensors")

KEEP = 3


def checkpoint_trials(tmp_path: Path, trials: int, seed: int,
                      retention: str = "workload") -> list[crashloop.Trial]:
    fs = UpMount(tmp_path / "data", tmp_path / "mnt")
    fs.format()  # the directories: the first start formats
    journal = tmp_path / "journal"
    meta_url = fs.meta_url if retention == "filesystem" else None
    return crashloop.sigkill_trials(fs, journal, trials, seed,
                                    workload=ckptload.loop_workload(fs.mountpoint, journal,
                                                                    KEEP, meta_url))


@pytest.mark.parametrize("retention", ["workload", "filesystem"])
def test_sigkill_of_up_loses_no_committed_checkpoint(tmp_path: Path, retention: str) -> None:
    results = checkpoint_trials(tmp_path, trials=2, seed=21, retention=retention)
    # Every trial got past its first step, so each checked at least 3 checkpoints.
    assert all(r.verdict.closed_ok >= 3 for r in results)
    print(crashloop.summary(f"up checkpoint sigkill loop ({retention} retention)", results))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("retention", ["workload", "filesystem"])
def test_sigkill_loop_soak_on_up_checkpoints(tmp_path: Path, retention: str) -> None:
    trials = int(os.environ.get("SHINGLEFS_CRASH_TRIALS", "40"))
    print(crashloop.summary(f"up checkpoint sigkill loop ({retention} retention)",
                            checkpoint_trials(tmp_path, trials, seed=int(time.time()),
                                              retention=retention)))
