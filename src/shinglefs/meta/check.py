"""Consistency checks of a metadata database, and their repairs (the core of fsck).

A list of small named passes (as S3QL's fsck has), each finding its problems
with one bulk SQL query (or a few) and, where a fix is safe, repairing them in
one transaction. ``check_consistency`` runs the finds of ``META_PASSES`` and
returns every problem; an empty list means the namespace, the content map, the
slice reference counts and the statfs counters agree with each other.
``shinglefs.meta.fsck`` adds the passes that compare the metadata with what
the drives hold, and runs the repairs.

Repairs never delete file bytes that can still be read: entries pointing at
nothing are dropped, unreachable inodes are linked into ``/lost+found``,
counters are recomputed; only inodes nobody can reach or open (nlink 0, open
by no live session) are freed. A file whose inode row is lost gets it back
(``lost_inodes``: at its entries, else in ``/lost+found``); a committed slice
nothing references any more becomes ``/lost+found/slice-<id>``
(``slice_refcounts``); only slices already queued for deletion, or with no
stored byte, are deleted (WRITING slices are the janitor's). A missing root
directory is re-created with its entries (``root_dir``), and missing or low
id counters are restored past every id in use (``id_counters``): without
them the file system does not mount.

Each pass is one set-based query or a few (joins, GROUP BY), never a
subquery per row: the entries have no index by inode, so a per-inode lookup
would make a pass quadratic in the number of inodes.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shinglefs.meta import schema as S
from shinglefs.meta.api import (
    FIRST_COOKIE,
    INLINE_SLICE_BIT,
    ROOT_INO,
    MetaStore,
    is_inline_slice,
)
from shinglefs.meta.backend import Backend, Mode, Tx

DIR_LO, DIR_HI = stat.S_IFDIR, stat.S_IFDIR + 0o010000  # mode range of directories
LOST_FOUND = b"lost+found"


@dataclass(frozen=True, slots=True)
class Problem:
    """One inconsistency: the pass that found it and what it saw."""

    check: str
    detail: str


@dataclass(frozen=True, slots=True)
class Finding:
    """What a pass found: a line for the user and the row(s) its repair acts on."""

    detail: str
    key: tuple[Any, ...] = ()
    repairable: bool = True


@dataclass
class CheckContext:
    """What passes see besides the database.

    ``live_sessions``: the sessions that count as alive (None: every
    registered one, as the engine itself assumes). ``held``: per drive id,
    slice id -> bytes the drive holds (None: the drives were not read).
    ``drop_slice(slice_id)``: delete a slice from every drive holding it.
    ``log``: what repairs did, one line each (paths of truncated files...).
    """

    backend: Backend
    meta: MetaStore
    chunk_size: int
    live_sessions: frozenset[int] | None = None
    held: dict[int, dict[int, int]] | None = None
    drop_slice: Callable[[int], None] | None = None
    log: list[str] = field(default_factory=list)

    def run(self, fn: Callable[[Tx], Any], mode: Mode = "write") -> Any:
        return self.backend.run(fn, mode)


Find = Callable[[Tx, CheckContext], list[Finding]]
Repair = Callable[[CheckContext, list[Finding]], None]


@dataclass(frozen=True, slots=True)
class CheckPass:
    """A named pass: ``find`` runs in a read snapshot; ``repair`` (when safe) fixes."""

    name: str
    find: Find
    repair: Repair | None = None


def path_of(tx: Tx, ino: int) -> str:
    """A path of ``ino`` (through its first entry at each level), or ``<ino N>``."""
    parts: list[bytes] = []
    cur = ino
    for _ in range(4096):
        if cur == ROOT_INO:
            return "/" + "/".join(p.decode(errors="replace") for p in reversed(parts))
        row = tx.one("SELECT parent, name FROM dentries WHERE ino = ? LIMIT 1", (cur,))
        if row is None:
            break
        cur, name = row
        parts.append(bytes(name))
    return f"<inode {ino}>"


def paths_of(tx: Tx, inos: list[int]) -> dict[int, str]:
    """``path_of`` of each of ``inos``; for more than a few, the entries are read
    once (the entries have no index by inode: one lookup scans them all)."""
    if len(inos) <= PATHS_ONE_BY_ONE:
        return {ino: path_of(tx, ino) for ino in inos}
    up: dict[int, tuple[int, bytes]] = {}
    for parent, name, ino in tx.all("SELECT parent, name, ino FROM dentries"):
        up.setdefault(ino, (parent, bytes(name)))
    out = {}
    for ino in inos:
        parts: list[bytes] = []
        cur = ino
        for _ in range(4096):
            if cur == ROOT_INO:
                out[ino] = "/" + "/".join(p.decode(errors="replace") for p in reversed(parts))
                break
            if cur not in up:
                break
            cur, name = up[cur]
            parts.append(name)
        out.setdefault(ino, f"<inode {ino}>")
    return out


PATHS_ONE_BY_ONE = 16


def _is_dir_sql(alias: str) -> str:
    return f"{alias}.mode >= {DIR_LO} AND {alias}.mode < {DIR_HI}"


# ---- sessions and open files ----------------------------------------------------------


def _stale_sessions(tx: Tx, ctx: CheckContext) -> list[Finding]:
    if ctx.live_sessions is None:
        return []
    rows = tx.all("SELECT id, host, pid, mountpoint FROM sessions ORDER BY id")
    return [Finding(f"session {r[0]} ({r[1]} pid {r[2]} {r[3] or '-'}) is not alive", (r[0],))
            for r in rows if r[0] not in ctx.live_sessions]


def _end_sessions(ctx: CheckContext, found: list[Finding]) -> None:
    def txn(tx: Tx) -> None:
        for f in found:
            tx.run(S.DEL_OPEN_OF_SESSION, f.key)
            tx.run(S.DEL_SESSION, f.key)

    ctx.run(txn)
    ctx.log.append(f"ended {len(found)} dead session(s)")


def _open_files(tx: Tx, ctx: CheckContext) -> list[Finding]:
    rows = tx.all(
        "SELECT o.session, o.ino FROM open_files o LEFT JOIN sessions s ON s.id = o.session "
        "WHERE s.id IS NULL"
    )
    gone = tx.all(
        "SELECT o.session, o.ino FROM open_files o LEFT JOIN inodes i ON i.ino = o.ino "
        "WHERE i.ino IS NULL"
    )
    return [Finding(f"inode {r[1]} is held open by unknown session {r[0]}", (r[0], r[1]))
            for r in rows] + [
        Finding(f"session {r[0]} holds open inode {r[1]}, which does not exist", (r[0], r[1]))
        for r in gone]


def _drop_open_files(ctx: CheckContext, found: list[Finding]) -> None:
    ctx.run(lambda tx: [tx.run(S.DEL_OPEN, f.key) for f in found])


# ---- namespace ------------------------------------------------------------------------


def _root_dir(tx: Tx, ctx: CheckContext) -> list[Finding]:
    row = tx.one("SELECT mode FROM inodes WHERE ino = ?", (ROOT_INO,))
    if row is None:
        n = tx.one("SELECT COUNT(*) FROM dentries WHERE parent = ?", (ROOT_INO,))[0]
        return [Finding(f"the root directory (inode {ROOT_INO}) is missing; {n} entries "
                        "live in it", (ROOT_INO,))]
    if not DIR_LO <= row[0] < DIR_HI:
        return [Finding(f"the root (inode {ROOT_INO}) is no directory (mode {row[0]:o})",
                        repairable=False)]
    return []


def _recreate_root(ctx: CheckContext, found: list[Finding]) -> None:
    """Put the root directory's row back (mode 0755, root's), keeping its entries;
    ``dir_nlink`` and ``counters`` then recount what it holds."""
    def txn(tx: Tx) -> None:
        if tx.one("SELECT 1 FROM inodes WHERE ino = ?", (ROOT_INO,)) is not None:
            return
        cookie = tx.one("SELECT COALESCE(MAX(cookie), 0) FROM dentries WHERE parent = ?",
                        (ROOT_INO,))[0]
        subdirs = tx.one("SELECT COUNT(*) FROM dentries d JOIN inodes c ON c.ino = d.ino "
                         f"WHERE d.parent = ? AND {_is_dir_sql('c')}", (ROOT_INO,))[0]
        now = time.time_ns()
        # The statfs counters still count the lost row: left as they are.
        tx.run(S.INS_INODE, (ROOT_INO, stat.S_IFDIR | 0o755, 0, 0, 2 + int(subdirs), 0, now,
                             now, now, 0, 1, 0, ROOT_INO, max(FIRST_COOKIE, int(cookie) + 1),
                             None, None, None))

    ctx.run(txn)
    ctx.log.append(f"re-created the missing root directory (inode {ROOT_INO}), its entries "
                   "kept")


ID_COUNTERS = ("inode", "slice", "session", "server")
"""The id counters a file system is formatted with (``engine/format.py``)."""


def _ids_in_use(tx: Tx, ctx: CheckContext) -> dict[str, int]:
    """The highest id of each kind in use (0: none), the drives' slices included
    when ``ctx.held`` is known."""
    top = {
        "inode": tx.one("SELECT COALESCE(MAX(ino), 0) FROM inodes")[0],
        "session": max(tx.one("SELECT COALESCE(MAX(id), 0) FROM sessions")[0],
                       tx.one("SELECT COALESCE(MAX(session), 0) FROM open_files")[0]),
        "server": tx.one("SELECT COALESCE(MAX(id), 0) FROM servers")[0],
    }
    top["inode"] = max(top["inode"], tx.one("SELECT COALESCE(MAX(ino), 0) FROM dentries")[0],
                       tx.one("SELECT COALESCE(MAX(ino), 0) FROM chunk_refs")[0])
    for (server,) in tx.all("SELECT DISTINCT server FROM slice_replicas"):
        if str(server).isdigit():
            top["server"] = max(top["server"], int(server))
    # An inline slice's id is a slice id with INLINE_SLICE_BIT set.
    top["slice"] = max(
        tx.one("SELECT COALESCE(MAX(id), 0) FROM slices WHERE id < ?", (INLINE_SLICE_BIT,))[0],
        tx.one("SELECT COALESCE(MAX(id), 0) FROM slices WHERE id >= ?",
               (INLINE_SLICE_BIT,))[0] & ~INLINE_SLICE_BIT,
        tx.one("SELECT COALESCE(MAX(slice_id), 0) FROM chunk_refs WHERE slice_id < ?",
               (INLINE_SLICE_BIT,))[0])
    if ctx.held:
        top["slice"] = max([top["slice"], *(max(d, default=0) for d in ctx.held.values())])
    return {k: int(v) for k, v in top.items()}


def _id_counters(tx: Tx, ctx: CheckContext) -> list[Finding]:
    """Every id counter exists and is past every id in use (a file system
    without them does not mount). The slice counter's value against the
    drives is ``fsck.py``'s ``slice_ids`` pass when the drives are read."""
    have = {str(r[0]): int(r[1]) for r in tx.all("SELECT name, next_id FROM ids")}
    top = _ids_in_use(tx, ctx)
    first = {"inode": ROOT_INO + 1}
    out = []
    for name in ID_COUNTERS:
        want = max(top[name] + 1, first.get(name, 1))
        if name not in have:
            out.append(Finding(f"the {name} id counter is missing (ids in use reach "
                               f"{top[name]})", (name, want)))
        elif have[name] < want and (name != "slice" or ctx.held is None):
            out.append(Finding(f"next {name} id {have[name]} is not past the highest in use "
                               f"({top[name]})", (name, want)))
    return out


