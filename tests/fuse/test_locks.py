"""flock and POSIX (fcntl/lockf) locks between two processes on the mount.

ShingleFS implements no lock handlers, so the kernel keeps the locks itself:
they exclude processes of this host, and only of this host (docs/mount.md).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuse

# The child tries a non-blocking lock of the given kind and prints the outcome.
CHILD = textwrap.dedent(
    """
    import fcntl, sys
    path, kind = sys.argv[1], sys.argv[2]
    with open(path, "r+b") as f:
        try:
            if kind == "flock":
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif kind == "lockf":
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
            else:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 100)
        except OSError as exc:
            print("blocked", exc.errno)
        else:
            print("acquired")
    """
)


def try_lock_in_child(path: Path, kind: str) -> str:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), kind], capture_output=True,
                         text=True, timeout=30, check=True)
    return out.stdout.split()[0]


def test_flock_excludes_a_second_process_until_released(mnt: Path) -> None:
    path = mnt / "flocked"
    path.write_bytes(b"x" * 200)
    with open(path, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        assert try_lock_in_child(path, "flock") == "blocked"
        fcntl.flock(f, fcntl.LOCK_UN)
        assert try_lock_in_child(path, "flock") == "acquired"


def test_lockf_byte_ranges_exclude_only_overlapping_ranges(mnt: Path) -> None:
    path = mnt / "ranged"
    path.write_bytes(b"x" * 200)
    with open(path, "r+b") as f:
        fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)  # bytes 0..9
        assert try_lock_in_child(path, "lockf") == "blocked"
        assert try_lock_in_child(path, "lockf-other-range") == "acquired"
        fcntl.lockf(f, fcntl.LOCK_UN, 10, 0)
        assert try_lock_in_child(path, "lockf") == "acquired"


def test_lock_holder_exit_releases_the_lock(mnt: Path) -> None:
    path = mnt / "released"
    path.write_bytes(b"")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl,sys,time; f=open(sys.argv[1],'r+b'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); sys.stdin.readline()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with open(path, "r+b") as f:
            with pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder.kill()
            holder.wait(timeout=10)
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert os.path.exists(path)
