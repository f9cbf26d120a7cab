"""Client sessions, the files they hold open, and the deletion queue.

A session is a mounted client (heartbeat, open files). An inode whose last
link goes while some session holds it open stays until the last close or the
session's expiry, which then frees it (``SqlCore._free_if_orphan``). Freed
content dereferences slices; a slice at refcount zero waits in the deletion
queue until the storage side pops it (leased, so a crashed consumer's slices
are offered again) and acknowledges it. Slices a crashed writer never
committed (``abandoned_slices``) join the queue through ``discard_slices``.
A storage server takes only the queued slices with a copy on its drives
(``pop_deletions_on``) and acknowledges its own copies
(``ack_replica_deletions``): the record goes with the last copy.
"""

from __future__ import annotations

import errno as E
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from shinglefs.meta import schema as S
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine.chunks import slice_info
from shinglefs.meta.engine.core import SqlCore, enoent, now_ns
from shinglefs.meta.engine.namespace import open_in_session
from shinglefs.meta.errors import FsError, SliceStateError
from shinglefs.meta.records import (
    INLINE_SLICE_BIT,
    Replica,
    Session,
    SessionInfo,
    SliceInfo,
    SliceState,
)

CLOSES_PER_STATEMENT = 512
"""Inodes one ``close_linked`` statement closes at most."""


