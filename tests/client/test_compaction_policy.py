"""Which references a compaction merges (``compaction._merge_from``), run
against long simulated logs: the write amplification stays logarithmic."""

from __future__ import annotations

import math
import random

import pytest

from shinglefs.client.background.compaction import _intersect, _merge_from, _spans
from shinglefs.meta.api import SliceRef

MiB = 1 << 20


def refs(*spans: tuple[int, int]) -> tuple[SliceRef, ...]:
    return tuple(SliceRef(i + 1, off, length, 0) for i, (off, length) in enumerate(spans))


@pytest.mark.parametrize("threshold", [4, 8, 16])
def test_a_log_compacted_every_threshold_appends_rewrites_each_byte_log_times(threshold: int) -> None:
    """An O_APPEND log of 100-byte lines, compacted every ``threshold``
    commits as the compactor would: each byte is rewritten O(log) times (not
    once per compaction: that grows with the log) and the references stay
    O(log) too."""
    lines, line = 50_000, 100
    chunk: list[SliceRef] = []
    rewritten = peak = 0
    for i in range(lines):
        chunk.append(SliceRef(i + 1, i * line, line, 0))
        peak = max(peak, len(chunk))
        if i % threshold == threshold - 1:
            first = _merge_from(tuple(chunk))
            merged = sum(r.length for r in chunk[first:])
            rewritten += merged
            chunk = [*chunk[:first], SliceRef(10**9 + i, chunk[first].chunk_offset, merged, 0)]
    bound = math.log2(lines / threshold)
    assert rewritten / (lines * line) <= bound, rewritten / (lines * line)
    assert peak <= threshold + 2 * bound


def test_the_whole_chunk_is_merged_when_the_newest_alone_would_not_defragment_it() -> None:
    # Overwrites scattered over a large base: merging them alone leaves as many runs.
    assert _merge_from(refs((0, MiB), *((i * 40_000, 3) for i in range(6)))) == 0
    # One small reference after a big one: nothing to gain from merging it alone.
    assert _merge_from(refs((0, MiB), (MiB, 10))) == 0
    # A base hidden under a rewrite of itself is freed with a whole merge.
    assert _merge_from(refs((0, 64 * MiB), (0, 64 * MiB), *((64 * MiB - 100 + i, 1)
                                                           for i in range(16)))) == 0


def test_appends_after_size_tiers_are_merged_alone() -> None:
    tiers = ((0, 8 * MiB), (8 * MiB, 2 * MiB), (10 * MiB, MiB))
    appends = tuple((11 * MiB + i * 100, 100) for i in range(16))
    assert _merge_from(refs(*tiers, *appends)) == 3


def test_runs_are_cut_to_the_merged_spans_as_a_byte_by_byte_model_says() -> None:
    rng = random.Random(5)
    for _ in range(300):
        spans = _spans([SliceRef(1, o, rng.randrange(1, 40), 0)
                        for o in rng.sample(range(400), rng.randrange(1, 12))])
        runs, at = [], 0
        while at < 450:
            at += rng.randrange(0, 30)
            length = rng.randrange(1, 60)
            runs.append((at, length))
            at += length + 1
        covered = {b for s, e in spans for b in range(s, e)}
        want = sorted(b for o, n in runs for b in range(o, o + n) if b in covered)
        got = _intersect(runs, spans)
        assert sorted(b for o, n in got for b in range(o, o + n)) == want
        assert got == sorted(got) and all(n > 0 for _, n in got)
