"""The trace file: JSON lines of ``TraceRecord``, with a header line naming the drive.

Format (``shinglefs-trace`` version 1), UTF-8, one JSON object a line::

    {"format": "shinglefs-trace", "version": 1, "drive": "d0",
     "zone_size": 268435456, "zone_count": 64, "block_size": 4096}
    {"op": "write", "zone": 2, "offset": 536870912, "length": 8392704, "time": 12.5}
    {"op": "flush", "zone": -1, "offset": 0, "length": 0, "time": 12.51}
    ...

Records keep the order the drive saw them in; ``time`` is the recording
process's ``time.perf_counter()`` at issue (models ignore it; it is there for
people). The header's ``zone_size`` lets a model map zones (``sim.model``).
A file without a header is accepted when every line is a record (zone size
then defaults to the model's).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from shinglefs.errors import UsageError
from shinglefs.zoned.model import TraceRecord, ZonedDrive

FORMAT = "shinglefs-trace"
VERSION = 1


@dataclass(slots=True)
class Trace:
    """A recorded trace and the geometry of the drive it was recorded on."""

    records: list[TraceRecord]
    drive: str = ""
    zone_size: int | None = None
    zone_count: int | None = None
    block_size: int = 4096
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, drive: ZonedDrive, records: list[TraceRecord]) -> Trace:
        """A trace of ``records`` taken on ``drive`` (from ``drive.stop_trace()``)."""
        return cls(records, drive.name, drive.zone_size, drive.zone_count, drive.block_size)

    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "drive": self.drive,
                "zone_size": self.zone_size, "zone_count": self.zone_count,
                "block_size": self.block_size, **self.extra}


def write_trace(trace: Trace, path: Path | str) -> None:
    """Write ``trace`` to ``path`` (replaced if it exists)."""
    with open(path, "w", encoding="utf-8") as f:
        dump_trace(trace, f)


def dump_trace(trace: Trace, f: IO[str]) -> None:
    f.write(json.dumps(trace.header()) + "\n")
    for r in trace.records:
        f.write(json.dumps({"op": r.op, "zone": r.zone, "offset": r.offset,
                            "length": r.length, "time": r.time}) + "\n")


def read_trace(path: Path | str) -> Trace:
    """Read a trace file; raises UsageError (with the line number) for a malformed one."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse_trace(f, str(path))
    except OSError as exc:
        raise UsageError(f"cannot read trace {path}: {exc.strerror or exc}") from exc


def parse_trace(lines: Iterable[str], where: str = "trace") -> Trace:
    trace = Trace([])
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if n == 1 and obj.get("format") == FORMAT:
                if obj.get("version") != VERSION:
                    raise ValueError(f"version {obj.get('version')} (this reads {VERSION})")
                trace.drive = str(obj.get("drive", ""))
                trace.zone_size = obj.get("zone_size")
                trace.zone_count = obj.get("zone_count")
                trace.block_size = int(obj.get("block_size", 4096))
                continue
            trace.records.append(TraceRecord(str(obj["op"]), int(obj["zone"]), int(obj["offset"]),
                                             int(obj["length"]), float(obj.get("time", 0.0))))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"{where}:{n}: not a shinglefs trace line ({exc})",
                             hint="a trace is JSON lines of TraceRecord; see docs/sim.md") from exc
    return trace