def _restore_id_counters(ctx: CheckContext, found: list[Finding]) -> None:
    def txn(tx: Tx) -> None:
        for f in found:
            name, want = f.key
            tx.run(S.INS_ID_IF_MISSING, (name, want))
            tx.run(S.RAISE_IDS, (want, name, want))

    ctx.run(txn)
    ctx.log.extend(f"set the {f.key[0]} id counter to {f.key[1]}" for f in found)


def _lost_inodes(tx: Tx, ctx: CheckContext) -> list[Finding]:
    """Files whose inode row is gone while their content map (chunk refs) is
    still there: their bytes are readable once the row is back."""
    rows = tx.all(
        "SELECT r.ino, COUNT(*) FROM chunk_refs r LEFT JOIN inodes i ON i.ino = r.ino "
        "WHERE i.ino IS NULL GROUP BY r.ino ORDER BY r.ino"
    )
    return [Finding(f"inode {r[0]} is missing but {r[1]} chunk reference(s) of it remain",
                    (r[0],)) for r in rows]


def _recreate_inodes(ctx: CheckContext, found: list[Finding]) -> None:
    """Give each lost file an inode row again (a regular file, mode 0600, root's,
    as long as its references reach), kept at the entries still naming it or,
    with none, linked as ``/lost+found/#INO``."""
    if not ctx.chunk_size:
        return
    cs = ctx.chunk_size
    named: list[tuple[int, str]] = []
    homeless: list[int] = []

    def txn(tx: Tx) -> None:
        now = time.time_ns()
        for f in found:
            ino = f.key[0]
            if tx.one("SELECT 1 FROM inodes WHERE ino = ?", (ino,)) is not None:
                continue
            size = int(tx.one("SELECT COALESCE(MAX(chunk_index * ? + chunk_offset + length), 0) "
                              "FROM chunk_refs WHERE ino = ?", (cs, ino))[0])
            links = int(tx.one("SELECT COUNT(*) FROM dentries WHERE ino = ?", (ino,))[0])
            # The statfs counters still count the lost row: left as they are.
            tx.run(S.INS_INODE, (ino, stat.S_IFREG | 0o600, 0, 0, links, size, now, now, now,
                                 0, 1, 0, 0, FIRST_COOKIE, None, None, None))
            if links:
                named.append((ino, path_of(tx, ino)))
            else:
                homeless.append(ino)

    ctx.run(txn)
    ctx.log.extend(f"re-created lost inode {ino} at {path} (mode 0600, owner root)"
                   for ino, path in named)
    if homeless:
        home = lost_found(ctx)

        def link(tx: Tx) -> None:
            for ino in homeless:
                link_into_lost_found(tx, home, ino, stat.S_IFREG, f"#{ino}".encode())
                tx.run("UPDATE inodes SET nlink = 1 WHERE ino = ?", (ino,))

        ctx.run(link)
        ctx.log.extend(f"re-created lost inode {ino} as /lost+found/#{ino} (mode 0600, "
                       "owner root)" for ino in homeless)


