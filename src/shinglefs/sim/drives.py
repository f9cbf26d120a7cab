"""Calibrated drive profiles: the figures every model is fitted to, and where they come from.

``hc620()`` - WD Ultrastar DC HC620, 15 TB host-managed SMR: 55,880 zones of
256 MiB (524 conventional), 128 max open zones, 7,200 rpm. Published fio
figures (zonedstorage.io, 256 KiB blocks, queue depth 8): one sequential
stream 235 MiB/s write and 238 MiB/s read from the first sequential zone;
four interleaved append streams 143 MiB/s in total; writes scattered across
zones 40 MiB/s; random 256 KiB reads about 30 MiB/s. Fitted here:

- OD rates: the measured sequential rates divided by the radius fraction at
  the first sequential zone (0.9965), so the model gives 235/238 there.
- Seek curve 0.6 ms track-to-track, 5.3 ms full stroke (effective, at queue
  depth 8): random 256 KiB reads over the whole drive -> ~29 MiB/s.
- ``write_window`` 3 MiB and ``destage_rotation_fraction`` 0.5, fitted
  together (grid search) to two figures: four interleaved streams (three
  positionings per window: the elevator continues the stream it ended on)
  -> 143 MiB/s, and scattered zone writes (12 per window, one sweep) -> 39 MiB/s.

``archive_dmsmr()`` - a Seagate Archive 8 TB-like drive-managed SMR disk:
media cache 24 GiB (published 20-32 GiB), bands of 30 MiB (20-40 MiB),
sustained small writes ~40 MB/s for ~14 GB then < 10 MB/s (borg issue 2252;
aicodix/smr): fitted by ``media_cache_op_s`` (256 KiB random writes at
~40 MB/s) and ``clean_threshold`` 0.55 (foreground cleaning from 14.2 GB).

``cmr_hdd()`` - a 16 TB 7,200 rpm CMR disk with the same mechanics as the
HC620 and a 260 MiB/s OD rate (assumed, typical of the class).

``nvme_flash()`` - a generic datacenter NVMe SSD: 3 GiB/s read, 2 GiB/s write,
80/20 us latency (assumed).

Every figure is a dataclass field: override with ``dataclasses.replace``.
"""

from __future__ import annotations

from shinglefs.sim.dmsmr import DmSmrDiskModel
from shinglefs.sim.flash import FlashModel
from shinglefs.sim.geometry import DiskGeometry, GiB, MiB
from shinglefs.sim.hdd import CmrDiskModel, HmSmrDiskModel
from shinglefs.sim.model import DriveModel

HC620_ZONES = 55_880
HC620_CONVENTIONAL = 524
HC620_ZONE = 256 * MiB
# radius fraction at the first sequential zone (see geometry.DiskGeometry.radius_fraction)
_FIRST_SEQ_RADIUS = (1 - HC620_CONVENTIONAL / HC620_ZONES * 0.75) ** 0.5

SEEK_T2T_S = 0.0006
SEEK_FULL_S = 0.0053
WRITE_WINDOW = 3 * MiB
DESTAGE_ROTATION = 0.5


def hc620() -> HmSmrDiskModel:
    """The WD HC620 15 TB host-managed SMR drive (the calibration reference)."""
    geo = DiskGeometry(
        capacity=HC620_ZONES * HC620_ZONE,
        read_rate_od=238 * MiB / _FIRST_SEQ_RADIUS,
        write_rate_od=235 * MiB / _FIRST_SEQ_RADIUS,
        track_to_track_s=SEEK_T2T_S,
        full_stroke_s=SEEK_FULL_S,
    )
    return HmSmrDiskModel(
        name="hc620-hmsmr", geometry=geo, write_window=WRITE_WINDOW,
        destage_rotation_fraction=DESTAGE_ROTATION, zone_size=HC620_ZONE,
        zone_count=HC620_ZONES, conventional_zones=HC620_CONVENTIONAL, max_open_zones=128,
    )


def archive_dmsmr() -> DmSmrDiskModel:
    """An 8 TB drive-managed SMR disk (Seagate Archive class)."""
    geo = DiskGeometry(capacity=8 * 10**12, read_rate_od=190 * MiB, write_rate_od=190 * MiB,
                       track_to_track_s=SEEK_T2T_S, full_stroke_s=SEEK_FULL_S)
    return DmSmrDiskModel(name="archive-dmsmr", geometry=geo, media_cache_bytes=24 * GiB,
                          clean_threshold=0.55, band_bytes=30 * MiB)


def cmr_hdd() -> CmrDiskModel:
    """A 16 TB conventional (CMR) 7,200 rpm disk."""
    geo = DiskGeometry(capacity=16 * 10**12, read_rate_od=260 * MiB, write_rate_od=260 * MiB,
                       track_to_track_s=SEEK_T2T_S, full_stroke_s=SEEK_FULL_S)
    return CmrDiskModel(name="cmr-hdd", geometry=geo, write_window=WRITE_WINDOW,
                        destage_rotation_fraction=DESTAGE_ROTATION)


def nvme_flash() -> FlashModel:
    """A generic datacenter NVMe SSD (7.68 TB)."""
    return FlashModel(name="nvme-flash", capacity=7_680 * 10**9, read_rate=3 * GiB,
                      write_rate=2 * GiB)


PROFILES = {"hc620": hc620, "dmsmr": archive_dmsmr, "cmr": cmr_hdd, "flash": nvme_flash}


def profile(name: str) -> DriveModel:
    """The model named ``name`` (one of ``PROFILES``); KeyError for another."""
    return PROFILES[name]()