class SessionOps(SqlCore):
    """Sessions (register, heartbeat, expire), open files (open/close), and the
    deletion queue (abandoned and discarded slices, pop and ack)."""

    # ---- sessions ------------------------------------------------------------------------

    def register_session(self, info: SessionInfo) -> int:
        sid = self._alloc("session")
        now = now_ns()
        self._run(
            lambda tx: tx.run(
                S.INS_SESSION, (sid, info.host, info.pid, info.mountpoint, info.version, now, now)
            ),
            "autocommit",
        )
        return sid

    def heartbeat(self, session: int) -> None:
        if not self._run(lambda tx: tx.run(S.HEARTBEAT, (now_ns(), session)), "autocommit"):
            raise FsError(E.ESTALE, f"session {session} has expired", hint="register again")

    def _end_session(self, tx: Tx, session: int, now: int) -> list[int]:
        """Close every file of ``session`` and remove it; the inodes freed."""
        inos = [r[0] for r in tx.all(S.SEL_OPEN_OF_SESSION, (session,))]
        tx.run(S.DEL_OPEN_OF_SESSION, (session,))
        tx.run(S.DEL_SESSION, (session,))
        return [ino for ino in inos if self._free_if_orphan(tx, ino, now)]

    def unregister_session(self, session: int) -> list[int]:
        return self._run(lambda tx: self._end_session(tx, session, now_ns()))

    def list_sessions(self) -> list[Session]:
        def txn(tx: Tx) -> list[Session]:
            out = []
            for r in tx.all(S.SEL_SESSIONS):
                inos = tuple(x[0] for x in tx.all(S.SEL_OPEN_OF_SESSION, (r[0],)))
                out.append(Session(r[0], SessionInfo(r[1], r[2], r[3], r[4]), r[5], r[6], inos))
            return out

        return self._run(txn, "read")

    def expire_sessions(self, timeout_s: float) -> list[int]:
        def txn(tx: Tx) -> list[int]:
            now = now_ns()
            expired = [r[0] for r in tx.all(S.SEL_EXPIRED, (now - int(timeout_s * 1e9),))]
            for sid in expired:
                self._end_session(tx, sid, now)
            for sid, ino in tx.all(S.SEL_STRAY_OPEN):  # S.SEL_STRAY_OPEN says how
                tx.run(S.DEL_OPEN, (sid, ino))
                self._free_if_orphan(tx, ino, now)
            return expired

        return self._run(txn)

    # ---- open files ----------------------------------------------------------------------

    def open_file(self, session: int, ino: int) -> None:
        def txn(tx: Tx) -> None:
            if tx.one(S.SEL_INODE, (ino,)) is None:
                raise enoent(ino)
            open_in_session(tx, session, ino)

        self._run(txn)

    def close_file(self, session: int, ino: int) -> bool:
        def txn(tx: Tx) -> bool:
            if tx.run(S.CLOSE_LINKED, (session, ino, ino)):
                return False
            row = tx.one(S.CLOSE_FILE, (session, ino))
            if row is None:
                return False
            if row[0] > 0:
                return False
            tx.put(S.DEL_OPEN, (session, ino))
            return self._free_if_orphan(tx, ino, now_ns())

        return self._run(txn)

    def close_files(self, session: int, inos: Sequence[int]) -> list[int]:
        # The common case, the last close of a linked file, for every inode
        # closed once here: one statement per batch, not one per inode.
        once = [ino for ino, n in Counter(inos).items() if n == 1]

        def txn(tx: Tx) -> list[int]:
            now = now_ns()
            freed = []
            closed: set[int] = set()
            for at in range(0, len(once), CLOSES_PER_STATEMENT):
                part = S.in_list(once[at:at + CLOSES_PER_STATEMENT])
                closed.update(r[0] for r in tx.all(S.close_linked(len(part)), (session, *part)))
            for ino in inos:
                if ino in closed or tx.run(S.CLOSE_LINKED, (session, ino, ino)):
                    continue
                row = tx.one(S.CLOSE_FILE, (session, ino))
                if row is None or row[0] > 0:
                    continue
                tx.put(S.DEL_OPEN, (session, ino))
                if self._free_if_orphan(tx, ino, now):
                    freed.append(ino)
            return freed

        return self._run(txn) if inos else []

    # ---- the deletion queue --------------------------------------------------------------

    def stored_slices(self, after: int = 0, limit: int = 1000) -> list[SliceInfo]:
        rows = self._run(lambda tx: tx.all(S.SEL_STORED_PAGE, (after, INLINE_SLICE_BIT, limit)),
                         "read")
        out: list[SliceInfo] = []
        for sid, length, grp, refcount, server, drive in rows:
            if not out or out[-1].id != sid:
                out.append(SliceInfo(sid, length, grp, SliceState.COMMITTED, refcount, ()))
            if server is not None:
                last = out[-1]
                out[-1] = replace(last, replicas=(*last.replicas, Replica(server, drive)))
        return out

    def abandoned_slices(self, older_than_s: float, limit: int = 1000) -> list[SliceInfo]:
        def txn(tx: Tx) -> list[SliceInfo]:
            cutoff = now_ns() - int(older_than_s * 1e9)
            ids = [r[0] for r in tx.all(S.SEL_ABANDONED, (cutoff, limit))]
            return [i for i in (slice_info(tx, sid) for sid in ids) if i is not None]

        return self._run(txn, "read")

    def discard_slices(self, slice_ids: Sequence[int]) -> list[int]:
        def txn(tx: Tx) -> list[int]:
            now = now_ns()
            queued = []
            for sid in sorted(set(slice_ids)):
                if tx.run(S.DISCARD_SLICE, (sid,)):
                    tx.run(S.QUEUE_DELETION, (sid, now))
                    queued.append(sid)
            return queued

        return self._run(txn)

    def pop_deletions(self, limit: int = 1000, lease_s: float = 60.0) -> list[SliceInfo]:
        def txn(tx: Tx) -> list[SliceInfo]:
            now = now_ns()
            ids = [r[0] for r in tx.all(S.SEL_DUE_DELETIONS, (now, limit))]
            out = []
            for sid in ids:
                tx.run(S.LEASE_DELETION, (now + int(lease_s * 1e9), sid))
                info = slice_info(tx, sid)
                if info is not None:
                    out.append(info)
            return out

        return self._run(txn)

    def ack_deletions(self, slice_ids: Sequence[int]) -> None:
        def txn(tx: Tx) -> None:
            for sid in slice_ids:
                row = tx.one(S.SEL_SLICE_STATE, (sid,))
                if row is not None and row[0] != SliceState.TO_DELETE.value:
                    raise SliceStateError(sid, row[0], "acknowledge its deletion")
                tx.run(S.DEL_DELETION, (sid,))
                tx.run(S.DEL_REPLICAS, (sid,))
                tx.run(S.DEL_SLICE, (sid,))

        self._run(txn)

    def pop_deletions_on(self, server_id: int, limit: int = 500,
                         lease_s: float = 60.0) -> list[SliceInfo]:
        server = str(server_id)
        # Every few seconds on every server, mostly with nothing due: one read
        # decides, and takes no write lock (SQLite) or serializable snapshot.
        due = (now_ns(), server, 1)
        if self._run(lambda tx: tx.one(S.SEL_DUE_DELETIONS_ON, due), "single") is None:
            return []

        def txn(tx: Tx) -> list[SliceInfo]:
            now = now_ns()
            ids = [r[0] for r in tx.all(S.SEL_DUE_DELETIONS_ON, (now, server, limit))]
            out = []
            for sid in ids:
                tx.run(S.LEASE_DELETION, (now + int(lease_s * 1e9), sid))
                row = tx.one(S.SEL_SLICE, (sid,))
                reps = tuple(Replica(r[0], r[1]) for r in tx.all(S.SEL_REPLICAS_ON, (sid, server)))
                out.append(SliceInfo(row[0], row[1], row[2], SliceState(row[3]), row[4], reps))
            return out

        return self._run(txn)

    def ack_replica_deletions(self, server_id: int, slice_ids: Sequence[int]) -> None:
        server = str(server_id)

        def txn(tx: Tx) -> None:
            for sid in sorted(set(slice_ids)):
                row = tx.one(S.SEL_SLICE_STATE, (sid,))
                if row is not None and row[0] != SliceState.TO_DELETE.value:
                    raise SliceStateError(sid, row[0], "acknowledge its deletion")
                tx.run(S.DEL_REPLICAS_ON, (sid, server))
                if tx.one(S.SEL_ANY_REPLICA, (sid,)) is None:  # every recorded copy is gone
                    tx.run(S.DEL_DELETION, (sid,))
                    tx.run(S.DEL_SLICE, (sid,))
                else:  # the next holder of a copy may take it at once
                    tx.run(S.LEASE_DELETION, (0, sid))

        self._run(txn)

