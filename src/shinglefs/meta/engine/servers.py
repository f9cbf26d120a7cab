"""Storage-server membership and the cluster secret.

A storage server registers itself (address, labels, drives with capacity and
free bytes), heartbeats, and unregisters on a clean stop. Its row stays after
a stop or a crash: the id is what replicas will name, so a server restarted
with the same drives rejoins under it. Which registration a starting server
is: the row sharing the most drive uuids with it (a drive's uuid lives in its
own header, so a server that moved to another address is still found); for
drives without a uuid (zoned block devices), the row at the same address
with the same drive specs; otherwise a new id from the ``server`` counter.

Liveness is judged by the reader: a server is live while it runs (not
stopped) and its last heartbeat is younger than the timeout the reader
passes. Heartbeat times are the server's clock and ages the reader's, so the
hosts' clocks must agree to well within the timeout (NTP).

Servers and clients of different versions share the drive records (JSON in
the ``servers`` row): a reader ignores a key it does not know and defaults a
missing optional one (``_drive_of``): from this version on, a heartbeat of a
newer server that adds a field breaks no reader (an older one's still may).

Drive states: an operator takes a drive offline (``set_drive_state``; a row of
``drive_states``, which heartbeats never touch), clients leave it out of
placement, and the servers drain it (server/repair.py); online again deletes
the row.

The cluster secret is the format record's ``secret``. A file system
formatted before secrets were created at format time holds an empty one;
the first caller of ``cluster_secret`` stores a random one in a transaction
that writes only while it is still empty, so of two first callers at once
both get the one that committed first.

A storage server's orphan sweep (server/sweep.py) asks what records a batch
of the slices its drives hold (``slice_records``: one read transaction, an
index lookup of the ids in ``slices`` and one in ``slice_replicas``), and
claims those with no record (``claim_orphans``): in one transaction, each id
without a row and below the ``slice`` id counter gets a ``to_delete`` row
naming the server's drive as its replica and a deletion-queue entry leased
for ``hold_s``. The row is inserted
with ``ON CONFLICT DO NOTHING``, so of a claim and a commit of the same id
(whose upsert refuses a ``to_delete`` row) exactly one wins, on SQLite and on
PostgreSQL alike. The statements are this module's (``schema`` holds the
others').

Forgetting a server (``forget_server``, ``shinglefs forget-server``) takes a
stopped one out for good, in transactions of at most ``SLICE_RECORDS_BATCH``
slices so that no transaction or memory grows with the cluster: page after
page of the slices with a replica on it (a range scan of the replicas'
primary key from the last id done: ``(slice_id, server, drive)``, nothing
is held between pages), its replicas leave the records -- readers stop
trying it, and the repair pass copies the slices under their goal from the
remaining copies -- and a TO_DELETE slice is treated as if the server had
acknowledged its deletion (``ack_replica_deletions``: with no replica left
its record and queue entry go, else its lease ends for the other holders).
A COMMITTED slice left with no replica keeps its record, replica-less: its
bytes are lost (reads fail, ``ReplicationHealth.lost`` counts it). Last, in
one transaction that finds no replica naming the server any more and the
server still not live, its drive states and its registration go. Each step
is idempotent, so a forget interrupted anywhere is completed by running it
again; run again after it completed, it cleans what named the id since (a
repairer that read the record before it, say) and changes nothing else.
A server started again with the same drives finds no registration sharing
a drive with it and registers under a new id (ids are never reused).
"""

from __future__ import annotations

import errno as E
import json
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import fields
from functools import partial
from typing import Any

from shinglefs.meta import schema as S
from shinglefs.meta.api import SLICE_RECORDS_BATCH
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine.core import SqlCore, now_ns
from shinglefs.meta.errors import FsError, NotFormatted
from shinglefs.meta.records import (
    SERVER_TIMEOUT_S,
    TIERS,
    Replica,
    ServerDrive,
    ServerRecord,
    SliceInfo,
    SliceState,
)

log = logging.getLogger(__name__)

DRIVE_STATES = ("offline",)
"""The states a drive may be put in (``set_drive_state``); no state: online."""
SECRET_BYTES = 32
"""Random bytes of a generated cluster secret (stored as 64 hex characters)."""


