"""fsck: the metadata passes of ``meta.check`` plus the passes that compare the
metadata with what the drives hold, run in order, each repaired before the next.

The drives enter as data: ``CheckContext.held`` maps each drive id to the
slices it holds and their stored lengths, and ``drop_slice`` deletes a slice
from the drives (the caller, ``shinglefs.client.recovery``, opens the drives;
this layer never calls the store). Passes added here:

- ``missing_slices``: a file references a slice no drive holds;
- ``short_slices``: a file references bytes past a slice's stored end
  (sizes beyond stored data). Both are repaired per file: the file is
  truncated to its first unreadable byte (its path is logged), and
  references to unreadable bytes hidden under later writes are trimmed;
- ``unknown_slices``: a drive holds a slice the metadata has no row for
  (written after the metadata backup that was loaded, or by a writer that
  crashed before registering it): re-attached as ``/lost+found/slice-<id>``;
- ``replica_drives``: a slice's replica rows name drives that do not hold it
  (a replica names a drive as ``("local", id)`` or, written through the
  owner's sharing server by another process, as that server's drive);
- ``slice_ids``: the next slice id is not past every id in use (a loaded
  backup would otherwise hand out ids the drives already hold).

``run_fsck`` returns an ``FsckReport``: what each pass found and, with
``repair``, what it changed; after repairing it checks again, so
``report.remaining`` is what is still wrong.
"""

from __future__ import annotations

import functools
import json
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shinglefs.meta import schema as S
from shinglefs.meta.api import (
    IMMUTABLE,
    INLINE_SLICE_BIT,
    LOCAL_SERVER,
    Replica,
    SliceRef,
    is_inline_slice,
)
from shinglefs.meta.backend import Tx
from shinglefs.meta.check import (
    COUNTER_PASSES,
    NAMESPACE_PASSES,
    SESSION_PASSES,
    SLICE_PASSES,
    CheckContext,
    CheckPass,
    Finding,
    deref_slices,
    lost_found,
    path_of,
)
from shinglefs.meta.overlay import flatten

Progress = Callable[[str], None]


def _held_length(ctx: CheckContext, sid: int) -> int | None:
    assert ctx.held is not None
    lengths = [d[sid] for d in ctx.held.values() if sid in d]
    return max(lengths) if lengths else None


def _needed(tx: Tx) -> list[tuple[int, int]]:
    """(slice id, bytes the references need) for every referenced slice on a drive
    (inline slices live in meta: ``check.py``'s ``inline_slices`` pass)."""
    return [(r[0], r[1]) for r in tx.all(
        "SELECT slice_id, MAX(slice_offset + length) FROM chunk_refs GROUP BY slice_id")
        if not is_inline_slice(r[0])]


def _missing_slices(tx: Tx, ctx: CheckContext) -> list[Finding]:
    if ctx.held is None:
        return []
    return [Finding(f"slice {sid:#x} is referenced but on no drive", (sid, 0))
            for sid, _need in _needed(tx) if _held_length(ctx, sid) is None]


def _short_slices(tx: Tx, ctx: CheckContext) -> list[Finding]:
    if ctx.held is None:
        return []
    out = []
    for sid, need in _needed(tx):
        have = _held_length(ctx, sid)
        if have is not None and have < need:
            out.append(Finding(f"slice {sid:#x}: files reference {need} bytes, the drive holds "
                               f"{have}", (sid, have)))
    return out


def _bad_refs(tx: Tx, ino: int, stored: dict[int, int],
              cs: int) -> tuple[int | None, list[tuple[int, int, int, int]]]:
    """The first unreadable visible byte of ``ino`` (None: all readable) and the
    references reaching unreadable bytes, as (chunk, seq, good length, length)."""
    refs = tx.all("SELECT chunk_index, seq, slice_id, chunk_offset, length, slice_offset "
                  "FROM chunk_refs WHERE ino = ? ORDER BY chunk_index, seq", (ino,))
    by_chunk: dict[int, list[SliceRef]] = {}
    bad: list[tuple[int, int, int, int]] = []
    for ci, seq, sid, coff, length, soff in refs:
        by_chunk.setdefault(ci, []).append(SliceRef(sid, coff, length, soff))
        if sid in stored and soff + length > stored[sid]:
            bad.append((ci, seq, max(0, min(length, stored[sid] - soff)), length))
    first: int | None = None
    for ci, chunk_refs in by_chunk.items():
        for s, e, sid, soff in flatten(chunk_refs, 0, cs):
            if sid in stored and soff + (e - s) > stored[sid]:
                at = ci * cs + s + max(0, stored[sid] - soff)
                first = at if first is None else min(first, at)
    return first, bad


def _set_flags(tx: Tx, ino: int, flags: int) -> None:
    tx.run("UPDATE inodes SET flags = ? WHERE ino = ?", (flags, ino))


