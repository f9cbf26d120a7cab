"""The pure overlay resolution: ordered references -> pieces and holes."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from shinglefs.meta.api import ReadPiece, SliceRef
from shinglefs.meta.overlay import flatten, resolve

CHUNK = 64

refs = st.lists(
    st.builds(
        lambda sid, off, ln, soff: SliceRef(sid, off, min(ln, CHUNK - off), soff),
        st.integers(1, 5),
        st.integers(0, CHUNK - 1),
        st.integers(1, CHUNK),
        st.integers(0, 100),
    ),
    max_size=10,
)


def paint(chunk_refs, size):
    """The model: apply references byte by byte, later ones winning."""
    cells = [None] * size
    for r in chunk_refs:
        for k in range(r.length):
            cells[r.chunk_offset + k] = (r.slice_id, r.slice_offset + k)
    return cells


@given(chunk0=refs, chunk1=refs, start=st.integers(0, 2 * CHUNK), length=st.integers(0, 2 * CHUNK))
def test_resolve_equals_painting_bytes_in_order(chunk0, chunk1, start, length):
    end = min(start + length, 2 * CHUNK)
    model = paint(chunk0, CHUNK) + paint(chunk1, CHUNK)
    pieces = resolve({0: chunk0, 1: chunk1}, CHUNK, start, end)
    got, pos = [], start
    for p in pieces:
        assert p.file_offset == pos and p.length > 0
        got += (
            [None] * p.length
            if p.is_hole
            else [(p.slice_id, p.slice_offset + k) for k in range(p.length)]
        )
        pos += p.length
    assert got == model[start:end]
    for a, b in itertools.pairwise(pieces):
        assert not (a.is_hole and b.is_hole), "adjacent holes are merged"


def test_later_reference_splits_an_earlier_one():
    runs = flatten([SliceRef(1, 0, 100, 0), SliceRef(2, 40, 20, 7)], 0, 100)
    assert runs == [(0, 40, 1, 0), (40, 60, 2, 7), (60, 100, 1, 60)]


def test_contiguous_runs_of_one_slice_merge_across_chunks():
    pieces = resolve({0: [SliceRef(9, 60, 4, 0)], 1: [SliceRef(9, 0, 4, 4)]}, 64, 60, 68)
    assert pieces == [ReadPiece(60, 8, 9, 0)]