def _sel_slice_rows(count: int) -> str:
    """The slice rows of ``count`` ids (``?`` each)."""
    return ("SELECT id, length, grp, state, refcount FROM slices "
            f"WHERE id IN ({S.in_marks(count)})")


def _sel_replica_rows(count: int) -> str:
    """Every replica row of ``count`` slice ids (``?`` each). Apart from the slice
    rows, not joined to them: PostgreSQL plans the join as a hash join over a
    scan of every replica row (20 ms a page of 500 at 130,000 rows, growing with
    the table); each alone is an index scan (under 1 ms)."""
    return ("SELECT slice_id, server, drive FROM slice_replicas "
            f"WHERE slice_id IN ({S.in_marks(count)}) ORDER BY slice_id, server, drive")


SEL_NEXT_SLICE_ID = "SELECT next_id FROM ids WHERE name = 'slice'"
INS_ORPHAN = (
    "INSERT INTO slices (id, length, grp, state, refcount, created_ns) "
    "VALUES (?, ?, 0, 'to_delete', 0, ?) ON CONFLICT (id) DO NOTHING"
)
INS_ORPHAN_REPLICA = (
    "INSERT INTO slice_replicas (slice_id, server, drive) VALUES (?, ?, ?) "
    "ON CONFLICT (slice_id, server, drive) DO NOTHING"
)
QUEUE_ORPHAN = (
    "INSERT INTO deletions (slice_id, queued_ns, lease_ns) VALUES (?, ?, ?) "
    "ON CONFLICT (slice_id) DO NOTHING"
)
# ---- forgetting a server (module docstring) --------------------------------------
SEL_SERVER_ROW = "SELECT heartbeat_ns, stopped_ns FROM servers WHERE id = ?"
SEL_NEXT_SERVER_ID = "SELECT next_id FROM ids WHERE name = 'server'"
# Replica rows on server ? above slice id ?, in key order: a range scan of the
# primary key that stops at the limit (a page of ``server_slices``/``forget_server``).
SEL_SLICES_ON = (
    "SELECT slice_id FROM slice_replicas WHERE slice_id > ? AND server = ? "
    "ORDER BY slice_id LIMIT ?"
)
SEL_ANY_ON = "SELECT slice_id FROM slice_replicas WHERE server = ? LIMIT 1"
FIRST_PAGE = -(1 << 63)
"""The ``after`` of a forget's first page: below every 64-bit slice id."""


def _del_replicas_on(count: int) -> str:
    return f"DELETE FROM slice_replicas WHERE server = ? AND slice_id IN ({S.in_marks(count)})"


def _sel_emptied(count: int) -> str:
    """The TO_DELETE slices among ``count`` ids that no replica row names any more."""
    return (f"SELECT id FROM slices WHERE state = 'to_delete' AND id IN ({S.in_marks(count)}) "
            "AND NOT EXISTS (SELECT 1 FROM slice_replicas r WHERE r.slice_id = slices.id)")


def _del_deletions(count: int) -> str:
    return f"DELETE FROM deletions WHERE slice_id IN ({S.in_marks(count)})"


def _del_slices(count: int) -> str:
    return f"DELETE FROM slices WHERE id IN ({S.in_marks(count)})"


def _end_leases(count: int) -> str:
    return f"UPDATE deletions SET lease_ns = 0 WHERE slice_id IN ({S.in_marks(count)})"


def _records(tx: Tx, ids: Sequence[int]) -> dict[int, SliceInfo]:
    """The records of those of ``ids`` (at most ``SLICE_RECORDS_BATCH``) that have
    one, with their replicas, by id."""
    if not ids:
        return {}
    ids = S.in_list(ids)
    replicas: dict[int, list[Replica]] = {}
    for sid, server, drive in tx.all(_sel_replica_rows(len(ids)), ids):
        replicas.setdefault(int(sid), []).append(Replica(server, drive))
    return {int(r[0]): SliceInfo(int(r[0]), r[1], r[2], SliceState(r[3]), r[4],
                                 tuple(replicas.get(int(r[0]), ())))
            for r in sorted(tx.all(_sel_slice_rows(len(ids)), ids))}