def _dangling_entries(tx: Tx, ctx: CheckContext) -> list[Finding]:
    rows = tx.all(
        "SELECT d.parent, d.name, d.ino FROM dentries d LEFT JOIN inodes i ON i.ino = d.ino "
        "WHERE i.ino IS NULL AND NOT EXISTS (SELECT 1 FROM chunk_refs r WHERE r.ino = d.ino)"
    )
    return [Finding(f"entry {bytes(r[1])!r} in {r[0]} points at missing inode {r[2]}",
                    (r[0], bytes(r[1]))) for r in rows]


def _entries_in_non_dirs(tx: Tx, ctx: CheckContext) -> list[Finding]:
    rows = tx.all(
        "SELECT d.parent, d.name FROM dentries d LEFT JOIN inodes p ON p.ino = d.parent "
        f"WHERE p.ino IS NULL OR NOT ({_is_dir_sql('p')})"
    )
    return [Finding(f"entry {bytes(r[1])!r} lives in {r[0]}, which is no directory",
                    (r[0], bytes(r[1]))) for r in rows]


def _drop_entries(ctx: CheckContext, found: list[Finding]) -> None:
    ctx.run(lambda tx: [tx.run(S.DEL_DENTRY, f.key) for f in found])
    ctx.log.extend(f"dropped entry {f.key[1]!r} of directory {f.key[0]}" for f in found)


