"""Calibration of the drive models against published figures (sim.drives names the sources).

Each test replays the fio-like workload behind one published figure and
checks the modeled rate within a stated tolerance.
"""

from __future__ import annotations

import pytest

from shinglefs.sim import archive_dmsmr, cmr_hdd, hc620, nvme_flash
from shinglefs.sim import workloads as w
from shinglefs.sim.geometry import GiB, MiB

TOL = 0.10  # ±10 % on every HC620 point


@pytest.fixture(scope="module")
def drive():
    return hc620()


def within(value: float, target: float, tol: float = TOL) -> bool:
    return abs(value / target - 1) <= tol


def test_hc620_geometry_matches_the_datasheet(drive):
    assert drive.zone_count == 55_880
    assert drive.zone_size == 256 * MiB
    assert drive.max_open_zones == 128
    assert drive.geometry.rpm == 7200
    assert drive.capacity == pytest.approx(15e12, rel=0.01)


def test_one_sequential_write_stream_runs_at_235_mib_s(drive):
    r = drive.replay(w.sequential(drive, drive.first_sequential_zone, GiB))
    assert within(r.write_mib_s, 235), r.write_mib_s
    assert r.seeks <= 1


def test_one_sequential_read_stream_runs_at_238_mib_s(drive):
    r = drive.replay(w.sequential(drive, drive.first_sequential_zone, GiB, op="read"))
    assert within(r.read_mib_s, 238), r.read_mib_s


def test_four_interleaved_append_streams_total_143_mib_s(drive):
    r = drive.replay(w.interleaved_appends(drive, drive.first_sequential_zone, 4, 256 * MiB))
    assert within(r.write_mib_s, 143), r.write_mib_s
    assert r.zone_switches > 100


def test_writes_scattered_across_zones_run_at_40_mib_s(drive):
    z = drive.first_sequential_zone
    r = drive.replay(w.scattered_zone_writes(drive, z, drive.zone_count - z, 4000))
    assert within(r.write_mib_s, 40), r.write_mib_s


def test_random_256k_reads_run_at_about_30_mib_s(drive):
    z = drive.first_sequential_zone
    r = drive.replay(w.random_reads(drive, z, drive.zone_count - z, 4000))
    assert within(r.read_mib_s, 30), r.read_mib_s
    assert r.seeks >= 3990


def test_inner_diameter_runs_at_about_half_the_outer_rate(drive):
    outer = drive.replay(w.sequential(drive, drive.first_sequential_zone, GiB)).write_mib_s
    inner = drive.replay(w.sequential(drive, drive.zone_count - 8, GiB)).write_mib_s
    assert 0.45 <= inner / outer <= 0.55


def test_seek_time_grows_from_track_to_track_to_full_stroke(drive):
    geo = drive.geometry
    assert geo.seek_s(0) == 0
    assert geo.seek_s(4096) == pytest.approx(geo.track_to_track_s, rel=0.01)
    assert geo.seek_s(geo.capacity) == pytest.approx(geo.full_stroke_s)
    assert geo.seek_s(geo.capacity // 100) < geo.seek_s(geo.capacity // 2)
    assert geo.rotational_latency_s == pytest.approx(60 / 7200 / 2)


def test_more_open_zones_than_the_limit_close_zones_implicitly(drive):
    z = drive.first_sequential_zone
    r = drive.replay(w.interleaved_appends(drive, z, 130, 4 * MiB))
    assert r.implicit_closes > 0
    r = drive.replay(w.interleaved_appends(drive, z, 128, 4 * MiB))
    assert r.implicit_closes == 0


def test_dmsmr_small_writes_run_at_40_mb_s_then_fall_off_a_cliff_after_14_gb():
    d = archive_dmsmr()
    sim = d.simulation()
    rates = []  # MB/s of each successive GiB of 256 KiB random writes
    for i in range(16):
        before_s, before_b = sim.result.seconds, sim.result.bytes_written
        d.replay(w.random_small_writes(d, GiB, seed=i), simulation=sim)
        rates.append((sim.result.bytes_written - before_b) / 1e6
                     / (sim.result.seconds - before_s))
    assert all(within(r, 40, 0.10) for r in rates[:12]), rates  # the first 12.9 GB
    assert all(r < 10 for r in rates[14:]), rates  # past 15 GB
    assert sim.result.bands_cleaned > 0


def test_dmsmr_idle_time_cleans_the_media_cache():
    d = archive_dmsmr()
    sim = d.simulation()
    d.replay(w.random_small_writes(d, GiB), simulation=sim)
    cached = sim.cache_bytes
    sim.idle(3600)
    assert cached > 0 and sim.cache_bytes == 0
    assert sim.result.seconds < 60  # idle cleaning is not busy time


def test_dmsmr_full_band_sequential_writes_bypass_the_media_cache():
    d = archive_dmsmr()
    r = d.replay(w.sequential(d, 0, GiB))
    assert r.media_cache_bytes == 0
    assert r.write_mib_s > 150


def test_resilver_like_32k_streams_are_10_to_20x_slower_on_dmsmr_than_on_cmr():
    d, c = archive_dmsmr(), cmr_hdd()
    slow = d.replay(w.resilver_stream(d, 512 * MiB)).write_mib_s
    fast = c.replay(w.resilver_stream(c, 512 * MiB)).write_mib_s
    assert 10 <= fast / slow <= 20, (fast, slow)


def test_flash_has_no_positioning_cost():
    f = nvme_flash()
    seq = f.replay(w.sequential(f, 0, GiB, op="read")).read_mib_s
    rnd = f.replay(w.random_reads(f, 0, 1000, 4096)).read_mib_s
    assert rnd == pytest.approx(seq, rel=1e-6)
    assert rnd > 1000
