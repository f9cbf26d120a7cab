"""The calibration table: every published figure beside the model's figure for the same workload.

Used by ``shinglefs sim calibrate`` and docs/sim.md; the tests in
tests/sim/test_calibration.py check the same points one by one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from shinglefs.sim import workloads as w
from shinglefs.sim.drives import archive_dmsmr, cmr_hdd, hc620
from shinglefs.sim.geometry import GiB, MiB


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    """``published`` as stated by the source; the model passes within ``[low, high]``."""

    name: str
    published: str
    modeled: float
    unit: str
    low: float
    high: float

    @property
    def ok(self) -> bool:
        return self.low <= self.modeled <= self.high

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "modeled": round(self.modeled, 2), "ok": self.ok}


def dmsmr_cliff() -> tuple[float, float, float]:
    """(MB/s before the cliff, GB written when a GiB first ran below 10 MB/s, MB/s after)."""
    d = archive_dmsmr()
    sim = d.simulation()
    rates = []
    for i in range(18):
        s0, b0 = sim.result.seconds, sim.result.bytes_written
        d.replay(w.random_small_writes(d, GiB, seed=i), simulation=sim)
        rates.append((sim.result.bytes_written - b0) / 1e6 / (sim.result.seconds - s0))
    cliff = next((i for i, r in enumerate(rates) if r < 10), len(rates))
    return rates[0], cliff * GiB / 1e9, rates[-1]


def calibration_points() -> list[CalibrationPoint]:
    """Compute every point (about two seconds)."""
    m = hc620()
    z, zones = m.first_sequential_zone, m.zone_count - m.first_sequential_zone
    before, cliff_gb, after = dmsmr_cliff()
    d, c = archive_dmsmr(), cmr_hdd()
    resilver = (c.replay(w.resilver_stream(c, 512 * MiB)).write_mib_s
                / d.replay(w.resilver_stream(d, 512 * MiB)).write_mib_s)
    return [
        _near("HC620 one sequential write stream", 235,
              m.replay(w.sequential(m, z, GiB)).write_mib_s, "MiB/s"),
        _near("HC620 one sequential read stream", 238,
              m.replay(w.sequential(m, z, GiB, op="read")).read_mib_s, "MiB/s"),
        _near("HC620 four interleaved append streams", 143,
              m.replay(w.interleaved_appends(m, z, 4, 256 * MiB)).write_mib_s, "MiB/s"),
        _near("HC620 writes scattered across zones", 40,
              m.replay(w.scattered_zone_writes(m, z, zones, 4000)).write_mib_s, "MiB/s"),
        _near("HC620 random 256 KiB reads", 30,
              m.replay(w.random_reads(m, z, zones, 4000)).read_mib_s, "MiB/s"),
        _near("DM-SMR sustained small writes", 40, before, "MB/s"),
        _near("DM-SMR write cliff after", 14, cliff_gb, "GB", 0.15),
        CalibrationPoint("DM-SMR small writes past the cliff", "< 10", after, "MB/s", 0, 10),
        CalibrationPoint("resilver 32 KiB stream, CMR / DM-SMR", "10-20", resilver, "x", 10, 20),
    ]


def _near(name: str, published: float, modeled: float, unit: str,
          tolerance: float = 0.10) -> CalibrationPoint:
    return CalibrationPoint(name, f"{published:g} ±{tolerance:.0%}", modeled, unit,
                            published * (1 - tolerance), published * (1 + tolerance))
