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


def _opener(url: str, index: int, out) -> None:  # type: ignore[no-untyped-def]
    store = open_meta(url)
    unexpected: list[str] = []
    session = store.register_session(SessionInfo(host="opener", pid=index))
    try:
        for i in range(ROUNDS):
            try:
                d = store.lookup(ROOT_INO, b"d")
                f = store.create(d.ino, b"f", 0o644, exclusive=False, session=session)
                store.create(d.ino, b"g%d-%d" % (index, i), 0o644)
                store.close_file(session, f.ino)
            except FsError as exc:
                if exc.errno == E.ESTALE:  # the session was expired under us
                    session = store.register_session(SessionInfo(host="opener", pid=index))
                elif exc.errno not in EXPECTED:
                    unexpected.append(f"{exc!r}")
    except Exception as exc:  # pragma: no cover - reported below
        unexpected.append(repr(exc))
    finally:
        out.put(unexpected)
        store.close()


def _remover(url: str, out) -> None:  # type: ignore[no-untyped-def]
    store = open_meta(url)
    unexpected: list[str] = []
    try:
        for i in range(ROUNDS):
            try:
                d = store.lookup(ROOT_INO, b"d")
                store.unlink(d.ino, b"f")
                for entry in store.readdir(d.ino):
                    store.unlink(d.ino, entry.name)
                store.rmdir(ROOT_INO, b"d")
            except FsError as exc:
                if exc.errno not in EXPECTED:
                    unexpected.append(f"{exc!r}")
            try:
                store.mkdir(ROOT_INO, b"d", 0o755)
            except FsError as exc:
                if exc.errno not in EXPECTED:
                    unexpected.append(f"{exc!r}")
            if i % 10 == 0:
                store.expire_sessions(0.0)  # every session, live or not, as a janitor might
    except Exception as exc:  # pragma: no cover - reported below
        unexpected.append(repr(exc))
    finally:
        out.put(unexpected)
        store.close()


def test_creates_racing_rmdir_unlink_and_session_expiry_stay_consistent(
        meta: SqlMetaStore, meta_url: str, check: Callable[[], None]) -> None:
    meta.mkdir(ROOT_INO, b"d", 0o755)
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_opener, args=(meta_url, i, out)) for i in range(2)]
    procs.append(SPAWN.Process(target=_remover, args=(meta_url, out)))
    for p in procs:
        p.start()
    problems = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(30)
    assert problems == [[], [], []]
    # An open record of a session expired under its create is collected by the
    # next expiry pass (schema.SEL_STRAY_OPEN), which expires nothing live here.
    meta.expire_sessions(3600.0)
    check()
    meta.expire_sessions(0.0)
    check()


def _create_unlink(url: str, index: int, out) -> None:  # type: ignore[no-untyped-def]
    store = open_meta(url)
    unexpected: list[str] = []
    try:
        for i in range(300):
            name = b"c%d-%d" % (index, i)
            try:
                d = store.lookup(ROOT_INO, b"d")
                store.create(d.ino, name, 0o644)
                store.unlink(d.ino, name)  # the directory is empty most of the time
            except FsError as exc:
                if exc.errno not in EXPECTED:
                    unexpected.append(f"{exc!r}")
    except Exception as exc:  # pragma: no cover - reported below
        unexpected.append(repr(exc))
    finally:
        out.put(unexpected)
        store.close()


def _rmdir_mkdir(url: str, out) -> None:  # type: ignore[no-untyped-def]
    store = open_meta(url)
    unexpected: list[str] = []
    try:
        for _ in range(600):
            for op in (lambda: store.rmdir(ROOT_INO, b"d"),
                       lambda: store.mkdir(ROOT_INO, b"d", 0o755)):
                try:
                    op()
                except FsError as exc:
                    if exc.errno not in EXPECTED:
                        unexpected.append(f"{exc!r}")
    except Exception as exc:  # pragma: no cover - reported below
        unexpected.append(repr(exc))
    finally:
        out.put(unexpected)
        store.close()


def test_a_create_never_lands_in_a_directory_removed_after_it_looked(
        meta: SqlMetaStore, meta_url: str, check: Callable[[], None]) -> None:
    """rmdir committing between a create's read of the parent and its write:
    the create must fail (ENOENT on its next attempt), never leave its entry
    under the removed directory (check: an entry in no directory)."""
    meta.mkdir(ROOT_INO, b"d", 0o755)
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_create_unlink, args=(meta_url, i, out)) for i in range(2)]
    procs.append(SPAWN.Process(target=_rmdir_mkdir, args=(meta_url, out)))
    for p in procs:
        p.start()
    problems = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(30)
    assert problems == [[], [], []]
    check()
