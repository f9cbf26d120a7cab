"""The SIGKILL loop of the crash tests, for a mount on any metadata backend.

``sigkill_trials`` runs the shared workload (``crashload.py``) in a child
process against a real mount, SIGKILLs the mount's daemon at a random
instant, mounts again, checks every promise (``crashload.verify``), unmounts
cleanly; ``shinglefs fsck``'s check runs on the metadata right after the kill
and after the clean unmount: it must report nothing but what a crash is
documented to leave (``CRASH_LEFTOVERS``). ``shared_sigkill_trials`` kills a
``shinglefs up`` daemon while another process writes through ``connect()``
(the drives' owner dies under a client it serves). ``sigkill_trials`` runs
another workload given as a ``LoopWorkload`` (tests/support/ckptload.py's
checkpoint commits: ``ckptload.loop_workload``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import crashload

from shinglefs.cli.recovery import EXIT_DAMAGED
from shinglefs.client.recovery import fsck as check_filesystem
from shinglefs.fuse.harness import MountedFileSystem, UpMount

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


def start_workload(*args: str, stderr: Path | None = None, script: str = WORKLOAD
                   ) -> subprocess.Popen[bytes]:
    """``crashload.py ARGS`` (or another ``script``) as a child process in its
    own process group; its stderr to a pipe, or appended to the file ``stderr``
    (a child that logs while the test waits on it cannot fill a pipe and block)."""
    if stderr is None:
        return subprocess.Popen([sys.executable, script, *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
    with open(stderr, "ab") as err:
        return subprocess.Popen([sys.executable, script, *args], stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)


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

    def unexpected(self, crashes: int, open_files: int = 1) -> dict[str, list[str]]:
        """Findings no crash is documented to leave, or more of them than
        ``crashes`` crashes may leave (each with at most ``open_files`` files
        open: an unknown slice per open file)."""
        def allowed(k: str) -> int:
            return CRASH_LEFTOVERS.get(k, 0) * crashes * (open_files if k == "unknown_slices"
                                                         else 1)
        return {k: v for k, v in self.found.items() if len(v) > allowed(k)}


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


@dataclass
class LoopWorkload:
    """What a SIGKILL loop runs on the mount and checks after it.

    ``start(tag, stderr)`` starts the child of one trial (in its own process
    group, its stderr appended to the file); ``verify()`` checks every promise
    through the new mount; ``ready``: a journal line ``READY TAG`` to wait for
    (at most ``LIMIT_S``) before the random delay, for a child that takes long
    to start (None: none); ``open_files``: how many files it may have open at
    once (each may leave one unknown slice at a crash)."""

    start: Callable[[str, Path], subprocess.Popen[bytes]]
    verify: Callable[[], crashload.Verdict]
    ready: str | None = None
    open_files: int = 1


def posix_workload(fs: MountedFileSystem, journal: Path) -> LoopWorkload:
    """crashload's POSIX workload on ``fs``'s mount, checked by ``crashload.verify``."""
    return LoopWorkload(
        start=lambda tag, _err: start_workload("posix", str(fs.mountpoint), str(journal), tag),
        verify=lambda: crashload.verify(crashload.posix_reader(fs.mountpoint), journal,
                                        closed_promised=True))


def sigkill_trials(fs: MountedFileSystem, journal: Path, trials: int, seed: int,
                   *, fsck: bool = True, workload: LoopWorkload | None = None) -> list[Trial]:
    """``trials`` rounds of: mount, workload (``posix_workload`` unless one is
    given), SIGKILL of the daemon after 0.3-2.5 s (after its ``ready`` line),
    fsck, mount again, verify, unmount, fsck. ``fs`` is formatted and not
    mounted. Fails (AssertionError) at the first broken promise or unexpected
    fsck finding, with the mount's log."""
    work = workload or posix_workload(fs, journal)
    rng = random.Random(seed)
    results = []
    try:
        for trial in range(trials):
            fs.start()
            tag, crashes = f"t{trial}", trial + 1
            err = journal.with_name(f"{journal.name}.{tag}.stderr")
            child = work.start(tag, err)
            try:
                if work.ready is not None:
                    wait_journaled(journal, work.ready, tag, child, err)
                time.sleep(rng.uniform(0.3, 2.5))
                fs.kill()  # SIGKILL of the daemon, wherever it is
            finally:
                stop(child)
            crashed = run_fsck(fs.meta_url) if fsck else FsckOutcome(0)
            assert not crashed.unexpected(crashes, work.open_files), (
                f"trial {trial}: fsck after the kill found "
                f"{crashed.unexpected(crashes, work.open_files)}")
            fs.start()
            verdict = work.verify()
            assert not verdict.problems, (f"trial {trial}: {verdict.problems[:10]}\n"
                                          f"{fs.log_text()[-3000:]}")
            code = fs.stop()
            assert code == 0, f"trial {trial}: the mount exited {code}\n{fs.log_text()}"
            outcome = run_fsck(fs.meta_url) if fsck else FsckOutcome(0)
            assert not outcome.unexpected(crashes, work.open_files), (
                f"trial {trial}: fsck after the remount found "
                f"{outcome.unexpected(crashes, work.open_files)}")
            results.append(Trial(verdict, crashed, outcome))
    finally:
        fs.stop()
    return results


