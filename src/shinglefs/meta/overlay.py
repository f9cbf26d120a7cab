"""Resolving a chunk's overlay of slice references into pieces (pure functions).

A chunk's content is its references applied in order, a later reference
winning where it overlaps an earlier one; bytes no reference covers are a hole
(they read as zeros). ``resolve_chunk`` flattens that into non-overlapping runs.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from shinglefs.meta.api import ReadPiece, SliceRef

# A run inside a chunk: (start, end, slice_id, slice_offset_at_start)
Run = tuple[int, int, int, int]


def flatten(refs: Iterable[SliceRef], start: int, end: int) -> list[Run]:
    """The visible runs of ``refs`` (oldest first) within ``[start, end)`` of the
    chunk, sorted, non-overlapping; gaps are holes."""
    runs: list[Run] = []
    for ref in refs:
        s = max(ref.chunk_offset, start)
        e = min(ref.chunk_offset + ref.length, end)
        if s >= e:
            continue
        new: Run = (s, e, ref.slice_id, ref.slice_offset + (s - ref.chunk_offset))
        # Runs are sorted by start and disjoint: find those overlapping [s, e).
        i = bisect_left(runs, (s,)) - 1
        i = max(i, 0)
        while i < len(runs) and runs[i][1] <= s:
            i += 1
        j = i
        keep: list[Run] = []
        while j < len(runs) and runs[j][0] < e:
            rs, re_, sid, soff = runs[j]
            if rs < s:
                keep.append((rs, s, sid, soff))
            if re_ > e:
                keep.append((e, re_, sid, soff + (e - rs)))
            j += 1
        keep.append(new)
        keep.sort()
        runs[i:j] = keep
    return runs


def resolve(
    refs_by_chunk: dict[int, list[SliceRef]],
    chunk_size: int,
    offset: int,
    end: int,
) -> list[ReadPiece]:
    """Pieces covering ``[offset, end)`` of a file exactly, in order, holes included.

    Adjacent holes merge, and so do adjacent runs of one slice that continue
    each other (same slice, contiguous slice offsets).
    """
    pieces: list[ReadPiece] = []

    def emit(fo: int, length: int, sid: int | None, soff: int) -> None:
        if length <= 0:
            return
        if pieces:
            last = pieces[-1]
            if last.file_offset + last.length == fo:
                if sid is None and last.slice_id is None:
                    pieces[-1] = ReadPiece(last.file_offset, last.length + length, None, 0)
                    return
                if (
                    sid is not None
                    and last.slice_id == sid
                    and last.slice_offset + last.length == soff
                ):
                    pieces[-1] = ReadPiece(
                        last.file_offset, last.length + length, sid, last.slice_offset
                    )
                    return
        pieces.append(ReadPiece(fo, length, sid, soff if sid is not None else 0))

    if end <= offset:
        return pieces
    first = offset // chunk_size
    last = (end - 1) // chunk_size
    for ci in range(first, last + 1):
        base = ci * chunk_size
        cs = max(offset, base) - base
        ce = min(end, base + chunk_size) - base
        pos = cs
        for s, e, sid, soff in flatten(refs_by_chunk.get(ci, ()), cs, ce):
            emit(base + pos, s - pos, None, 0)
            emit(base + s, e - s, sid, soff)
            pos = e
        emit(base + pos, ce - pos, None, 0)
    return pieces
