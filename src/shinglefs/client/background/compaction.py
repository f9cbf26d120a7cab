"""Compaction: a chunk fragmented into many slices is rewritten as one sequential slice.

Two sources of work: the chunks this client's own commits fragmented (every
``compact_threshold`` commits into one chunk queue it: ``note_commit``,
drained by ``run_queued``), and, every ``compaction_scan_interval``, the
chunks meta reports with many references from any client
(``compact_fragmented``).

The swap is optimistic: the live bytes of the references chosen
(``_merge_from``) are read through the chunk's overlay, written into one new
slice (holes stay holes) in the file's lifetime group, flushed on the drive
(the ordered-commit rule: ``client.commit``), then ``replace_chunk`` swaps
exactly those references, under any committed since. If one of them changed
meanwhile, or writing the new slice failed (a full drive), the new slice is
queued for deletion and nothing happened.
The old slices are dereferenced by meta and freed by the deletion consumer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from shinglefs.client.commit import register_slice
from shinglefs.client.config import ClientConfig
from shinglefs.client.groups import GroupPolicy
from shinglefs.client.inodes import InodeTable, OpenInode, cut
from shinglefs.client.reader import DirectReader, ReadSlice, assemble
from shinglefs.meta.api import MetaStore, ReadPiece, SliceRef
from shinglefs.meta.errors import ChunkChanged, FsError, SliceStateError
from shinglefs.server.errors import SliceMissing
from shinglefs.server.node import SliceNode

log = logging.getLogger(__name__)

__all__ = ["COMPACTION_ATTEMPTS", "Compactor"]

COMPACTION_ATTEMPTS = 3


class Compactor:
    """Compacts chunks of one client's file system (thread-safe).

    ``pause(seconds)`` sleeps between attempts and returns True when the
    client is stopping; ``wake()`` starts a scheduler pass (the deletion of
    the replaced slices, or a queued compaction).
    """

    def __init__(
        self,
        meta: MetaStore,
        node: SliceNode,
        config: ClientConfig,
        *,
        chunk_size: int,
        inodes: InodeTable,
        groups: GroupPolicy,
        read_slice: ReadSlice,
        wake: Callable[[], None],
        pause: Callable[[float], bool],
    ) -> None:
        self.meta = meta
        self.node = node
        self.config = config
        self.chunk_size = chunk_size
        self.inodes = inodes
        self.groups = groups
        self._read_slice = read_slice
        self._wake = wake
        self._pause = pause
        self._lock = threading.Lock()
        self._queue: list[tuple[int, int]] = []  # (ino, chunk_index)
        self.compactions = 0
        self.compacted_bytes = 0  # written into new slices by the swaps that succeeded

    def note_commit(self, state: OpenInode, chunk_index: int) -> None:
        """A slice of ``state``'s inode was committed into ``chunk_index``: queue
        the chunk once it has collected ``compact_threshold`` of them."""
        if not self.config.compaction:
            return
        with self._lock:  # a file's settle threads return from one commit batch at once
            n = state.commits_per_chunk.get(chunk_index, 0) + 1
            state.commits_per_chunk[chunk_index] = n
            due = n >= self.config.compact_threshold
            if due:
                state.commits_per_chunk[chunk_index] = 0
                self._queue.append((state.ino, chunk_index))
        if due:
            self._wake()

    def run_queued(self) -> None:
        """Compact the chunks ``note_commit`` queued; a chunk that changed while
        being compacted (its writer is still busy) is retried a few times."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                ino, chunk_index = self._queue.pop(0)
            for attempt in range(COMPACTION_ATTEMPTS):
                try:
                    if self.compact_chunk(ino, chunk_index):
                        break
                except FsError as exc:
                    log.info("compaction of inode %d chunk %d skipped: %s", ino, chunk_index, exc)
                    break
                if len(self.meta.get_chunk(ino, chunk_index).refs) < 2 or self._pause(
                    0.1 * (attempt + 1)
                ):
                    break

    def compact_fragmented(self, min_refs: int | None = None, limit: int = 100) -> int:
        """Compact every chunk meta reports with at least ``min_refs`` references
        (default ``compact_threshold``); returns how many were compacted."""
        count = 0
        threshold = min_refs or self.config.compact_threshold
        for info in self.meta.compaction_candidates(threshold, limit):
            try:
                if self.compact_chunk(info.ino, info.chunk_index):
                    count += 1
            except FsError as exc:  # this chunk only (its inode went away): the scan goes on
                log.info("compaction of inode %d chunk %d skipped: %s", info.ino,
                         info.chunk_index, exc)
        return count

    def compact_chunk(self, ino: int, chunk_index: int, *, min_refs: int = 2) -> bool:
        """Rewrite a fragmented chunk's references as one sequential slice
        (optimistic swap).

        Which references: the newest ones that a log-like writer left
        (``_merge_from``: each older one kept is larger than all those after
        it, so a byte is rewritten at most log2 times however the chunk grows),
        or all of them when merging only those would not defragment the chunk
        (overwrites scattered over it). References committed while the new
        slice is written stay on top of it: a writer that keeps committing
        (an O_APPEND log fsynced every line) does not make the swap fail.

        Durable when it returns True: the new slice is flushed on its drive
        and referenced in meta. Returns False when the chunk had fewer than
        ``min_refs`` references (1: any chunk is rewritten whole, the tier
        mover's use: the new slice is placed as its group's now are, and the
        swap is refused if anything was committed into the chunk meanwhile,
        so a moved chunk has no reference left behind), held no bytes, or the
        references chosen changed meanwhile (the new slice is then deleted).
        Raises ``FsError`` (the inode is gone) and storage errors.
        """
        chunk = self.meta.get_chunk(ino, chunk_index)
        if len(chunk.refs) < max(1, min_refs):
            return False
        whole = min_refs <= 1  # the tier mover: the chunk as read, or nothing
        first = 0 if whole else _merge_from(chunk.refs)
        merged = list(zip(chunk.seqs[first:], chunk.refs[first:], strict=True))
        base = chunk_index * self.chunk_size
        end = max(r.chunk_offset + r.length for _, r in merged)
        pieces = self.meta.read_map(ino, base, end)
        # The bytes now visible where the merged references lie: theirs, or a
        # newer reference's, which stays on top of them after the swap.
        runs = _intersect(_live_runs(pieces, base), _spans([r for _, r in merged]))
        if not runs or len(runs) > len(merged):
            return False  # the chunk was cut or emptied since it was read
        slice_id = self.meta.next_slice_id()
        group = self._group_of(ino)
        reader = DirectReader(self._read_slice)
        drive_id: int | None = None
        written = 0
        refs: list[SliceRef] = []
        try:
            for run_offset, run_length in runs:
                refs.append(SliceRef(slice_id, run_offset, run_length, written))
                pos = 0
                while pos < run_length:
                    n = min(self.config.piece_size, run_length - pos)
                    at = base + run_offset + pos
                    data = assemble(cut(pieces, at, at + n), reader, at, n)
                    first = drive_id is None
                    drive_id = self.node.write(slice_id, written, data, group, drive_id=drive_id)
                    if first:
                        register_slice(self.meta, slice_id,
                                       self.node.replicas_of(slice_id, drive_id), group)
                    written += n
                    pos += n
            assert drive_id is not None
            self.node.flush(self.node.replicas_of(slice_id, drive_id))
            self.meta.replace_chunk(
                ino, chunk_index, chunk.version, refs, group=group, slice_length=written,
                registered=True, replaced=None if whole else merged,
            )
        except BaseException as exc:
            if drive_id is not None:
                self._drop_partial(slice_id, drive_id)
            if isinstance(exc, (ChunkChanged, SliceMissing, SliceStateError)):
                return False  # the last: discarded meanwhile
            raise  # a full drive, a dead server: the caller reports it
        self.node.forget(slice_id)
        self.inodes.maps.invalidate(ino)
        self.compactions += 1
        self.compacted_bytes += written
        self._wake()
        return True

    def _drop_partial(self, slice_id: int, drive_id: int) -> None:
        """Free a new slice the swap gave up on (the chunk changed, a drive was
        full, a server died): queued in meta for the deletion consumer, which
        deletes it on each replica's drive, so that neither its registration
        nor its bytes are left behind. Only a slice still WRITING and never
        referenced is queued (``discard_slices``): one whose commit did land
        is kept. Best effort; the janitor collects what this could not."""
        try:
            queued = self.meta.discard_slices([slice_id])
        except Exception as exc:  # meta unreachable: the janitor finds the slice later
            log.warning("compaction: slice %#x not queued for deletion: %s", slice_id, exc)
            return
        self.node.forget(slice_id)
        if queued:
            self._wake()

    def _group_of(self, ino: int) -> int:
        """The lifetime group of ``ino``'s writes: its open writer's, else the policy's."""
        state = self.inodes.get(ino)
        if state is not None and state.writer.group is not None:
            return state.writer.group
        return self.groups.group_for(ino, self.inodes.parent(ino), small=False)


