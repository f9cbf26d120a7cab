"""The replay interface: zone mapping, counters, unknown operations."""

from __future__ import annotations

import pytest

from shinglefs.sim import PROFILES, hc620, profile
from shinglefs.sim.geometry import MiB
from shinglefs.zoned.model import TraceRecord


def test_a_small_zone_trace_maps_zone_for_zone_onto_the_model():
    m = hc620()
    rec = TraceRecord("write", 3, 3 * 32 * MiB + 4096, 4096, 0.0)
    assert m.position(rec, 32 * MiB) == 3 * m.zone_size + 4096
    assert m.position(rec, m.zone_size) == rec.offset


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_model_replays_the_same_trace_and_counts_bytes(name):
    m = profile(name)
    zs = 32 * MiB
    trace = [TraceRecord("write", 2, 2 * zs + i * MiB, MiB, 0.0) for i in range(8)]
    trace += [TraceRecord("flush", -1, 0, 0, 0.0), TraceRecord("read", 2, 2 * zs, 8 * MiB, 0.0),
              TraceRecord("reset", 2, 2 * zs, 0, 0.0)]
    r = m.replay(trace, zone_size=zs)
    assert r.bytes_written == 8 * MiB and r.bytes_read == 8 * MiB
    assert r.ops == len(trace)
    assert r.seconds > 0 and r.mib_s > 0


def test_a_sequential_trace_has_no_zone_switch_and_an_interleaved_one_has_many():
    m = hc620()
    z = m.first_sequential_zone
    seq = [TraceRecord("write", z, z * m.zone_size + i * MiB, MiB, 0.0) for i in range(64)]
    inter = [TraceRecord("write", z + i % 2, (z + i % 2) * m.zone_size + (i // 2) * MiB, MiB, 0.0)
             for i in range(64)]
    assert m.replay(seq).zone_switches == 0
    r = m.replay(inter)
    assert r.zone_switches >= 20
    assert r.seconds > m.replay(seq).seconds


def test_a_reset_is_counted():
    r = hc620().replay([TraceRecord("reset", 600, 600 * 256 * MiB, 0, 0.0)])
    assert r.zone_resets == 1


def test_an_unknown_operation_is_refused():
    with pytest.raises(ValueError, match="unknown trace operation"):
        hc620().replay([TraceRecord("trim", 1, 0, 0, 0.0)])