def _dir_parents(tx: Tx, ctx: CheckContext) -> list[Finding]:
    rows = tx.all(
        "SELECT c.ino, c.parent, d.parent FROM inodes c JOIN dentries d ON d.ino = c.ino "
        f"WHERE {_is_dir_sql('c')} AND c.parent <> d.parent"
    )
    out = [Finding(f"directory {r[0]} records parent {r[1]} but lives in {r[2]}", (r[0], r[2]))
           for r in rows]
    # Every directory reaches the root (no cycles): walk parents in memory.
    parent = dict(tx.all(f"SELECT ino, parent FROM inodes i WHERE {_is_dir_sql('i')}"))
    for ino in parent:
        cur, seen = ino, 0
        while cur != ROOT_INO and seen <= len(parent):
            cur = parent.get(cur, ROOT_INO)
            seen += 1
        if cur != ROOT_INO:
            out.append(Finding(f"directory {ino} does not reach the root (cycle)", (ino,),
                               repairable=False))
    return out


def _set_inode_column(column: str) -> Callable[[CheckContext, list[Finding]], None]:
    """A repair that sets ``column`` of inode ``key[0]`` to ``key[1]`` for each
    repairable finding, in one transaction."""
    def repair(ctx: CheckContext, found: list[Finding]) -> None:
        fixable = [f for f in found if f.repairable]
        ctx.run(lambda tx: [tx.run(f"UPDATE inodes SET {column} = ? WHERE ino = ?",
                                   (f.key[1], f.key[0])) for f in fixable])
    return repair


