"""Hard disks with a write-back cache: the conventional (CMR) disk and the host-managed SMR disk.

Both share one mechanism (``DiskSimulation``):

- Reads are served in order: positioning (``DiskGeometry.positioning_s``)
  plus transfer. A read that continues where the head is costs transfer only
  (the drive's read-ahead keeps a sequential stream streaming).
- Writes are acknowledged into a write-back window of ``write_window`` bytes.
  When it is full, or before a read, flush or zone command, the drive destages
  it: the window's extents are sorted in one elevator sweep from the head
  (C-SCAN), contiguous extents merge, and each extent costs positioning plus
  transfer. So interleaved appends to several zones cost one positioning per
  zone per window, and writes scattered over many zones cost short seeks of
  about capacity / extents-per-window each. ``write_window`` is fitted (see
  ``sim.drives``), not the drive's cache size: it is how much the firmware
  reorders at a time. A destage positioning waits ``destage_rotation_fraction``
  of the average rotational latency: with a window of writes to choose from,
  the firmware orders them by rotational position too (fitted).

The host-managed SMR disk adds zones: ``max_open_zones`` open zones at most
(a write to one more implicitly closes the least recently written open zone,
as ZBC allows, costing ``zone_close_s``), zone resets (``zone_command_s``
each) and a count of zone switches. It does not check write pointers: the
traces come from drives that already enforce them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from shinglefs.sim.geometry import DiskGeometry
from shinglefs.sim.model import DriveModel, Simulation


class DiskSimulation(Simulation):
    """Head position, the write-back window and the totals of one disk replay."""

    def __init__(self, model: CmrDiskModel) -> None:
        super().__init__(model.name)
        self.model = model
        self.geo = model.geometry
        self.head = 0
        self.pending: list[tuple[int, int, int]] = []  # (position, length, zone)
        self.pending_bytes = 0
        self.last_write_zone: int | None = None

    def _move(self, position: int, length: int, write: bool) -> float:
        fraction = self.model.destage_rotation_fraction if write else 1.0
        cost, seeked = self.geo.positioning_s(self.head, position, write, fraction)
        if seeked:
            self.result.seeks += 1
        self.head = position + length
        return cost + self.geo.transfer_s(position, length, write)

    def read(self, position: int, length: int, zone: int) -> None:
        self.flush()
        self.charge(self._move(position, length, write=False), write=False)
        self.result.bytes_read += length

    def write(self, position: int, length: int, zone: int) -> None:
        self.pending.append((position, length, zone))
        self.pending_bytes += length
        self.result.bytes_written += length
        if self.pending_bytes >= self.model.write_window:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        ahead = sorted(e for e in self.pending if e[0] >= self.head)
        behind = sorted(e for e in self.pending if e[0] < self.head)
        self.pending, self.pending_bytes = [], 0
        merged: list[list[int]] = []
        for pos, length, zone in ahead + behind:
            if merged and merged[-1][0] + merged[-1][1] == pos:
                merged[-1][1] += length
            else:
                merged.append([pos, length, zone])
        for pos, length, zone in merged:
            if self.last_write_zone is not None and zone != self.last_write_zone:
                self.result.zone_switches += 1
            self.last_write_zone = zone
            self.charge(self._move(pos, length, write=True), write=True)


@dataclass(frozen=True, slots=True)
class CmrDiskModel(DriveModel):
    """A conventional-recording disk: writes anywhere, through the write-back window."""

    name: str
    geometry: DiskGeometry
    write_window: int = 7 * 1024 * 1024
    destage_rotation_fraction: float = 1.0
    zone_size: int = 256 * 1024 * 1024  # only for mapping traces from zoned drives

    @property
    def capacity(self) -> int:  # type: ignore[override]
        return self.geometry.capacity

    def simulation(self) -> Simulation:
        return DiskSimulation(self)


class SmrSimulation(DiskSimulation):
    """A disk replay that also tracks open zones (host-managed SMR)."""

    model: HmSmrDiskModel

    def __init__(self, model: HmSmrDiskModel) -> None:
        super().__init__(model)
        self.open_zones: OrderedDict[int, None] = OrderedDict()

    def write(self, position: int, length: int, zone: int) -> None:
        zone = position // self.model.zone_size  # the zone on this model
        if zone in self.open_zones:
            self.open_zones.move_to_end(zone)
        else:
            if len(self.open_zones) >= self.model.max_open_zones:
                self.open_zones.popitem(last=False)
                self.result.implicit_closes += 1
                self.charge(self.model.zone_close_s, write=True)
            self.open_zones[zone] = None
        super().write(position, length, zone)
        if position + length >= (zone + 1) * self.model.zone_size:
            self.open_zones.pop(zone, None)  # FULL: no longer open

    def zone_command(self, op: str, zone: int) -> None:
        if zone < 0:
            return
        self.flush()
        self.open_zones.pop(zone, None)
        if op == "open":
            self.open_zones[zone] = None
        if op == "reset":
            self.result.zone_resets += 1
        self.charge(self.model.zone_command_s, write=True)


@dataclass(frozen=True, slots=True)
class HmSmrDiskModel(CmrDiskModel):
    """A host-managed SMR disk: the CMR mechanics plus zones and the open-zone limit."""

    zone_count: int = 0
    conventional_zones: int = 0
    max_open_zones: int = 128
    zone_close_s: float = 0.001  # assumed: firmware bookkeeping of an implicit close
    zone_command_s: float = 0.0002  # assumed: reset/open/close/finish round trip

    def simulation(self) -> Simulation:
        return SmrSimulation(self)

    @property
    def first_sequential_zone(self) -> int:
        return self.conventional_zones
