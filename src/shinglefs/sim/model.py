"""The common interface of every drive model: replay operations, get modeled time.

A model is an immutable description of a drive (``DriveModel``); each replay
runs a fresh ``Simulation`` over it, so one model serves any number of
replays and threads. Operations are ``shinglefs.zoned.model.TraceRecord``s,
exactly what our drives record with ``start_trace``/``stop_trace``: ``op`` in
read, write, flush, reset, open, close, finish; ``offset`` absolute bytes;
``zone`` the traced drive's zone (-1 for a flush).

Zone mapping: a trace taken on a drive with another zone size than the
model's (an emulated drive with small zones) is replayed zone for zone: zone
``z`` at in-zone offset ``o`` lands at ``z * model.zone_size + o``. So zone 2
of a small emulated drive is zone 2 of the HC620, near the outer diameter,
where a fresh drive writes first.

Never does: I/O, sleeping, or reading the records' ``time`` (the model's
timeline is its own; recorded times only order the records).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from shinglefs.sim.result import ReplayResult
from shinglefs.zoned.model import TraceRecord

OPS = ("read", "write", "flush", "reset", "open", "close", "finish")


class Simulation(ABC):
    """The state of one replay (head position, caches, zones) and its running totals."""

    def __init__(self, name: str) -> None:
        self.result = ReplayResult(model=name)

    @abstractmethod
    def read(self, position: int, length: int, zone: int) -> None:
        """Serve a read of ``length`` bytes at ``position`` (in the model's byte space)."""

    @abstractmethod
    def write(self, position: int, length: int, zone: int) -> None:
        """Accept a write of ``length`` bytes at ``position``."""

    def flush(self) -> None:  # noqa: B027 - nothing to flush without a write cache
        """Make every accepted write reach the media (a cache flush)."""

    def zone_command(self, op: str, zone: int) -> None:  # noqa: B027 - optional for zoneless models
        """Reset/open/close/finish ``zone`` (ignored by models without zones)."""

    def idle(self, seconds: float) -> None:  # noqa: B027 - only drive-managed SMR uses idle time
        """Let the drive sit idle for ``seconds`` (background work may run)."""

    def charge(self, seconds: float, write: bool) -> None:
        self.result.seconds += seconds
        if write:
            self.result.write_seconds += seconds
        else:
            self.result.read_seconds += seconds

    def finish_replay(self) -> ReplayResult:
        """Flush what is cached and return the totals."""
        self.flush()
        return self.result


class DriveModel(ABC):
    """A drive's timing model; see the module docstring."""

    name: str
    zone_size: int
    capacity: int

    @abstractmethod
    def simulation(self) -> Simulation:
        """A fresh replay state (empty caches, head at the outer diameter)."""

    def replay(self, records: Iterable[TraceRecord], *, zone_size: int | None = None,
               simulation: Simulation | None = None) -> ReplayResult:
        """Replay ``records`` in order; ``zone_size`` is the traced drive's (default: the model's).

        Pass ``simulation`` to continue an earlier replay's state (e.g. a read
        phase after a write phase on the same drive). Raises ValueError for an
        unknown operation.
        """
        sim = simulation or self.simulation()
        traced = zone_size or self.zone_size
        for rec in records:
            self.apply(sim, rec, traced)
        return sim.finish_replay()

    def position(self, rec: TraceRecord, traced_zone_size: int) -> int:
        """Where ``rec`` lands on this model (see zone mapping in the module docstring)."""
        if traced_zone_size == self.zone_size:
            return rec.offset
        return rec.zone * self.zone_size + (rec.offset - rec.zone * traced_zone_size)

    def apply(self, sim: Simulation, rec: TraceRecord, traced_zone_size: int) -> None:
        """Feed one record to ``sim``."""
        op = rec.op
        if op == "write":
            sim.write(self.position(rec, traced_zone_size), rec.length, rec.zone)
        elif op == "read":
            sim.read(self.position(rec, traced_zone_size), rec.length, rec.zone)
        elif op == "flush":
            sim.flush()
        elif op in OPS:
            sim.zone_command(op, rec.zone)
        else:
            raise ValueError(f"unknown trace operation {op!r}")
        sim.result.ops += 1
