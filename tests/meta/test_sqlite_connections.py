"""SQLite: one connection per thread, and no more than the threads alive."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO


def open_files_on(path: Path) -> int:
    """Descriptors of this process open on ``path`` (the database file itself)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            pass
    return count


def test_threads_that_come_and_go_do_not_pile_up_connections(tmp_path: Path) -> None:
    """The FUSE loop replaces idle worker threads: each one used the metadata
    once. Before, every such thread left a connection (and its 64 MiB page
    cache) open for the life of the mount."""
    db = tmp_path / "meta.db"
    meta = open_meta(f"sqlite3://{db}")
    meta.format("test", str(uuid.uuid4()), secret="s3cret")
    try:
        def one_lookup() -> None:
            meta.getattr(ROOT_INO)

        for _ in range(50):
            worker = threading.Thread(target=one_lookup)
            worker.start()
            worker.join()
        one_lookup()  # a new connection in this thread prunes the ended ones
        # This thread's, the last worker's (pruned by the next new one), the
        # checkpointer's and the formatter's: a handful, not one per thread ever.
        assert open_files_on(db) <= 5
    finally:
        meta.close()


FORKED = """
import os, sys, uuid
from pathlib import Path
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO
from tests.meta.test_sqlite_connections import open_files_on

db = Path(sys.argv[1])
meta = open_meta(f"sqlite3://{db}")
meta.format("test", str(uuid.uuid4()), secret="s3cret")
made = meta.mkdir(ROOT_INO, b"before-fork", 0o755)
pid = os.fork()
if pid == 0:  # the child
    code = 1
    try:
        # what the parent had open (its checkpointer's connection too)
        before = open_files_on(db)
        seen = meta.lookup(ROOT_INO, b"before-fork").ino == made.ino
        opened = open_files_on(db) - before  # before the child's own writes
        meta.mkdir(ROOT_INO, b"in-child", 0o755)
        meta.mkdir(ROOT_INO, b"in-child-2", 0o755)
        code = 0 if seen and opened == 1 else 2
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert meta.lookup(ROOT_INO, b"in-child").is_dir
# The parent writes on: its counter deltas must not collide with the child's.
meta.mkdir(ROOT_INO, b"after-fork", 0o755)
meta.mkdir(ROOT_INO, b"after-fork-2", 0o755)
assert meta.statfs().inodes == 6, meta.statfs()
meta.close()
print("ok")
"""


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    """The backend knows its process id without a system call per transaction
    (kept current across fork): a child forked after the parent used the
    database must not use the parent's connection (SQLite forbids carrying a
    connection over fork), but open its own and see the parent's commits; and
    both write on without their counter deltas colliding (the child draws its
    own writer id). In a fresh interpreter: a thread of another test's, left in
    SQLite at the fork, would hold SQLite's process-wide mutexes in the child."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", FORKED, str(tmp_path / "meta.db")],
                          capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ,
                               "PYTHONPATH": os.pathsep.join((str(root / "src"), str(root)))})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
