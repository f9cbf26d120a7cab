"""Races against the operations that run under snapshot isolation on PostgreSQL.

create, mkdir, mknod and symlink run at REPEATABLE READ there (backend mode
"snapshot"), on the argument that every row they read they also write or
lock. These processes race them against what would exploit a gap in that
argument: rmdir of the directory they create in, unlink of the file
``open(O_CREAT)`` opens, and expiry of the session they open in. Afterwards
``check_consistency`` must find nothing (no entry under a removed directory,
no open record of a freed inode, counters exact) once the next expiry pass
has collected the open records of sessions expired under their create.
"""

from __future__ import annotations

import errno as E
import multiprocessing as mp
from collections.abc import Callable

from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO, SessionInfo
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import FsError

SPAWN = mp.get_context("spawn")
ROUNDS = 150
EXPECTED = {E.ENOENT, E.EEXIST, E.ENOTEMPTY, E.ESTALE}


def _tolerated(unexpected: list[str], op: Callable[..., object], *args: object) -> FsError | None:
    """Run ``op(*args)``; an FsError it raises is returned (and noted when not EXPECTED)."""
    try:
        op(*args)
    except FsError as exc:
        if exc.errno not in EXPECTED:
            unexpected.append(f"{exc!r}")
        return exc
    return None


def _open_and_create(store: SqlMetaStore, session: int, name: bytes) -> None:
    d = store.lookup(ROOT_INO, b"d")
    f = store.create(d.ino, b"f", 0o644, exclusive=False, session=session)
    store.create(d.ino, name, 0o644)
    store.close_file(session, f.ino)


def _create_and_unlink(store: SqlMetaStore, name: bytes) -> None:
    d = store.lookup(ROOT_INO, b"d")
    store.create(d.ino, name, 0o644)
    store.unlink(d.ino, name)  # the directory is empty most of the time


def _opener(store: SqlMetaStore, index: int, unexpected: list[str]) -> None:
    session = store.register_session(SessionInfo(host="opener", pid=index))
    for i in range(ROUNDS):
        failed = _tolerated(unexpected, _open_and_create, store, session, b"g%d-%d" % (index, i))
        if failed is not None and failed.errno == E.ESTALE:  # the session expired under us
            session = store.register_session(SessionInfo(host="opener", pid=index))


def _remover(store: SqlMetaStore, index: int, unexpected: list[str]) -> None:
    def empty_and_remove() -> None:
        d = store.lookup(ROOT_INO, b"d")
        store.unlink(d.ino, b"f")
        for entry in store.readdir(d.ino):
            store.unlink(d.ino, entry.name)
        store.rmdir(ROOT_INO, b"d")

    for i in range(ROUNDS):
        _tolerated(unexpected, empty_and_remove)
        _tolerated(unexpected, store.mkdir, ROOT_INO, b"d", 0o755)
        if i % 10 == 0:
            store.expire_sessions(0.0)  # every session, live or not, as a janitor might


def _create_unlink(store: SqlMetaStore, index: int, unexpected: list[str]) -> None:
    for i in range(300):
        _tolerated(unexpected, _create_and_unlink, store, b"c%d-%d" % (index, i))


def _rmdir_mkdir(store: SqlMetaStore, index: int, unexpected: list[str]) -> None:
    for _ in range(600):
        _tolerated(unexpected, store.rmdir, ROOT_INO, b"d")
        _tolerated(unexpected, store.mkdir, ROOT_INO, b"d", 0o755)


WORKERS = {f.__name__: f for f in (_opener, _remover, _create_unlink, _rmdir_mkdir)}


def _worker(name: str, url: str, index: int, out) -> None:  # type: ignore[no-untyped-def]
    """Run ``WORKERS[name]`` on its own store; put the unexpected errors in ``out``."""
    store = open_meta(url)
    unexpected: list[str] = []
    try:
        assert isinstance(store, SqlMetaStore)
        WORKERS[name](store, index, unexpected)
    except Exception as exc:  # pragma: no cover - reported by the test
        unexpected.append(repr(exc))
    finally:
        out.put(unexpected)
        store.close()


def race(url: str, *workers: str) -> list[list[str]]:
    """Run the named workers as processes at once; each one's unexpected errors."""
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_worker, args=(name, url, i, out))
             for i, name in enumerate(workers)]
    for p in procs:
        p.start()
    problems = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(30)
    return problems


def test_creates_racing_rmdir_unlink_and_session_expiry_stay_consistent(
        meta: SqlMetaStore, meta_url: str, check: Callable[[], None]) -> None:
    meta.mkdir(ROOT_INO, b"d", 0o755)
    assert race(meta_url, "_opener", "_opener", "_remover") == [[], [], []]
    # An open record of a session expired under its create is collected by the
    # next expiry pass (schema.SEL_STRAY_OPEN), which expires nothing live here.
    meta.expire_sessions(3600.0)
    check()
    meta.expire_sessions(0.0)
    check()


def test_a_create_never_lands_in_a_directory_removed_after_it_looked(
        meta: SqlMetaStore, meta_url: str, check: Callable[[], None]) -> None:
    """rmdir committing between a create's read of the parent and its write:
    the create must fail (ENOENT on its next attempt), never leave its entry
    under the removed directory (check: an entry in no directory)."""
    meta.mkdir(ROOT_INO, b"d", 0o755)
    assert race(meta_url, "_create_unlink", "_create_unlink", "_rmdir_mkdir") == [[], [], []]
    check()