def _truncate_unreadable(ctx: CheckContext, found: list[Finding]) -> None:
    """Truncate each file referencing the found slices to its first unreadable
    byte, then trim the (now hidden) references to bytes the drives lack."""
    stored = {f.key[0]: f.key[1] for f in found}
    marks = ", ".join("?" * len(stored))
    inos = [r[0] for r in ctx.run(lambda tx: tx.all(
        f"SELECT DISTINCT ino FROM chunk_refs WHERE slice_id IN ({marks})", list(stored)),
        "read")]
    for ino in inos:
        def look(tx: Tx, ino: int = ino) -> tuple[Any, Any, Any, Any]:
            size, flags = tx.one("SELECT size, flags FROM inodes WHERE ino = ?", (ino,))
            return (size, flags, path_of(tx, ino), _bad_refs(tx, ino, stored, ctx.chunk_size))

        size, flags, path, (first, _bad) = ctx.run(look, "read")
        if first is not None and first < size:
            # A read-only snapshot's file is repaired too: immutable for users,
            # not for the repair (its flag is put back at once).
            frozen = bool(flags & IMMUTABLE)
            if frozen:
                ctx.run(functools.partial(_set_flags, ino=ino, flags=flags & ~IMMUTABLE))
            try:
                ctx.meta.truncate(ino, first)
            finally:
                if frozen:
                    ctx.run(functools.partial(_set_flags, ino=ino, flags=flags))
            ctx.log.append(f"truncated {path} (inode {ino}) from {size} to {first} bytes: "
                           "the rest is on no drive")

        def trim(tx: Tx, ino: int = ino) -> None:
            _first, bad = _bad_refs(tx, ino, stored, ctx.chunk_size)
            dropped: dict[int, int] = {}
            for ci, seq, good, _length in bad:
                if good:
                    tx.run(S.TRIM_REF, (good, ino, ci, seq))
                    continue
                sid = tx.one("SELECT slice_id FROM chunk_refs WHERE ino = ? AND chunk_index = ? "
                             "AND seq = ?", (ino, ci, seq))[0]
                tx.run(S.DEL_REF, (ino, ci, seq))
                tx.run("UPDATE chunks SET nrefs = nrefs - 1, version = version + 1 "
                       "WHERE ino = ? AND chunk_index = ?", (ino, ci))
                dropped[sid] = dropped.get(sid, 0) + 1
            deref_slices(tx, dropped)

        ctx.run(trim)


def _unknown_slices(tx: Tx, ctx: CheckContext) -> list[Finding]:
    if ctx.held is None:
        return []
    known = {r[0] for r in tx.all("SELECT id FROM slices")}
    out = []
    for drive, slices in sorted(ctx.held.items()):
        for sid, length in sorted(slices.items()):
            if sid not in known:
                out.append(Finding(f"drive {drive} holds slice {sid:#x} ({length} bytes) that no "
                                   "file references", (sid, length, drive)))
    return out


def _adopt_slices(ctx: CheckContext, found: list[Finding]) -> None:
    """Each unknown slice becomes a file ``/lost+found/slice-<id>`` holding its bytes."""
    home = lost_found(ctx)
    for f in found:
        sid, length, drive = f.key
        name = f"slice-{sid:x}".encode()
        ino = ctx.meta.mknod(home, name, stat.S_IFREG | 0o600).ino
        ctx.meta.commit_slice(ino, 0, SliceRef(sid, 0, length, 0), length,
                              slice_length=length,
                              replicas=[Replica(LOCAL_SERVER, str(drive))])
        ctx.log.append(f"re-attached slice {sid:#x} of drive {drive} as "
                       f"/lost+found/{name.decode()} ({length} bytes)")


def _shared_drives(tx: Tx) -> dict[tuple[str, str], str]:
    """(server id, its drive id) -> this file system's own drive id, for the
    storage server an owner registered to share its drives (server/share.py),
    matched by drive uuid: a ``connect()`` or second mount in another process
    records its slices' replicas on that server's drives."""
    by_uuid = {r[0]: str(i) for i, r in enumerate(tx.all("SELECT uuid FROM drives ORDER BY id"))
               if r[0] is not None}
    shared = {}
    for server, drives in tx.all("SELECT id, drives FROM servers"):
        for d in json.loads(drives):
            if d.get("uuid") in by_uuid:
                shared[(str(server), str(d["drive_id"]))] = by_uuid[d["uuid"]]
    return shared