_fix_dir_parents = _set_inode_column("parent")


def _unreachable(tx: Tx, ctx: CheckContext) -> list[Finding]:
    # One anti-join against the set of linked inodes (dentries has no index by
    # ino: a per-inode subquery would scan it once per inode).
    rows = tx.all(
        "SELECT i.ino, i.mode FROM inodes i LEFT JOIN (SELECT DISTINCT ino FROM dentries) d "
        "ON d.ino = i.ino WHERE i.ino <> ? AND i.nlink > 0 AND d.ino IS NULL", (ROOT_INO,)
    )
    return [Finding(f"inode {r[0]} has links but no entry (unreachable)", (r[0], r[1]))
            for r in rows]


def lost_found(ctx: CheckContext) -> int:
    """The inode of ``/lost+found``, made (mode 0700) when missing."""
    from shinglefs.meta.errors import FsError

    try:
        return ctx.meta.lookup(ROOT_INO, LOST_FOUND).ino
    except FsError:
        return ctx.meta.mkdir(ROOT_INO, LOST_FOUND, 0o700).ino


def link_into_lost_found(tx: Tx, home: int, ino: int, mode: int, name: bytes) -> None:
    """Give ``ino`` an entry ``name`` in ``home`` (a directory also its parent)."""
    is_dir = DIR_LO <= mode < DIR_HI
    now = time.time_ns()
    cookie = tx.one(S.TAKE_COOKIE, (home,))[0]
    tx.run(S.INS_DENTRY, (home, name, ino, cookie))
    tx.run(S.TOUCH_DIR, (now, now, 1 if is_dir else 0, home))
    if is_dir:
        tx.run(S.SET_PARENT, (home, now, ino))


def _adopt(ctx: CheckContext, found: list[Finding]) -> None:
    home = lost_found(ctx)

    def txn(tx: Tx) -> None:
        for f in found:
            ino, mode = f.key
            link_into_lost_found(tx, home, ino, mode, f"#{ino}".encode())

    ctx.run(txn)
    ctx.log.extend(f"linked unreachable inode {f.key[0]} as /lost+found/#{f.key[0]}"
                   for f in found)


def _orphans(tx: Tx, ctx: CheckContext) -> list[Finding]:
    rows = tx.all(
        "SELECT i.ino, i.size FROM inodes i WHERE i.ino <> ? AND i.nlink = 0 "
        "AND NOT EXISTS (SELECT 1 FROM open_files o WHERE o.ino = i.ino)",
        (ROOT_INO,),
    )
    return [Finding(f"inode {r[0]} has no links and is open nowhere (leaked)", (r[0], r[1]))
            for r in rows]


def deref_slices(tx: Tx, counts: dict[int, int]) -> None:
    """``engine.core.deref_slices`` at the current time (repairs drop references)."""
    from shinglefs.meta.engine.core import deref_slices as deref

    deref(tx, counts, time.time_ns())


def _free_orphans(ctx: CheckContext, found: list[Finding]) -> None:
    def txn(tx: Tx) -> None:
        for f in found:
            ino, size = f.key
            counts: dict[int, int] = {}
            for (sid,) in tx.all(S.SEL_REF_SLICES_OF, (ino,)):
                counts[sid] = counts.get(sid, 0) + 1
            tx.run(S.DEL_REFS_OF, (ino,))
            tx.run(S.DEL_CHUNKS_OF, (ino,))
            deref_slices(tx, counts)
            tx.run(S.DEL_XATTRS_OF, (ino,))
            tx.run(S.DEL_INODE, (ino,))
            tx.run(S.ADD_COUNTERS, (-size, -1, 0))

    ctx.run(txn)
    ctx.log.append(f"freed {len(found)} leaked inode(s)")


def _file_nlink(tx: Tx, ctx: CheckContext) -> list[Finding]:
    rows = tx.all(
        "SELECT i.ino, i.nlink, COALESCE(d.n, 0) FROM inodes i LEFT JOIN "
        "(SELECT ino, COUNT(*) AS n FROM dentries GROUP BY ino) d ON d.ino = i.ino "
        f"WHERE NOT ({_is_dir_sql('i')}) AND i.nlink <> COALESCE(d.n, 0)"
    )
    return [Finding(f"inode {r[0]} has nlink {r[1]} but {r[2]} entries", (r[0], r[2]),
                    repairable=r[2] > 0) for r in rows if r[1] != r[2]]


