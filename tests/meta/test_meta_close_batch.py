"""``close_files`` closes linked files in batches of one statement; every other
case (a file open twice, closed twice in one call, unlinked while open, more
inodes than one statement takes) keeps the one-by-one semantics."""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

from shinglefs.meta.api import ROOT_INO, SessionInfo
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.engine.sessions import CLOSES_PER_STATEMENT
from shinglefs.meta.errors import FsError


def open_count(meta: SqlMetaStore, session: int) -> int:
    return int(meta.backend.run(
        lambda tx: tx.one("SELECT COALESCE(SUM(opens), 0) FROM open_files WHERE session = ?",
                          (session,)), "read")[0])


def test_a_mixed_batch_closes_each_handle_once(meta: SqlMetaStore,
                                               check: Callable[[], None]) -> None:
    s = meta.register_session(SessionInfo(host="batch"))
    many = [meta.create(ROOT_INO, b"f%d" % i, 0o644, session=s).ino
            for i in range(CLOSES_PER_STATEMENT + 20)]
    twice = meta.create(ROOT_INO, b"twice", 0o644, session=s).ino
    meta.open_file(s, twice)
    held = meta.create(ROOT_INO, b"held", 0o644, session=s).ino
    meta.open_file(s, held)
    gone = meta.create(ROOT_INO, b"gone", 0o644, session=s).ino
    meta.unlink(ROOT_INO, b"gone")
    assert open_count(meta, s) == len(many) + 5

    # twice: both its handles; held: one of two; gone: its last (freed).
    freed = meta.close_files(s, [*many, twice, held, gone, twice])
    assert freed == [gone]
    assert open_count(meta, s) == 1  # held's second handle
    with pytest.raises(FsError) as err:
        meta.getattr(gone)
    assert err.value.errno == errno.ENOENT
    assert all(meta.getattr(ino).nlink == 1 for ino in [*many[:3], twice, held])
    meta.unlink(ROOT_INO, b"held")
    assert meta.close_files(s, [held]) == [held]
    assert open_count(meta, s) == 0
    check()