def _forget_replicas(tx: Tx, server: str, after: int) -> list[int]:
    """One page of ``forget_server``: the replicas on ``server`` of the next
    ``SLICE_RECORDS_BATCH`` slice ids above ``after`` leave their records, as
    ``ack_replica_deletions`` would for TO_DELETE ones; the ids done."""
    ids = sorted({int(r[0]) for r in tx.all(SEL_SLICES_ON, (after, server, SLICE_RECORDS_BATCH))})
    if not ids:
        return ids
    padded = S.in_list(ids)
    tx.run(_del_replicas_on(len(padded)), (server, *padded))
    emptied = S.in_list([int(r[0]) for r in tx.all(_sel_emptied(len(padded)), padded)])
    if emptied:
        tx.run(_del_deletions(len(emptied)), emptied)
        tx.run(_del_slices(len(emptied)), emptied)
    tx.run(_end_leases(len(padded)), padded)  # the others' holders may take them at once
    return ids


def _forgettable(tx: Tx, server_id: int, timeout_s: float) -> bool:
    """Whether server ``server_id`` is registered (False: forgotten already).
    EBUSY while it is live; ENOENT for an id never handed out."""
    row = tx.one(SEL_SERVER_ROW, (server_id,))
    if row is None:
        counter = tx.one(SEL_NEXT_SERVER_ID)
        if counter is None or not 0 < server_id < int(counter[0]):
            raise FsError(E.ENOENT, f"no storage server {server_id} was ever registered",
                          hint="server ids as `shinglefs status URL --servers` lists them")
        return False
    heartbeat_ns, stopped_ns = int(row[0]), int(row[1])
    age_s = (now_ns() - heartbeat_ns) / 1e9
    if stopped_ns == 0 and age_s <= timeout_s:
        raise FsError(E.EBUSY, f"storage server {server_id} is up (last heartbeat "
                               f"{max(age_s, 0.0):.1f} s ago)",
                      hint="stop its `shinglefs server` process first (SIGTERM), "
                           "then run this again")
    return True


def _check_batch(count: int) -> None:
    if count > SLICE_RECORDS_BATCH:
        raise FsError(E.EINVAL, f"{count} slice ids in one call; at most {SLICE_RECORDS_BATCH}")


def _drives_json(drives: Sequence[ServerDrive]) -> str:
    return json.dumps([
        {"drive_id": d.drive_id, "spec": d.spec, "uuid": d.uuid, "tier": d.tier,
         "capacity_bytes": d.capacity_bytes, "free_bytes": d.free_bytes}
        for d in drives
    ], sort_keys=True)


DRIVE_FIELDS = frozenset(f.name for f in fields(ServerDrive))
"""The keys of a drive's JSON record this version reads."""
_unknown_logged: set[str] = set()


def _drive_of(record: Mapping[str, Any]) -> ServerDrive:
    """A drive's JSON record as written by any version: a key this version does
    not know is ignored (logged once per key at debug); a missing optional one
    defaulted -- ``uuid`` None, ``tier`` by the spec's kind (``conventional``:
    hot, else cold), ``free_bytes`` 0 (nothing is placed on it until its server
    heartbeats). ``FsError`` (EIO) when ``drive_id``, ``spec`` or
    ``capacity_bytes`` is missing."""
    for key in record.keys() - DRIVE_FIELDS - _unknown_logged:
        _unknown_logged.add(key)
        log.debug("a storage server's drive record has a key this version ignores: %r", key)
    known = {k: v for k, v in record.items() if k in DRIVE_FIELDS}
    missing = {"drive_id", "spec", "capacity_bytes"} - known.keys()
    if missing:
        raise FsError(E.EIO, f"a storage server's drive record lacks {sorted(missing)}: "
                             f"{dict(record)!r}")
    known.setdefault("uuid", None)
    known.setdefault("tier", "hot" if str(known["spec"]).startswith("conventional:")
                     else "cold")
    known.setdefault("free_bytes", 0)
    return ServerDrive(**known)


def _drives_of(text: str) -> tuple[ServerDrive, ...]:
    """The drives of a server row's JSON (``_drive_of`` each)."""
    return tuple(_drive_of(d) for d in json.loads(text))


