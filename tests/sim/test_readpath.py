"""``sim.readpath``: the order in which the client's read path sends concurrent reads to a drive."""

from __future__ import annotations

import itertools

import pytest

from shinglefs.client.config import ClientConfig
from shinglefs.sim import hc620
from shinglefs.sim.readpath import ReadFile, ReadPathParams, schedule
from shinglefs.zoned.model import TraceRecord

MiB = 1024 * 1024
MODEL = hc620()
ZONE = MODEL.zone_size


def a_file(zone: int, length: int, extent: int = 4 * MiB) -> ReadFile:
    """A file stored contiguously from the start of ``zone``: one drive read per extent."""
    base = zone * ZONE
    return ReadFile(length, [[TraceRecord("read", zone, base + pos, min(extent, length - pos), 0.0)]
                             for pos in range(0, length, extent)])


def files_of(records: list[TraceRecord]) -> list[int]:
    """The zone (= file) of each drive read, in the drive's order."""
    return [r.zone for r in records]


def switches(records: list[TraceRecord]) -> int:
    zones = files_of(records)
    return sum(1 for a, b in itertools.pairwise(zones) if a != b)


def test_defaults_are_the_clients():
    c, p = ClientConfig(), ReadPathParams()
    assert (p.read_extent, p.readahead, p.io_threads) == (c.read_extent, c.readahead_bytes,
                                                          c.io_threads)


def test_one_reader_streams_its_file_in_order_at_the_rated_rate():
    f = a_file(10, 256 * MiB)
    res = schedule(MODEL, [[f]], params=ReadPathParams(consume_mib_s=100.0))
    assert [r.offset for r in res.records] == sorted(r.offset for r in res.records)
    assert res.bytes_read == 256 * MiB
    rated = MODEL.geometry.rate(10 * ZONE, write=False) / MiB
    assert res.busy_mib_s == pytest.approx(rated, rel=0.02)
    assert res.seconds >= 256 / 100  # the reader's own pace bounds the epoch


def test_paced_readers_interleave_extents_and_pay_for_the_seeks():
    files = [[a_file(10, 256 * MiB)], [a_file(3000, 256 * MiB)]]
    paced = schedule(MODEL, files, params=ReadPathParams(consume_mib_s=100.0))
    one = schedule(MODEL, [[files[0][0], files[1][0]]], params=ReadPathParams(consume_mib_s=100.0))
    assert switches(paced.records) > 20  # past the first windows, a top-up at a time
    assert switches(one.records) == 1
    assert paced.busy_mib_s < 0.9 * one.busy_mib_s


def test_readers_as_fast_as_the_drive_keep_their_windows_together():
    files = [[a_file(10, 256 * MiB)], [a_file(3000, 256 * MiB)]]
    fast = schedule(MODEL, files)
    paced = schedule(MODEL, files, params=ReadPathParams(consume_mib_s=100.0))
    assert switches(fast.records) < switches(paced.records)
    assert fast.seconds == pytest.approx(fast.busy_seconds)


def test_a_larger_refill_as_one_request_cuts_the_switches():
    files = [[a_file(10, 256 * MiB)], [a_file(3000, 256 * MiB)]]
    fifo = schedule(MODEL, files, params=ReadPathParams(consume_mib_s=100.0))
    refill = schedule(MODEL, files, params=ReadPathParams(consume_mib_s=100.0, refill=32 * MiB,
                                                          whole_window=True))
    assert switches(refill.records) < switches(fifo.records) / 3
    assert refill.busy_mib_s > fifo.busy_mib_s


def test_every_byte_is_read_once():
    files = [[a_file(10 + 2 * i, 40 * MiB)] for i in range(8)]
    res = schedule(MODEL, files, params=ReadPathParams(consume_mib_s=50.0))
    assert res.bytes_read == 8 * 40 * MiB
    assert len({(r.zone, r.offset) for r in res.records}) == len(res.records)


def test_a_file_without_its_extents_is_refused():
    with pytest.raises(ValueError, match="extents"):
        schedule(MODEL, [[ReadFile(64 * MiB, [])]])