_set_nlink = _set_inode_column("nlink")


def _dir_nlink(tx: Tx, ctx: CheckContext) -> list[Finding]:
    rows = tx.all(
        "SELECT p.ino, p.nlink, COALESCE(s.n, 0) FROM inodes p LEFT JOIN "
        "(SELECT d.parent AS parent, COUNT(*) AS n FROM dentries d JOIN inodes c "
        f"ON c.ino = d.ino WHERE {_is_dir_sql('c')} GROUP BY d.parent) s ON s.parent = p.ino "
        f"WHERE {_is_dir_sql('p')}"
    )
    return [Finding(f"directory {r[0]} has nlink {r[1]} but {r[2]} subdirectories",
                    (r[0], 2 + r[2])) for r in rows if r[1] != 2 + r[2]]


# ---- content map and slices -----------------------------------------------------------


def _chunk_nrefs(tx: Tx, ctx: CheckContext) -> list[Finding]:
    """A chunk row's reference count and version against its references: the
    version must be at least every reference's seq, or the next commit would
    take a seq under (or equal to) references older than it."""
    rows = tx.all(
        "SELECT c.ino, c.chunk_index, c.nrefs, COUNT(r.seq), c.version, MAX(r.seq) "
        "FROM chunks c LEFT JOIN chunk_refs r "
        "ON r.ino = c.ino AND r.chunk_index = c.chunk_index "
        "GROUP BY c.ino, c.chunk_index, c.nrefs, c.version"
    )
    out = [Finding(f"chunk {r[1]} of {r[0]} says {r[2]} refs, holds {r[3]}", ("nrefs", *r[:2]))
           for r in rows if r[2] != r[3]]
    out += [Finding(f"chunk {r[1]} of {r[0]} is at version {r[4]}, under its reference "
                    f"seq {r[5]}", ("nrefs", *r[:2]))
            for r in rows if r[2] == r[3] and r[5] is not None and r[5] > r[4]]
    rows = tx.all(
        "SELECT DISTINCT r.ino, r.chunk_index FROM chunk_refs r LEFT JOIN chunks c "
        "ON c.ino = r.ino AND c.chunk_index = r.chunk_index WHERE c.ino IS NULL"
    )
    out += [Finding(f"refs of chunk {r[1]} of {r[0]} have no chunk row", ("row", *r))
            for r in rows]
    return out  # refs of a missing inode: the ``lost_inodes`` pass


def _fix_chunks(ctx: CheckContext, found: list[Finding]) -> None:
    """Recount; the version goes past every reference's seq (a recreated row
    too), so that later commits land on top."""
    refs = ("SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM chunk_refs "
            "WHERE ino = ? AND chunk_index = ?")

    def txn(tx: Tx) -> None:
        for f in found:
            ino, ci = f.key[1:]
            n, top = tx.one(refs, (ino, ci))
            if f.key[0] == "row":
                tx.run("INSERT INTO chunks (ino, chunk_index, version, nrefs) VALUES (?, ?, ?, ?)",
                       (ino, ci, top + 1, n))
            else:
                version = tx.one(S.SEL_CHUNK, (ino, ci))[0]
                tx.run("UPDATE chunks SET nrefs = ?, version = ? "
                       "WHERE ino = ? AND chunk_index = ?", (n, max(version, top) + 1, ino, ci))

    ctx.run(txn)


def _slice_refcounts(tx: Tx, ctx: CheckContext) -> list[Finding]:
    # Counted in one pass per table (chunk_refs has no index by slice).
    real = dict(tx.all("SELECT slice_id, COUNT(*) FROM chunk_refs GROUP BY slice_id"))
    queued = {r[0] for r in tx.all("SELECT slice_id FROM deletions")}
    inline = dict(tx.all("SELECT slice_id, LENGTH(data) FROM inline_slices"))
    out = []
    for sid, refcount, state, length in tx.all(
            "SELECT id, refcount, state, length FROM slices ORDER BY id"):
        n = int(real.get(sid, 0))
        if refcount != n:
            out.append(Finding(f"slice {sid} has refcount {refcount} but {n} references",
                               ("count", sid, n)))
        if state == "to_delete" and n:
            out.append(Finding(f"slice {sid} is queued for deletion but still referenced",
                               ("revive", sid)))
        if state == "committed" and not n:
            stored = _stored_length(ctx, sid, length, inline)
            if stored:  # its bytes can still be read: kept, as a file of lost+found
                out.append(Finding(f"slice {sid} ({stored} bytes) is committed but no file "
                                   "references it", ("adopt", sid, stored)))
            else:
                out.append(Finding(f"slice {sid} is committed but unreferenced and not queued "
                                   "(no bytes of it are stored)", ("drop", sid)))
        if state == "to_delete" and sid not in queued:
            out.append(Finding(f"slice {sid} is to_delete but not in the deletion queue",
                               ("drop", sid)))
    rows = tx.all(
        "SELECT r.slice_id, COUNT(*), MAX(r.slice_offset + r.length) FROM chunk_refs r "
        "LEFT JOIN slices s ON s.id = r.slice_id WHERE s.id IS NULL GROUP BY r.slice_id"
    )
    out += [Finding(f"chunk refs point at unknown slice {r[0]}", ("register", *r)) for r in rows]
    return out


