"""``SqlCore``: what every concern of the engine shares — one backend, one way to
run a transaction, id allocation, row locks, and freeing an inode.

Every concern class (``namespace``, ``rename``, ``attrs``, ``xattrs``,
``chunks``, ``sessions``, ``format``) derives from ``SqlCore`` and builds its
public methods the same way: check the arguments, then hand a closure over them
to ``_run`` as ONE transaction, which the backend retries whole on a
serialization failure. The closure therefore keeps no state across attempts
other than what it returns.

Ids (inodes, slices, sessions) are allocated *before* the transaction starts,
from a per-process batch refilled by one autocommit UPDATE, so an operation's
transaction never includes an allocation and a retry never reuses a failed id.

Freeing is shared because three concerns end an inode's life: the namespace
(last link removed), rename (a replaced target) and sessions (last close).

The statfs counters change by appended deltas (``schema.ADD_DELTA``), one row
per change keyed by this store's random writer id and sequence, so concurrent
writers never meet on a counter row; every ``FOLD_EVERY`` deltas this store
folds all deltas into the base row (``_fold``), which keeps the table short.
"""

from __future__ import annotations

import errno as E
import itertools
import logging
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from shinglefs.errors import ShingleError
from shinglefs.meta import schema as S
from shinglefs.meta.api import MetaStore
from shinglefs.meta.backend import Backend, Mode, Tx
from shinglefs.meta.errors import FsError, NotFormatted
from shinglefs.meta.records import CHUNK_SIZE, FormatInfo, InodeAttr, is_inline_slice

log = logging.getLogger(__name__)
_rng = random.SystemRandom()  # not the module's: an application's seeded sequence is its own; fork-safe

T = TypeVar("T")
FOLD_EVERY = 4096
"""Counter deltas a store appends between two folds of every delta into the base."""
ID_BATCH = {"inode": 1024, "slice": 1024, "session": 1}
"""Ids taken from the database at once, per kind and process."""


def now_ns() -> int:
    return time.time_ns()


def deref_slices(tx: Tx, counts: Mapping[int, int], now: int) -> None:
    """Drop ``counts`` references per slice inside ``tx``; a slice reaching zero is
    queued for deletion, or, an inline slice (no drive copy), deleted with its
    bytes at once. The one place that decides a slice's end (engine and fsck)."""
    for sid, n in sorted(counts.items()):
        row = tx.one(S.DEREF_SLICE, (n, sid))
        if row is not None and row[0] <= 0:
            if is_inline_slice(sid):
                tx.run(S.DEL_INLINE, (sid,))
                tx.run(S.DEL_SLICE, (sid,))
                continue
            tx.run(S.DOOM_SLICE, (sid,))
            tx.run(S.QUEUE_DELETION, (sid, now))


def attr_of(row: Sequence[Any], offset: int = 0) -> InodeAttr:
    """The ``InodeAttr`` in a row of ``schema.INODE_COLS`` starting at ``offset``."""
    return InodeAttr(*row[offset : offset + 12])


def enoent(ino: int) -> FsError:
    return FsError(E.ENOENT, f"no inode {ino}", ino=ino)


