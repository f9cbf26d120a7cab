"""``touch_slices``: a live writer vouches for its WRITING slices, on every backend.

A touched slice counts as registered now, so ``abandoned_slices`` (what the
janitor discards) skips it; committed, discarded and unknown slices are left
alone. The writer is another client: a second store on the same database.
"""

from __future__ import annotations

import errno as E
import time

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO, SLICE_RECORDS_BATCH, SliceInfo, SliceRef, SliceState
from shinglefs.meta.errors import FsError

# The abandoned age asked about: long enough that a loaded machine cannot age
# the touch past it between the touch and the question.
AGE_S = 1.0


def test_a_touched_writing_slice_is_not_abandoned_and_nothing_else_is_touched(
    meta, meta_url, check,
) -> None:
    f = meta.create(ROOT_INO, b"f", 0o644)
    vouched, silent, committed, doomed = (meta.next_slice_id() for _ in range(4))
    for sid in (vouched, silent, committed, doomed):
        meta.add_slice(SliceInfo(sid, 4096))
    meta.commit_slice(f.ino, 0, SliceRef(committed, 0, 4096), 4096)
    time.sleep(AGE_S + 0.2)
    assert meta.discard_slices([doomed]) == [doomed]
    writer = open_meta(meta_url)  # the client writing ``vouched``, elsewhere
    try:
        unknown = writer.next_slice_id()
        assert writer.touch_slices([vouched, committed, doomed, unknown, vouched]) == 1
        # The janitor's question: only the slice nobody vouched for is abandoned.
        assert [s.id for s in meta.abandoned_slices(older_than_s=AGE_S)] == [silent]
    finally:
        writer.close()
    assert meta.discard_slices([silent]) == [silent]
    assert meta.get_slice(vouched).state is SliceState.WRITING
    assert meta.get_slice(committed).state is SliceState.COMMITTED
    assert meta.get_slice(committed).refcount == 1
    assert {s.id for s in meta.pop_deletions()} == {doomed, silent}
    time.sleep(AGE_S + 0.2)  # not touched again: abandoned once older than the age
    assert [s.id for s in meta.abandoned_slices(older_than_s=AGE_S)] == [vouched]
    # A touched slice commits as any other.
    meta.commit_slice(f.ino, 0, SliceRef(vouched, 0, 4096), 4096)
    assert meta.get_slice(vouched).state is SliceState.COMMITTED
    check()


def test_touch_slices_takes_a_bounded_batch(meta) -> None:
    ids = [meta.next_slice_id() for _ in range(SLICE_RECORDS_BATCH + 1)]
    for sid in ids:
        meta.add_slice(SliceInfo(sid, 0))
    assert meta.touch_slices([]) == 0
    assert meta.touch_slices(ids[:SLICE_RECORDS_BATCH]) == SLICE_RECORDS_BATCH
    with pytest.raises(FsError) as raised:
        meta.touch_slices(ids)
    assert raised.value.errno == E.EINVAL