def _stored_length(ctx: CheckContext, sid: int, length: int, inline: dict[int, int]) -> int:
    """How many bytes of slice ``sid`` can be read: an inline slice's bytes in
    meta; else what the drives hold (``ctx.held``) or, not read, its recorded length."""
    if is_inline_slice(sid):
        return int(inline.get(sid) or 0)
    if ctx.held is None:
        return int(length)
    return max((d[sid] for d in ctx.held.values() if sid in d), default=0)


def free_name(tx: Tx, parent: int, base: str) -> bytes:
    """``base``, or ``base.N`` for the first N it is free as, in directory ``parent``."""
    name, n = base.encode(), 1
    while tx.one("SELECT 1 FROM dentries WHERE parent = ? AND name = ?", (parent, name)):
        name, n = f"{base}.{n}".encode(), n + 1
    return name


def adopt_unreferenced(ctx: CheckContext, adopt: list[tuple[int, int]]) -> None:
    """Each committed slice no file references any more (its references or its
    inode lost), given as (slice id, readable bytes), becomes a file
    ``/lost+found/slice-<id>`` holding those bytes: never deleted, as unknown
    slices on a drive are not (``fsck.py``'s ``unknown_slices``)."""
    if not adopt:
        return
    home = lost_found(ctx)
    for sid, length in adopt:
        def txn(tx: Tx, sid: int = sid, length: int = length) -> str | None:
            if tx.one("SELECT 1 FROM chunk_refs WHERE slice_id = ? LIMIT 1", (sid,)):
                return None  # referenced again meanwhile
            name = free_name(tx, home, f"slice-{sid:x}")
            ino = tx.one(S.ALLOC_IDS, (1, "inode"))[0] - 1
            now = time.time_ns()
            tx.run(S.INS_INODE, (ino, stat.S_IFREG | 0o600, 0, 0, 0, length, now, now, now,
                                 0, 1, 0, 0, FIRST_COOKIE, None, None, None))
            link_into_lost_found(tx, home, ino, stat.S_IFREG, name)
            tx.run("UPDATE inodes SET nlink = 1 WHERE ino = ?", (ino,))
            tx.run("INSERT INTO chunks (ino, chunk_index, version, nrefs) VALUES (?, 0, 1, 1)",
                   (ino,))
            tx.run(S.INS_REF, (ino, 0, 0, sid, 0, length, 0))
            tx.run("UPDATE slices SET refcount = 1, state = 'committed' WHERE id = ?", (sid,))
            tx.run(S.ADD_COUNTERS, (length, 1, 0))
            return name.decode()

        name = ctx.run(txn)
        if name is not None:
            ctx.log.append(f"re-attached slice {sid:#x}, which no file references any more, "
                           f"as /lost+found/{name} ({length} bytes)")


def _inline_slices(tx: Tx, ctx: CheckContext) -> list[Finding]:
    """Inline slices: references need bytes meta holds; bytes need a slice row."""
    out = []
    rows = tx.all(
        "SELECT r.slice_id, MAX(r.slice_offset + r.length), MAX(LENGTH(b.data)) "
        "FROM chunk_refs r LEFT JOIN inline_slices b ON b.slice_id = r.slice_id "
        "GROUP BY r.slice_id"
    )
    for sid, need, have in rows:
        if is_inline_slice(sid) and (have is None or have < need):
            out.append(Finding(f"inline slice {sid:#x}: files reference {need} bytes, meta "
                               f"holds {have or 0}", repairable=False))
    rows = tx.all("SELECT b.slice_id FROM inline_slices b LEFT JOIN slices s "
                  "ON s.id = b.slice_id WHERE s.id IS NULL")
    out += [Finding(f"inline bytes of unknown slice {r[0]:#x}", (r[0],)) for r in rows]
    return out