class SqlCore(MetaStore):
    """The backend and the helpers every concern of ``SqlMetaStore`` uses.

    Abstract: each concern class implements its part of ``MetaStore`` (so the
    type checker holds every signature to the contract), and ``SqlMetaStore``
    composes them all.

    Thread-safe: the id batches are guarded by a lock; the backend gives each
    thread its own connection. After ``fork`` the id batches are dropped so
    parent and child never hand out the same id.
    """

    durability: str
    url_where: str

    def __init__(self, backend: Backend) -> None:
        self._b = backend
        self.durability = backend.durability
        self.url_where = backend.where
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._ids: dict[str, tuple[int, int]] = {}
        self._writer = _rng.getrandbits(62)
        self._seq = itertools.count()
        self._appended = 0
        self._chunk_size = CHUNK_SIZE
        self._formatted = False

    @property
    def backend(self) -> Backend:
        """The backend under this store, for maintenance in this package
        (``check``, ``fsck``, ``dump``) and for tests that must build a state
        the API refuses to make (an older schema, ``LINK_MAX`` links).

        ``backend.run(fn, mode)`` runs ``fn`` as one transaction but bypasses
        every rule of the engine (permissions, counters, reference counts):
        what it writes must leave the database consistent by itself."""
        return self._b

    # ---- transactions --------------------------------------------------------------

    def _run(self, fn: Callable[[Tx], T], mode: Mode = "write") -> T:
        result = self._b.run(fn, mode)
        if self._appended >= FOLD_EVERY:
            self._fold()
        return result

    def _alloc(self, name: str) -> int:
        """A fresh id of kind ``name`` (``ID_BATCH``), outside any transaction."""
        with self._lock:
            if self._pid != os.getpid():
                self._forked()
            nxt, end = self._ids.get(name, (0, 0))
            if nxt >= end:
                batch = ID_BATCH[name]
                row = self._run(lambda tx: tx.one(S.ALLOC_IDS, (batch, name)), "autocommit")
                if row is None:
                    raise NotFormatted(f"{self.url_where} has no id counters; format it first")
                end = row[0]
                nxt = end - batch
            self._ids[name] = (nxt + 1, end)
            return nxt

    def _lock_rows(self, tx: Tx, *inos: int | None) -> None:
        """Row-lock the inodes an operation will modify, in ascending order (see
        ``schema.lock_inodes``); a no-op on SQLite."""
        if not self._b.dialect.row_locks:
            return
        wanted = S.in_list(sorted({i for i in inos if i is not None}))
        if wanted:
            tx.all(S.lock_inodes(len(wanted)), wanted)

    def format_info(self) -> FormatInfo:
        """The format record (``MetaStore.format_info``); here because every
        concern depends on it (the chunk size, "formatted yet?")."""
        row = self._run(lambda tx: tx.one(S.SEL_FORMAT), "single")
        if row is None:
            raise NotFormatted(
                f"{self.url_where} holds no ShingleFS file system",
                hint="format it first: `shinglefs format URL --drive KIND:PATH:SIZE`",
            )
        return FormatInfo(*row[:7])

    def _require_formatted(self) -> None:
        if not self._formatted:
            # Another process may have formatted meanwhile.
            info = self.format_info()
            self._chunk_size = info.chunk_size
            self._formatted = True

    # ---- counters, references, freeing ------------------------------------------------

    def _delta_key(self) -> tuple[int, int]:
        """A fresh ``(writer, seq)`` key for a counter delta, unique across
        processes (a forked child draws its own writer id)."""
        if os.getpid() != self._pid:
            with self._lock:
                if os.getpid() != self._pid:
                    self._forked()
        self._appended += 1
        return self._writer, next(self._seq)

    def _forked(self) -> None:
        """This store was carried into a forked child (called under ``_lock``):
        the parent's id batches and counter-delta writer id are the parent's
        alone. Whichever of ``_alloc``/``_delta_key`` notices first calls it,
        so both see a new process exactly once."""
        self._ids.clear()
        self._pid = os.getpid()
        self._writer = _rng.getrandbits(62)

    def _counters(self, tx: Tx, used_delta: int, inode_delta: int) -> None:
        """Append a change of the statfs counters (no shared row: module docstring)."""
        tx.put(S.ADD_DELTA, (*self._delta_key(), used_delta, inode_delta))

    def _fold(self) -> None:
        """Move every counter delta into the base row, in one transaction. Best
        effort: a failure (another store folding at once, meta unreachable) is
        logged and the next fold catches up; the sum never changes."""
        self._appended = 0

        def txn(tx: Tx) -> None:
            used, inodes, count = tx.one(S.SUM_DELTAS)
            if count:
                tx.run(S.DEL_DELTAS)
                tx.run(S.ADD_COUNTERS, (int(used), int(inodes), 0))

        try:
            self._b.run(txn, "write")
        except ShingleError as exc:
            log.debug("folding the counter deltas failed (the next fold retries): %s", exc)

    def _deref(self, tx: Tx, counts: Counter[int], now: int) -> None:
        deref_slices(tx, counts, now)

    def _free_inode(self, tx: Tx, ino: int, size: int, now: int) -> None:
        """Delete an inode that has no links and is open nowhere, with its content."""
        refs = tx.all(S.SEL_REF_SLICES_OF, (ino,))
        if refs:
            tx.run(S.DEL_REFS_OF, (ino,))
            tx.run(S.DEL_CHUNKS_OF, (ino,))
            self._deref(tx, Counter(r[0] for r in refs), now)
        tx.run(S.DEL_XATTRS_OF, (ino,))
        tx.run(S.DEL_INODE, (ino,))
        self._counters(tx, -size, -1)

    def _free_if_orphan(self, tx: Tx, ino: int, now: int) -> bool:
        """Free ``ino`` if it has no link left and no session holds it open."""
        row = tx.one(S.SEL_INODE, (ino,))
        if row is None or row[4] > 0:
            return False
        if tx.one(S.IS_OPEN, (ino,)) is not None:
            return False
        self._free_inode(tx, ino, row[5], now)
        return True