def _replica_drives(tx: Tx, ctx: CheckContext) -> list[Finding]:
    if ctx.held is None:
        return []
    shared = _shared_drives(tx)
    recorded: dict[int, set[str]] = {}
    for sid, server, drive in tx.all("SELECT slice_id, server, drive FROM slice_replicas"):
        if server == LOCAL_SERVER:
            recorded.setdefault(sid, set()).add(drive)
        elif (server, drive) in shared:
            recorded.setdefault(sid, set()).add(shared[(server, drive)])
    out = []
    for (sid,) in tx.all("SELECT id FROM slices WHERE state = 'committed'"):
        holders = {str(d) for d, slices in ctx.held.items() if sid in slices}
        if holders and recorded.get(sid, set()) != holders:
            out.append(Finding(f"slice {sid:#x}: replicas say drive(s) "
                               f"{sorted(recorded.get(sid, ()))}, held by {sorted(holders)}",
                               (sid, tuple(sorted(holders)))))
    return out


def _fix_replicas(ctx: CheckContext, found: list[Finding]) -> None:
    for f in found:
        ctx.meta.set_slice_replicas(f.key[0], [Replica(LOCAL_SERVER, d) for d in f.key[1]])


def _slice_ids(tx: Tx, ctx: CheckContext) -> list[Finding]:
    row = tx.one("SELECT next_id FROM ids WHERE name = 'slice'")
    top = tx.one("SELECT COALESCE(MAX(id), 0) FROM slices WHERE id < ?", (INLINE_SLICE_BIT,))[0]
    if ctx.held:
        top = max([top, *(max(d, default=0) for d in ctx.held.values())])
    if row is not None and row[0] <= top:
        return [Finding(f"next slice id {row[0]} is not past the highest in use ({top})",
                        (top + 1,))]
    return []


def _raise_slice_ids(ctx: CheckContext, found: list[Finding]) -> None:
    ctx.run(lambda tx: tx.run("UPDATE ids SET next_id = ? WHERE name = 'slice'", found[0].key))


DRIVE_PASSES = [
    CheckPass("missing_slices", _missing_slices, _truncate_unreadable),
    CheckPass("short_slices", _short_slices, _truncate_unreadable),
]
SLICE_DRIVE_PASSES = [
    CheckPass("unknown_slices", _unknown_slices, _adopt_slices),
    CheckPass("replica_drives", _replica_drives, _fix_replicas),
    CheckPass("slice_ids", _slice_ids, _raise_slice_ids),
]
FSCK_PASSES = (SESSION_PASSES + NAMESPACE_PASSES + DRIVE_PASSES + SLICE_PASSES
               + SLICE_DRIVE_PASSES + COUNTER_PASSES)


@dataclass
class FsckReport:
    """What each pass found (``found``), what repairs did (``actions``) and what
    is still wrong after them (``remaining``; equals ``found`` without repair)."""

    found: dict[str, list[Finding]] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    remaining: dict[str, list[Finding]] = field(default_factory=dict)
    repaired: bool = False
    skipped: list[str] = field(default_factory=list)
    """Passes not run, each with its reason (``name: why``)."""

    @property
    def clean(self) -> bool:
        return not any(self.found.values())


def run_fsck(ctx: CheckContext, *, repair: bool, passes: list[CheckPass] | None = None,
             progress: Progress | None = None) -> FsckReport:
    """Run ``passes`` (default ``FSCK_PASSES``) in order; with ``repair``, each
    pass repairs what it found before the next looks, and every pass looks
    once more at the end."""
    passes = FSCK_PASSES if passes is None else passes
    report = FsckReport(repaired=repair)
    for one in passes:
        if progress is not None:
            progress(one.name)
        found = ctx.run(functools.partial(_find, one, ctx), "read")
        report.found[one.name] = found
        if repair and one.repair is not None and any(f.repairable for f in found):
            one.repair(ctx, found)
    if repair and ctx.drop_slice is not None:
        drain_deletions(ctx)
    report.actions = list(ctx.log)
    if not repair:
        report.remaining = {k: v for k, v in report.found.items() if v}
        return report
    for one in passes:
        found = ctx.run(functools.partial(_find, one, ctx), "read")
        if found:
            report.remaining[one.name] = found
    return report


def drain_deletions(ctx: CheckContext) -> int:
    """Delete the queued slices from the drives and acknowledge them (what the
    mount's deletion consumer does), so repairs free their space now."""
    assert ctx.drop_slice is not None
    total = 0
    while batch := ctx.meta.pop_deletions(1000):
        for info in batch:
            ctx.drop_slice(info.id)
            if ctx.held is not None:
                for slices in ctx.held.values():
                    slices.pop(info.id, None)
        ctx.meta.ack_deletions([i.id for i in batch])
        total += len(batch)
    if total:
        ctx.log.append(f"deleted {total} unreferenced slice(s) from the drives")
    return total


__all__ = ["FSCK_PASSES", "FsckReport", "drain_deletions", "run_fsck"]


def _find(one: Any, ctx: Any, tx: Tx) -> Any:
    """Run one pass's ``find`` in ``tx`` (what ``ctx.run`` calls)."""
    return one.find(tx, ctx)