def _check_drives(drives: Sequence[ServerDrive]) -> None:
    ids = [d.drive_id for d in drives]
    if not drives or len(set(ids)) != len(ids):
        raise FsError(E.EINVAL, f"a server needs drives with distinct ids, got {ids}")
    for d in drives:
        if d.tier not in TIERS or not d.spec or min(d.capacity_bytes, d.free_bytes) < 0:
            raise FsError(E.EINVAL, f"bad drive record {d!r} (tier one of {TIERS})")


def _check_labels(labels: Mapping[str, str]) -> None:
    if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()):
        raise FsError(E.EINVAL, f"labels are non-empty string keys with string values: "
                                f"{dict(labels)!r}")


def _same_server(rows: Sequence[Any], address: str,
                 drives: Sequence[ServerDrive]) -> int | None:
    """The id of the registration ``drives`` belong to (module docstring), or None."""
    uuids = {d.uuid for d in drives if d.uuid is not None}
    best, best_shared = None, 0
    for row in rows:
        shared = len(uuids & {d.uuid for d in _drives_of(row[3]) if d.uuid is not None})
        if shared > best_shared:
            best, best_shared = row[0], shared
    if best is not None:
        return int(best)
    specs = sorted(d.spec for d in drives if d.uuid is None)
    for row in rows:
        if row[1] == address and specs and sorted(
                d.spec for d in _drives_of(row[3]) if d.uuid is None) == specs:
            return int(row[0])
    return None