def _drop_inline(ctx: CheckContext, found: list[Finding]) -> None:
    def txn(tx: Tx) -> None:
        for f in found:
            tx.run(S.DEL_INLINE, f.key)

    ctx.run(txn)


def _fix_refcounts(ctx: CheckContext, found: list[Finding]) -> None:
    now = time.time_ns()

    def txn(tx: Tx) -> None:
        for f in found:
            kind, sid = f.key[:2]
            if kind == "count":
                tx.run("UPDATE slices SET refcount = ? WHERE id = ?", (f.key[2], sid))
            elif kind == "revive":
                tx.run("UPDATE slices SET state = 'committed' WHERE id = ?", (sid,))
                tx.run(S.DEL_DELETION, (sid,))
            elif kind == "drop":  # queued to_delete, or no bytes stored: the queue ends it
                tx.run(S.DOOM_SLICE, (sid,))
                tx.run(S.QUEUE_DELETION, (sid, now))
            elif kind == "register":
                tx.run(S.INS_SLICE, (sid, f.key[3], 0, "committed", f.key[2], now))

    ctx.run(txn)
    adopt_unreferenced(ctx, [(f.key[1], f.key[2]) for f in found if f.key[0] == "adopt"])


def _counters(tx: Tx, ctx: CheckContext) -> list[Finding]:
    used, inodes = tx.one(S.SUM_COUNTERS)
    real_inodes, real_used = tx.one("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM inodes")
    out = []
    if int(inodes) != int(real_inodes):
        out.append(Finding(f"inode counter says {inodes}, table holds {real_inodes}"))
    if int(used) != int(real_used):
        out.append(Finding(f"used-bytes counter says {used}, sizes sum to {real_used}"))
    return out


def _fix_counters(ctx: CheckContext, found: list[Finding]) -> None:
    def txn(tx: Tx) -> None:
        real_inodes, real_used = tx.one("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM inodes")
        tx.run(S.DEL_DELTAS)
        tx.run("UPDATE counters SET used_bytes = 0, inodes = 0")
        tx.run("UPDATE counters SET used_bytes = ?, inodes = ? WHERE shard = 0",
               (int(real_used), int(real_inodes)))

    ctx.run(txn)


SESSION_PASSES = [
    CheckPass("stale_sessions", _stale_sessions, _end_sessions),
    CheckPass("open_files", _open_files, _drop_open_files),
]
NAMESPACE_PASSES = [
    CheckPass("root_dir", _root_dir, _recreate_root),
    CheckPass("id_counters", _id_counters, _restore_id_counters),
    CheckPass("lost_inodes", _lost_inodes, _recreate_inodes),
    CheckPass("dangling_entries", _dangling_entries, _drop_entries),
    CheckPass("entries_in_non_dirs", _entries_in_non_dirs, _drop_entries),
    CheckPass("dir_parents", _dir_parents, _fix_dir_parents),
    CheckPass("unreachable", _unreachable, _adopt),
    CheckPass("orphans", _orphans, _free_orphans),
    CheckPass("file_nlink", _file_nlink, _set_nlink),
    CheckPass("dir_nlink", _dir_nlink, _set_nlink),
    CheckPass("chunk_nrefs", _chunk_nrefs, _fix_chunks),
]
SLICE_PASSES = [
    CheckPass("slice_refcounts", _slice_refcounts, _fix_refcounts),
    CheckPass("inline_slices", _inline_slices, _drop_inline),
]
COUNTER_PASSES = [CheckPass("counters", _counters, _fix_counters)]
META_PASSES = SESSION_PASSES + NAMESPACE_PASSES + SLICE_PASSES + COUNTER_PASSES


def check_consistency(store: MetaStore) -> list[Problem]:
    """Run every metadata pass in one read snapshot; returns all problems (empty = consistent)."""
    from shinglefs.meta.dump import backend_of

    backend = backend_of(store)
    ctx = CheckContext(backend, store, chunk_size=0)

    def txn(tx: Tx) -> list[Problem]:
        problems: list[Problem] = []
        for one in META_PASSES:
            problems += [Problem(one.name, f.detail) for f in one.find(tx, ctx)]
        return problems

    result: list[Problem] = backend.run(txn, "read")
    return result
