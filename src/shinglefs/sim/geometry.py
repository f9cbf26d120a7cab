"""The mechanics of a 3.5" hard disk: where bytes are, how fast they pass the head, how long a seek takes.

Positions are absolute byte offsets (LBA x block size); position 0 is at the
outer diameter (OD), the last byte at the inner diameter (ID).

- Sequential rate: a track's bytes are proportional to its radius and the
  platter turns at a constant speed, so the media rate is proportional to the
  radius. With constant linear density the radius at fraction ``f`` of the
  capacity is ``sqrt(1 - f * (1 - k**2))`` of the outer one, where ``k`` is the
  ID/OD radius ratio (REFERENCE.md: ID rate commonly 45-55 % of OD; we use 0.5).
- Seek: ``track_to_track + (full_stroke - track_to_track) * sqrt(d / capacity)``
  for a move of ``d`` bytes (the classic square-root arm curve), zero for none.
- Rotational latency after a seek: half a revolution on average (4.17 ms at
  7,200 rpm).
- A short forward skip on the same track (less than one track of bytes) costs
  the time the gap takes to pass under the head, when that is cheaper than a
  seek plus rotational latency.

The seek figures of the calibrated profiles (``sim.drives``) are *effective*
curves fitted to published fio figures taken at queue depth 8, so they fold
the drive's own command reordering in; they are lower than datasheet seeks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MiB = 1024 * 1024
GiB = 1024 * MiB


@dataclass(frozen=True, slots=True)
class DiskGeometry:
    """Capacity, rates and arm timing of one disk; every time is in seconds."""

    capacity: int
    read_rate_od: float  # bytes/s at the outer diameter
    write_rate_od: float
    id_od_ratio: float = 0.5
    rpm: int = 7200
    track_to_track_s: float = 0.0006
    full_stroke_s: float = 0.0053

    @property
    def revolution_s(self) -> float:
        return 60.0 / self.rpm

    @property
    def rotational_latency_s(self) -> float:
        """Average wait for the target sector after a seek: half a revolution."""
        return self.revolution_s / 2

    def radius_fraction(self, position: int) -> float:
        """Radius at ``position`` as a fraction of the outer radius (1.0 at OD)."""
        f = min(max(position / self.capacity, 0.0), 1.0)
        return math.sqrt(1.0 - f * (1.0 - self.id_od_ratio**2))

    def rate(self, position: int, write: bool) -> float:
        """Media rate (bytes/s) at ``position``."""
        od = self.write_rate_od if write else self.read_rate_od
        return od * self.radius_fraction(position)

    def transfer_s(self, position: int, length: int, write: bool) -> float:
        """Time for ``length`` bytes starting at ``position`` to pass under the head."""
        return length / self.rate(position + length // 2, write)

    def track_bytes(self, position: int) -> float:
        """Bytes on one track at ``position`` (one revolution's worth)."""
        return self.rate(position, False) * self.revolution_s

    def seek_s(self, distance: int) -> float:
        """Arm movement time for ``distance`` bytes (either direction)."""
        if distance == 0:
            return 0.0
        f = min(abs(distance) / self.capacity, 1.0)
        return self.track_to_track_s + (self.full_stroke_s - self.track_to_track_s) * math.sqrt(f)

    def positioning_s(self, head: int, target: int, write: bool,
                      rotation_fraction: float = 1.0) -> tuple[float, bool]:
        """Time to start transferring at ``target`` with the head at ``head``; and whether it seeked.

        Zero when ``target == head`` (a sequential continuation); a short forward
        skip within a track costs the gap's rotation time when that is cheaper.
        ``rotation_fraction`` scales the average rotational latency (a drive
        ordering a window of cached writes by rotational position waits less).
        """
        if target == head:
            return 0.0, False
        seek = self.seek_s(target - head) + self.rotational_latency_s * rotation_fraction
        gap = target - head
        if 0 < gap < self.track_bytes(head):
            skip = gap / self.rate(head, write)
            if skip <= seek:
                return skip, False
        return seek, True