class ServerOps(SqlCore):
    """register_server, heartbeat_server, list_servers, unregister_server,
    forget_server and server_slices, drive states (set_drive_state,
    drive_states), cluster_secret, and the orphan sweep's slice_records and
    claim_orphans."""

    def register_server(self, address: str, drives: Sequence[ServerDrive],
                        labels: Mapping[str, str] | None = None) -> int:
        labels = dict(labels or {})
        if not address:
            raise FsError(E.EINVAL, "a server registers with a non-empty address")
        _check_drives(drives)
        _check_labels(labels)
        drives_text = _drives_json(drives)
        labels_text = json.dumps(labels, sort_keys=True)

        def txn(tx: Tx) -> int:
            now = now_ns()
            known = _same_server(tx.all(S.SEL_SERVERS), address, drives)
            if known is not None:
                tx.run(S.REJOIN_SERVER, (address, labels_text, drives_text, now, now, known))
                return known
            row = tx.one(S.ALLOC_IDS, (1, "server"))
            if row is None:
                raise NotFormatted(f"{self.url_where} has no id counters; format it first")
            server_id = int(row[0]) - 1
            tx.run(S.INS_SERVER, (server_id, address, labels_text, drives_text, now, now))
            return server_id

        self._require_formatted()
        return self._run(txn)

    def heartbeat_server(self, server_id: int, drives: Sequence[ServerDrive], *,
                         at_ns: int | None = None) -> None:
        _check_drives(drives)
        text = _drives_json(drives)
        at = now_ns() if at_ns is None else at_ns
        if not self._run(lambda tx: tx.run(S.HEARTBEAT_SERVER, (at, text, server_id)),
                         "autocommit"):
            raise FsError(E.ESTALE, f"server {server_id} is not registered (stopped or removed)",
                          hint="register again")

    def list_servers(self, timeout_s: float = SERVER_TIMEOUT_S) -> list[ServerRecord]:
        rows = self._run(lambda tx: tx.all(S.SEL_SERVERS), "read")
        cutoff = now_ns() - int(timeout_s * 1e9)
        return [
            ServerRecord(int(r[0]), r[1], dict(json.loads(r[2])), _drives_of(r[3]), int(r[4]),
                         int(r[5]), int(r[6]), live=r[6] == 0 and r[5] >= cutoff)
            for r in rows
        ]

    def unregister_server(self, server_id: int, *, forget: bool = False) -> None:
        if forget:
            def txn(tx: Tx) -> None:
                tx.run(S.DEL_SERVER, (server_id,))
                tx.run(S.DEL_DRIVE_STATES_OF, (server_id,))

            self._run(txn)
        else:
            self._run(lambda tx: tx.run(S.STOP_SERVER, (now_ns(), server_id)), "autocommit")

    def set_drive_state(self, server_id: int, drive_id: int, state: str | None) -> None:
        if state is not None and state not in DRIVE_STATES:
            raise FsError(E.EINVAL, f"a drive state is one of {DRIVE_STATES} (or online), "
                                    f"got {state!r}")

        def txn(tx: Tx) -> None:
            rows = [r for r in tx.all(S.SEL_SERVERS) if int(r[0]) == server_id]
            if not rows:
                raise FsError(E.ENOENT, f"no storage server {server_id} is registered")
            if drive_id not in {d.drive_id for d in _drives_of(rows[0][3])}:
                raise FsError(E.ENOENT, f"storage server {server_id} has no drive {drive_id}")
            if state is None:
                tx.run(S.DEL_DRIVE_STATE, (server_id, drive_id))
            else:
                tx.run(S.SET_DRIVE_STATE, (server_id, drive_id, state, now_ns()))

        self._run(txn)

    def drive_states(self) -> dict[tuple[int, int], str]:
        rows = self._run(lambda tx: tx.all(S.SEL_DRIVE_STATES), "read")
        return {(int(r[0]), int(r[1])): str(r[2]) for r in rows}

    def slice_records(self, slice_ids: Sequence[int]) -> dict[int, SliceInfo]:
        ids = sorted(set(slice_ids))
        _check_batch(len(ids))
        if not ids:
            return {}
        return self._run(lambda tx: _records(tx, ids), "read")

    def server_slices(self, server_id: int, after: int = FIRST_PAGE,
                      limit: int = SLICE_RECORDS_BATCH) -> list[SliceInfo]:
        _check_batch(limit)

        def txn(tx: Tx) -> list[SliceInfo]:
            ids = sorted({int(r[0]) for r in tx.all(SEL_SLICES_ON, (after, str(server_id), limit))})
            return list(_records(tx, ids).values())

        return self._run(txn, "read")

    def forget_server(self, server_id: int, timeout_s: float = SERVER_TIMEOUT_S) -> int:
        server = str(server_id)
        self._run(lambda tx: _forgettable(tx, server_id, timeout_s), "read")
        changed = 0

        def last(tx: Tx) -> bool:
            registered = _forgettable(tx, server_id, timeout_s)
            if tx.one(SEL_ANY_ON, (server,)) is not None:  # named since: another round
                return False
            if registered:
                tx.run(S.DEL_DRIVE_STATES_OF, (server_id,))
                tx.run(S.DEL_SERVER, (server_id,))
            return True

        while True:
            after = FIRST_PAGE  # any row SEL_ANY_ON can find, whatever its id
            while done := self._run(partial(_forget_replicas, server=server, after=after)):
                changed += len(done)
                after = done[-1]
            if self._run(last):
                log.info("storage server %d forgotten: %d slice records named it", server_id,
                         changed)
                return changed

    def claim_orphans(self, server_id: int, drive_id: int, lengths: Mapping[int, int],
                      hold_s: float) -> list[int]:
        _check_batch(len(lengths))
        if not lengths:
            return []

        def txn(tx: Tx) -> list[int]:
            now = now_ns()
            row = tx.one(SEL_NEXT_SLICE_ID)
            ceiling = int(row[0]) if row is not None else 0
            claimed = []
            for sid in sorted(lengths):
                if sid >= ceiling or not tx.run(INS_ORPHAN, (sid, lengths[sid], now)):
                    continue
                tx.run(INS_ORPHAN_REPLICA, (sid, str(server_id), str(drive_id)))
                tx.run(QUEUE_ORPHAN, (sid, now, now + int(hold_s * 1e9)))
                claimed.append(sid)
            return claimed

        return self._run(txn)

    def cluster_secret(self) -> str:
        secret = self.format_info().secret
        if secret:
            return secret
        candidate = secrets.token_hex(SECRET_BYTES)

        def txn(tx: Tx) -> str:
            tx.run(S.SET_SECRET_IF_EMPTY, (candidate,))
            row = tx.one(S.SEL_FORMAT)
            if row is None:
                raise NotFormatted(f"{self.url_where} holds no ShingleFS file system",
                                   hint="format it first: `shinglefs format URL --drive ...`")
            return str(row[5])

        return self._run(txn)
