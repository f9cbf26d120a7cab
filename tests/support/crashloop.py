"""The SIGKILL loop of the crash tests, for a mount on any metadata backend.

``sigkill_trials`` runs the shared workload (``crashload.py``) in a child
process against a real mount, SIGKILLs the mount's daemon at a random
instant, mounts again, checks every promise (``crashload.verify``), unmounts
cleanly; ``shinglefs fsck``'s check runs on the metadata right after the kill
and after the clean unmount: it must report nothing but what a crash is
documented to leave (``CRASH_LEFTOVERS``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import crashload

from shinglefs.cli.recovery import EXIT_DAMAGED
from shinglefs.client.recovery import fsck as check_filesystem
from shinglefs.fuse.harness import MountedFileSystem

WORKLOAD = str(Path(crashload.__file__).resolve())

CRASH_LEFTOVERS = {
    # The killed daemon's session: expired by a live client's maintenance
    # after session_timeout (docs/client.md "Crash model"); fsck sees its
    # process gone at once. One per crash.
    "stale_sessions": 1,
    # A small file's piece written in the instant before its commit: bytes on
    # the drive meta never heard of, at most one per open file (docs/client.md
    # "Crash model"); the workload has one file open at a time.
    "unknown_slices": 1,
}
"""fsck passes that may report findings after a SIGKILL: at most this many
per crash so far (nothing repairs them between trials)."""


def start_workload(*args: str) -> subprocess.Popen[bytes]:
    """``crashload.py ARGS`` as a child process in its own process group."""
    return subprocess.Popen([sys.executable, WORKLOAD, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def stop(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the workload's process group (if still running) and reap it."""
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(60)


@dataclass
class FsckOutcome:
    """What fsck found: the command's exit code and the findings per pass."""

    code: int
    found: dict[str, list[str]] = field(default_factory=dict)

    def unexpected(self, crashes: int) -> dict[str, list[str]]:
        """Findings no crash is documented to leave, or more of them than
        ``crashes`` crashes may leave."""
        return {k: v for k, v in self.found.items()
                if len(v) > CRASH_LEFTOVERS.get(k, 0) * crashes}


def run_fsck(meta_url: str) -> FsckOutcome:
    """What ``shinglefs fsck META_URL`` reports (``client.recovery.fsck``, the
    command's work, in this process: a command costs seconds of start-up on a
    busy machine). Check only; the drives must be free."""
    report = check_filesystem(meta_url)
    return FsckOutcome(0 if report.clean else EXIT_DAMAGED,
                       {k: [f.detail for f in v] for k, v in report.found.items() if v})


@dataclass
class Trial:
    """One trial's verification and the fscks of it: right after the kill
    (what the crash left, before a mount touched it) and after the remount's
    clean unmount."""

    verdict: crashload.Verdict
    fsck_crashed: FsckOutcome
    fsck: FsckOutcome


def sigkill_trials(fs: MountedFileSystem, journal: Path, trials: int, seed: int,
                   *, fsck: bool = True) -> list[Trial]:
    """``trials`` rounds of: mount, workload, SIGKILL of the daemon after
    0.3-2.5 s, fsck, mount again, verify, unmount, fsck. ``fs`` is formatted
    and not mounted. Fails (AssertionError) at the first broken promise or
    unexpected fsck finding, with the mount's log."""
    rng = random.Random(seed)
    results = []
    try:
        for trial in range(trials):
            fs.start()
            child = start_workload("posix", str(fs.mountpoint), str(journal), f"t{trial}")
            time.sleep(rng.uniform(0.3, 2.5))
            fs.kill()  # SIGKILL of the daemon, wherever it is
            stop(child)
            crashed = run_fsck(fs.meta_url) if fsck else FsckOutcome(0)
            assert not crashed.unexpected(trial + 1), (
                f"trial {trial}: fsck after the kill found {crashed.unexpected(trial + 1)}")
            fs.start()
            verdict = crashload.verify(crashload.posix_reader(fs.mountpoint), journal,
                                       closed_promised=True)
            assert not verdict.problems, (f"trial {trial}: {verdict.problems[:10]}\n"
                                          f"{fs.log_text()[-3000:]}")
            code = fs.stop()
            assert code == 0, f"trial {trial}: the mount exited {code}\n{fs.log_text()}"
            outcome = run_fsck(fs.meta_url) if fsck else FsckOutcome(0)
            assert not outcome.unexpected(trial + 1), (
                f"trial {trial}: fsck after the remount found {outcome.unexpected(trial + 1)}")
            results.append(Trial(verdict, crashed, outcome))
    finally:
        fs.stop()
    return results


def summary(kind: str, results: list[Trial]) -> str:
    """One line: trials, files checked, closed intact, mid-write prefixes, and
    what fsck found after the last kill (every crash's leftovers so far)."""
    left = {k: len(v) for k, v in results[-1].fsck_crashed.found.items()} if results else {}
    return (f"{kind}: {len(results)} trials, "
            f"{sum(r.verdict.files_checked for r in results)} files checked, "
            f"{sum(r.verdict.closed_ok for r in results)} closed intact, "
            f"{sum(r.verdict.partial_ok for r in results)} mid-write prefixes, 0 problems; "
            f"fsck after the last kill: {left or 'clean'}")
