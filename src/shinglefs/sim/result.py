"""What a replay reports: modeled seconds, bytes, seeks and zone switches."""

from __future__ import annotations

from dataclasses import asdict, dataclass

MiB = 1024 * 1024


@dataclass(slots=True)
class ReplayResult:
    """Totals of one replay through one drive model.

    ``seconds`` is the modeled busy time of the drive (operations are served
    one after another, as one actuator does; host think time is not counted:
    the question is what the drive would take for exactly these operations).
    ``seeks`` counts arm movements (a short skip within a track is not one);
    ``zone_switches`` counts written extents that landed in another zone than
    the previous written extent. The cleaning fields are non-zero only for the
    drive-managed SMR model.
    """

    model: str
    seconds: float = 0.0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    ops: int = 0
    seeks: int = 0
    zone_switches: int = 0
    zone_resets: int = 0
    implicit_closes: int = 0
    media_cache_bytes: int = 0
    bands_cleaned: int = 0
    cleaning_bytes: int = 0

    @property
    def bytes_total(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def mib_s(self) -> float:
        """Throughput over the whole replay, MiB/s (0 for an empty one)."""
        return self.bytes_total / MiB / self.seconds if self.seconds else 0.0

    @property
    def write_mib_s(self) -> float:
        return self.bytes_written / MiB / self.write_seconds if self.write_seconds else 0.0

    @property
    def read_mib_s(self) -> float:
        return self.bytes_read / MiB / self.read_seconds if self.read_seconds else 0.0

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["mib_s"] = round(self.mib_s, 2)
        out["write_mib_s"] = round(self.write_mib_s, 2)
        out["read_mib_s"] = round(self.read_mib_s, 2)
        for key in ("seconds", "read_seconds", "write_seconds"):
            out[key] = round(float(out[key]), 6)  # type: ignore[arg-type]
        return out
