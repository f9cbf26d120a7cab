"""A drive-managed SMR disk: the alternative a conventional file system sits on.

The firmware hides the shingled bands behind a conventional block interface:

- A write that streams a band (starts at a band's first byte, or continues the
  last direct write into one of the ``stream_slots`` most recent streamed
  bands, and that band holds nothing in the media cache) goes straight to the
  band: positioning plus transfer, as on a CMR disk.
- Any other write lands in the persistent media cache (a log at the outer
  diameter): ``media_cache_op_s`` (the head's trip to the cache and back, its
  bookkeeping) plus the transfer at the OD rate. The band is now dirty.
- When the cache holds more than ``clean_threshold`` of ``media_cache_bytes``,
  the next cached write first cleans bands in the foreground until it is
  below: a band is cleaned by read-modify-write (position, read the whole
  band, merge its cached bytes, position, write the whole band back). The
  cache is a log cleaned from its tail: the band cached first goes first.
- ``idle(seconds)`` cleans bands in the background for as long as the idle
  time lasts (real drives keep cleaning for over an hour after a burst).

Reads are served from the band location (the cache copy's extra seek is not
modeled). The fitted figures are in ``sim.drives``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from shinglefs.sim.geometry import DiskGeometry
from shinglefs.sim.model import DriveModel, Simulation


class DmSmrSimulation(Simulation):
    """Head, media cache occupancy per band, streamed bands and the totals of one replay."""

    def __init__(self, model: DmSmrDiskModel) -> None:
        super().__init__(model.name)
        self.model = model
        self.geo = model.geometry
        self.head = 0
        self.cached: OrderedDict[int, int] = OrderedDict()  # band -> cached bytes, oldest first
        self.cache_bytes = 0
        self.streams: OrderedDict[int, int] = OrderedDict()  # band -> next streamed position
        self.last_zone: int | None = None

    def _move(self, position: int, length: int, write: bool) -> float:
        cost, seeked = self.geo.positioning_s(self.head, position, write)
        if seeked:
            self.result.seeks += 1
        self.head = position + length
        return cost + self.geo.transfer_s(position, length, write)

    def read(self, position: int, length: int, zone: int) -> None:
        self.charge(self._move(position, length, write=False), write=False)
        self.result.bytes_read += length

    def write(self, position: int, length: int, zone: int) -> None:
        self.result.bytes_written += length
        band_bytes = self.model.band_bytes
        end = position + length
        while position < end:
            band = position // band_bytes
            piece = min(end, (band + 1) * band_bytes) - position
            self._write_band_piece(band, position, piece)
            position += piece

    def _write_band_piece(self, band: int, position: int, length: int) -> None:
        streamed = self.streams.get(band)
        starts_band = position == band * self.model.band_bytes
        if (starts_band or streamed == position) and not self.cached.get(band):
            self.streams[band] = position + length
            self.streams.move_to_end(band)
            while len(self.streams) > self.model.stream_slots:
                self.streams.popitem(last=False)
            self.charge(self._move(position, length, write=True), write=True)
            return
        self.streams.pop(band, None)
        limit = self.model.media_cache_bytes * self.model.clean_threshold
        while self.cache_bytes + length > limit and self.cached:
            self._clean_one()
        self.cached[band] = self.cached.get(band, 0) + length
        self.cache_bytes += length
        self.result.media_cache_bytes += length
        self.charge(self.model.media_cache_op_s + self.geo.transfer_s(0, length, True), write=True)

    def _clean_one(self) -> float:
        """Read-modify-write the oldest cached band; returns its modeled time."""
        band, cached = self.cached.popitem(last=False)
        self.cache_bytes -= cached
        start, size = band * self.model.band_bytes, self.model.band_bytes
        seconds = self._move(start, size, write=False) + self._move(start, size, write=True)
        self.result.bands_cleaned += 1
        self.result.cleaning_bytes += 2 * size
        self.charge(seconds, write=True)
        return seconds

    def idle(self, seconds: float) -> None:
        """Background cleaning while idle; the idle time itself is not busy time."""
        spent = 0.0
        while self.cached and spent < seconds:
            before = self.result.seconds
            self._clean_one()
            took = self.result.seconds - before
            spent += took
            # background work is hidden in the idle period: take it off the busy clock
            self.result.seconds -= took
            self.result.write_seconds -= took


@dataclass(frozen=True, slots=True)
class DmSmrDiskModel(DriveModel):
    """A drive-managed SMR disk; see the module docstring."""

    name: str
    geometry: DiskGeometry
    media_cache_bytes: int = 24 * 1024**3
    clean_threshold: float = 0.55
    band_bytes: int = 30 * 1024 * 1024
    media_cache_op_s: float = 0.0052
    stream_slots: int = 2
    zone_size: int = 256 * 1024 * 1024  # only for mapping traces from zoned drives

    @property
    def capacity(self) -> int:  # type: ignore[override]
        return self.geometry.capacity

    def simulation(self) -> Simulation:
        return DmSmrSimulation(self)
