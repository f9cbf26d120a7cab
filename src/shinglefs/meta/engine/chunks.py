"""The chunk map and the slices: which slice bytes make up each chunk of a file.

A chunk's content is an ordered overlay of slice references (later ones win,
``overlay.resolve``). Committing a reference also takes a reference on its
slice (registering it COMMITTED); dropping one dereferences it, and a slice
whose count reaches zero is queued for deletion (``SqlCore._deref``). Every
change to a chunk bumps its version, which compaction (``replace_chunk``)
compares to refuse a chunk that changed since it was read; or, given the
references it read (``replaced``), it checks that those are unchanged and
slots the new pieces in at their seqs, under the references committed since.
Commits lock inode rows in ascending order (no deadlock between two batches).

Inline slices (``SliceCommit.inline``, ids with ``INLINE_SLICE_BIT``) keep
their bytes in ``inline_slices``, written in the transaction that commits
their reference; ``read_map`` returns those bytes in the piece
(``ReadPiece.inline``), and a dereferenced inline slice is deleted in the
same transaction (``SqlCore._deref``): there is no drive copy to collect.
"""

from __future__ import annotations

import errno as E
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from shinglefs.meta import schema as S
from shinglefs.meta.api import SLICE_RECORDS_BATCH
from shinglefs.meta.backend import Mode, Tx
from shinglefs.meta.engine.core import SqlCore, attr_of, enoent, now_ns
from shinglefs.meta.engine.permissions import check_mutable
from shinglefs.meta.errors import ChunkChanged, FsError, SliceStateError, TxConflict
from shinglefs.meta.overlay import resolve
from shinglefs.meta.records import (
    ChunkInfo,
    ChunkMap,
    InodeAttr,
    ReadPiece,
    Replica,
    SliceCommit,
    SliceInfo,
    SliceRef,
    SliceState,
    is_inline_slice,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


def slice_info(tx: Tx, slice_id: int) -> SliceInfo | None:
    """A slice with its replicas, read inside ``tx``; None if unknown."""
    row = tx.one(S.SEL_SLICE, (slice_id,))
    if row is None:
        return None
    reps = tuple(Replica(r[0], r[1]) for r in tx.all(S.SEL_REPLICAS, (slice_id,)))
    return SliceInfo(row[0], row[1], row[2], SliceState(row[3]), row[4], reps)


def file_attr(tx: Tx, ino: int) -> InodeAttr:
    """The attributes of regular file ``ino``: ENOENT, EISDIR, EINVAL (other types)."""
    return _file_row(tx.one(S.SEL_INODE, (ino,)), ino)


def _file_row(row: Any, ino: int) -> InodeAttr:
    """``row`` (SEL_INODE's columns, None for no inode) as a regular file's attributes."""
    if row is None:
        raise enoent(ino)
    a = attr_of(row)
    if a.is_dir:
        raise FsError(E.EISDIR, f"inode {ino} is a directory", ino=ino)
    if not a.is_file:
        raise FsError(E.EINVAL, f"inode {ino} is not a regular file", ino=ino)
    return a


MAX_REFUSALS = 3
"""Times a commit is run again at most when a statement refused it but the
cause is gone when read (an inode or a slice never goes back: only a damaged
or hand-edited database gets here)."""


class _Refused(Exception):
    """A statement of a commit refused it (``Tx.later``): nothing committed.
    ``explain`` reads, in a transaction of its own, why."""

    def __init__(self, what: str, key: int) -> None:
        super().__init__(f"{what} {key} refused a commit")
        self.what = what
        self.key = key

    def explain(self, tx: Tx) -> None:
        """Raise the precise error: ENOENT, EISDIR or EINVAL for an inode that
        is no regular file, EPERM for an immutable one, ``SliceStateError`` (ESTALE) for a slice queued for
        deletion or gone; return if the cause is not there any more."""
        if self.what == "inode":
            a = file_attr(tx, self.key)
            check_mutable(a.flags, a.ino, "a write")
            return
        row = tx.one(S.SEL_SLICE_STATE, (self.key,))
        if row is None or row[0] == SliceState.TO_DELETE.value:
            raise SliceStateError(self.key, row[0] if row else "gone", "reference it")


class ChunkOps(SqlCore):
    """commit_slice(s), read_map, get_chunk, compaction, and the slice registry
    (ids, add_slice, touch_slices, replicas, get_slice). ``truncate`` is a size change, in
    ``AttributeOps``; its content side is ``_drop_content_past`` here."""

    # ---- slices ------------------------------------------------------------------------

    def next_slice_id(self) -> int:
        return self._alloc("slice")

    def raise_slice_ids(self, past: int) -> bool:
        moved = self._run(lambda tx: tx.run(S.RAISE_IDS, (past + 1, "slice", past)), "autocommit")
        with self._lock:
            self._ids.pop("slice", None)  # a batch taken before may lie below: take a new one
        return bool(moved)

    def add_slice(self, info: SliceInfo) -> None:
        def txn(tx: Tx) -> None:
            state = SliceState(info.state).value
            row = (info.id, info.length, info.group, state, info.refcount, now_ns())
            if not tx.run(S.INS_SLICE, row):
                raise FsError(E.EEXIST, f"slice {info.id} is already registered")
            for rep in info.replicas:
                tx.run(S.INS_REPLICA, (info.id, rep.server, rep.drive))

        self._run(txn)

    def touch_slices(self, slice_ids: Sequence[int]) -> int:
        ids = sorted(set(slice_ids))
        if len(ids) > SLICE_RECORDS_BATCH:
            raise FsError(E.EINVAL, f"{len(ids)} slice ids in one call; at most "
                          f"{SLICE_RECORDS_BATCH}")
        if not ids:
            return 0
        padded = S.in_list(ids)
        return self._run(lambda tx: tx.run(S.touch_slices(len(padded)), (now_ns(), *padded)))

    def set_slice_replicas(self, slice_id: int, replicas: Sequence[Replica]) -> None:
        def txn(tx: Tx) -> None:
            if tx.one(S.SEL_SLICE_STATE, (slice_id,)) is None:
                raise FsError(E.ENOENT, f"no slice {slice_id}")
            tx.run(S.DEL_REPLICAS, (slice_id,))
            for rep in replicas:
                tx.run(S.INS_REPLICA, (slice_id, rep.server, rep.drive))

        self._run(txn)

    def get_slice(self, slice_id: int) -> SliceInfo:
        info = self._run(lambda tx: slice_info(tx, slice_id), "read")
        if info is None:
            raise FsError(E.ENOENT, f"no slice {slice_id}")
        return info

    def _ref_slice(self, tx: Tx, piece: SliceRef, group: int, slice_length: int | None,
                   registered: bool = False) -> None:
        """Take one reference on ``piece``'s slice, COMMITTED from then on; ESTALE
        (SliceStateError) if it is queued for deletion. A slice its writer
        ``registered`` (``add_slice``) must still have its record: one that is
        gone (discarded by the janitor, its bytes deleted and the deletion
        acked) is refused the same way, never recorded anew; an unregistered
        one is registered here if new. One statement either way (``Tx.later``:
        no round trip of its own on PostgreSQL; ``_Refused`` when refused, raised
        by the end of the transaction), which writes the one slice row it reads
        (safe under mode "snapshot")."""
        length = slice_length if slice_length is not None else piece.slice_offset + piece.length

        def refused() -> _Refused:
            return _Refused("slice", piece.slice_id)

        if registered:
            tx.later(S.REF_REGISTERED_SLICE, (1, length, piece.slice_id), refused)
        else:
            tx.later(S.REF_SLICE, (piece.slice_id, length, group, 1, now_ns(), 1, length), refused)

    # ---- commits -----------------------------------------------------------------------

    def _check_piece(self, piece: SliceRef) -> None:
        if piece.length <= 0 or piece.chunk_offset < 0 or piece.slice_offset < 0:
            raise FsError(E.EINVAL, f"empty or negative piece {piece}")
        if piece.chunk_offset + piece.length > self._chunk_size:
            raise FsError(E.EINVAL, f"piece {piece} crosses the chunk end ({self._chunk_size})")

    def commit_slice(
        self,
        ino: int,
        chunk_index: int,
        piece: SliceRef,
        new_size: int,
        mtime_ns: int | None = None,
        *,
        group: int = 0,
        slice_length: int | None = None,
        replicas: Sequence[Replica] = (),
    ) -> InodeAttr:
        return self.commit_slices([SliceCommit(ino, chunk_index, piece, new_size, group,
                                               slice_length, tuple(replicas), mtime_ns)])[0]

    def commit_slices(self, commits: Sequence[SliceCommit]) -> list[InodeAttr]:
        self._require_formatted()
        for c in commits:
            self._check_commit(c)
        # Inode rows are locked in ascending order (no deadlock between batches);
        # a stable sort keeps one file's slices in their order.
        order = sorted(range(len(commits)), key=lambda i: commits[i].ino)

        def txn(tx: Tx) -> list[Callable[[], Any]]:
            rows: list[Callable[[], Any]] = [lambda: None] * len(commits)
            for i in order:
                rows[i] = self._commit_in(tx, commits[i])
            return rows

        return [attr_of(row()) for row in self._run_refusable(txn, "snapshot")]

    def _run_refusable(self, txn: Callable[[Tx], T], mode: Mode = "write") -> T:
        """``_run(txn, mode)`` for a transaction with ``later`` statements that
        raise ``_Refused``: the refusal is explained (its precise error raised)
        in a read transaction of its own; run again if its cause is gone."""
        for _ in range(MAX_REFUSALS):
            try:
                return self._run(txn, mode)
            except _Refused as refusal:
                self._run(refusal.explain, "read")
                log.warning("%s: the cause is gone when read; committing again", refusal)
        raise TxConflict(f"a commit refused {MAX_REFUSALS} times")

    def _check_commit(self, c: SliceCommit) -> None:
        self._check_piece(c.piece)
        if (c.inline is not None) != is_inline_slice(c.piece.slice_id):
            raise FsError(E.EINVAL, f"slice {c.piece.slice_id:#x}: inline bytes go with an "
                          "inline slice id, and only with one")
        if c.inline is not None and c.registered:
            raise FsError(E.EINVAL, f"inline slice {c.piece.slice_id:#x} cannot have been "
                          "registered (its bytes are in the commit)")
        if c.inline is not None and (
            c.slice_length not in (None, len(c.inline))
            or c.piece.slice_offset + c.piece.length > len(c.inline)
        ):
            raise FsError(E.EINVAL, f"inline slice {c.piece.slice_id:#x}: {len(c.inline)} bytes "
                          f"do not hold piece {c.piece}")
        if c.chunk_index < 0 or c.new_size < 0:
            raise FsError(E.EINVAL, f"negative chunk index {c.chunk_index} or size {c.new_size}")
        piece_end = c.chunk_index * self._chunk_size + c.piece.chunk_offset + c.piece.length
        if c.new_size < piece_end:
            raise FsError(E.EINVAL, f"new size {c.new_size} ends before the piece ({piece_end})")

    def _commit_in(self, tx: Tx, c: SliceCommit) -> Callable[[], Any]:
        """One slice reference into the chunk map, inside ``tx``.

        Safe under snapshot isolation (mode "snapshot"): every row it reads it
        also writes -- the inode (size for the counters, then GROW_FILE_ATTR),
        the chunk row (bumped, then its version read for the reference), the
        slice row (its state checked by the upsert, or for a registered slice
        the UPDATE, that takes the reference);
        the replica and inline rows it writes are the slice's own.
        Returns the function that gives the grown inode row once committed;
        ``_Refused`` (on PostgreSQL by the end of the transaction) when ``c.ino``
        is no regular file or the slice is queued for deletion: nothing commits."""
        now = now_ns()
        mtime = now if c.mtime_ns is None else c.mtime_ns
        p = c.piece
        tx.put(S.COUNT_GROWTH, (*self._delta_key(), c.new_size, c.ino, c.new_size))
        tx.put(S.BUMP_CHUNK, (c.ino, c.chunk_index))
        tx.put(S.INS_REF_AT_VERSION, (p.slice_id, p.chunk_offset, p.length, p.slice_offset,
                                      c.ino, c.chunk_index))
        if c.inline is not None:  # a second reference to it keeps the bytes it has
            tx.put(S.INS_INLINE, (p.slice_id, c.inline))
        self._ref_slice(tx, p, c.group, c.slice_length, c.registered)
        if c.replicas:
            tx.put(S.DEL_REPLICAS, (p.slice_id,))
        for rep in c.replicas:
            tx.put(S.INS_REPLICA, (p.slice_id, rep.server, rep.drive))
        # Last, so that one round trip carries the whole commit with its COMMIT;
        # no inode, a directory or a special file fails the transaction here.
        # ctime as write(2) sets it, with mtime; never back past a later change.
        return tx.later(S.GROW_FILE_ATTR, (c.new_size, mtime, mtime, c.ino),
                        lambda: _Refused("inode", c.ino))

    # ---- size changes ------------------------------------------------------------------

    def _drop_content_past(self, tx: Tx, a: InodeAttr, size: int, now: int) -> None:
        """The content side of changing ``a``'s size to ``size`` (the caller updates
        the inode row): going down, references past ``size`` are dropped or
        trimmed and their slices dereferenced; emptied chunks keep their row with
        a bumped version. The statfs counters follow the size either way."""
        cs = self._chunk_size
        if size < a.size:
            keep_chunks = -(-size // cs)  # chunks [0, keep_chunks) keep some bytes
            ino = a.ino
            refs = tx.all(S.SEL_REFS_FROM, (ino, size // cs))
            dropped: Counter[int] = Counter()
            partial: dict[int, int] = {}
            for ci, seq, sid, coff, ln, _soff in refs:
                start = ci * cs + coff
                if start >= size:
                    dropped[sid] += 1
                    if ci < keep_chunks:
                        tx.run(S.DEL_REF, (ino, ci, seq))
                        partial[ci] = partial.get(ci, 0) - 1
                elif start + ln > size:
                    tx.run(S.TRIM_REF, (size - start, ino, ci, seq))
                    partial.setdefault(ci, 0)
            if refs:
                tx.run(S.DEL_REFS_FROM, (ino, keep_chunks))
                # Emptied chunks keep their row (version bumped) so that a
                # compaction that read them before cannot succeed later (ABA).
                for ci in {r[0] for r in refs if r[0] >= keep_chunks}:
                    row = tx.one(S.SEL_CHUNK, (ino, ci))
                    if row is not None:
                        tx.run(S.SET_CHUNK, (row[0] + 1, 0, ino, ci))
                for ci, delta in partial.items():
                    row = tx.one(S.SEL_CHUNK, (ino, ci))
                    if row is not None:
                        tx.run(S.SET_CHUNK, (row[0] + 1, row[1] + delta, ino, ci))
                if dropped:
                    self._deref(tx, dropped, now)
        self._counters(tx, size - a.size, 0)

    # ---- reading the map ---------------------------------------------------------------

    def read_map(self, ino: int, offset: int, length: int) -> list[ReadPiece]:
        if offset < 0 or length < 0:
            raise FsError(E.EINVAL, f"negative offset {offset} or length {length}")
        self._require_formatted()
        cs = self._chunk_size

        def txn(tx: Tx) -> list[ReadPiece]:
            a = file_attr(tx, ino)
            end = min(offset + length, a.size)
            if end <= offset:
                return []
            rows = tx.all(S.SEL_REFS, (ino, offset // cs, (end - 1) // cs))
            by_chunk: dict[int, list[SliceRef]] = {}
            inline = False
            for ci, _seq, sid, coff, ln, soff in rows:
                by_chunk.setdefault(ci, []).append(SliceRef(sid, coff, ln, soff))
                inline = inline or is_inline_slice(sid)
            pieces = resolve(by_chunk, cs, offset, end)
            return _with_inline_bytes(tx, pieces) if inline else pieces

        return self._run(txn, "read")

    def get_chunk(self, ino: int, chunk_index: int) -> ChunkMap:
        def txn(tx: Tx) -> ChunkMap:
            file_attr(tx, ino)
            row = tx.one(S.SEL_CHUNK, (ino, chunk_index))
            rows = tx.all(S.SEL_REFS, (ino, chunk_index, chunk_index))
            refs = tuple(SliceRef(r[2], r[3], r[4], r[5]) for r in rows)
            return ChunkMap(ino, chunk_index, row[0] if row else 0, refs, tuple(r[1] for r in rows))

        return self._run(txn, "read")

    # ---- compaction --------------------------------------------------------------------

    def compaction_candidates(self, min_refs: int = 8, limit: int = 100) -> list[ChunkInfo]:
        rows = self._run(lambda tx: tx.all(S.CANDIDATES, (max(1, min_refs), limit)), "single")
        return [ChunkInfo(*r) for r in rows]

    def replace_chunk(
        self,
        ino: int,
        chunk_index: int,
        old_refs_version: int,
        new_piece: SliceRef | Sequence[SliceRef],
        *,
        group: int = 0,
        slice_length: int | None = None,
        registered: bool = False,
        replaced: Sequence[tuple[int, SliceRef]] | None = None,
    ) -> ChunkMap:
        self._require_formatted()
        pieces = [new_piece] if isinstance(new_piece, SliceRef) else list(new_piece)
        for p in pieces:
            self._check_piece(p)
        spans = sorted((p.chunk_offset, p.chunk_offset + p.length) for p in pieces)
        for (_, e1), (s2, _) in itertools.pairwise(spans):
            if s2 < e1:
                raise FsError(E.EINVAL, "replacement pieces overlap")
        if replaced is not None:
            seqs = sorted(seq for seq, _ in replaced)
            if not seqs or len(set(seqs)) != len(seqs) or seqs[-1] > old_refs_version:
                raise FsError(E.EINVAL, "replaced references are not references of the map read")
            if len(pieces) > len(seqs):
                raise FsError(E.EINVAL, "more replacement pieces than references replaced")
            expected = dict(replaced)

        def txn(tx: Tx) -> ChunkMap:
            now = now_ns()
            file_attr(tx, ino)
            row = tx.one(S.SEL_CHUNK, (ino, chunk_index))
            version = row[0] if row else 0
            current = {r[1]: SliceRef(r[2], r[3], r[4], r[5])
                       for r in tx.all(S.SEL_REFS, (ino, chunk_index, chunk_index))}
            new_seqs: Sequence[int]
            if replaced is None:  # the whole overlay, as read
                if version != old_refs_version:
                    raise ChunkChanged(ino, chunk_index, old_refs_version, version)
                gone = current
                new_seqs = range(version + 1, version + 1 + len(pieces))
                new_version = version + max(1, len(pieces))
            else:  # those references, under any committed since
                gone = {q: r for q, r in current.items() if seqs[0] <= q <= seqs[-1]}
                if version < old_refs_version or gone != expected:
                    raise ChunkChanged(ino, chunk_index, old_refs_version, version)
                new_seqs = seqs[:len(pieces)]
                new_version = version + 1
            if gone is current:
                tx.run(S.DEL_REFS_CHUNK, (ino, chunk_index))
            else:  # exactly those between the lowest and highest replaced (checked above)
                tx.run(S.DEL_REFS_SEQS, (ino, chunk_index, seqs[0], seqs[-1]))
            for seq, p in zip(new_seqs, pieces, strict=True):
                tx.run(S.INS_REF, (ino, chunk_index, seq, p.slice_id, p.chunk_offset,
                                   p.length, p.slice_offset))
                self._ref_slice(tx, p, group, slice_length, registered)
            if row is None:
                tx.one(S.BUMP_CHUNK, (ino, chunk_index))
            tx.run(S.SET_CHUNK, (new_version, len(current) - len(gone) + len(pieces),
                                 ino, chunk_index))
            self._deref(tx, Counter(r.slice_id for r in gone.values()), now)
            kept = {q: r for q, r in current.items() if q not in gone}
            kept.update(zip(new_seqs, pieces, strict=True))
            order = sorted(kept)
            return ChunkMap(ino, chunk_index, new_version, tuple(kept[q] for q in order),
                            tuple(order))

        return self._run_refusable(txn)


def _with_inline_bytes(tx: Tx, pieces: list[ReadPiece]) -> list[ReadPiece]:
    """``pieces`` with the bytes of their inline slices attached (``ReadPiece.inline``)."""
    blobs: dict[int, bytes] = {}
    out = []
    for p in pieces:
        if p.slice_id is not None and is_inline_slice(p.slice_id):
            blob = blobs.get(p.slice_id)
            if blob is None:
                row = tx.one(S.SEL_INLINE, (p.slice_id,))
                if row is None:
                    raise FsError(E.EIO, f"inline slice {p.slice_id:#x} has no bytes in meta")
                blob = blobs[p.slice_id] = bytes(row[0])
            p = replace(p, inline=blob[p.slice_offset:p.slice_offset + p.length])
        out.append(p)
    return out
