"""Consistency checks of a metadata database (the core of a future fsck).

A list of small named passes, each one bulk SQL query (as S3QL's fsck does).
``check_consistency`` runs them all in one read snapshot and returns every
problem found; an empty list means the namespace, the content map, the slice
reference counts and the statfs counters agree with each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shinglefs.meta.api import ROOT_INO
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine import SqlMetaStore


@dataclass(frozen=True, slots=True)
class Problem:
    """One inconsistency: the pass that found it and what it saw."""

    check: str
    detail: str


def _file_nlink(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT i.ino, i.nlink, (SELECT COUNT(*) FROM dentries d WHERE d.ino = i.ino) "
        f"FROM inodes i WHERE i.mode < {0o040000} OR i.mode >= {0o050000}"
    )
    return [f"inode {r[0]} has nlink {r[1]} but {r[2]} entries" for r in rows if r[1] != r[2]]


def _dir_nlink(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT p.ino, p.nlink, (SELECT COUNT(*) FROM dentries d JOIN inodes c ON c.ino = d.ino "
        f"WHERE d.parent = p.ino AND c.mode >= {0o040000} AND c.mode < {0o050000}) "
        f"FROM inodes p WHERE p.mode >= {0o040000} AND p.mode < {0o050000}"
    )
    return [
        f"directory {r[0]} has nlink {r[1]} but {r[2]} subdirectories"
        for r in rows
        if r[1] != 2 + r[2]
    ]


def _dangling_entries(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT d.parent, d.name, d.ino FROM dentries d LEFT JOIN inodes i ON i.ino = d.ino "
        "WHERE i.ino IS NULL"
    )
    return [f"entry {bytes(r[1])!r} in {r[0]} points at missing inode {r[2]}" for r in rows]


def _entries_in_non_dirs(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT d.parent, d.name FROM dentries d LEFT JOIN inodes p ON p.ino = d.parent "
        f"WHERE p.ino IS NULL OR p.mode < {0o040000} OR p.mode >= {0o050000}"
    )
    return [f"entry {bytes(r[1])!r} lives in {r[0]}, which is no directory" for r in rows]


def _orphans(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT i.ino FROM inodes i WHERE i.ino <> ? AND i.nlink = 0 "
        "AND NOT EXISTS (SELECT 1 FROM open_files o WHERE o.ino = i.ino)",
        (ROOT_INO,),
    )
    return [f"inode {r[0]} has no links and is open nowhere (leaked)" for r in rows]


def _dir_parents(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT c.ino, c.parent, d.parent FROM inodes c JOIN dentries d ON d.ino = c.ino "
        f"WHERE c.mode >= {0o040000} AND c.mode < {0o050000} AND c.parent <> d.parent"
    )
    out = [f"directory {r[0]} records parent {r[1]} but lives in {r[2]}" for r in rows]
    # Every directory reaches the root (no cycles): walk parents in memory.
    parent = dict(
        tx.all(f"SELECT ino, parent FROM inodes WHERE mode >= {0o040000} AND mode < {0o050000}")
    )
    for ino in parent:
        cur, seen = ino, 0
        while cur != ROOT_INO and seen <= len(parent):
            cur = parent.get(cur, ROOT_INO)
            seen += 1
        if cur != ROOT_INO:
            out.append(f"directory {ino} does not reach the root (cycle)")
    return out


def _counters(tx: Tx) -> list[str]:
    used, inodes = tx.one(
        "SELECT COALESCE(SUM(used_bytes), 0), COALESCE(SUM(inodes), 0) FROM counters"
    )
    real_inodes, real_used = tx.one("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM inodes")
    out = []
    if int(inodes) != int(real_inodes):
        out.append(f"inode counter says {inodes}, table holds {real_inodes}")
    if int(used) != int(real_used):
        out.append(f"used-bytes counter says {used}, sizes sum to {real_used}")
    return out


def _chunk_nrefs(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT c.ino, c.chunk_index, c.nrefs, (SELECT COUNT(*) FROM chunk_refs r "
        "WHERE r.ino = c.ino AND r.chunk_index = c.chunk_index) FROM chunks c"
    )
    out = [f"chunk {r[1]} of {r[0]} says {r[2]} refs, holds {r[3]}" for r in rows if r[2] != r[3]]
    rows = tx.all(
        "SELECT DISTINCT r.ino, r.chunk_index FROM chunk_refs r LEFT JOIN chunks c "
        "ON c.ino = r.ino AND c.chunk_index = r.chunk_index WHERE c.ino IS NULL"
    )
    out += [f"refs of chunk {r[1]} of {r[0]} have no chunk row" for r in rows]
    rows = tx.all(
        "SELECT DISTINCT r.ino FROM chunk_refs r LEFT JOIN inodes i ON i.ino = r.ino "
        "WHERE i.ino IS NULL"
    )
    out += [f"chunk refs of missing inode {r[0]}" for r in rows]
    return out


def _slice_refcounts(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT s.id, s.refcount, s.state, (SELECT COUNT(*) FROM chunk_refs r "
        "WHERE r.slice_id = s.id) FROM slices s"
    )
    out = []
    for sid, refcount, state, real in rows:
        if refcount != real:
            out.append(f"slice {sid} has refcount {refcount} but {real} references")
        if state == "to_delete" and real:
            out.append(f"slice {sid} is queued for deletion but still referenced")
        if state == "committed" and not real:
            out.append(f"slice {sid} is committed but unreferenced and not queued")
    rows = tx.all(
        "SELECT s.id FROM slices s LEFT JOIN deletions q ON q.slice_id = s.id "
        "WHERE s.state = 'to_delete' AND q.slice_id IS NULL"
    )
    out += [f"slice {r[0]} is to_delete but not in the deletion queue" for r in rows]
    rows = tx.all(
        "SELECT DISTINCT r.slice_id FROM chunk_refs r LEFT JOIN slices s ON s.id = r.slice_id "
        "WHERE s.id IS NULL"
    )
    out += [f"chunk refs point at unknown slice {r[0]}" for r in rows]
    return out


def _open_files(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT o.session, o.ino FROM open_files o LEFT JOIN sessions s ON s.id = o.session "
        "WHERE s.id IS NULL"
    )
    return [f"inode {r[1]} is held open by unknown session {r[0]}" for r in rows]


PASSES: list[tuple[str, Callable[[Tx], list[str]]]] = [
    ("file_nlink", _file_nlink),
    ("dir_nlink", _dir_nlink),
    ("dangling_entries", _dangling_entries),
    ("entries_in_non_dirs", _entries_in_non_dirs),
    ("orphans", _orphans),
    ("dir_parents", _dir_parents),
    ("counters", _counters),
    ("chunk_nrefs", _chunk_nrefs),
    ("slice_refcounts", _slice_refcounts),
    ("open_files", _open_files),
]


def check_consistency(store: SqlMetaStore) -> list[Problem]:
    """Run every pass in one read snapshot; returns all problems (empty = consistent)."""

    def txn(tx: Tx) -> list[Problem]:
        problems: list[Problem] = []
        for name, check in PASSES:
            problems += [Problem(name, detail) for detail in check(tx)]
        return problems

    result: Any = store._b.run(txn, "read")
    return list(result)