def _live_runs(pieces: list[ReadPiece], base: int) -> list[tuple[int, int]]:
    """``(chunk_offset, length)`` of the contiguous runs of bytes ``pieces``
    hold (holes skipped), for the chunk starting at file offset ``base``."""
    runs: list[tuple[int, int]] = []
    for p in pieces:
        if p.slice_id is None:
            continue
        offset = p.file_offset - base
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + p.length)
        else:
            runs.append((offset, p.length))
    return runs


def _spans(refs: list[SliceRef]) -> list[tuple[int, int]]:
    """The union of ``refs``' chunk ranges as sorted ``(start, end)`` pairs."""
    out: list[tuple[int, int]] = []
    for start, end in sorted((r.chunk_offset, r.chunk_offset + r.length) for r in refs):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _intersect(runs: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, length)`` runs (disjoint, in order) cut to the sorted,
    disjoint ``(start, end)`` spans; linear in both (a chunk may hold
    thousands of references)."""
    out: list[tuple[int, int]] = []
    j = 0
    for offset, length in runs:
        end = offset + length
        while j < len(spans) and spans[j][1] <= offset:
            j += 1
        k = j
        while k < len(spans) and spans[k][0] < end:
            lo, hi = max(offset, spans[k][0]), min(end, spans[k][1])
            if lo < hi:
                out.append((lo, hi - lo))
            k += 1
    return out


def _merge_from(refs: tuple[SliceRef, ...]) -> int:
    """Index of the first reference to merge. Walking from the newest, an
    older reference joins the merge unless it is larger than all the bytes
    already chosen. The newest ones alone are merged when they are two or
    more, become at most half as many runs (appends, not scattered
    overwrites), and the references kept are size tiers themselves (each
    larger than everything after it, as in a size-tiered LSM tree: at most
    log2(chunk / smallest) of them, and a byte is rewritten O(log) times
    however long a log grows). Otherwise 0: the whole chunk is merged,
    which also frees older references hidden under newer ones."""
    total = 0
    first = len(refs)
    for i in range(len(refs) - 1, -1, -1):
        if i < len(refs) - 1 and refs[i].length > total:
            break
        total += refs[i].length
        first = i
    merged = len(refs) - first
    if merged < 2 or len(_spans(list(refs[first:]))) > merged // 2:
        return 0
    for i in range(first - 1, -1, -1):
        if refs[i].length <= total:
            return 0  # a kept reference is not a tier: scattered or hidden bytes
        total += refs[i].length
    return first