LIMIT_S = 120.0
"""How long the loop waits for a child's next step: a bound against a hang,
not a timing assertion."""


def journaled(journal: Path, kind: str, tag: str) -> list[str] | None:
    """The words of the first journal line ``KIND TAG ...`` (or ``closed``
    of a file of ``tag``), None while there is none."""
    for words in crashload.journal_lines(journal):
        if words[0] == kind and (words[1] == tag or words[1].split("/")[-1].startswith(tag + "-")):
            return words
    return None


def wait_journaled(journal: Path, kind: str, tag: str, child: subprocess.Popen[bytes],
                   stderr: Path) -> list[str]:
    """Wait (at most ``LIMIT_S``) for ``journaled(journal, kind, tag)``; fails
    with the child's ``stderr`` file if it exits or hangs first."""
    deadline = time.monotonic() + LIMIT_S
    while (words := journaled(journal, kind, tag)) is None:
        if child.poll() is not None or time.monotonic() > deadline:
            stop(child)
            raise AssertionError(f"{tag}: no '{kind}' in the journal (child exit "
                                 f"{child.returncode}):\n{tail(stderr)}")
        time.sleep(0.01)
    return words


def tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


@dataclass
class SharedTrial(Trial):
    """A trial of ``shared_sigkill_trials``: also what the ``connect()``
    client journaled while the daemon was dead (``failed``/``dead-read``/
    ``dead-write`` errno names or ``ok``)."""

    seen: dict[str, str] = field(default_factory=dict)


def shared_sigkill_trials(fs: UpMount, journal: Path, trials: int, seed: int
                          ) -> list[SharedTrial]:
    """``trials`` rounds of: ``up``, the workload through ``connect()`` in another
    process (``crashload.run_shared``) until it has closed a file, SIGKILL of
    the daemon 0.3-2.5 s later, the client's first failure and its probes of
    the dead owner (each bounded by ``LIMIT_S``), fsck, ``up`` again, the
    same client handle writes once more, verify every promise through the new
    mount, unmount, fsck. Fails (AssertionError) at the first broken promise,
    unexpected fsck finding, non-``OSError`` failure or hang."""
    rng = random.Random(seed)
    results = []
    try:
        for trial in range(trials):
            tag = f"s{trial}"
            fs.start()
            err = journal.with_name(f"{journal.name}.{tag}.stderr")
            child = start_workload("api-shared", fs.meta_url, str(journal), tag, stderr=err)
            try:
                wait_journaled(journal, "closed", tag, child, err)  # a new connect() works
                time.sleep(rng.uniform(0.3, 2.5))
                fs.kill()
                seen = {kind: wait_journaled(journal, kind, tag, child, err)[2]
                        for kind in ("failed", "dead-read", "dead-write")}
                crashed = run_fsck(fs.meta_url)
                assert not crashed.unexpected(trial + 1), (
                    f"trial {trial}: fsck after the kill found {crashed.unexpected(trial + 1)}")
                fs.start()
                Path(f"{journal}.{tag}.resume").touch()
                child.wait(LIMIT_S)
                assert child.returncode == 0, (f"trial {trial}: client exit {child.returncode}"
                                               f"\n{tail(err)}")
                stale = journaled(journal, "stale", tag)
                assert stale is None, f"trial {trial}: the client's handle after up: {stale}"
            finally:
                stop(child)
            verdict = crashload.verify(crashload.posix_reader(fs.mountpoint), journal,
                                       closed_promised=True)
            assert not verdict.problems, (f"trial {trial}: {verdict.problems[:10]}\n"
                                          f"{fs.log_text()[-3000:]}")
            code = fs.stop()
            assert code == 0, f"trial {trial}: up exited {code}\n{fs.log_text()}"
            outcome = run_fsck(fs.meta_url)
            assert not outcome.unexpected(trial + 1), (
                f"trial {trial}: fsck after the restart found {outcome.unexpected(trial + 1)}")
            results.append(SharedTrial(verdict, crashed, outcome, seen))
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
